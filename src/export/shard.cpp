#include "export/shard.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "actcap/error.h"
#include "actcap/hash.h"
#include "export/faults.h"
#include "export/stats.h"
#include "io/atomic_file.h"
#include "util/stage_timer.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kRowsSeq = "__rows__.seq";
constexpr const char* kRowsPos = "__rows__.pos";
constexpr const char* kRowsToken = "__rows__.token";
constexpr const char* kRowsStep = "__rows__.step";

std::string shard_file_name(int64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard-%05lld.safetensors", static_cast<long long>(index));
  return buf;
}

std::optional<ShardSchema> shard_schema(const json& manifest, std::string& problem) {
  ShardSchema s;
  if (!manifest.is_object() || !manifest.contains("format") || !manifest["format"].is_string()) {
    problem = "has no format";
    return std::nullopt;
  }
  s.format = manifest["format"].get<std::string>();
  if (!manifest.contains("model") || !manifest["model"].is_object() ||
      !manifest["model"].contains("fingerprint") || !manifest["model"]["fingerprint"].is_string()) {
    problem = "has no model fingerprint";
    return std::nullopt;
  }
  s.fingerprint = manifest["model"]["fingerprint"].get<std::string>();
  if (!manifest.contains("points") || !manifest["points"].is_object()) {
    problem = "has no points";
    return std::nullopt;
  }
  for (const auto& [name, p] : manifest["points"].items()) {
    const bool ok = p.is_object() && p.contains("dtype") && p["dtype"].is_string() &&
                    p.contains("shape") && p["shape"].is_array();
    ShardSchema::Tensor t;
    if (ok) {
      t.dtype = p["dtype"].get<std::string>();
      for (const json& d : p["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) {
          t.dtype.clear();
          break;
        }
        t.row_shape.push_back(d.get<int64_t>());
      }
    }
    if (t.dtype.empty() || name.rfind("__rows__", 0) == 0 || name.rfind("__stats__", 0) == 0) {
      problem = concat("point '", name, "' has no valid dtype and shape");
      return std::nullopt;
    }
    s.tensors[name] = t;
  }
  s.tensors[kRowsSeq] = {"I64", {}};
  s.tensors[kRowsPos] = {"I64", {}};
  // Since actcap/3 every row carries its token id; folders of actcap/2 and before verify without.
  if (s.format != "actcap/1" && s.format != "actcap/2") s.tensors[kRowsToken] = {"I64", {}};
  // A generation's rows also say which forward computed them (0: the prompt pass).
  if (manifest.contains("generation")) s.tensors[kRowsStep] = {"I64", {}};
  if (manifest.contains("stats")) {
    const json& st = manifest["stats"];
    if (!st.is_object() || !st.contains("top_k") || !st["top_k"].is_number_integer() ||
        st["top_k"].get<int64_t>() < 0 || !st.contains("stored") || !st["stored"].is_boolean()) {
      problem = "has malformed stats settings (top_k, stored)";
      return std::nullopt;
    }
    s.stats = true;
    s.stats_top_k = st["top_k"].get<int64_t>();
    s.stats_stored = st["stored"].get<bool>();
    for (const auto& [name, t] : s.tensors)
      if (name.rfind("__rows__", 0) != 0) s.stat_points.emplace_back(name, t.row_shape);
    if (!s.stats_stored) s.tensors.clear();  // --stats-only: the statistics alone
    for (const auto& [name, shape] : s.stat_points)
      for (auto& [stat, t] : stats_schema(name, shape, s.stats_top_k)) s.tensors[stat] = t;
  }
  return s;
}

json tensor_checksums(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  json sums = json::object();
  for (const auto& [name, t] : tensors) sums[name] = hex64(tensor_xxh3(t));
  return sums;
}

std::map<std::string, std::string> shard_metadata(const ShardSchema& schema,
                                                  const json& checksums) {
  return {{"actcap.format", schema.format},
          {"actcap.model", schema.fingerprint},
          {"actcap.checksums", checksums.dump()}};
}

namespace {

std::string shape_text(const std::vector<int64_t>& shape) { return json(shape).dump(); }

}  // namespace

void materialize_pieces(ShardContents& contents) {
  for (size_t k = 0; k < contents.pieces.size(); ++k)
    if (!contents.pieces[k].empty()) contents.tensors[k].second = at::cat(contents.pieces[k], 0);
  contents.pieces.clear();
}

json write_checked_shard(const std::string& dir, int64_t index, const ShardContents& contents,
                         const ShardSchema& schema, FaultPoints* faults,
                         const OutputLayout& layout) {
  return write_checked_file(dir, layout.shard(index), contents, schema, faults, index);
}

