// What `actcap verify` and `extract --resume` read from an output folder they did not write:
// manifest.json and manifest.journal. Input: the manifest's bytes, a NUL, the journal's bytes
// (no NUL: manifest only). When the first byte is odd the target also makes the input get past
// the checksums, so the checks behind them are reached: the manifest is re-sealed
// (seal_manifest) when it parses, and each journal line that parses is re-written with its own
// checksum (journal_line).
// Both files go into a private temp folder; no shard files exist, so every shard a manifest
// names is a missing file (or a name that must be refused before it is opened).
// Invariants: verify_output never throws for a folder (problems are issues), every issue names a
// file and says what is wrong, the count of shards never exceeds the entries claimed;
// merge_journal_text only ever appends objects that have a string "file", never the same file
// twice, and leaves the list unchanged past the first problem.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "actcap/export.h"
#include "export/journal.h"
#include "fuzz_common.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string& folder() { return fuzz::scratch_dir(); }

void write(const std::string& name, const std::string& bytes) {
  std::ofstream(folder() + "/" + name, std::ios::binary | std::ios::trunc) << bytes;
}

std::string fix_journal(const std::string& text) {
  std::string out;
  for (const std::string& line : fuzz::split(text, '\n')) {
    json e = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (e.is_object() && e.contains("shard") && e["shard"].is_object()) {
      std::string fixed = actcap::journal_line(e["shard"]);
      out += fixed;
    } else {
      out += line + "\n";
    }
  }
  if (!out.empty() && !text.empty() && text.back() != '\n')
    out.pop_back();  // keep a torn tail torn
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::string manifest = input.substr(0, nul);
  std::string journal = nul == std::string::npos ? "" : input.substr(nul + 1);
  if (size > 0 && (data[0] & 1)) {
    json m = json::parse(manifest, nullptr, /*allow_exceptions=*/false);
    if (m.is_object()) manifest = actcap::seal_manifest(m);
    journal = fix_journal(journal);
  }

  // merge_journal_text against the manifest's own list (or an empty one).
  json m = json::parse(manifest, nullptr, /*allow_exceptions=*/false);
  json shards = m.is_object() && m.contains("shards") ? m["shards"] : json::array();
  const json before = shards;
  const auto problems = actcap::merge_journal_text(journal, shards);
  if (before.is_array()) {
    FUZZ_CHECK(shards.size() >= before.size(), "merge dropped entries");
    std::set<std::string> files;
    for (size_t i = 0; i < before.size(); ++i)
      FUZZ_CHECK(shards[i] == before[i], "merge changed entry %zu", i);
    for (size_t i = before.size(); i < shards.size(); ++i) {
      FUZZ_CHECK(
          shards[i].is_object() && shards[i].contains("file") && shards[i]["file"].is_string(),
          "merged entry %zu has no file name", i);
      FUZZ_CHECK(files.insert(shards[i]["file"].get<std::string>()).second, "file merged twice");
    }
  } else {
    FUZZ_CHECK(!problems.empty(), "a shard list that is not a list was accepted");
  }

  // verify_output over the folder.
  write(actcap::kManifestName, manifest);
  if (nul == std::string::npos) {
    std::error_code ec;
    fs::remove(folder() + "/" + actcap::kJournalName, ec);
  } else {
    write(actcap::kJournalName, journal);
  }
  const actcap::VerifyReport r = actcap::verify_output(folder());
  for (const actcap::VerifyIssue& i : r.issues) {
    FUZZ_CHECK(!i.file.empty() && !i.problem.empty(), "issue without file or problem");
  }
  if (r.issues.empty())
    FUZZ_CHECK(r.shards == 0, "no shard file exists, yet %lld verified", (long long)r.shards);
  return 0;
}
