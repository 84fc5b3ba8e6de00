// GPT-2's byte-level alphabet: every byte maps to one printable character (bytes_to_unicode).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace actcap::tok {

struct ByteAlphabet {
  std::array<std::string, 256> byte_to_char;  // UTF-8 of the character standing for each byte
  std::array<int16_t, 512> char_to_byte;      // code point (< 512) -> byte, or -1
};
const ByteAlphabet& byte_alphabet();

// The byte-level spelling of raw bytes ("hello world" -> "helloĠworld").
void byte_level_append(std::string& out, std::string_view raw);
// Decodes one token's byte-level spelling back to bytes. Returns false (out unchanged) when a
// character is not in the alphabet.
bool byte_level_decode(std::string& out, std::string_view token);

}  // namespace actcap::tok
