// manifest.journal: the shards an unfinished extract has claimed, one line each, appended and
// synced as each shard is read back. Rewriting the whole manifest after every shard would write
// O(shards^2) bytes over a long run; the journal writes each entry once. The manifest takes the
// entries in when the run completes or is resumed, and the journal is removed.
//
// A line is {"shard": <the manifest's shard entry>, "xxh3": <XXH3 of the entry, dumped>}. A last
// line without its newline is an append a kill interrupted: not claimed, not an error. A damaged
// whole line is: nothing after it is trusted.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "actcap/export.h"
#include "export/faults.h"
#include "export/manifest.h"

namespace actcap {

// Appends the journal's entries to `shards` (skipping entries already there, as a resume that was
// killed between rewriting the manifest and removing the journal leaves). Returns the problems
// found, one line each; an absent journal has none.
// `file`: the journal's name (a rank's, in a ranked extract).
std::vector<std::string> merge_journal(const std::string& dir, nlohmann::json& shards,
                                       const std::string& file = kJournalName);
// The same over the journal's text (what merge_journal reads from DIR/manifest.journal).
std::vector<std::string> merge_journal_text(const std::string& text, nlohmann::json& shards);
// The shard entries already claimed, 16 bytes each: XXH3 of the file name -> XXH3 of the entry,
// dumped. (Two names with one 64-bit hash, ~1e-8 at a million shards, would read as one file
// claimed twice: a false alarm, never a shard passed unchecked.)
using KnownEntries = std::unordered_map<uint64_t, uint64_t>;
// Adds `shard` (an entry with a string "file") to `known`.
void know(KnownEntries& known, const nlohmann::json& shard);

// The journal's entries streamed, one line at a time: each entry not in `known` goes to
// `on_entry` and into `known`; one already there must be the same.
// Without `known`, every entry goes to `on_entry`. Returns the problems (at most one: nothing
// after a damaged line is claimed).
std::vector<std::string> stream_journal(const std::string& dir, const std::string& file,
                                        KnownEntries* known,
                                        const std::function<void(const nlohmann::json&)>& on_entry);
// The entries DIR/`file` claims, every one, as a source for write_manifest_streamed; RunError
// naming the journal when a line is damaged. An absent journal claims none.
EntrySource journal_entries(std::string dir, std::string file);
// XXH3 of a shard entry, dumped: what `known` holds.
uint64_t entry_xxh3(const nlohmann::json& shard);
// One journal line for `shard`, newline included.
std::string journal_line(const nlohmann::json& shard);

class JournalWriter {
 public:
  // `faults` (tests only): the kill moment right after a line is synced.
  explicit JournalWriter(std::string dir, FaultPoints* faults = nullptr,
                         const std::string& file = kJournalName);
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  // Appends one entry and syncs it: from then on the shard is claimed. RunError on failure.
  void append(const nlohmann::json& shard);
  // Closes and deletes the journal (its entries are in the manifest now) and syncs the folder.
  void remove();

 private:
  std::string path_;
  FaultPoints* faults_;
  int fd_ = -1;
};

}  // namespace actcap
