// The one integer parser behind every option that takes integers (--tokens, --positions,
// repro --devices): the whole text must be a decimal integer, nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace actcap {

// An optional sign and decimal digits, nothing before or after them (no spaces, no "12abc", no
// "0x10"); nullopt when the text is not that or does not fit in int64.
std::optional<int64_t> parse_int64(std::string_view text);

}  // namespace actcap
