// Tokenizer::from_json on arbitrary text. When a tokenizer is built: encoding a few fixed strings
// (ASCII, multi-byte UTF-8, invalid UTF-8, digits, whitespace runs, special-token look-alikes)
// must succeed or fail cleanly, be deterministic (the second call is served by the BPE cache),
// and every id that encode() produces without the post-processor must decode.
#include <memory>
#include <string>
#include <vector>

#include "actcap/tokenizer.h"
#include "fuzz_common.h"

namespace {

const std::vector<std::string>& samples() {
  static const std::vector<std::string> kSamples = {
      "",
      "Hello world",
      " hello  world\n\n\tthe end ",
      "I'm 12345 years old; it's 3.14!",
      "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xe2\x80\xaf",
      "A\xcc\x8a\xe2\x84\xab \xef\xac\x81",  // combining ring, Angstrom, fi ligature
      "bad \xff\xfe utf8 \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf",  // invalid UTF-8
      "<|endoftext|>x<|endoftext|><s></s><unk>[CLS] [SEP]",
      std::string("nul\0byte", 8),
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",  // long word (queue
                                                                                 // merge)
  };
  return kSamples;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<actcap::Tokenizer> tok;
  if (!fuzz::clean([&] { tok = actcap::Tokenizer::from_json(text, "tokenizer.json"); })) return 0;
  FUZZ_CHECK(tok != nullptr, "from_json returned null");
  const int64_t vocab = tok->vocab_size();
  FUZZ_CHECK(vocab >= 0, "vocab_size %lld", static_cast<long long>(vocab));

  for (const std::string& s : samples()) {
    for (bool special : {false, true}) {
      std::vector<int64_t> ids, again;
      if (!fuzz::clean([&] { ids = tok->encode(s, special); })) continue;
      FUZZ_CHECK(fuzz::clean([&] { again = tok->encode(s, special); }),
                 "encode failed the second time only");
      FUZZ_CHECK(ids == again, "encode is not deterministic for '%s'", fuzz::escape(s).c_str());
      std::string decoded;
      const bool ok = fuzz::clean([&] { decoded = tok->decode(ids); });
      // Without the post-processor every id comes from model.vocab or added_tokens.
      if (!special)
        FUZZ_CHECK(ok, "decode rejected ids that encode('%s') produced", fuzz::escape(s).c_str());
      if (ok)
        for (int64_t id : ids)
          FUZZ_CHECK(id >= 0 && id < vocab, "id %lld outside vocab_size %lld",
                     static_cast<long long>(id), static_cast<long long>(vocab));
    }
  }
  // decode of arbitrary ids: out-of-range ones must be rejected cleanly.
  fuzz::clean([&] { tok->decode({-1}); });
  fuzz::clean([&] { tok->decode({vocab}); });
  fuzz::clean([&] { tok->decode({0, vocab > 0 ? vocab - 1 : 0}); });
  return 0;
}
