// UTF-8 helpers for the tokenizer. Invalid input never throws: an invalid byte counts as a
// one-byte "character" of its own, and is carried through unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace actcap::tok {

// Decodes the character starting at s[i] (i < s.size()). Returns its code point, or -1 for an
// invalid sequence (overlong, surrogate, out of range, truncated, stray continuation byte); *len
// receives the number of bytes consumed (1 for an invalid byte).
inline int32_t utf8_decode(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  size_t n;
  int32_t cp;
  int32_t min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    *len = 1;
    return -1;
  }
  if (i + n > s.size()) {
    *len = 1;
    return -1;
  }
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *len = 1;
      return -1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    *len = 1;
    return -1;
  }
  *len = n;
  return cp;
}

// Byte length of the character starting at s[i] (1 for an invalid byte).
inline size_t utf8_char_len(std::string_view s, size_t i) {
  size_t len;
  utf8_decode(s, i, &len);
  return len;
}

// Decodes the character that ends at s[end] (exclusive; end > 0). Returns its code point or -1,
// *len receives its byte length.
inline int32_t utf8_decode_before(std::string_view s, size_t end, size_t* len) {
  // A valid character is at most 4 bytes long: try the longest start that decodes to exactly end.
  for (size_t n = 4; n >= 2; --n) {
    if (end < n) continue;
    size_t l;
    const int32_t cp = utf8_decode(s, end - n, &l);
    if (cp >= 0 && l == n) {
      *len = n;
      return cp;
    }
  }
  *len = 1;
  const auto b = static_cast<unsigned char>(s[end - 1]);
  return b < 0x80 ? b : -1;
}

// How many bytes utf8_append writes for cp.
inline size_t utf8_size(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

inline void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Number of characters (invalid bytes count one each).
inline size_t utf8_char_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += utf8_char_len(s, i)) ++n;
  return n;
}

inline bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace actcap::tok