ShardSchema stats_file_schema(const ShardSchema& schema) {
  ShardSchema s = schema;
  s.tensors.clear();
  for (const auto& [name, t] : schema.tensors)
    if (name.rfind("__stats__.", 0) == 0) s.tensors[name] = t;
  return s;
}

json write_checked_file(const std::string& dir, const std::string& file,
                        const ShardContents& contents, const ShardSchema& schema,
                        FaultPoints* faults, int64_t index) {
  const std::string path = (fs::path(dir) / file).string();
  std::string prefix;
  try {
    prefix = safetensors_prefix(contents.tensors, shard_metadata(schema, contents.checksums));
  } catch (const InputError& e) {
    throw InputError(concat("cannot write ", path, ": ", e.what()));
  }
  uint64_t bytes = prefix.size();
  for (const auto& [name, t] : contents.tensors)
    bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
  StageTimer write_timer("writer.write+fsync");
  write_file_atomic(path, [&](int fd) {
    StageTimer data_timer("writer.write_data");
    write_all(fd, prefix.data(), prefix.size(), path);
    if (faults && index >= 0) faults->reached(ExportFaults::Moment::kShardWrite);
    for (size_t k = 0; k < contents.tensors.size(); ++k) {
      if (!held_as_pieces(contents, k)) {
        write_safetensors_data(fd, {contents.tensors[k]}, path);
        continue;
      }
      for (const at::Tensor& piece : contents.pieces[k]) {  // contiguous CPU rows (extract.cpp)
        const size_t n = static_cast<size_t>(piece.numel()) * piece.element_size();
        if (n > 0) write_all(fd, piece.data_ptr(), n, path);
      }
    }
  });
  write_timer.stop();
  if (faults && index >= 0 && names_shard(faults->faults().damage_file, index))
    flip_last_byte(path);
  const json entry = {{"file", file},
                      {"rows", contents.rows},
                      {"bytes", bytes},
                      {"header_xxh3", hex64(xxh3(prefix.data(), prefix.size()))},
                      {"checksums", contents.checksums}};

  // Read back what landed on disk and check it as verify will, before anyone claims it.
  std::vector<VerifyIssue> problems;
  StageTimer readback_timer("writer.readback");
  try {
    problems = check_shard(*SafetensorsFile::open(path), file, entry, schema);
  } catch (const Error& e) {
    problems.push_back({file, "", e.what()});
  }
  reject_unless_intact(path, problems);
  return entry;
}

void reject_unless_intact(const std::string& path, const std::vector<VerifyIssue>& problems) {
  if (problems.empty()) return;
  std::error_code ec;
  fs::remove(path, ec);
  const VerifyIssue& p = problems.front();
  throw RunError(concat(path, " does not read back as written: ",
                        p.tensor.empty() ? "" : concat("tensor ", p.tensor, ": "), p.problem,
                        " (removed it; check the disk, then run again or resume)"),
                 {"resume"});
}

