// Hugging Face tokenizer.json (BPE model with byte fallback; normalizers, pre-tokenizers
// (ByteLevel, Split with PCRE2 regexes, Digits, Metaspace), added/special tokens, the declared
// post-processor and decoder), and the demo model's byte-level tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace actcap {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws InputError naming the file and the unsupported/malformed part.
  static std::unique_ptr<Tokenizer> from_file(const std::string& path);
  static std::unique_ptr<Tokenizer> from_json(const std::string& text, const std::string& origin);
  // One id per UTF-8 byte; `eos` is the id of <|endoftext|> (the demo model: 256).
  static std::unique_ptr<Tokenizer> byte_level(int64_t eos);

  // add_special: apply the post-processor's special tokens as HF's encode() does by default.
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special = true) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // largest id + 1, added tokens included
  // The ids of the special tokens (tokenizer.json's added tokens marked "special"; the byte-level
  // tokenizer's eos), ascending.
  virtual std::vector<int64_t> special_ids() const = 0;
};

}  // namespace actcap
