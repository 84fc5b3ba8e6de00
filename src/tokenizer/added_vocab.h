// Added tokens (tokenizer.json "added_tokens"), found in the text before pre-tokenization as the
// Rust crate's AddedVocabulary does: leftmost-longest match, single_word / lstrip / rstrip; tokens
// with normalized=false are matched in the raw text, the others in the normalized text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace actcap::tok {

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A piece of the text: an added token (id >= 0) or plain text (id == -1), [begin, end).
struct Segment {
  size_t begin;
  size_t end;
  int64_t id;
  bool operator==(const Segment& o) const { return begin == o.begin && end == o.end && id == o.id; }
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalize` turns a normalized=true token's content into what is matched (null: unchanged).
  AddedVocabulary(std::vector<AddedToken> tokens,
                  const std::function<std::string(std::string_view)>& normalize);

  // Splits text with the raw-text tokens (normalized=false) or the normalized-text tokens. The
  // segments cover the text in order, as the Rust crate's find_matches gives them: a token found
  // inside the whitespace an rstrip token took overlaps it, and the text goes on from its end.
  // Empty segments are left out.
  void split(std::string_view text, bool normalized_set, std::vector<Segment>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_
  };
  struct Trie {
    std::vector<Node> nodes{1};
    bool first[256] = {};
    bool empty = true;
    void add(const std::string& pattern, int32_t token);
    // Leftmost-longest match at or after `from`: false if none.
    bool find(std::string_view text, size_t from, size_t* b, size_t* e, int32_t* token) const;
  };

  std::vector<AddedToken> tokens_;
  Trie raw_;
  Trie normalized_;
};

}  // namespace actcap::tok
