#include "tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <queue>

#include "actcap/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace actcap::tok {

namespace {
// Words up to this many symbols use the quadratic scan; longer ones the priority queue.
constexpr size_t kQueueThreshold = 160;
}  // namespace

Bpe::Bpe(Vocab vocab, const Merges& merges, BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  size_t capacity = 8;
  int bits = 3;
  while (capacity < merges.size() * 2) {
    capacity *= 2;
    ++bits;
  }
  merge_slots_.assign(capacity, MergeSlot{});
  merge_mask_ = capacity - 1;
  merge_shift_ = 64 - bits;
  auto id_of = [&](const std::string& token, size_t rank) {
    auto it = vocab_.find(token);
    if (it == vocab_.end())
      throw InputError(concat(where, ".merges[", rank, "] (\"", merges[rank].first, "\" + \"",
                              merges[rank].second, "\"): token \"", token,
                              "\" is not in model.vocab"));
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int32_t ia = id_of(a, rank);
    const int32_t ib = id_of(b, rank);
    const int32_t inew = id_of(a + b, rank);
    const uint64_t k = key(ia, ib);
    size_t i = slot_of(k);
    while (merge_slots_[i].key != kEmpty && merge_slots_[i].key != k) i = (i + 1) & merge_mask_;
    merge_slots_[i] = {k, {static_cast<int32_t>(rank), inew}};  // a repeated pair: the last wins
  }
  if (options_.unk_token) {
    auto it = vocab_.find(*options_.unk_token);
    if (it != vocab_.end())
      unk_id_ = it->second;
    else
      unk_missing_ = *options_.unk_token;
  }
  const ByteAlphabet& alphabet = byte_alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(alphabet.byte_to_char[b]);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto f = vocab_.find(name);
    fallback_ids_[b] = f == vocab_.end() ? -1 : f->second;
  }
}

size_t Bpe::cache_size() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return cache_.size();
}

void Bpe::initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const {
  // A character missing from the vocab: byte fallback, else the unk token (fused if asked),
  // else it is dropped -- as the Rust crate does.
  bool pending_unk = false;
  auto flush_unk = [&] {
    if (pending_unk) symbols.push_back(unk_id_);
    pending_unk = false;
  };
  auto unknown = [&](std::string_view spelled) {
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : spelled) all = all && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // Rust adds the bytes ahead of an unk still pending (it comes at the next known symbol).
        for (char c : spelled) symbols.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
        return;
      }
    }
    if (unk_missing_)
      throw InputError(concat("model.unk_token \"", *unk_missing_,
                              "\" is needed for this text but is not in model.vocab"));
    if (unk_id_ < 0) return;
    if (pending_unk && !options_.fuse_unk) symbols.push_back(unk_id_);
    pending_unk = true;
  };

  if (options_.byte_level) {
    const ByteAlphabet& alphabet = byte_alphabet();
    for (char c : piece) {
      const auto b = static_cast<unsigned char>(c);
      if (byte_ids_[b] >= 0) {
        flush_unk();
        symbols.push_back(byte_ids_[b]);
      } else {
        unknown(alphabet.byte_to_char[b]);
      }
    }
  } else {
    std::string ch;
    for (size_t i = 0; i < piece.size();) {
      const size_t len = utf8_char_len(piece, i);
      ch.assign(piece.data() + i, len);
      auto it = vocab_.find(ch);
      if (it != vocab_.end()) {
        flush_unk();
        symbols.push_back(it->second);
      } else {
        unknown(ch);
      }
      i += len;
    }
  }
  flush_unk();
}

void Bpe::merge(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  if (n > kQueueThreshold) {
    merge_with_queue(symbols);
    return;
  }
  // rank of the pair (symbols[i], symbols[i+1]), INT_MAX when there is no such merge
  int32_t ranks[kQueueThreshold];
  int32_t news[kQueueThreshold];
  auto look = [&](size_t i) {
    const MergeInfo* m = find_merge(symbols[i], symbols[i + 1]);
    ranks[i] = m ? m->rank : INT_MAX;
    news[i] = m ? m->new_id : -1;
  };
  size_t len = n;
  for (size_t i = 0; i + 1 < len; ++i) look(i);
  while (len > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < len; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT_MAX) break;
    symbols[best] = news[best];
    for (size_t i = best + 1; i + 1 < len; ++i) symbols[i] = symbols[i + 1];
    for (size_t i = best + 1; i + 2 < len; ++i) {
      ranks[i] = ranks[i + 1];
      news[i] = news[i + 1];
    }
    --len;
    if (best > 0) look(best - 1);
    if (best + 1 < len) look(best);
  }
  symbols.resize(len);
}

void Bpe::merge_with_queue(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Entry {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    int32_t left;  // the pair the entry was made for: stale when the symbols changed
    int32_t right;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  auto push = [&](int32_t pos) {
    const int32_t nx = next[pos];
    if (nx < 0) return;
    if (const MergeInfo* m = find_merge(symbols[pos], symbols[nx]))
      queue.push({m->rank, pos, m->new_id, symbols[pos], symbols[nx]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    if (!alive[top.pos]) continue;
    const int32_t nx = next[top.pos];
    if (nx < 0) continue;
    if (symbols[top.pos] != top.left || symbols[nx] != top.right) continue;  // stale
    symbols[top.pos] = top.new_id;
    alive[nx] = 0;
    next[top.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = top.pos;
    if (prev[top.pos] >= 0) push(prev[top.pos]);
    push(top.pos);
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

void Bpe::encode_uncached(std::string_view piece, std::vector<int32_t>& ids) const {
  if (options_.ignore_merges) {
    std::string spelled;
    if (options_.byte_level) {
      spelled.reserve(piece.size() * 2);
      byte_level_append(spelled, piece);
    } else {
      spelled.assign(piece);
    }
    auto it = vocab_.find(spelled);
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  initial_symbols(piece, ids);
  merge(ids);
}

void Bpe::encode(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  std::string key;
  if (cacheable) {
    key.assign(piece);
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(piece.size());
  encode_uncached(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }
}

}  // namespace actcap::tok
