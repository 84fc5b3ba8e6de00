#include "export/corpus.h"

#include <xxhash.h>

#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "actcap/hash.h"
#include "io/text_file.h"
#include "util/strings.h"

namespace actcap {

namespace {
bool blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }
}  // namespace

CorpusReader::CorpusReader(const std::string& path, const Tokenizer* tokenizer, int64_t vocab_size,
                           bool skip_bad_lines)
    : path_(path),
      in_(path, std::ios::binary),
      tokenizer_(tokenizer),
      vocab_size_(vocab_size),
      skip_bad_(skip_bad_lines),
      jsonl_(ends_with(path, ".jsonl")) {
  if (!in_) throw InputError(concat("input ", path, " cannot be read"), {"input"});
  if (!jsonl_ && !tokenizer_)
    throw InputError(concat("input ", path,
                            ": a .txt corpus needs a tokenizer and the model has no "
                            "tokenizer.json; give a .jsonl file with \"input_ids\""),
                     {"input"});
}

bool CorpusReader::parse(const std::string& text, Document& doc) {
  std::string problem;
  doc.ids.clear();
  if (!jsonl_) {
    doc.ids = tokenizer_->encode(text);
  } else {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      problem = "is not valid JSON";
    }
    if (problem.empty() && !j.is_object()) problem = "is not a JSON object";
    if (problem.empty()) {
      if (j.contains("input_ids")) {
        const auto& ids = j["input_ids"];
        if (!ids.is_array()) problem = "has \"input_ids\" that is not an array";
        for (size_t i = 0; problem.empty() && i < ids.size(); ++i) {
          if (!ids[i].is_number_integer())
            problem = concat("has a non-integer input_ids[", i, "]");
          else
            doc.ids.push_back(ids[i].get<int64_t>());
        }
      } else if (j.contains("text") && j["text"].is_string()) {
        if (!tokenizer_)
          problem = "has \"text\" but the model has no tokenizer.json (give \"input_ids\")";
        else
          doc.ids = tokenizer_->encode(j["text"].get<std::string>());
      } else {
        problem = "has neither a \"text\" string nor \"input_ids\"";
      }
    }
  }
  for (size_t i = 0; problem.empty() && i < doc.ids.size(); ++i)
    if (doc.ids[i] < 0 || doc.ids[i] >= vocab_size_)
      problem = concat("has token id ", doc.ids[i], " outside the model's vocabulary [0, ",
                       vocab_size_, ")");
  if (problem.empty()) return true;
  if (!skip_bad_)
    throw InputError(
        concat(path_, ":", line_ + 1, ": line ", problem, " (bad lines can be skipped)"),
        {"skip_bad_lines"});
  ++skipped_;
  return false;
}

bool CorpusReader::next(Document& doc) {
  std::string text;
  while (read_line_bounded(in_, text, kMaxLineBytes, path_, line_ + 2)) {
    ++line_;
    if (blank(text)) continue;
    doc.line = line_;
    if (parse(text, doc) && !doc.ids.empty()) return true;
  }
  if (in_.bad())
    throw RunError(concat("input ", path_, ": read error at line ", line_ + 1), {"input"});
  return false;
}

void CorpusReader::skip_to(int64_t line) {
  std::string text;
  while (line_ + 1 < line && read_line_bounded(in_, text, kMaxLineBytes, path_, line_ + 2)) ++line_;
  if (in_.bad())
    throw RunError(concat("input ", path_, ": read error at line ", line_ + 1), {"input"});
}

int64_t CorpusReader::count_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(concat("input ", path, " cannot be read"), {"input"});
  int64_t n = 0;
  std::string text;
  int64_t line = 0;
  while (read_line_bounded(in, text, kMaxLineBytes, path, ++line)) n += !blank(text);
  return n;
}

std::string CorpusReader::fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(concat("input ", path, " cannot be read"), {"input"});
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH3_64bits_update(st, buf.data(), static_cast<size_t>(in.gcount()));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return hex64(h);
}

}  // namespace actcap
