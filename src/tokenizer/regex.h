// PCRE2 (UTF, UCP, JIT when available) for the tokenizer's split patterns. Patterns in
// tokenizer.json are written for Oniguruma; onig_to_pcre2 rewrites the escapes whose meaning
// differs (\s \S \w \W \h \H \b \B \p{Script} \uHHHH) and the classes PCRE2 cannot hold (POSIX
// brackets, nested classes, &&) so PCRE2 matches what Oniguruma matches.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace actcap::tok {

// Throws InputError for classes nested too deep to translate.
std::string onig_to_pcre2(const std::string& pattern);

class Regex {
 public:
  // `what` names the pattern in error messages ("<file>: pre_tokenizer.pattern.Regex").
  // The pattern goes through onig_to_pcre2 first. Throws InputError when it does not compile.
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match in subject at or after byte `start`; lookbehinds see the whole subject.
  // Invalid UTF-8 in subject never matches anything and never fails.
  bool find(std::string_view subject, size_t start, size_t* match_begin, size_t* match_end) const;

  // Calls f(begin, end) for each match, left to right, as Oniguruma's find_iter does: after a
  // match, the search resumes at its end; an empty match right at the previous match's end is
  // skipped by advancing one character.
  template <typename F>
  void for_each_match(std::string_view subject, F&& f) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
};

size_t regex_next_char(std::string_view s, size_t i);

template <typename F>
void Regex::for_each_match(std::string_view subject, F&& f) const {
  size_t pos = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (pos <= subject.size()) {
    size_t b, e;
    if (!find(subject, pos, &b, &e)) return;
    if (b == e && have_last && last_end == e) {
      if (pos >= subject.size()) return;
      pos = regex_next_char(subject, pos);
      continue;
    }
    f(b, e);
    have_last = true;
    last_end = e;
    pos = e;
  }
}

}  // namespace actcap::tok
