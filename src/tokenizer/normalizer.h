// Normalizers (NFC/NFD/NFKC/NFKD, Prepend, Replace, Strip, Lowercase; a Sequence is the list) and
// decoders (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace; a Sequence is the list),
// with the semantics of the Rust `tokenizers` crate.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace actcap::tok {

// A Replace pattern: {"String": ...} or {"Regex": ...}.
struct Pattern {
  std::optional<std::string> literal;
  std::shared_ptr<const Regex> regex;
  // Every non-overlapping match, left to right, replaced by `content` (taken literally). With
  // `head` (tokenizer/alignment.h), text's head in, the result's out: as in Rust, the content
  // aligns with the match's last character.
  std::string replace_all(std::string_view text, std::string_view content,
                          size_t* head = nullptr) const;
};

struct Normalizer {
  enum class Kind { Unicode, Prepend, Replace, Strip, Lowercase };
  Kind kind = Kind::Unicode;
  NormalForm form = NormalForm::NFC;  // Unicode
  std::string content;                // Prepend: the prefix; Replace: the replacement
  Pattern pattern;                    // Replace
  bool strip_left = false;            // Strip
  bool strip_right = false;

  // With `head`: the text's head in, the result's out (tokenizer/alignment.h), as the Rust
  // crate's alignments move through this normalizer.
  std::string apply(std::string_view text, size_t* head = nullptr) const;
};

struct DecoderStep {
  enum class Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace };
  Kind kind = Kind::Fuse;
  Pattern pattern;            // Replace
  std::string content;        // Replace: replacement; Strip: the character; Metaspace: replacement
  size_t start = 0;           // Strip: at most this many leading `content` characters
  size_t stop = 0;            // Strip: at most this many trailing ones
  bool prepend_first = true;  // Metaspace: prepend_scheme is not "never"
};

// Runs the decoders over the tokens (each step maps the token list to a new one) and joins the
// result. No steps: the tokens joined with spaces, as the Rust crate does without a decoder.
std::string run_decoders(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens);

}  // namespace actcap::tok
