// Output folder layout (docs/format.md): safetensors shards with one tensor per captured point
// named exactly as the point, [rows, ...features], plus int64 `__rows__.seq` / `__rows__.pos`, and
// a manifest.json written atomically that lists shards, points, dtypes and checksums. While an
// extract runs, each finished shard is claimed by one line appended to manifest.journal; the
// manifest takes them all in when the run completes (or is resumed).
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actcap/capture.h"
#include "actcap/generate.h"
#include "actcap/model.h"

namespace actcap {

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kJournalName = "manifest.journal";
constexpr const char* kFormatVersion = "actcap/3";

struct ExportedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;     // safetensors name
  std::string checksum;  // XXH3-64, 16 hex digits
};

// actcap's own files in an output folder: the manifest and its journal, shards, and the temp files
// an interrupted write leaves behind (`<name>.tmp.<pid>-<n>`, or `<name>.tmp.<pid>` as earlier
// versions named them; a process killed with SIGKILL cannot remove them).
bool is_output_file(const std::string& name);

// Makes `dir` ready for a new output: creates it, refuses (InputError) a non-empty folder unless
// `overwrite`, in which case only actcap's own files (manifest first, then shards) are removed.
void prepare_output_dir(const std::string& dir, bool overwrite);

// Test-only fault injection on the export path, so that tests reach a chosen state and prove each
// defence catches what it is for (the CLI reads them from ACTCAP_FAULT_SHARD,
// ACTCAP_FAULT_ASSEMBLED, ACTCAP_FAULT_QUEUED and ACTCAP_KILL_AT). Shard indices count from 0.
struct ExportFaults {
  std::optional<int64_t> damage_file;       // flip a bit of shard N's file before its read-back
  std::optional<int64_t> damage_assembled;  // flip a bit of shard N's rows before checksums
  std::optional<int64_t> damage_queued;     // the same after, while it waits for the writer
  // SIGKILL the process at the `kill_occurrence`-th (from 1) such moment: right after a journal
  // line is synced; a shard file with its header written and not its data; a manifest half
  // written; --resume having taken the journal in, before it removes unclaimed files; a rank's
  // new run having written its manifest's head, before it removes the earlier run's files; the
  // manifest.json a ranked run's assembler (merge_ranks: the last rank, rank 0 after a gather,
  // actcap merge) writes, half written.
  enum class Moment { kJournal, kShardWrite, kManifestWrite, kResume, kMergeWrite, kStart };
  std::optional<Moment> kill_at;
  int64_t kill_occurrence = 1;
};
// Sets kill_at/kill_occurrence from "journal:N", "shard-write:N", "manifest-write:N", "resume",
// "merge-write:N" or "start"; InputError (setting "kill_at") otherwise.
void parse_kill_at(const std::string& text, ExportFaults& faults);

// Who produced a capture: the manifest's "model" (path, model_type, fingerprint of the weights)
// and "device_map" (module name -> device).
struct CaptureOrigin {
  std::string path, model_type, fingerprint;
  std::map<std::string, std::string> device_map;
};
CaptureOrigin capture_origin(const Model& model);

// Writes the snapshots of a single forward as shard-00000.safetensors, then manifest.json.
// Verifies every snapshot's fingerprint before writing and the shard's bytes after.
std::vector<ExportedTensor> export_run(const std::string& dir, const SafeCapturer& capturer,
                                       const Model& model, const ExportFaults& faults = {});
// The same for rows captured elsewhere (the Python package's SafeCapturer over a torch model):
// `points` [rows, ...] in plan order, each row's sequence, position and token id (`row_token`
// empty: not known, stored as -1), and `reverify`, called after the checksums are taken, which must
// throw when a snapshot changed since it was captured.
std::vector<ExportedTensor> export_rows(
    const std::string& dir, const CaptureOrigin& origin,
    const std::vector<std::pair<std::string, at::Tensor>>& points,
    const std::vector<int64_t>& row_seq, const std::vector<int64_t>& row_pos,
    const std::vector<int64_t>& row_token, const std::function<void()>& reverify,
    const ExportFaults& faults = {});
// A generation's stitched captures (generate.h) as one shard, with the rows' steps and the
// manifest's "generation" (sequences, steps).
std::vector<ExportedTensor> export_generation(const std::string& dir,
                                              const GenerateCapture& capture, const Model& model,
                                              const ExportFaults& faults = {});
// A SnapshotStore's captures (snapshot.h) as one forward's shard: per forward (Snapshot::step) in
// order, each of `points` (empty: every point kept) must have exactly one snapshot, and all of them
// the same rows (their RowSelection, or the whole [batch, seq, ...] tensor); sequences are numbered
// across forwards. Token ids when every selection was made with its input ids (-1 otherwise).
// RunError naming the point and forward otherwise.
class SnapshotStore;
std::vector<ExportedTensor> export_snapshots(const std::string& dir, SnapshotStore& store,
                                             const CaptureOrigin& origin,
                                             std::vector<std::string> points = {});

// `actcap verify`: re-reads an output folder and checks everything a reader decodes from it: the
// manifest's own checksum, the journal's lines, and for every claimed shard its header bytes
// (header_xxh3), the set of tensors, each tensor's dtype and shape against the manifest's points
// and the shard's rows, its __metadata__, and every tensor's bytes.
struct VerifyIssue {
  enum class Kind {
    kIncomplete,  // the run is not marked complete (what --resume continues from)
    kManifest,    // the manifest itself: missing, unreadable, altered, malformed
    kJournal,     // a journal line
    kShard,       // a claimed shard: unreadable, header, a tensor's bytes
  };
  std::string file;
  std::string tensor;  // empty when the problem is the file itself
  std::string problem;
  Kind kind = Kind::kShard;
};
struct VerifyReport {
  int64_t shards = 0;
  // How many shard entries the folder claims: the manifest's, then (while the run is not complete)
  // the journal's.
  int64_t claimed = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<VerifyIssue> issues;
  bool ok() const { return issues.empty(); }
};
// Throws InputError when `dir` is not a folder; everything else is reported as an issue.
VerifyReport verify_output(const std::string& dir);
// Adds "manifest_checksum" (XXH3 of the manifest without that field, dumped canonically).
std::string seal_manifest(nlohmann::json manifest);

}  // namespace actcap
