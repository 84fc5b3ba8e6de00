// The pieces `run` (one shard), `extract` (many) and `verify` share: what the manifest says a shard
// holds, writing a shard so that nothing damaged is ever claimed, checking a shard against its
// manifest entry, and writing the manifest itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actcap/export.h"
#include "actcap/model.h"
#include "actcap/safetensors.h"
#include "export/faults.h"
#include "export/layout.h"
#include "export/manifest.h"

namespace actcap {

// shard-00000.safetensors, shard-00001.safetensors, ...
std::string shard_file_name(int64_t index);

// What the manifest says every shard holds: each planned point with its dtype and per-row shape,
// plus the two row-index tensors (I64, no per-row shape), and what the shard's __metadata__ says.
struct ShardSchema {
  struct Tensor {
    std::string dtype;               // safetensors name
    std::vector<int64_t> row_shape;  // the shape after the rows dimension
    bool per_row = true;             // false: `row_shape` is the whole shape (a shard's statistics)
  };
  std::map<std::string, Tensor> tensors;
  std::string format;       // the manifest's "format"
  std::string fingerprint;  // the model's weights
  // The manifest's "stats" (extract --stats): each shard also holds its rows' statistics per point
  // (stats.h), the k best rows of every feature; without `stats_stored` (--stats-only) only them.
  bool stats = false, stats_stored = true;
  int64_t stats_top_k = 0;
  std::vector<std::pair<std::string, std::vector<int64_t>>> stat_points;  // name, per-token shape
};
// The schema of a manifest; nullopt with `problem` set when the manifest's points, format or
// model fingerprint are missing or malformed.
std::optional<ShardSchema> shard_schema(const nlohmann::json& manifest, std::string& problem);

// A shard ready to write: tensors in write order (points in plan order, then __rows__.seq and
// __rows__.pos) and their checksums, taken by the caller from data it has verified.
struct ShardContents {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json checksums = nlohmann::json::object();  // {tensor: XXH3-64 hex}
  int64_t rows = 0;
  // Tensors written from pieces, without being copied into one (extract, when its rows are already
  // in order): empty, or one entry per tensor; a non-empty pieces[k] holds tensor k's bytes, the
  // contiguous pieces back to back, and tensors[k] then only gives its dtype and shape (a view
  // that owns one row). materialize_pieces() makes such tensors whole.
  std::vector<std::vector<at::Tensor>> pieces;
};
// Replaces every tensor held as pieces by the pieces' concatenation.
void materialize_pieces(ShardContents& contents);
// True when tensor k of `contents` is held as pieces.
inline bool held_as_pieces(const ShardContents& contents, size_t k) {
  return k < contents.pieces.size() && !contents.pieces[k].empty();
}
// {tensor: XXH3-64 hex of its bytes} for every tensor.
nlohmann::json tensor_checksums(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// Writes DIR/shard-<index> crash-safely (io/atomic_file.h) with the checksums, the format and the
// weights' fingerprint in its __metadata__, reads it back and checks it exactly as verify does
// (check_shard). On any problem the file is removed (a damaged shard never sits where a claimed
// one would) and RunError names the shard, the tensor and the problem. Returns the shard's
// manifest entry: file, rows, bytes, header_xxh3 (XXH3 of the length and header JSON as
// written), checksums.
// `faults` (tests only): the shard-write kill moment and damage to the file before read-back.
// `layout` names the file (OutputLayout::shard).
nlohmann::json write_checked_shard(const std::string& dir, int64_t index,
                                   const ShardContents& contents, const ShardSchema& schema,
                                   FaultPoints* faults = nullptr, const OutputLayout& layout = {});
// The same for a file of another name (`file` in `dir`; test faults by shard index do not apply).
nlohmann::json write_checked_file(const std::string& dir, const std::string& file,
                                  const ShardContents& contents, const ShardSchema& schema,
                                  FaultPoints* faults = nullptr, int64_t index = -1);

constexpr const char* kStatsFileName = "stats.safetensors";
// The schema of the run's merged statistics file: `schema`'s statistics tensors alone.
ShardSchema stats_file_schema(const ShardSchema& schema);

// What a shard's __metadata__ holds: actcap.format, actcap.model, actcap.checksums (the dumped
// `checksums`).
std::map<std::string, std::string> shard_metadata(const ShardSchema& schema,
                                                  const nlohmann::json& checksums);

// A shard just written whose read-back found `problems`: removes `path` (a damaged shard never
// sits where a claimed one would) and throws RunError naming the first problem. Nothing when
// `problems` is empty.
void reject_unless_intact(const std::string& path, const std::vector<VerifyIssue>& problems);

struct ShardCheckOptions {
  bool header_checksum = true;  // off only in tests that show the field-by-field checks alone
};
// Everything a reader of `shard` decodes, against its manifest `entry` and the `schema`: the
// header's bytes (header_xxh3), the set of tensors (exactly the schema's), each tensor's dtype and
// shape ([entry.rows, ...row_shape]), the __metadata__ (exactly format, actcap.format,
// actcap.model, actcap.checksums, with the manifest's values), the file size, and every tensor's
// bytes against entry.checksums. Offsets are covered by the header checksum; the reader's own
// validation (parse_safetensors) already requires them packed and sized as dtype x shape. Issues
// are named by `file`.
std::vector<VerifyIssue> check_shard(const SafetensorsFile& shard, const std::string& file,
                                     const nlohmann::json& entry, const ShardSchema& schema,
                                     const ShardCheckOptions& options = {});

// A shard as read back without mapping it (extract's streamed shards, shard_stream.h): its parsed
// header, the file's first header.data_offset bytes as read, its size, and the XXH3-64 of each
// tensor's bytes as read.
struct ShardImage {
  const SafetensorsHeader& header;
  const uint8_t* prefix;
  uint64_t file_size;
  std::function<uint64_t(const TensorInfo&)> xxh3_of;
};
// check_shard over such an image: the same checks, the same issues.
std::vector<VerifyIssue> check_shard(const ShardImage& shard, const std::string& file,
                                     const nlohmann::json& entry, const ShardSchema& schema,
                                     const ShardCheckOptions& options = {});

// verify_output, also handing every shard entry the folder claims to `on_claimed` as it is
// checked, in order (the manifest's, then the journal's): what `extract --resume` continues
// from. `layout`: whose manifest and journal (a rank's, while a ranked extract runs).
VerifyReport verify_output(const std::string& dir, const OutputLayout& layout,
                           const EntryVisitor& on_claimed);

// format, complete (false), model (path, model_type, fingerprint), device_map, points (dtype
// and per-token shape of each planned point), rows (0), shards ([]).
nlohmann::json manifest_head(const CaptureOrigin& origin, const std::vector<PointInfo>& plan);
nlohmann::json manifest_head(const Model& model, const std::vector<PointInfo>& plan);

}  // namespace actcap
