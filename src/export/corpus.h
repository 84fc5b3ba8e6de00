// Reads a corpus document by document: .txt (one document per line, tokenised) or .jsonl (one
// object per line with "text" or "input_ids"). Blank lines are skipped; line numbers are 0-based.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "actcap/tokenizer.h"

namespace actcap {

struct Document {
  int64_t line = 0;
  std::vector<int64_t> ids;
};

class CorpusReader {
 public:
  // Throws InputError for an unreadable file or a .txt corpus without a tokenizer.
  CorpusReader(const std::string& path, const Tokenizer* tokenizer, int64_t vocab_size,
               bool skip_bad_lines);
  // Next non-blank document; false at the end. Throws InputError naming the line for a bad line
  // (invalid JSON, missing field, ids outside the vocabulary) unless skipping bad lines.
  bool next(Document& doc);
  // Moves past every line before `line` (0-based) without parsing them (another rank's share).
  void skip_to(int64_t line);
  int64_t skipped() const { return skipped_; }

  // Non-blank lines in the file (for progress and ETA).
  static int64_t count_documents(const std::string& path);
  // XXH3-64 of the file's bytes, to tie a resumed run to the same input.
  static std::string fingerprint(const std::string& path);

 private:
  bool parse(const std::string& text, Document& doc);
  std::string path_;
  std::ifstream in_;
  const Tokenizer* tokenizer_;
  int64_t vocab_size_;
  bool skip_bad_;
  bool jsonl_;
  int64_t line_ = -1;
  int64_t skipped_ = 0;
};

}  // namespace actcap
