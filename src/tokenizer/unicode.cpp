#include "tokenizer/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "actcap/error.h"
#include "tokenizer/utf8.h"

namespace actcap::tok {

bool is_white_space(int32_t cp) { return cp >= 0 && u_isUWhiteSpace(cp); }

bool is_word_char(int32_t cp) {
  if (cp < 0) return false;
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC)) return true;
  if (U_GET_GC_MASK(cp) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) return true;
  return u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL);
}

bool is_numeric(int32_t cp) {
  return cp >= 0 && (U_GET_GC_MASK(cp) & (U_GC_ND_MASK | U_GC_NL_MASK | U_GC_NO_MASK)) != 0;
}

namespace {

const UNormalizer2* instance(NormalForm form) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case NormalForm::NFC:
      n = unorm2_getNFCInstance(&err);
      break;
    case NormalForm::NFD:
      n = unorm2_getNFDInstance(&err);
      break;
    case NormalForm::NFKC:
      n = unorm2_getNFKCInstance(&err);
      break;
    case NormalForm::NFKD:
      n = unorm2_getNFKDInstance(&err);
      break;
  }
  if (U_FAILURE(err) || n == nullptr)
    throw RunError(concat("ICU normalizer unavailable: ", u_errorName(err)));
  return n;
}

}  // namespace

namespace {

std::vector<UChar> to_utf16(std::string_view text) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t len16 = 0;
  u_strFromUTF8WithSub(nullptr, 0, &len16, text.data(), static_cast<int32_t>(text.size()), 0xFFFD,
                       nullptr, &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err))
    throw RunError(concat("UTF-8 conversion failed: ", u_errorName(err)));
  std::vector<UChar> src(static_cast<size_t>(len16) + 1);
  err = U_ZERO_ERROR;
  u_strFromUTF8WithSub(src.data(), len16 + 1, &len16, text.data(),
                       static_cast<int32_t>(text.size()), 0xFFFD, nullptr, &err);
  if (U_FAILURE(err)) throw RunError(concat("UTF-8 conversion failed: ", u_errorName(err)));
  src.resize(static_cast<size_t>(len16));
  return src;
}

std::string to_utf8(const UChar* s, int32_t len16) {
  int32_t len8 = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &len8, s, len16, &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err))
    throw RunError(concat("UTF-8 conversion failed: ", u_errorName(err)));
  std::string out(static_cast<size_t>(len8), '\0');
  err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), len8, &len8, s, len16, &err);
  if (U_FAILURE(err) && err != U_STRING_NOT_TERMINATED_WARNING)
    throw RunError(concat("UTF-8 conversion failed: ", u_errorName(err)));
  return out;
}

}  // namespace

std::string normalize(NormalForm form, std::string_view text) {
  if (is_ascii(text)) return std::string(text);  // ASCII is invariant under every form
  const UNormalizer2* norm = instance(form);
  std::vector<UChar> src = to_utf16(text);
  const auto len16 = static_cast<int32_t>(src.size());
  std::vector<UChar> dst(static_cast<size_t>(len16) * 2 + 16);
  UErrorCode err = U_ZERO_ERROR;
  int32_t out16 =
      unorm2_normalize(norm, src.data(), len16, dst.data(), static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    dst.resize(static_cast<size_t>(out16) + 1);
    err = U_ZERO_ERROR;
    out16 = unorm2_normalize(norm, src.data(), len16, dst.data(), static_cast<int32_t>(dst.size()),
                             &err);
  }
  if (U_FAILURE(err)) throw RunError(concat("Unicode normalization failed: ", u_errorName(err)));
  return to_utf8(dst.data(), out16);
}

