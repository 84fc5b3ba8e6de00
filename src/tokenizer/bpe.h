// The BPE model of tokenizer.json: vocab, ranked merges, unk / fuse_unk / byte_fallback /
// ignore_merges, and a bounded cache of pre-token encodings.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace actcap::tok {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  // Pre-tokens are raw bytes that the model spells through GPT-2's byte alphabet (the ByteLevel
  // pre-tokenizer's mapping).
  bool byte_level = false;
};

class Bpe {
 public:
  using Vocab = std::unordered_map<std::string, int32_t>;
  using Merges = std::vector<std::pair<std::string, std::string>>;

  // `where` prefixes error messages ("<file>: model"). Throws InputError for a merge whose parts
  // or result are not in the vocab.
  Bpe(Vocab vocab, const Merges& merges, BpeOptions options, const std::string& where);

  // Appends the ids of one (non-empty) pre-token.
  void encode(std::string_view piece, std::vector<int64_t>& out) const;

  // Applies the merges to a word given as symbol ids (lowest rank first, leftmost on ties).
  void merge(std::vector<int32_t>& symbols) const;
  // The same with a priority queue, used for long words (exposed so tests can compare both).
  void merge_with_queue(std::vector<int32_t>& symbols) const;

  const Vocab& vocab() const { return vocab_; }
  const BpeOptions& options() const { return options_; }
  size_t cache_size() const;

  static constexpr size_t kCacheCapacity = 1 << 16;  // entries; cleared when full
  static constexpr size_t kMaxCachedPiece = 256;     // bytes

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Open addressing, linear probing, power-of-two size: the lookup is the inner loop of BPE.
  struct MergeSlot {
    uint64_t key = kEmpty;
    MergeInfo info{};
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of ids >= 0 has this key
  size_t slot_of(uint64_t k) const {
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> merge_shift_);
  }
  const MergeInfo* find_merge(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = slot_of(k);; i = (i + 1) & merge_mask_) {
      const MergeSlot& s = merge_slots_[i];
      if (s.key == k) return &s.info;
      if (s.key == kEmpty) return nullptr;
    }
  }
  void initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const;
  void encode_uncached(std::string_view piece, std::vector<int32_t>& ids) const;

  Vocab vocab_;
  std::vector<MergeSlot> merge_slots_;
  size_t merge_mask_ = 0;
  int merge_shift_ = 64;
  BpeOptions options_;
  int32_t unk_id_ = -1;                     // -1: no unk token (unknown characters are dropped)
  std::optional<std::string> unk_missing_;  // unk_token named but absent from the vocab
  int32_t byte_ids_[256];                   // byte_level: id of each byte's character, or -1
  int32_t fallback_ids_[256];               // byte_fallback: id of "<0xXX>", or -1

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace actcap::tok