namespace {

// Collects one shard's issues, each named by the shard's file.
struct ShardIssues {
  const std::string& file;
  std::vector<VerifyIssue>& out;
  void operator()(const std::string& tensor, const std::string& problem) const {
    out.push_back({file, tensor, problem});
  }
};

// The header as bytes: dtypes, shapes, offsets, names and metadata exactly as written.
void check_header_bytes(const ShardImage& shard, const json& entry, const ShardIssues& bad) {
  const std::string got = hex64(xxh3(shard.prefix, shard.header.data_offset));
  if (!entry.contains("header_xxh3") || !entry["header_xxh3"].is_string())
    bad("",
        "its manifest entry has no header_xxh3, so its header cannot be proven (written "
        "before format actcap/2?); write it again");
  else if (got != entry["header_xxh3"].get<std::string>())
    bad("",
        concat("header checksum ", got, ", manifest says ", entry["header_xxh3"].get<std::string>(),
               ": the header (dtypes, shapes, offsets) is not what was written"));
}

// The __metadata__ field by field: exactly the keys and values the manifest implies.
void check_metadata(const ShardImage& shard, const ShardSchema& schema, const json& sums,
                    const ShardIssues& bad) {
  const std::map<std::string, std::string>& meta = shard.header.metadata;
  std::map<std::string, std::string> want_meta = shard_metadata(schema, sums);
  want_meta["format"] = "pt";
  for (const auto& [key, value] : meta)
    if (!want_meta.count(key)) bad("", concat("__metadata__ has an unexpected key '", key, "'"));
  for (const auto& [key, value] : want_meta) {
    const auto it = meta.find(key);
    if (it == meta.end()) {
      bad("", concat("__metadata__ has no '", key, "'"));
    } else if (key == "actcap.checksums") {
      const json parsed = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
      // (A parse failure yields a discarded value, which compares unequal to nothing: test it.)
      if (parsed.is_discarded() || !(parsed == sums))
        bad("", "checksums in the shard's __metadata__ differ from the manifest");
    } else if (it->second != value) {
      bad("",
          concat("__metadata__ '", key, "' is '", it->second, "', manifest says '", value, "'"));
    }
  }
}

// The tensors field by field: exactly the schema's, each with its dtype and [rows, ...row_shape],
// and a checksum for each in the manifest.
void check_tensor_set(const ShardImage& shard, const ShardSchema& schema, int64_t rows,
                      const json& sums, const ShardIssues& bad) {
  std::map<std::string, const TensorInfo*> by_name;
  for (const TensorInfo& info : shard.header.tensors) by_name[info.name] = &info;
  for (const auto& [name, want] : schema.tensors) {
    const auto found = by_name.find(name);
    const TensorInfo* info = found == by_name.end() ? nullptr : found->second;
    if (!info) {
      bad(name, "is planned in the manifest but absent from the shard");
      continue;
    }
    if (info->dtype_name != want.dtype)
      bad(name, concat("dtype ", info->dtype_name, " in the header, manifest says ", want.dtype));
    std::vector<int64_t> shape;
    if (want.per_row) shape.push_back(rows);
    shape.insert(shape.end(), want.row_shape.begin(), want.row_shape.end());
    if (info->shape != shape)
      bad(name, concat("shape ", shape_text(info->shape), " in the header, manifest says ",
                       shape_text(shape)));
  }
  for (const TensorInfo& info : shard.header.tensors)
    if (!schema.tensors.count(info.name))
      bad(info.name, "is in the shard but is no point of the manifest");
  for (const auto& [name, sum] : sums.items())
    if (!schema.tensors.count(name))
      bad(name, "has a checksum in the manifest but is no point of the manifest");
}

// Every tensor's bytes against its checksum in the manifest.
void check_tensor_bytes(const ShardImage& shard, const json& sums, const ShardIssues& bad) {
  for (const TensorInfo& info : shard.header.tensors) {
    if (!sums.contains(info.name)) {
      bad(info.name, "has no checksum in the manifest");
      continue;
    }
    const std::string want = sums[info.name].is_string() ? sums[info.name].get<std::string>() : "";
    const std::string got = hex64(shard.xxh3_of(info));
    if (got != want) bad(info.name, concat("checksum ", got, ", manifest says ", want));
  }
}

}  // namespace

std::vector<VerifyIssue> check_shard(const SafetensorsFile& shard, const std::string& file,
                                     const json& entry, const ShardSchema& schema,
                                     const ShardCheckOptions& options) {
  const ShardImage image{
      shard.header(), shard.file_bytes(), shard.file_size(),
      [&](const TensorInfo& info) { return xxh3(shard.data(info), info.end - info.begin); }};
  return check_shard(image, file, entry, schema, options);
}

std::vector<VerifyIssue> check_shard(const ShardImage& shard, const std::string& file,
                                     const json& entry, const ShardSchema& schema,
                                     const ShardCheckOptions& options) {
  std::vector<VerifyIssue> out;
  const ShardIssues bad{file, out};
  if (!entry.contains("rows") || !entry["rows"].is_number_integer() ||
      entry["rows"].get<int64_t>() < 0) {
    bad("", "its manifest entry has no row count");
    return out;
  }
  const int64_t rows = entry["rows"].get<int64_t>();
  if (!entry.contains("checksums") || !entry["checksums"].is_object()) {
    bad("", "its manifest entry has no checksums");
    return out;
  }
  const json& sums = entry["checksums"];

  if (!entry.contains("bytes") || entry["bytes"] != shard.file_size)
    bad("", concat("is ", shard.file_size, " bytes, manifest says ",
                   entry.contains("bytes") ? entry["bytes"].dump() : "nothing"));
  if (options.header_checksum) check_header_bytes(shard, entry, bad);
  check_metadata(shard, schema, sums, bad);
  check_tensor_set(shard, schema, rows, sums, bad);
  check_tensor_bytes(shard, sums, bad);
  return out;
}

json manifest_head(const CaptureOrigin& origin, const std::vector<PointInfo>& plan) {
  json points = json::object();
  for (const PointInfo& p : plan)
    points[p.name] = {{"dtype", safetensors_dtype_name(p.dtype)}, {"shape", p.shape}};
  json device_map = json::object();
  for (const auto& [module, device] : origin.device_map) device_map[module] = device;
  return {{"format", kFormatVersion},
          {"complete", false},
          {"model",
           {{"path", origin.path},
            {"model_type", origin.model_type},
            {"fingerprint", origin.fingerprint}}},
          {"device_map", device_map},
          {"points", points},
          {"rows", 0},
          {"shards", json::array()}};
}

json manifest_head(const Model& model, const std::vector<PointInfo>& plan) {
  return manifest_head(capture_origin(model), plan);
}

}  // namespace actcap
