// The byte alphabet, and Tokenizer::byte_level: the demo model's tokenizer, one id per byte.
#include "tokenizer/byte_level.h"

#include "actcap/error.h"
#include "actcap/tokenizer.h"
#include "tokenizer/utf8.h"

namespace actcap {
namespace tok {

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    a.char_to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const int cp = printable ? b : 256 + extra++;
      utf8_append(a.byte_to_char[b], static_cast<uint32_t>(cp));
      a.char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

void byte_level_append(std::string& out, std::string_view raw) {
  const ByteAlphabet& a = byte_alphabet();
  for (char c : raw) out += a.byte_to_char[static_cast<unsigned char>(c)];
}

bool byte_level_decode(std::string& out, std::string_view token) {
  const ByteAlphabet& a = byte_alphabet();
  const size_t mark = out.size();
  for (size_t i = 0; i < token.size();) {
    size_t len;
    const int32_t cp = utf8_decode(token, i, &len);
    if (cp < 0 || cp >= 512 || a.char_to_byte[cp] < 0) {
      out.resize(mark);
      return false;
    }
    out += static_cast<char>(a.char_to_byte[cp]);
    i += len;
  }
  return true;
}

namespace {

class ByteLevelTokenizer : public Tokenizer {
 public:
  explicit ByteLevelTokenizer(int64_t eos) : eos_(eos) {}

  std::vector<int64_t> encode(const std::string& text, bool /*add_special*/) const override {
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int64_t id : ids) {
      if (id >= 0 && id < 256) {
        out += static_cast<char>(id);
      } else if (id == eos_) {
        out += "<|endoftext|>";
      } else {
        throw InputError(concat("token id ", id,
                                " is not in the byte-level vocabulary (0..255 and ", eos_,
                                " for <|endoftext|>)"));
      }
    }
    return out;
  }

  int64_t vocab_size() const override { return eos_ + 1; }
  std::vector<int64_t> special_ids() const override { return {eos_}; }

 private:
  int64_t eos_;
};

}  // namespace
}  // namespace tok

std::unique_ptr<Tokenizer> Tokenizer::byte_level(int64_t eos) {
  if (eos < 256)
    throw InputError(
        concat("byte-level tokenizer: eos id ", eos, " collides with the byte ids 0..255"));
  return std::make_unique<tok::ByteLevelTokenizer>(eos);
}

}  // namespace actcap
