#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "actcap/error.h"
#include "actcap/hooks.h"
#include "util/strings.h"

namespace actcap {

namespace {

// Glob within one segment: '*' matches any run of characters (not crossing '.'). Iterative with
// one backtrack point (the last '*'), so linear-ish in |p| * |s| whatever the number of stars, and
// length-aware: an embedded NUL is an ordinary character, not the end of the pattern.
bool glob(std::string_view p, std::string_view s) {
  size_t i = 0, j = 0, star = std::string_view::npos, mark = 0;
  while (j < s.size()) {
    if (i < p.size() && p[i] == '*') {
      star = i++;
      mark = j;
    } else if (i < p.size() && p[i] == s[j]) {
      ++i;
      ++j;
    } else if (star != std::string_view::npos) {
      i = star + 1;
      j = ++mark;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

// Segment match where "**" spans any number of segments (zero included). Dynamic programming over
// (pattern segment, name segment): O(|p| * |n|) glob calls, where naive backtracking is
// exponential in the number of "**" (a 121-byte pattern used to hang).
bool match_segments(const std::vector<std::string>& p, const std::vector<std::string>& n) {
  // ok[j]: pattern segments [i, end) match name segments [j, end); computed for i from the back.
  std::vector<char> ok(n.size() + 1, 0), next(n.size() + 1, 0);
  next[n.size()] = 1;  // empty pattern matches only the empty rest
  for (size_t i = p.size(); i-- > 0;) {
    if (p[i] == "**") {
      char any = 0;
      for (size_t j = n.size() + 1; j-- > 0;) {
        any = any || next[j];
        ok[j] = any;  // "**" takes segments j..k-1 for some k >= j with next[k]
      }
    } else {
      ok[n.size()] = 0;
      for (size_t j = 0; j < n.size(); ++j) ok[j] = next[j + 1] && glob(p[i], n[j]);
    }
    std::swap(ok, next);
  }
  return next[0] != 0;
}

// Removes a point-kind suffix (`:input`, or an attention module's `:scores` / `:probs`) from `s`;
// returns it ("" when none).
std::string strip_kind(std::string& s) {
  for (const char* suffix : {":input", ":scores", ":probs"}) {
    const std::string k = suffix;
    if (s.size() >= k.size() && s.compare(s.size() - k.size(), k.size(), k) == 0) {
      s.resize(s.size() - k.size());
      return k;
    }
  }
  return "";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

BareRefPolicy parse_bare_ref_policy(const std::string& text) {
  if (text == "error") return BareRefPolicy::kError;
  if (text == "warn") return BareRefPolicy::kWarn;
  if (text == "off") return BareRefPolicy::kOff;
  throw InputError(concat("bare-reference policy '", text, "' is not one of error, warn, off"),
                   {"bare_ref"});
}

bool match_point(const std::string& pattern, const std::string& name) {
  std::string p = pattern, n = name;
  if (strip_kind(p) != strip_kind(n)) return false;
  return match_segments(split(p, '.'), split(n, '.'));
}

std::vector<std::string> nearest_points(const std::string& pattern,
                                        const std::vector<std::string>& names, size_t n) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& name : names) scored.emplace_back(edit_distance(pattern, name), name);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < n; ++i) out.push_back(scored[i].second);
  return out;
}

}  // namespace actcap
