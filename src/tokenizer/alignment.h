// A text's head: how many of its first bytes align to offset 0 of the input text, as the Rust
// crate's alignments (NormalizedString) say. It is 0 unless the text begins the input; there it
// is the input's first character, then whatever the normalizers and pre-tokenizers made of it:
// NFKC's "fi" from U+FB01, a Prepend's prefix, Metaspace's "\u2581". Metaspace's prepend_scheme
// "first" prepends to a piece whose head is not 0, which can be several pieces of one input.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "tokenizer/utf8.h"

namespace actcap::tok {

// The head of text.substr(offset, len), given the head of text.
inline size_t sub_head(size_t head, size_t offset, size_t len) {
  return offset < head ? std::min(head - offset, len) : 0;
}

// The head of a text that is the whole input: its first character.
inline size_t input_head(std::string_view text) {
  size_t len = 0;
  if (!text.empty()) utf8_decode(text, 0, &len);
  return len;
}

}  // namespace actcap::tok
