// What `actcap extract --input` reads: a corpus file from anywhere, .jsonl ({"input_ids": [...]}
// or {"text": "..."} per line) or .txt (one document per line, tokenized). Input: one flags byte,
// then the file's bytes.
//   bit 0: --skip-bad-lines        bit 1: .txt (else .jsonl)
//   bit 2: a tokenizer is given (always for .txt)    bits 3-4: vocabulary 1, 200, 50257, 2^31-1
// Invariants: only InputError is thrown, and never with --skip-bad-lines; every document returned
// is non-empty, its ids lie in [0, vocab), its line numbers increase; documents + skipped lines
// never exceed count_documents (the progress total).
#include <cstdint>
#include <fstream>
#include <string>

#include "actcap/tokenizer.h"
#include "export/corpus.h"
#include "fuzz_common.h"

namespace {

std::string corpus_path(bool txt) {
  return fuzz::scratch_dir() + (txt ? "/corpus.txt" : "/corpus.jsonl");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const auto tokenizer = actcap::Tokenizer::byte_level(/*eos=*/256);
  const uint8_t flags = data[0];
  const bool skip_bad = flags & 1, txt = flags & 2, with_tokenizer = txt || (flags & 4);
  static const int64_t kVocab[] = {1, 200, 50257, (int64_t{1} << 31) - 1};
  const int64_t vocab = kVocab[(flags >> 3) & 3];
  const std::string path = corpus_path(txt);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));

  const int64_t total = actcap::CorpusReader::count_documents(path);
  actcap::CorpusReader reader(path, with_tokenizer ? tokenizer.get() : nullptr, vocab, skip_bad);
  int64_t docs = 0, last_line = -1;
  try {
    actcap::Document doc;
    while (reader.next(doc)) {
      ++docs;
      FUZZ_CHECK(!doc.ids.empty(), "empty document at line %lld", static_cast<long long>(doc.line));
      FUZZ_CHECK(doc.line > last_line, "line %lld after %lld", static_cast<long long>(doc.line),
                 static_cast<long long>(last_line));
      last_line = doc.line;
      for (int64_t id : doc.ids)
        FUZZ_CHECK(id >= 0 && id < vocab, "id %lld outside [0, %lld) at line %lld",
                   static_cast<long long>(id), static_cast<long long>(vocab),
                   static_cast<long long>(doc.line));
    }
  } catch (const actcap::InputError& e) {
    const std::string why = e.what();
    FUZZ_CHECK(!skip_bad, "--skip-bad-lines still threw: %s", why.c_str());
    FUZZ_CHECK(why.find(path) != std::string::npos, "error does not name the file: %s",
               why.c_str());
  }
  FUZZ_CHECK(docs + reader.skipped() <= total, "%lld documents + %lld skipped > %lld counted lines",
             static_cast<long long>(docs), static_cast<long long>(reader.skipped()),
             static_cast<long long>(total));
  return 0;
}
