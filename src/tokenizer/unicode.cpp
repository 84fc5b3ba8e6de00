#include "tokenizer/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

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
