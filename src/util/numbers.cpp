#include "actcap/numbers.h"

#include <charconv>

namespace actcap {

std::optional<int64_t> parse_int64(std::string_view text) {
  if (!text.empty() && text.front() == '+') {
    text.remove_prefix(1);  // from_chars takes '-' only
    if (!text.empty() && (text.front() == '-' || text.front() == '+')) return std::nullopt;
  }
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace actcap
