#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "actcap/error.h"
#include "tokenizer/utf8.h"

namespace actcap::tok {

namespace {

// Oniguruma (UTF-8, Ruby syntax as the `tokenizers` crate uses it) versus PCRE2 with UCP:
//   \s  Onig: White_Space (has U+0085)       PCRE2: Z + \t\n\v\f\r (lacks U+0085)
//   \w  Onig: Alphabetic, M, Nd, Pc          PCRE2 10.42: L, N, underscore
//   \h  Onig: hex digit                      PCRE2: horizontal space
constexpr const char* kSpace = "\\p{White_Space}";
constexpr const char* kNotSpace = "\\P{White_Space}";
constexpr const char* kWordChars = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";
constexpr const char* kHexChars = "0-9A-Fa-f";

// Per-thread match state: one ovector pair (the patterns' groups are not needed) and a JIT stack
// larger than the 32 KiB default, for long inputs.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() {
    if (ctx != nullptr && stack != nullptr) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(md);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& thread_match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      switch (e) {
        case 's':
          out += kSpace;
          continue;
        case 'S':
          out += kNotSpace;
          continue;
        case 'w':
          out += in_class ? std::string(kWordChars) : concat("[", kWordChars, "]");
          continue;
        case 'W':
          if (!in_class) {
            out += concat("[^", kWordChars, "]");
            continue;
          }
          break;  // inside a class PCRE2's own \W is the closest available
        case 'h':
          out += in_class ? std::string(kHexChars) : concat("[", kHexChars, "]");
          continue;
        case 'H':
          if (!in_class) {
            out += concat("[^", kHexChars, "]");
            continue;
          }
          break;
        default:
          break;
      }
      out += '\\';
      out += e;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // a ']' right after '[' or '[^' is a literal
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:name:]: copy through its closing ":]"
      const size_t close = p.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(p, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& what) {
  const std::string translated = onig_to_pcre2(pattern);
  int errcode = 0;
  PCRE2_SIZE erroffset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode, &erroffset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(errcode, msg, sizeof(msg));
    throw InputError(concat(what, ": regex does not compile (", reinterpret_cast<const char*>(msg),
                            ", near offset ", erroffset, " of the translated pattern \"",
                            translated, "\")"));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::find(std::string_view subject, size_t start, size_t* match_begin,
                 size_t* match_end) const {
  MatchState& st = thread_match_state();
  if (st.md == nullptr) throw RunError("regex match failed: out of memory");
  // rc == 0 only says the ovector is too small for the groups; the match itself is in ov[0..1].
  const int rc = pcre2_match(static_cast<const pcre2_code*>(code_),
                             reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start, 0,
                             st.md, st.ctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    throw RunError(concat("regex match failed: ", reinterpret_cast<const char*>(msg)));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  *match_begin = ov[0];
  *match_end = ov[1];
  return true;
}

size_t regex_next_char(std::string_view s, size_t i) { return i + utf8_char_len(s, i); }

}  // namespace actcap::tok
