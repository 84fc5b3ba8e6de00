#include "tokenizer/regex.h"

#include <optional>
#include <string_view>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>

#include "actcap/error.h"
#include "tokenizer/utf8.h"

namespace actcap::tok {

namespace {

// Oniguruma (UTF-8, Ruby syntax as the `tokenizers` crate uses it) versus PCRE2 with UCP:
//   \s  Onig: White_Space (has U+0085)       PCRE2: Z + \t\n\v\f\r (lacks U+0085)
//   \w  Onig: Alphabetic, M, Nd, Pc (no Join_Control); outside a class also the numbers
//       \u00b2\u00b3\u00b9\u00bc\u00bd\u00be (its Latin-1 table), inside one not
//                                           PCRE2 10.42: L, N, underscore
//   [\W] [\H] (complements in a class), POSIX brackets ([[:punct:]] is P and S, [[:alpha:]]
//       Alphabetic, ...), nested classes and && intersections: see translate_class
//   \b \B  word boundaries of those \w       PCRE2: of its own \w
//   \h  Onig: hex digit                      PCRE2: horizontal space
//   \p{Han}  Onig: the Script property       PCRE2 >= 10.40: Script_Extensions (\u3002 is Han)
//   \uHHHH  Onig: a code point               PCRE2: refused (\x{HHHH})
//   ^ $  Onig: at every line (\n)            PCRE2: at the subject's ends (PCRE2_MULTILINE below)
// Measured against tokenizers 0.23 (tests/python/test_tokenizer_pipelines_rust.py).
constexpr const char* kSpace = "\\p{White_Space}";
constexpr const char* kNotSpace = "\\P{White_Space}";
constexpr const char* kHexChars = "0-9A-Fa-f";
// \w in a class; outside one, Oniguruma's Latin-1 table adds these numbers.
constexpr const char* kWordChars = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kLatin1WordNumbers = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";

// Oniguruma's \w outside a class, as a PCRE2 class ("[...]"), or its complement ("[^...]").
std::string word_class(bool negated) {
  return concat(negated ? "[^" : "[", kWordChars, kLatin1WordNumbers, "]");
}

// \b (at == true) or \B as Oniguruma has them: where a word character (outside a class) begins
// or ends, or where none does.
std::string word_boundary(bool at) {
  const std::string w = word_class(false);
  const std::string same = concat("(?<=", w, ")(?=", w, ")|(?<!", w, ")(?!", w, ")");
  const std::string changes = concat("(?<=", w, ")(?!", w, ")|(?<!", w, ")(?=", w, ")");
  return concat("(?:", at ? changes : same, ")");
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Whether `name` (of \p{name}) is a script and neither a general category nor a binary property
// (Han, Latin, Common; not L, Lu, White_Space), in Unicode's loose matching as both libraries
// take it.
bool is_script_name(const std::string& name) {
  const char* n = name.c_str();
  if (u_getPropertyValueEnum(UCHAR_GENERAL_CATEGORY_MASK, n) != UCHAR_INVALID_CODE) return false;
  if (u_getPropertyEnum(n) != UCHAR_INVALID_CODE) return false;
  return u_getPropertyValueEnum(UCHAR_SCRIPT, n) != UCHAR_INVALID_CODE;
}

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

namespace {

// POSIX brackets as Oniguruma defines them for Unicode (make_unicode_property_data.py): the inside
// of a class, or of the class whose complement the bracket is (graph, print).
struct PosixClass {
  const char* name;
  const char* chars;
  bool complement;
};
constexpr PosixClass kPosix[] = {
    {"alnum", "\\p{Alphabetic}\\p{Nd}", false},
    {"alpha", "\\p{Alphabetic}", false},
    {"ascii", "\\x{0}-\\x{7F}", false},
    {"blank", "\\t\\p{Zs}", false},
    {"cntrl", "\\p{Cc}", false},
    {"digit", "\\p{Nd}", false},
    // Any but White_Space, Cc, Cs, Cn
    {"graph", "\\p{White_Space}\\p{Cc}\\p{Cs}\\p{Cn}", true},
    {"lower", "\\p{Lowercase}", false},
    // graph and Zs: the White_Space left out is Cc but U+2028 and U+2029
    {"print", "\\p{Cc}\\p{Cs}\\p{Cn}\\x{2028}\\x{2029}", true},
    {"punct", "\\p{P}\\p{S}", false},
    {"space", "\\p{White_Space}", false},
    {"upper", "\\p{Uppercase}", false},
    {"word", kWordChars, false},
    {"xdigit", kHexChars, false},
};

// The POSIX bracket called `name` (lower case), or null.
const PosixClass* find_posix(const std::string& name) {
  for (const PosixClass& pc : kPosix)
    if (name == pc.name) return &pc;
  return nullptr;
}

// A set of characters as translate_escape hands it on: outside a class, a class; inside one, its
// chars, or for a complement (which a PCRE2 class cannot hold beside other items) a class of its
// own, with *whole set.
std::string set_text(const std::string& chars, bool complement, bool in_class, bool* whole) {
  if (!in_class) return concat(complement ? "[^" : "[", chars, "]");
  if (!complement) return chars;
  *whole = true;
  return concat("[^", chars, "]");
}

struct Property {
  std::string chars;  // the inside of a class
  bool complement;    // the property is the complement of that class
};

// Oniguruma's \p{name} where PCRE2 has no such name or another meaning for it: the POSIX-like
// properties (as kPosix, but \p{Punct} is P alone), Any, Assigned, and a general category's long
// name (\p{Letter} is \p{L}). Names are matched loosely, as both libraries do (case, ' ', '-',
// '_' ignored). nullopt: the name goes to PCRE2 as it is.
std::optional<Property> onig_property(const std::string& name) {
  std::string loose;
  for (char c : name)
    if (c != ' ' && c != '-' && c != '_')
      loose += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (loose == "punct") return Property{"\\p{P}", false};
  if (loose == "any") return Property{"\\x{0}-\\x{10FFFF}", false};
  if (loose == "assigned") return Property{"\\p{Cn}", true};
  if (const PosixClass* pc = find_posix(loose)) return Property{pc->chars, pc->complement};
  const int32_t gc = u_getPropertyValueEnum(UCHAR_GENERAL_CATEGORY_MASK, name.c_str());
  if (gc == UCHAR_INVALID_CODE) return std::nullopt;
  const char* s = u_getPropertyValueName(UCHAR_GENERAL_CATEGORY_MASK, gc, U_SHORT_PROPERTY_NAME);
  if (s == nullptr || name == s) return std::nullopt;  // L, Lu, ...: PCRE2's own
  return Property{concat("\\p{", std::string(s) == "LC" ? "L&" : s, "}"), false};
}

// What an escape is, for a class's ranges: a set of characters (\w, \p{L}, ...) or one character
// (\n, \x41, \u00e9, \-; and outside a class whatever else, such as \b).
enum class EscapeKind { Set, Char };

// The escape at p[i] == '\\' (i + 1 < p.size()), translated; i is left on its last character.
// In a class, a set that is a complement (\W, \H) has no spelling inside a PCRE2 class: it comes
// back as a class of its own ("[^...]") with *complement set.
std::string translate_escape(const std::string& p, size_t& i, bool in_class, bool* complement,
                             EscapeKind* kind) {
  const char e = p[++i];
  *kind = EscapeKind::Set;
  switch (e) {
    case 's':
      return kSpace;
    case 'S':
      return kNotSpace;
    case 'd':
    case 'D':
      return concat("\\", e);
    case 'w':
      return in_class ? std::string(kWordChars) : word_class(false);
    case 'W':
      return in_class ? set_text(kWordChars, true, true, complement) : word_class(true);
    case 'h':
    case 'H':
      return set_text(kHexChars, e == 'H', in_class, complement);
    case 'p':
    case 'P':
      if (i + 1 < p.size() && p[i + 1] == '{') {
        const size_t close = p.find('}', i + 2);
        if (close != std::string::npos) {
          std::string name = p.substr(i + 2, close - i - 2);
          const size_t open = i + 1;
          i = close;
          const bool negated = !name.empty() && name[0] == '^';
          if (negated) name.erase(0, 1);
          if (is_script_name(name))
            return concat("\\", e, "{", negated ? "^" : "", "sc:", name, "}");
          if (name == "L&") throw InputError("\\p{L&} is no Oniguruma property (\\p{LC} is)");
          if (const std::optional<Property> prop = onig_property(name))
            return set_text(prop->chars, prop->complement != (negated != (e == 'P')), in_class,
                            complement);
          return concat("\\", e, p.substr(open, close + 1 - open));
        }
      }
      // without braces, a plain letter in Oniguruma's Ruby syntax (\pL is "pL")
      *kind = EscapeKind::Char;
      return std::string(1, e);
    default:
      break;
  }
  *kind = EscapeKind::Char;
  switch (e) {
    case 'b':  // inside a class \b is a backspace, as in both; \B an error in both
    case 'B':
      if (!in_class) return word_boundary(e == 'b');
      break;
    case 'u':
      if (i + 4 < p.size() && is_hex(p[i + 1]) && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
          is_hex(p[i + 4])) {
        i += 4;
        return concat("\\x{", p.substr(i - 3, 4), "}");
      }
      break;
    case 'v':  // the vertical tab alone (PCRE2: any vertical space)
      return "\\x{0B}";
    case 'C':
    case 'M':
      if (i + 1 < p.size() && p[i + 1] == '-')
        throw InputError(concat("\\", e, "- (control and meta characters) is not supported"));
      break;
    case 'x': {  // \xHH or \x{H...}: the same in both, taken whole
      const size_t from = i - 1;
      if (i + 1 < p.size() && p[i + 1] == '{') {
        const size_t close = p.find('}', i + 2);
        if (close != std::string::npos) i = close;
      } else {
        for (int n = 0; n < 2 && i + 1 < p.size() && is_hex(p[i + 1]); ++n) ++i;
      }
      return p.substr(from, i + 1 - from);
    }
    default:
      break;
  }
  // A letter Oniguruma gives no meaning here stands for itself (\Q and \E too: Ruby's syntax
  // has no quoting; in a class, \R \X \N \K \y \z \A ...). The letters both read alike stay.
  const bool alpha = (e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z');
  if (alpha &&
      (e == 'V' || e == 'Q' || e == 'E' ||
       (in_class && std::string_view("abcefgknortuxBC").find(e) == std::string_view::npos)))
    return std::string(1, e);
  return concat("\\", e);
}

// One character of a class or of what a class's items add up to, as PCRE2 can say it.
struct ClassUnion {
  std::string chars;               // the inside of a PCRE2 class
  std::vector<std::string> whole;  // expressions for one character each (nested classes, \W, ...)
  bool empty() const { return chars.empty() && whole.empty(); }
  // One character of any of them. The group is atomic: each alternative takes one character, so
  // trying the others after one matched finds nothing new (and, under a quantifier, would make a
  // failing match exponential).
  std::string expression() const {
    if (whole.empty()) return concat("[", chars, "]");
    std::string out = "(?>";
    if (!chars.empty()) out += concat("[", chars, "]|");
    for (size_t k = 0; k < whole.size(); ++k) out += (k ? "|" : "") + whole[k];
    return out + ")";
  }
};

// Where a POSIX bracket ends ("[:alpha:]", "[:^space:]": letters only, as Oniguruma reads one) if
// p[i] begins one, else npos (then '[' opens a nested class).
size_t posix_bracket_end(const std::string& p, size_t i) {
  if (p.compare(i, 2, "[:") != 0) return std::string::npos;
  size_t j = i + 2;
  if (j < p.size() && p[j] == '^') ++j;
  const size_t letters = j;
  while (j < p.size() && ((p[j] >= 'a' && p[j] <= 'z') || (p[j] >= 'A' && p[j] <= 'Z'))) ++j;
  // "[:^:]" too, which Oniguruma takes for a bracket with no name and refuses
  if ((j == letters && j == i + 2) || p.compare(j, 2, ":]") != 0) return std::string::npos;
  return j + 2;
}

// The Oniguruma class at p[i] == '[', translated; i is left on its closing ']'. A class of plain
// items keeps its text (escapes translated); one with what PCRE2 10.42's classes cannot hold (\W,
// \H, POSIX brackets as Oniguruma means them, nested classes, && intersections) becomes an
// expression for one character: alternatives, lookaheads for &&, and for a complement
// (?!...)(?s:.). Ranges are left to PCRE2 but for Oniguruma's rules where a set meets a '-':
// "[\w-a]" and "[a-\w]" are errors, "[[x]-a]" has a literal '-', and "[a-[x]]" drops the "a-".
std::string translate_class(const std::string& p, size_t& i, int depth = 0) {
  // Oniguruma refuses nesting past its parse depth limit; PCRE2 refuses the parentheses of
  // anything near this deep
  constexpr int kMaxDepth = 64;
  if (depth > kMaxDepth)
    throw InputError(concat("character classes nested more than ", kMaxDepth, " deep"));
  ++i;
  const bool negated = i < p.size() && p[i] == '^';
  if (negated) ++i;
  std::vector<ClassUnion> operands(1);  // the && operands
  // The item before: none yet (or a finished range), one character (which began at char_at in
  // chars), a '-' after one (a range's operator), a set (\w, [:alpha:]) or a nested class.
  enum class Prev { None, Char, Dash, Set, Nested } prev = Prev::None;
  size_t char_at = 0;
  auto add_char = [&](ClassUnion& u, const std::string& text) {
    if (prev == Prev::Dash) {  // the end of a range
      u.chars += text;
      prev = Prev::None;
      return;
    }
    char_at = u.chars.size();
    // first in a PCRE2 class, '^' would negate and ':', '.', '=' begin POSIX syntax
    const bool quote =
        u.chars.empty() && (text == "^" || text == ":" || text == "." || text == "=");
    u.chars += quote ? "\\" + text : text;
    prev = Prev::Char;
  };
  auto add_set = [&](ClassUnion& u, std::string text, bool complement) {
    if (prev == Prev::Dash) throw InputError("a class value at the end of a range in a class");
    if (complement)
      u.whole.push_back(std::move(text));
    else
      u.chars += text;
    prev = Prev::Set;
  };
  for (bool first = true; i < p.size(); first = false) {
    ClassUnion& u = operands.back();
    const char c = p[i];
    if (c == ']' && !first) break;  // a ']' first is a literal
    if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      operands.emplace_back();
      i += 2;
      prev = Prev::None;
      continue;
    }
    const size_t posix_end = posix_bracket_end(p, i);
    if (posix_end != std::string::npos) {
      std::string name = p.substr(i + 2, posix_end - 2 - (i + 2));
      const bool not_in = name[0] == '^';
      if (not_in) name.erase(0, 1);
      const PosixClass* posix = find_posix(name);
      bool whole = posix == nullptr;
      // an unknown name is an error in Oniguruma, and in PCRE2 as it stands
      std::string t = posix == nullptr
                          ? concat("[", p.substr(i, posix_end - i), "]")
                          : set_text(posix->chars, posix->complement != not_in, true, &whole);
      add_set(u, std::move(t), whole);
      i = posix_end;
      continue;
    }
    if (c == '[') {
      if (prev == Prev::Dash) u.chars.erase(char_at);  // Oniguruma drops the pending "a-"
      u.whole.push_back(translate_class(p, i, depth + 1));
      ++i;
      prev = Prev::Nested;
      continue;
    }
    if (c == '\\' && i + 1 < p.size()) {
      bool complement = false;
      EscapeKind kind;
      std::string t = translate_escape(p, i, true, &complement, &kind);
      if (kind == EscapeKind::Set)
        add_set(u, std::move(t), complement);
      else
        add_char(u, t);
      ++i;
      continue;
    }
    if (c == '-') {
      // before ']' or && a literal (Oniguruma looks for && first)
      const bool last = i + 1 >= p.size() || p[i + 1] == ']' || p.compare(i + 1, 2, "&&") == 0;
      if (prev == Prev::Set && !last)
        throw InputError("a '-' after a class value in a class is not a range");
      if (prev == Prev::Char && !last) {  // a range's operator
        u.chars += '-';
        prev = Prev::Dash;
        ++i;
        continue;
      }
      // a literal: escaped where PCRE2 could read it as a range
      add_char(u, prev == Prev::None && u.chars.empty() ? "-" : last ? "-" : "\\-");
      ++i;
      continue;
    }
    // one character, all its bytes
    const size_t len = std::min(utf8_char_len(p, i), p.size() - i);
    add_char(u, p.substr(i, len));
    i += len;
  }
  if (i >= p.size())  // no closing ']': left open, for PCRE2 to refuse
    return concat(negated ? "[^" : "[", operands[0].chars);
  if (operands.size() == 1 && operands[0].whole.empty())
    return concat(negated ? "[^" : "[", operands[0].chars, "]");
  // the intersection of the operands; an empty one, as in [a&&], is the empty set (Oniguruma)
  std::string one;
  for (size_t k = 0; k < operands.size(); ++k) {
    const std::string set = operands[k].empty() ? "(?!)" : operands[k].expression();
    one += k + 1 < operands.size() ? concat("(?=", set, ")") : set;
  }
  if (operands.size() > 1) one = concat("(?>", one, ")");
  return negated ? concat("(?>(?!", one, ")(?s:.))") : one;
}

}  // namespace

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      bool complement = false;
      EscapeKind kind;
      out += translate_escape(p, i, false, &complement, &kind);
    } else if (c == '[') {
      out += translate_class(p, i);
    } else {
      out += c;
    }
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& what) {
  std::string translated;
  try {
    translated = onig_to_pcre2(pattern);
  } catch (const InputError& e) {
    throw InputError(concat(what, ": regex does not compile (", e.what(), ")"));
  }
  int errcode = 0;
  PCRE2_SIZE erroffset = 0;
  // Lines end at \n only (Oniguruma's Ruby syntax): for ^, $ and '.', whatever PCRE2's build
  // default.
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  if (cc == nullptr) throw RunError("regex compile failed: out of memory");
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &errcode, &erroffset, cc);
  pcre2_compile_context_free(cc);
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
