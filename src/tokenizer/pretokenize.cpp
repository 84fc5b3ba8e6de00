#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace actcap::tok {

std::vector<Piece> apply_behavior(const std::vector<Piece>& pieces, SplitBehavior behavior) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      return pieces;
    case SplitBehavior::Removed:
      for (const Piece& p : pieces)
        if (!p.match) out.push_back(p);
      return out;
    case SplitBehavior::MergedWithPrevious:
      for (const Piece& p : pieces) {
        if (p.match && !previous_match) {
          if (!out.empty())
            out.back().end = p.end;
          else
            out.push_back({p.begin, p.end, true});
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      return out;
    case SplitBehavior::MergedWithNext:
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        const Piece& p = *it;
        if (p.match && !previous_match) {
          if (!out.empty())
            out.back().begin = p.begin;
          else
            out.push_back({p.begin, p.end, true});
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      return {out.rbegin(), out.rend()};
    case SplitBehavior::Contiguous:
      for (const Piece& p : pieces) {
        if (p.match == previous_match) {
          if (!out.empty())
            out.back().end = p.end;
          else
            out.push_back({p.begin, p.end, false});
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      return out;
  }
  return out;
}

SplitPreTokenizer::SplitPreTokenizer(std::unique_ptr<Regex> regex,
                                     std::optional<std::string> literal, SplitBehavior behavior,
                                     bool invert)
    : regex_(std::move(regex)),
      literal_(std::move(literal)),
      behavior_(behavior),
      invert_(invert) {}

std::vector<Piece> SplitPreTokenizer::find_pieces(std::string_view text) const {
  std::vector<Piece> pieces;
  if (text.empty()) return {{0, 0, false}};
  size_t prev = 0;
  auto on_match = [&](size_t b, size_t e) {
    if (prev != b) pieces.push_back({prev, b, false});
    pieces.push_back({b, e, true});
    prev = e;
  };
  if (regex_) {
    regex_->for_each_match(text, on_match);
  } else if (literal_->empty()) {  // tokenizer.json's "" is the empty regex (tokenizer_json.cpp)
    return {{0, text.size(), false}};
  } else {
    for (size_t at = text.find(*literal_); at != std::string_view::npos;
         at = text.find(*literal_, at + literal_->size()))
      on_match(at, at + literal_->size());
  }
  if (prev != text.size()) pieces.push_back({prev, text.size(), false});
  if (invert_)
    for (Piece& p : pieces) p.match = !p.match;
  return pieces;
}

namespace {
// Hands on text[b, e) with its head.
void emit_slice(Sink emit, std::string_view text, size_t head, size_t b, size_t e) {
  emit(text.substr(b, e - b), sub_head(head, b, e - b));
}
}  // namespace

void SplitPreTokenizer::run(std::string_view text, size_t head, Sink emit) const {
  if (regex_ && !invert_ &&
      (behavior_ == SplitBehavior::Isolated || behavior_ == SplitBehavior::Removed)) {
    // the common case (Llama 3, GPT-4 style patterns), streamed without building the piece list
    const bool keep_matches = behavior_ == SplitBehavior::Isolated;
    size_t prev = 0;
    regex_->for_each_match(text, [&](size_t b, size_t e) {
      if (prev < b) emit_slice(emit, text, head, prev, b);
      if (keep_matches && e > b) emit_slice(emit, text, head, b, e);
      prev = e;
    });
    if (prev < text.size()) emit_slice(emit, text, head, prev, text.size());
    return;
  }
  for (const Piece& p : apply_behavior(find_pieces(text), behavior_))
    if (p.end > p.begin) emit_slice(emit, text, head, p.begin, p.end);
}

void DigitsPreTokenizer::run(std::string_view text, size_t head, Sink emit) const {
  // A digit is what Rust's char::is_numeric says (Nd, Nl, No: ١, ５, ², ½ too), as the Rust
  // `tokenizers` crate splits; an invalid byte is not one.
  auto numeric_at = [&](size_t i, size_t* len) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      *len = 1;
      return b >= '0' && b <= '9';
    }
    return is_numeric(utf8_decode(text, i, len));
  };
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    const bool digit = numeric_at(i, &len);
    size_t j = i + len;
    if (!digit || !individual_)
      while (j < text.size() && numeric_at(j, &len) == digit) j += len;
    emit_slice(emit, text, head, i, j);
    i = j;
  }
}

const char* ByteLevelPreTokenizer::gpt2_pattern() {
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

namespace {
const Regex& gpt2_regex() {
  static const Regex re(ByteLevelPreTokenizer::gpt2_pattern(), "ByteLevel pre-tokenizer");
  return re;
}
}  // namespace

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
  if (use_regex_) gpt2_regex();  // compile now, not on the first encode
}

void ByteLevelPreTokenizer::run(std::string_view text, size_t head, Sink emit) const {
  if (text.empty()) return;
  std::string prefixed;
  if (add_prefix_space_ && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed += ' ';
    prefixed += text;
    text = prefixed;
    if (head > 0) ++head;  // the prefix aligns with the first character
  }
  if (!use_regex_) {
    emit(text, head);
    return;
  }
  size_t prev = 0;
  gpt2_regex().for_each_match(text, [&](size_t b, size_t e) {
    if (prev < b) emit_slice(emit, text, head, prev, b);
    if (e > b) emit_slice(emit, text, head, b, e);
    prev = e;
  });
  if (prev < text.size()) emit_slice(emit, text, head, prev, text.size());
}

bool SequencePreTokenizer::byte_level() const {
  for (const auto& s : steps_)
    if (s->byte_level()) return true;
  return false;
}

void SequencePreTokenizer::run_from(size_t step, std::string_view text, size_t head,
                                    Sink emit) const {
  if (step == steps_.size()) {
    emit(text, head);
    return;
  }
  auto next = [&](std::string_view piece, size_t piece_head) {
    run_from(step + 1, piece, piece_head, emit);
  };
  steps_[step]->run(text, head, next);
}

void MetaspacePreTokenizer::run(std::string_view text, size_t head, Sink emit) const {
  if (text.empty()) return;
  std::string s;
  s.reserve(text.size() + replacement_.size() * 2);
  // As in Rust: "first" prepends where the text aligns to offset 0 of the input.
  const bool prepend =
      scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && head > 0);
  size_t new_head = 0;
  if (prepend && text.substr(0, replacement_.size()) != replacement_ &&
      !(text[0] == ' ' && replacement_.size() > 0)) {
    s += replacement_;
    if (head > 0) new_head = replacement_.size();  // aligned with the first character
  }
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ')
      s += replacement_;
    else
      s += c;
    if (i + 1 == head) new_head = s.size();
  }
  if (!split_ || replacement_.empty()) {
    emit(s, new_head);
    return;
  }
  const std::string_view v = s;
  size_t begin = 0;
  for (size_t at = v.find(replacement_); at != std::string_view::npos;
       at = v.find(replacement_, at + replacement_.size())) {
    if (at > begin) emit_slice(emit, v, new_head, begin, at);
    begin = at;
  }
  if (begin < v.size()) emit_slice(emit, v, new_head, begin, v.size());
}

}  // namespace actcap::tok
