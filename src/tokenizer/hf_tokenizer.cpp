#include "tokenizer/hf_tokenizer.h"

#include <algorithm>

#include "actcap/error.h"

namespace actcap::tok {

HfTokenizer::HfTokenizer(HfParts parts) : parts_(std::move(parts)) {
  std::function<std::string(std::string_view)> norm;
  if (!parts_.normalizers.empty()) norm = [this](std::string_view s) { return normalize(s); };
  added_ = AddedVocabulary(parts_.added_tokens, norm);

  int64_t max_id = -1;
  for (const auto& [token, id] : parts_.model->vocab()) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& t : parts_.added_tokens) max_id = std::max(max_id, t.id);
  vocab_size_ = max_id + 1;
  // Keyed by id, not a dense table: memory follows the number of entries, so one hostile id
  // near the limit cannot make a tiny file allocate gigabytes.
  id_to_token_.reserve(parts_.model->vocab().size() + parts_.added_tokens.size());
  for (const auto& [token, id] : parts_.model->vocab()) id_to_token_[id] = token;
  for (const AddedToken& t : parts_.added_tokens)  // added tokens take precedence, as in Rust
    id_to_token_[t.id] = t.content;
}

std::string HfTokenizer::normalize(std::string_view text, size_t* head) const {
  std::string s(text);
  for (const Normalizer& n : parts_.normalizers) s = n.apply(s, head);
  return s;
}

void HfTokenizer::encode_text(std::string_view text, std::vector<int64_t>& ids) const {
  const Bpe& model = *parts_.model;
  auto to_model = [&](std::string_view piece, size_t) { model.encode(piece, ids); };
  auto pre_tokenize = [&](std::string_view part, size_t head) {
    if (parts_.pre_tokenizer)
      parts_.pre_tokenizer->run(part, head, to_model);
    else
      to_model(part, head);
  };
  std::vector<Segment> raw;
  added_.split(text, false, raw);
  std::vector<Segment> inner;
  for (const Segment& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view part = text.substr(seg.begin, seg.end - seg.begin);
    // what of this part aligns to the input's start (Metaspace's prepend_scheme "first")
    size_t head = seg.begin == 0 ? input_head(part) : 0;
    std::string normalized;
    if (!parts_.normalizers.empty()) {
      normalized = normalize(part, &head);
      part = normalized;
    }
    inner.clear();
    added_.split(part, true, inner);
    for (const Segment& sub : inner) {
      const size_t len = sub.end - sub.begin;
      if (sub.id >= 0)
        ids.push_back(sub.id);
      else
        pre_tokenize(part.substr(sub.begin, len), sub_head(head, sub.begin, len));
    }
  }
}

std::vector<int64_t> HfTokenizer::special_ids() const {
  std::vector<int64_t> out;
  for (const AddedToken& t : parts_.added_tokens)
    if (t.special) out.push_back(t.id);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int64_t> HfTokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_text(text, ids);
  if (!add_special) return ids;
  for (const PostStep& step : parts_.post) {
    std::vector<int64_t> out;
    out.reserve(ids.size() + 4);
    for (const PostStep::Item& item : step.items) {
      if (item.sequence)
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
    ids = std::move(out);
  }
  return ids;
}

const std::string& HfTokenizer::token(int64_t id) const {
  const auto found = id_to_token_.find(id);
  if (found == id_to_token_.end())
    throw InputError(concat("token id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
  return found->second;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) tokens.push_back(token(id));
  return run_decoders(parts_.decoders, std::move(tokens));
}

}  // namespace actcap::tok
