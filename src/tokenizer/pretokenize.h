// Pre-tokenizers (Split, Digits, ByteLevel, Metaspace, Sequence), with the semantics of the Rust
// `tokenizers` crate. They stream: each piece is handed to the sink as soon as it is known, and the
// pieces handed on are never empty.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/alignment.h"
#include "tokenizer/function_ref.h"
#include "tokenizer/regex.h"

namespace actcap::tok {

// Each piece is handed on with its head (tokenizer/alignment.h).
using Sink = FunctionRef<void(std::string_view piece, size_t head)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Pre-tokenizes text whose head is `head` (tokenizer/alignment.h).
  virtual void run(std::string_view text, size_t head, Sink emit) const = 0;
  // The text is the whole input.
  void run(std::string_view text, Sink emit) const { run(text, input_head(text), emit); }
  // True for the ByteLevel pre-tokenizer (or a Sequence holding one): the model then works on
  // bytes through GPT-2's byte alphabet.
  virtual bool byte_level() const { return false; }
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// A piece of the text being split: [begin, end) and whether the pattern matched it.
struct Piece {
  size_t begin;
  size_t end;
  bool match;
  bool operator==(const Piece& o) const {
    return begin == o.begin && end == o.end && match == o.match;
  }
};

// What SplitDelimiterBehavior does to the pieces (gaps and matches covering the text); the
// returned pieces are kept, in order (empty ones are dropped later).
std::vector<Piece> apply_behavior(const std::vector<Piece>& pieces, SplitBehavior behavior);

// Split: pattern {"Regex": ...} or {"String": ...}, behavior, invert.
class SplitPreTokenizer : public PreTokenizer {
 public:
  // Exactly one of regex / literal.
  SplitPreTokenizer(std::unique_ptr<Regex> regex, std::optional<std::string> literal,
                    SplitBehavior behavior, bool invert);
  using PreTokenizer::run;
  void run(std::string_view text, size_t head, Sink emit) const override;
  // The pieces (matches and gaps) before the behavior is applied; exposed for tests.
  std::vector<Piece> find_pieces(std::string_view text) const;

 private:
  std::unique_ptr<Regex> regex_;
  std::optional<std::string> literal_;
  SplitBehavior behavior_;
  bool invert_;
};

// Digits: ASCII digits split off, one by one (individual_digits) or as runs.
class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits) : individual_(individual_digits) {}
  using PreTokenizer::run;
  void run(std::string_view text, size_t head, Sink emit) const override;

 private:
  bool individual_;
};

// ByteLevel: optional prefix space, optional GPT-2 regex split; the byte-to-character mapping
// itself is done by the model (see byte_level()).
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
  using PreTokenizer::run;
  void run(std::string_view text, size_t head, Sink emit) const override;
  bool byte_level() const override { return true; }
  static const char* gpt2_pattern();

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

enum class PrependScheme { Always, First, Never };

// Metaspace: spaces become the replacement character ("\u2581"), which is prepended as the scheme
// says unless the text starts with it; split: the text is then cut before each replacement
// character (MergedWithNext).
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  using PreTokenizer::run;
  void run(std::string_view text, size_t head, Sink emit) const override;

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  using PreTokenizer::run;
  void run(std::string_view text, size_t head, Sink emit) const override {
    run_from(0, text, head, emit);
  }
  bool byte_level() const override;

 private:
  void run_from(size_t step, std::string_view text, size_t head, Sink emit) const;
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace actcap::tok
