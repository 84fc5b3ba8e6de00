// Reading and writing a manifest without ever holding its shard list: a run of 1M shards has a
// manifest of about a gigabyte, its list ~6 KiB per shard once parsed. The list is read in two
// streaming passes (the outline, then each entry in turn) and written in two (the seal's
// checksum over the canonical text, then the pretty text), entry by entry from their sources:
// the old manifest, the journal, the ranks' manifests. What is written is byte for byte what
// write_manifest writes for the same manifest held whole.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actcap/export.h"
#include "export/faults.h"
#include "io/atomic_file.h"

namespace actcap {

class Xxh3Stream;

// A manifest or journal read as a stream may be this large (the disk is the bound); one read
// whole is held to kMaxManifestBytes (io/text_file.h).
constexpr uint64_t kMaxStreamedManifestBytes = uint64_t{1} << 40;

// Shard entries in order, each handed to the visitor; a source may be walked more than once and
// must give the same entries each time (an EntryTally of each walk proves it).
using EntryVisitor = std::function<void(const nlohmann::json&)>;
using EntrySource = std::function<void(const EntryVisitor&)>;

// The count and an XXH3 of the dumps of shard entries, in order: what shows that a list walked
// again is the one checked or claimed, without keeping it.
class EntryTally {
 public:
  EntryTally();
  ~EntryTally();
  EntryTally(EntryTally&&) noexcept;
  EntryTally& operator=(EntryTally&&) noexcept;
  void add(const nlohmann::json& entry);
  int64_t count() const { return count_; }
  uint64_t digest() const;
  bool operator==(const EntryTally& other) const {
    return count_ == other.count_ && digest() == other.digest();
  }

 private:
  std::unique_ptr<Xxh3Stream> sum_;
  int64_t count_ = 0;
};

// The manifest at `path` without its shard entries ("shards" left empty, if it is a list), read
// as a stream so that a long list is never held; nullopt with `problem` ("not valid JSON (...)",
// "cannot be read", too large) otherwise.
// With `on_entry`, the same single pass also hands it every shard entry in order (nothing checks
// the seal then: stream_manifest_entries does).
std::optional<nlohmann::json> manifest_outline(const std::string& path, std::string& problem,
                                               const EntryVisitor& on_entry = nullptr);

// The second pass over the manifest at `path` whose manifest_outline is `outline`: every shard
// entry, in order, to `on_entry`. Returns whether the file matches its manifest_checksum (taken
// over the canonical text as the entries go by). json::exception when the file is not the one
// the outline was read from.
bool stream_manifest_entries(const std::string& path, const nlohmann::json& outline,
                             const EntryVisitor& on_entry);

// Both passes over one open manifest file. A run replaces its manifest by rename, never in
// place, so the file held open stays the version the outline came from: reading the manifest of
// a rank that is still running (merge, verify) sees one version of it whole, where reopening the
// path for the second pass could find the next one.
class ManifestFile {
 public:
  explicit ManifestFile(std::string path);
  // manifest_outline's pass.
  std::optional<nlohmann::json> outline(std::string& problem,
                                        const EntryVisitor& on_entry = nullptr);
  // stream_manifest_entries' pass, over the file the outline was read from (any number of times).
  bool entries(const nlohmann::json& outline, const EntryVisitor& on_entry);
  // Whether the path no longer names the file held open (removed or replaced since: its rank
  // started again); false when that cannot be told (the file changed while it was being opened).
  bool replaced() const;
  // XXH3 of the bytes of the file held open (a third pass); nullopt when they cannot be read.
  std::optional<uint64_t> bytes_xxh3();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  std::optional<FileId> id_;  // the file held open
};

// The entries of the held manifest `file` (its outline `outline`) as a source: every walk reads
// the version held open, whatever the path names by then.
EntrySource manifest_entries(std::shared_ptr<ManifestFile> file, nlohmann::json outline);

// The entries of the manifest at `path` (its outline `outline`) as a source, the path opened anew
// at every walk.
EntrySource manifest_entries(std::string path, nlohmann::json outline);
// The entries of every source in turn.
EntrySource in_turn(std::vector<EntrySource> sources);

// Whether `manifest` carries its manifest_checksum and matches it (unaltered since sealed).
bool manifest_sealed(const nlohmann::json& manifest);

// Seals `manifest` (seal_manifest) and writes DIR/`file` (manifest.json, or a rank's manifest)
// crash-safely. `faults` (tests only): the manifest-write kill moment, with the temp file half
// written.
void write_manifest(const std::string& dir, const nlohmann::json& manifest,
                    FaultPoints* faults = nullptr, const std::string& file = kManifestName);

// The same for `outline` (a manifest whose "shards" is left empty) with the entries of `entries`
// as its shard list, walked twice: once for the seal, once for the text. `expected`, when given,
// is the tally of the list the caller checked or claimed: a walk that differs from it (or the
// second from the first) fails with RunError and leaves the old file in place. Returns the
// manifest_checksum written; `written`, when given, receives the file written, held open.
std::string write_manifest_streamed(const std::string& dir, const nlohmann::json& outline,
                                    const EntrySource& entries,
                                    const EntryTally* expected = nullptr,
                                    FaultPoints* faults = nullptr,
                                    const std::string& file = kManifestName,
                                    HeldFile* written = nullptr);

}  // namespace actcap
