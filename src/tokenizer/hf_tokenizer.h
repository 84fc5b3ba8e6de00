// A tokenizer.json tokenizer: normalizer -> added tokens -> pre-tokenizer -> BPE -> post-processor.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actcap/tokenizer.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenize.h"

namespace actcap::tok {

// One post-processor: its single-sequence template. An item is either the sequence ($A) or the
// ids of a special token. ByteLevel is the template [$A].
struct PostStep {
  struct Item {
    bool sequence = false;
    std::vector<int64_t> ids;
  };
  std::vector<Item> items;
};

struct HfParts {
  std::vector<Normalizer> normalizers;  // applied in order
  std::vector<AddedToken> added_tokens;
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<Bpe> model;
  std::vector<PostStep> post;         // applied in order
  std::vector<DecoderStep> decoders;  // empty: tokens joined with spaces
};

class HfTokenizer : public Tokenizer {
 public:
  explicit HfTokenizer(HfParts parts);

  std::vector<int64_t> encode(const std::string& text, bool add_special = true) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::vector<int64_t> special_ids() const override;

  // With `head`: the text's head in, the result's out (tokenizer/alignment.h).
  std::string normalize(std::string_view text, size_t* head = nullptr) const;
  const Bpe& model() const { return *parts_.model; }

 private:
  void encode_text(std::string_view text, std::vector<int64_t>& ids) const;
  // The token string of an id; throws InputError for an id outside the vocabulary.
  const std::string& token(int64_t id) const;

  HfParts parts_;
  AddedVocabulary added_;
  std::unordered_map<int64_t, std::string> id_to_token_;
  int64_t vocab_size_ = 0;
};

}  // namespace actcap::tok
