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
// Full Unicode lowercase mapping of each character by itself, as the Rust `tokenizers` Lowercase
// normalizer does it (char::to_lowercase per character): a final capital sigma becomes σ, not ς
// (Rust's str::to_lowercase and JavaScript's toLowerCase give ς).
std::string lowercase(std::string_view text);

}  // namespace actcap::tok
