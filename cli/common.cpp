#include "common.h"

#include <sstream>

#include "actcap/error.h"

namespace actcap::cli {

std::vector<std::vector<int64_t>> parse_token_lists(const std::string& text) {
  std::vector<std::vector<int64_t>> out;
  std::stringstream seqs(text);
  std::string seq;
  size_t si = 0;
  while (std::getline(seqs, seq, ';')) {
    std::vector<int64_t> ids;
    std::stringstream items(seq);
    std::string item;
    while (std::getline(items, item, ',')) {
      size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      std::string trimmed = b == std::string::npos ? "" : item.substr(b, e - b + 1);
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(trimmed, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (trimmed.empty() || used != trimmed.size())
        throw InputError(concat("--tokens: '", trimmed, "' in sequence ", si, " is not an integer token id"));
      ids.push_back(v);
    }
    if (ids.empty()) throw InputError(concat("--tokens: sequence ", si, " is empty"));
    out.push_back(std::move(ids));
    ++si;
  }
  if (out.empty()) throw InputError("--tokens: no token ids given");
  return out;
}

std::vector<std::vector<int64_t>> tokenize_text(const Model& model, const std::string& text) {
  if (model.origin() != "demo")
    throw InputError(concat("--text: no tokenizer for ", model.origin(),
                         " (only the demo model's byte-level tokenizer is built in); pass --tokens"));
  if (text.empty()) throw InputError("--text is empty");
  std::vector<int64_t> ids;
  for (unsigned char ch : text) ids.push_back(ch);
  return {ids};
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace actcap::cli
