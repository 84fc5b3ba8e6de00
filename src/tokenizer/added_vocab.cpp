#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace actcap::tok {

void AddedVocabulary::Trie::add(const std::string& pattern, int32_t token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char ch : pattern) {
    const auto c = static_cast<unsigned char>(ch);
    int32_t child = -1;
    for (const auto& [k, v] : nodes[node].children)
      if (k == c) child = v;
    if (child < 0) {
      child = static_cast<int32_t>(nodes.size());
      nodes[node].children.emplace_back(c, child);
      nodes.emplace_back();
    }
    node = child;
  }
  if (nodes[node].token < 0) nodes[node].token = token;  // the first token with this content wins
  first[static_cast<unsigned char>(pattern[0])] = true;
  empty = false;
}

bool AddedVocabulary::Trie::find(std::string_view text, size_t from, size_t* b, size_t* e,
                                 int32_t* token) const {
  if (empty) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (!first[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto c = static_cast<unsigned char>(text[j]);
      int32_t child = -1;
      for (const auto& [k, v] : nodes[node].children)
        if (k == c) {
          child = v;
          break;
        }
      if (child < 0) break;
      node = child;
      if (nodes[node].token >= 0) {
        best = nodes[node].token;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      *b = i;
      *e = best_end;
      *token = best;
      return true;
    }
  }
  return false;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens,
                                 const std::function<std::string(std::string_view)>& normalize)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.normalized)
      normalized_.add(normalize ? normalize(t.content) : t.content, static_cast<int32_t>(i));
    else
      raw_.add(t.content, static_cast<int32_t>(i));
  }
}

namespace {

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t len;
  return is_word_char(utf8_decode_before(s, s.size(), &len));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t len;
  return is_word_char(utf8_decode(s, 0, &len));
}

// Start of the run of whitespace that ends s.
size_t space_leftmost_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t len;
    if (!is_white_space(utf8_decode_before(s, end, &len))) break;
    end -= len;
  }
  return end;
}

// Length of the run of whitespace that starts s.
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    if (!is_white_space(utf8_decode(s, i, &len))) break;
    i += len;
  }
  return i;
}

}  // namespace

void AddedVocabulary::split(std::string_view text, bool normalized_set,
                            std::vector<Segment>& out) const {
  const Trie& trie = normalized_set ? normalized_ : raw_;
  size_t start_offset = 0;
  size_t pos = 0;
  size_t mb, me;
  int32_t ti;
  while (pos < text.size() && trie.find(text, pos, &mb, &me, &ti)) {
    pos = me;  // the next search starts after this match, kept or not
    const AddedToken& t = tokens_[ti];
    size_t start = mb;
    size_t stop = me;
    if (t.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(space_leftmost_at_end(text.substr(0, start)), start_offset);
    if (t.rstrip) stop += space_rightmost_at_start(text.substr(stop));
    // As Rust's find_matches: a token found inside the whitespace an rstrip token took keeps its
    // own range (overlapping that one) and the text goes on from its end; a range left empty (an
    // lstrip token whose whitespace was all taken) is dropped with its id, as Rust drops every
    // empty split.
    if (start_offset < start) out.push_back({start_offset, start, -1});
    if (start < stop) out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace actcap::tok
