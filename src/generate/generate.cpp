#include "actcap/generate.h"

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>
#include <numeric>
#include <set>

#include "actcap/error.h"
#include "export/corpus.h"
#include "generate/sampling.h"
#include "models/kv_cache.h"
#include "models/model_parts.h"

namespace actcap {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The rows one forward captured: sequence, position and token of each, in batch order.
struct FedRows {
  std::vector<int64_t> seq, pos, token;
};

// Stitches the capturer's snapshots of the generation's forwards (from model step `first_step`)
// into (sequence, position) order, verified.
GenerateCapture stitch(const SafeCapturer& capturer, const std::vector<FedRows>& fed,
                       int64_t first_step) {
  capturer.verify();  // fenced; every snapshot's bytes against its fingerprint
  GenerateCapture c;
  std::vector<int64_t> seq, pos, token, step;
  for (size_t f = 0; f < fed.size(); ++f) {
    seq.insert(seq.end(), fed[f].seq.begin(), fed[f].seq.end());
    pos.insert(pos.end(), fed[f].pos.begin(), fed[f].pos.end());
    token.insert(token.end(), fed[f].token.begin(), fed[f].token.end());
    step.insert(step.end(), fed[f].seq.size(), static_cast<int64_t>(f));
  }
  std::vector<int64_t> order(seq.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return seq[a] != seq[b] ? seq[a] < seq[b] : pos[a] < pos[b];
  });
  for (int64_t i : order) {
    c.row_seq.push_back(seq[i]);
    c.row_pos.push_back(pos[i]);
    c.row_token.push_back(token[i]);
    c.row_step.push_back(step[i]);
  }
  const at::Tensor index = at::tensor(order, at::kLong);
  for (const PointInfo& p : capturer.plan()) {
    std::vector<at::Tensor> parts;
    for (const Snapshot& s : capturer.snapshots()) {
      if (s.point != p.name || s.step < first_step) continue;
      const size_t f = static_cast<size_t>(s.step - first_step);
      if (f >= fed.size() || s.rows.size(0) != static_cast<int64_t>(fed[f].seq.size()))
        throw RunError(concat("generation: ", p.name, " captured ", s.rows.size(0),
                              " rows in forward ", f, ", expected ",
                              f < fed.size() ? fed[f].seq.size() : 0));
      parts.push_back(s.rows);
    }
    if (parts.size() != fed.size())
      throw RunError(concat("generation: ", p.name, " was captured in ", parts.size(), " of ",
                            fed.size(), " forwards"));
    c.points.emplace_back(p.name, at::cat(parts).index_select(0, index));
  }
  return c;
}

}  // namespace

std::vector<std::vector<int64_t>> read_prompts(const std::string& path, const Tokenizer* tokenizer,
                                               int64_t vocab_size) {
  CorpusReader reader(path, tokenizer, vocab_size, /*skip_bad_lines=*/false);
  std::vector<std::vector<int64_t>> out;
  Document doc;
  while (reader.next(doc)) out.push_back(std::move(doc.ids));
  if (out.empty()) throw InputError(concat("input ", path, " has no prompt"), {"input"});
  return out;
}

int64_t generation_capacity(const Model& model, const std::vector<std::vector<int64_t>>& prompts,
                            const GenerateOptions& o) {
  if (prompts.empty()) throw InputError("no prompt to generate from", {"input"});
  if (o.max_new_tokens < 1)
    throw InputError(concat("max new tokens must be at least 1, got ", o.max_new_tokens),
                     {"max_new_tokens"});
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw InputError(concat("temperature must be 0 (greedy) or positive, got ", o.temperature),
                     {"temperature"});
  if (o.top_k < 0)
    throw InputError(concat("top-k must be 0 (off) or positive, got ", o.top_k), {"top_k"});
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw InputError(concat("top-p must be in (0, 1], got ", o.top_p), {"top_p"});
  const int64_t vocab = model.config().vocab_size;
  for (int64_t t : o.stop_tokens)
    if (t < 0 || t >= vocab)
      throw InputError(concat("stop token ", t, " is outside the vocabulary [0, ", vocab, ")"),
                       {"stop_tokens"});
  size_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw InputError(concat("prompt ", i, " is empty"), {"input"});
    longest = std::max(longest, prompts[i].size());
  }
  const int64_t capacity = static_cast<int64_t>(longest) + o.max_new_tokens;
  const int64_t context = model.config().max_positions();
  if (capacity > context)
    throw InputError(concat("generation past the context: the longest prompt (", longest,
                            " tokens) plus ", o.max_new_tokens, " new tokens needs ", capacity,
                            " positions, ", model.origin(), " has ", context),
                     {"max_new_tokens"});
  return capacity;
}

