#include <algorithm>
#include <string>
#include <vector>

#include "actcap/error.h"
#include "actcap/hooks.h"

namespace actcap {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// Glob within one segment: '*' matches any run of characters (not crossing '.').
bool glob(const char* p, const char* s) {
  while (*p) {
    if (*p == '*') {
      while (*p == '*') ++p;
      if (!*p) return true;
      for (; *s; ++s)
        if (glob(p, s)) return true;
      return false;
    }
    if (*p != *s) return false;
    ++p;
    ++s;
  }
  return *s == '\0';
}

bool match_segments(const std::vector<std::string>& p, size_t i, const std::vector<std::string>& n, size_t j) {
  if (i == p.size()) return j == n.size();
  if (p[i] == "**") {
    for (size_t k = j; k <= n.size(); ++k)
      if (match_segments(p, i + 1, n, k)) return true;
    return false;
  }
  if (j == n.size()) return false;
  return glob(p[i].c_str(), n[j].c_str()) && match_segments(p, i + 1, n, j + 1);
}

bool strip_input(std::string& s) {
  static const std::string kSuffix = ":input";
  if (s.size() >= kSuffix.size() && s.compare(s.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    s.resize(s.size() - kSuffix.size());
    return true;
  }
  return false;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

BareRefPolicy parse_bare_ref_policy(const std::string& text) {
  if (text == "error") return BareRefPolicy::kError;
  if (text == "warn") return BareRefPolicy::kWarn;
  if (text == "off") return BareRefPolicy::kOff;
  throw InputError(concat("--bare-ref: '", text, "' is not one of error, warn, off"));
}

bool match_point(const std::string& pattern, const std::string& name) {
  std::string p = pattern, n = name;
  if (strip_input(p) != strip_input(n)) return false;
  return match_segments(split(p, '.'), 0, split(n, '.'), 0);
}

std::vector<std::string> nearest_points(const std::string& pattern, const std::vector<std::string>& names,
                                        size_t n) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& name : names) scored.emplace_back(edit_distance(pattern, name), name);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < n; ++i) out.push_back(scored[i].second);
  return out;
}

}  // namespace actcap
