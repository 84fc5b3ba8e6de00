// `actcap extract`: push a corpus through a (split) model and write a verified activation dataset.
//
// The corpus is cut into shards of whole documents (about --shard-size of captured bytes each).
// Within a shard, windows are grouped by length into batches; the shard's rows are written in
// (document line, position) order. A background thread writes shards behind a bounded queue
// (temp file, fsync, rename, read-back check) and updates manifest.json atomically after each
// one, so a crash leaves only complete shards claimed and --resume continues after the last.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "actcap/capture.h"
#include "actcap/export.h"
#include "actcap/model.h"
#include "actcap/tokenizer.h"

namespace actcap {

struct ExtractOptions {
  std::string input;  // .txt (one document per line) or .jsonl ("text" or "input_ids")
  std::string out;
  CaptureOptions capture;  // patterns, dtype, positions
  int64_t batch_size = 8;
  int64_t max_length = 0;  // 0: the model's context
  int64_t stride = 0;      // 0: no windowing (longer documents are an error)
  uint64_t shard_bytes = 256ull << 20;
  bool resume = false;
  bool overwrite = false;
  bool skip_bad_lines = false;
  bool forward_only = false;  // benchmark: same batches, no capture, nothing written
  // Streaming statistics (docs/stats.md): per point and feature count, mean, variance, min, max
  // and the `stats_top_k` rows of largest value, in each shard and merged into stats.safetensors;
  // `stats_only` stores the statistics without the activations.
  bool stats = false, stats_only = false;
  int64_t stats_top_k = 8;
  // Leave special tokens (the tokenizer's special added tokens, the config's bos and eos ids) out
  // of the rows and the statistics.
  bool skip_special = false;
  // One rank of a run launched as `world_size` processes (actcap/ranks.h, docs/scale.md): it
  // takes its share of the corpus by tokens (corpus_share) and writes its own manifest, journal
  // and shards into `out`; with `assemble`, the last rank to finish assembles manifest.json
  // (merge_ranks) through the folder. Off when the caller assembles (rank 0 after an MPI gather).
  int rank = 0, world_size = 1;
  bool assemble = true;
  int queue_shards = 2;  // shards waiting for the writer before compute blocks
  ExportFaults faults;   // test-only fault injection (actcap/export.h)
};

struct ExtractProgress {
  int64_t documents_done = 0, documents_total = 0;
  int64_t tokens_done = 0;
  uint64_t bytes_written = 0;
  int64_t shards_written = 0;
  double seconds = 0.0;
};

struct ExtractResult {
  ExtractProgress progress;
  int64_t skipped_lines = 0;
  int64_t resumed_from_line = 0;  // first document line computed in this run
  std::string manifest;           // manifest.json, or a rank's own manifest
  // A ranked run: its share of the corpus, its manifest's manifest_checksum as sealed, and whether
  // this rank assembled manifest.json.
  int64_t lines_begin = 0, lines_end = 0;  // lines_end kPastTheEnd: to the end (ranks.h)
  std::string rank_manifest_checksum;
  bool assembled = false;
};

// A ranked extract's manifests merged into one manifest.json.
struct MergeReport {
  bool assembled = false;
  int world_size = 0;
  int64_t shards = 0, rows = 0;
  std::vector<std::string> waiting;  // why not assembled: each rank not yet complete
  std::string manifest;
};
// Assembles DIR/manifest.json from the complete manifests of every rank of a ranked extract, in
// rank order: the shards in rank order (so the rows of one process, in (line, position) order),
// rows and documents added up, statistics merged into stats.safetensors, and the ranks' line
// ranges and device maps under "ranks". The ranks' manifests are streamed, never held: memory
// does not grow with the number of shards. `sealed_as` (rank 0 after an MPI gather): each rank's
// manifest_checksum as that rank sealed it, which the file on disk must carry, and the world
// size; empty: the run of `world_size` ranks (a rank of that run assembling it), or, with 0, the
// one run whose rank manifests are in DIR. Nothing is written while a rank is unfinished
// (`waiting` says which). Running it again gives the same files. InputError, when the world size
// is not given, for a folder without rank manifests or with those of several world sizes;
// RunError for a damaged rank manifest or ranks that disagree on the model, points, settings or
// input. `faults` (tests only): its merge-write kill moment.
MergeReport merge_ranks(const std::string& dir, const std::vector<std::string>& sealed_as = {},
                        int world_size = 0, const ExportFaults& faults = {});

// Throws InputError for bad input (exit 2) and RunError when the run fails (exit 1), leaving the
// manifest consistent with the shards on disk.
ExtractResult run_extract(Model& model, const Tokenizer* tokenizer, const ExtractOptions& options,
                          const std::function<void(const ExtractProgress&)>& on_progress = {});

// The tokenizer for a model argument: demo's byte-level one, DIR/tokenizer.json, or null.
std::unique_ptr<Tokenizer> tokenizer_for(const std::string& model_path);

}  // namespace actcap