GenerateResult generate(Model& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o, SafeCapturer* capturer) {
  c10::InferenceMode inference;
  const int64_t capacity = generation_capacity(model, prompts, o);
  const int64_t B = static_cast<int64_t>(prompts.size());
  const ModelConfig& config = model.config();
  std::set<int64_t> stops(o.stop_tokens.begin(), o.stop_tokens.end());
  if (o.stop_at_eos && config.eos_token_id >= 0 && config.eos_token_id < config.vocab_size)
    stops.insert(config.eos_token_id);
  // Without a capturer a sequence's last token need not be fed back: nothing reads its
  // activations.
  const bool feed_last = capturer != nullptr;

  // The capture budget covers the whole generation: every prompt token and every new one.
  if (capturer) {
    uint64_t rows = static_cast<uint64_t>(B * o.max_new_tokens);
    for (const auto& p : prompts) rows += p.size();
    capturer->checked_bytes_for_rows(rows);
  }
  GenerateResult r;
  for (const auto& p : prompts) r.sequences.push_back({p, static_cast<int64_t>(p.size()), ""});
  KvCache kv(capacity);
  Sampler sampler(o);
  const int64_t first_step = model.steps();
  std::vector<FedRows> fed;

  // The prompt pass: every real token, the cache filled at positions 0..len-1 of each row.
  const Batch prompt = Batch::from_sequences(prompts, config.vocab_size, config.max_positions());
  FedRows rows0;
  std::vector<std::vector<int64_t>> all(B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < prompt.lengths[b]; ++t) {
      all[b].push_back(t);
      rows0.seq.push_back(b);
      rows0.pos.push_back(t);
      rows0.token.push_back(prompts[b][t]);
    }
  if (capturer) capturer->set_positions(all);
  auto clock = std::chrono::steady_clock::now();
  at::Tensor logits =
      ModelParts::forward_cached(model, prompt, Model::Logits::kCompute, CachedStep{&kv, {}});
  std::vector<at::Tensor> last;
  for (int64_t b = 0; b < B; ++b) last.push_back(logits[b][prompt.lengths[b] - 1]);
  std::vector<int64_t> next = sampler.next(at::stack(last));
  r.prompt_seconds = seconds_since(clock);
  fed.push_back(std::move(rows0));
  r.forwards = 1;

  // Decoding: each step appends every running sequence's token and feeds it at its position.
  clock = std::chrono::steady_clock::now();
  std::vector<bool> done(B, false);
  std::vector<int64_t> generated(B, 0);
  for (;;) {
    std::vector<bool> feed(B, false);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      GeneratedSequence& s = r.sequences[b];
      s.tokens.push_back(next[b]);
      ++generated[b];
      const bool stopped = stops.count(next[b]) > 0;
      if (stopped || generated[b] == o.max_new_tokens) {
        s.finish = stopped ? "stop" : "length";
        done[b] = true;
      }
      feed[b] = !done[b] || feed_last;
    }
    if (std::none_of(feed.begin(), feed.end(), [](bool f) { return f; })) break;
    // Rows not fed this step run a placeholder token at position 0 of their own cache row (no
    // longer read) and capture nothing.
    std::vector<int64_t> ids(B, 0), positions(B, 0);
    std::vector<std::vector<int64_t>> keep(B);
    FedRows step_rows;
    for (int64_t b = 0; b < B; ++b) {
      if (!feed[b]) continue;
      ids[b] = next[b];
      positions[b] = static_cast<int64_t>(r.sequences[b].tokens.size()) - 1;
      keep[b] = {0};
      step_rows.seq.push_back(b);
      step_rows.pos.push_back(positions[b]);
      step_rows.token.push_back(next[b]);
    }
    Batch batch;
    batch.ids = at::tensor(ids, at::kLong).view({B, 1});
    batch.lengths.assign(B, 1);
    if (capturer) capturer->set_positions(keep);
    logits =
        ModelParts::forward_cached(model, batch, Model::Logits::kCompute,
                                   CachedStep{&kv, at::tensor(positions, at::kLong).view({B, 1})});
    fed.push_back(std::move(step_rows));
    ++r.forwards;
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    next = sampler.next(logits.select(1, 0));
  }
  r.decode_seconds = seconds_since(clock);
  r.cache_bytes = kv.bytes();
  if (capturer) r.capture = stitch(*capturer, fed, first_step);
  return r;
}

}  // namespace actcap