namespace {

struct Changed {
  int32_t cp;
  int change;  // Rust's: 1 a new character, 0 one replaced, -N one replacing N + 1
};

// The crate's Decompositions: each character's full decomposition, its first part marked 0 and
// the others 1, then each run of non-starters stably sorted by combining class.
std::vector<Changed> decompose_changes(const UNormalizer2* decomposer,
                                       const std::vector<int32_t>& in) {
  struct Item {
    uint8_t ccc;
    Changed c;
  };
  std::vector<Item> items;
  size_t ready = 0;
  auto sort_pending = [&] {
    std::stable_sort(items.begin() + static_cast<ptrdiff_t>(ready), items.end(),
                     [](const Item& a, const Item& b) { return a.ccc < b.ccc; });
    ready = items.size();
  };
  auto push = [&](int32_t cp, bool first) {
    const auto ccc = static_cast<uint8_t>(u_getCombiningClass(cp));
    if (ccc == 0) sort_pending();
    items.push_back({ccc, {cp, first ? 0 : 1}});
  };
  for (int32_t cp : in) {
    UChar d[64];
    UErrorCode err = U_ZERO_ERROR;
    const int32_t n = unorm2_getDecomposition(decomposer, cp, d, 64, &err);
    if (n < 0 || U_FAILURE(err)) {
      push(cp, true);
      continue;
    }
    bool first = true;
    for (int32_t i = 0; i < n;) {
      UChar32 part;
      U16_NEXT(d, i, n, part);
      push(part, first);
      first = false;
    }
  }
  sort_pending();
  std::vector<Changed> out;
  out.reserve(items.size());
  for (const Item& it : items) out.push_back(it.c);
  return out;
}

// The crate's Recompositions over decomposed characters: a starter composes with what follows
// unless blocked; a composed character's change is its parts' changes summed, less one.
std::vector<Changed> recompose_changes(const UNormalizer2* composer,
                                       const std::vector<Changed>& in) {
  std::vector<Changed> out, buffer;
  std::optional<Changed> composee;
  int last_ccc = -1;  // the class of the last character held back; -1: none
  auto compose = [&](int32_t a, int32_t b) { return unorm2_composePair(composer, a, b); };
  for (const Changed& c : in) {
    const int ccc = u_getCombiningClass(c.cp);
    if (!composee) {
      if (ccc != 0)
        out.push_back(c);
      else
        composee = c;
      continue;
    }
    if (last_ccc < ccc) {
      const int32_t r = compose(composee->cp, c.cp);
      if (r >= 0) {
        composee = Changed{r, composee->change + c.change - 1};
        continue;
      }
      if (last_ccc < 0 && ccc == 0) {
        out.push_back(*composee);
        composee = c;
        continue;
      }
    } else if (ccc == 0) {  // blocked: the composee and what waited behind it go out
      out.push_back(*composee);
      out.insert(out.end(), buffer.begin(), buffer.end());
      buffer.clear();
      composee = c;
      last_ccc = -1;
      continue;
    }
    buffer.push_back(c);
    last_ccc = ccc;
  }
  if (composee) out.push_back(*composee);
  out.insert(out.end(), buffer.begin(), buffer.end());
  return out;
}

}  // namespace

size_t normalized_head(NormalForm form, std::string_view text, size_t head) {
  if (head == 0 || is_ascii(text)) return head;  // ASCII is invariant: each byte aligns with itself
  const bool compose = form == NormalForm::NFC || form == NormalForm::NFKC;
  const bool compat = form == NormalForm::NFKC || form == NormalForm::NFKD;
  const UNormalizer2* whole = instance(form);
  // The characters up to the first normalization boundary at or after the head: the rest
  // normalizes by itself, after the head's last aligned character.
  std::vector<int32_t> in;
  std::vector<size_t> sizes;
  for (size_t pos = 0, len = 0; pos < text.size(); pos += len) {
    int32_t cp = utf8_decode(text, pos, &len);
    if (cp < 0) cp = 0xFFFD;  // as normalize() reads an invalid byte
    if (pos >= head && unorm2_hasBoundaryBefore(whole, cp)) break;
    in.push_back(cp);
    sizes.push_back(len);
  }
  std::vector<Changed> out =
      decompose_changes(instance(compat ? NormalForm::NFKD : NormalForm::NFD), in);
  if (compose) out = recompose_changes(instance(NormalForm::NFC), out);
  // Rust's transform: a replaced character takes the alignment of the input character it
  // consumes, a new one that of the byte before; the head is what aligns with the input's head.
  size_t idx = 0, k = 0, new_head = 0;
  for (const Changed& c : out) {
    const bool in_head = c.change > 0 ? idx <= head : idx < head;
    if (c.change <= 0)
      for (int n = 0; n <= -c.change && k < sizes.size(); ++n) idx += sizes[k++];
    if (in_head) new_head += utf8_size(static_cast<uint32_t>(c.cp));
  }
  return new_head;
}

std::string lowercase(std::string_view text) {
  if (is_ascii(text)) {
    std::string out(text);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
  }
  std::vector<UChar> src = to_utf16(text);
  const auto len16 = static_cast<int32_t>(src.size());
  std::vector<UChar> dst(static_cast<size_t>(len16) + 16);
  UErrorCode err = U_ZERO_ERROR;
  // The root locale's full case mapping, character by character: its one condition on context,
  // Final_Sigma, would turn a word-final Σ into ς; a character lowered by itself gives σ.
  for (UChar& c : src)
    if (c == 0x03A3) c = 0x03C3;
  int32_t out16 =
      u_strToLower(dst.data(), static_cast<int32_t>(dst.size()), src.data(), len16, "", &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    dst.resize(static_cast<size_t>(out16) + 1);
    err = U_ZERO_ERROR;
    out16 = u_strToLower(dst.data(), static_cast<int32_t>(dst.size()), src.data(), len16, "", &err);
  }
  if (U_FAILURE(err)) throw RunError(concat("Unicode lowercasing failed: ", u_errorName(err)));
  return to_utf8(dst.data(), out16);
}

}  // namespace actcap::tok
