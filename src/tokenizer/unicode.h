// Unicode character properties and normalization forms (ICU), as the Rust `tokenizers` crate
// uses them: White_Space for lstrip/rstrip, the regex-crate \w for single_word tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace actcap::tok {

// Unicode White_Space (Rust char::is_whitespace). False for -1 (an invalid byte).
bool is_white_space(int32_t cp);
// Rust regex \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool is_word_char(int32_t cp);
// Rust char::is_numeric: general category Nd, Nl or No (Arabic-Indic and fullwidth digits, ², ½).
// False for -1 (an invalid byte).
bool is_numeric(int32_t cp);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
// Normalizes UTF-8 text. Invalid UTF-8 sequences become U+FFFD in non-ASCII text.
std::string normalize(NormalForm form, std::string_view text);
// The head (tokenizer/alignment.h) of normalize(form, text), given text's head: as the Rust crate
// aligns its normalized characters (unicode-normalization-alignments: a decomposed character's
// parts align with it, a composed one with its first part, in the order they come out after
// canonical reordering). Can exceed the result's size for invalid UTF-8; callers clamp it.
size_t normalized_head(NormalForm form, std::string_view text, size_t head);
// Full Unicode lowercase mapping of each character by itself, as the Rust `tokenizers` Lowercase
// normalizer does it (char::to_lowercase per character): a final capital sigma becomes σ, not ς
// (Rust's str::to_lowercase and JavaScript's toLowerCase give ς).
std::string lowercase(std::string_view text);

}  // namespace actcap::tok
