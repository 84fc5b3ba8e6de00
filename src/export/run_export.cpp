#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "actcap/snapshot.h"
#include "export/layout.h"
#include "export/shard.h"
#include "io/atomic_file.h"
#include "util/strings.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_output_file(const std::string& name) {
  const std::string base = temp_target(name);  // a temp file counts as the file it was for
  return base == kManifestName || base == kJournalName || base == kStatsFileName ||
         parse_rank_file(base).has_value() ||
         (starts_with(base, "shard-") && ends_with(base, ".safetensors"));
}

void prepare_output_dir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(concat("output folder ", dir, " exists and is not a folder"), {"out"});
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    if (!overwrite)
      throw InputError(
          concat("output folder ", dir, " is not empty; allow overwriting to replace its contents"),
          {"out", "overwrite"});
    // Manifest first: from this moment nothing in the folder claims to be complete.
    fs::remove(fs::path(dir) / kManifestName, ec);
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.is_regular_file() && is_output_file(entry.path().filename().string()))
        fs::remove(entry.path(), ec);
  }
  fs::create_directories(dir, ec);
  if (ec)
    throw InputError(concat("cannot create output folder ", dir, ": ", ec.message()), {"out"});
}

CaptureOrigin capture_origin(const Model& model) {
  CaptureOrigin o{model.origin(), model.config().model_type, model.fingerprint(), {}};
  const auto modules = model.stage_modules();
  for (size_t i = 0; i < modules.size(); ++i)
    for (const std::string& m : modules[i]) o.device_map[m] = model.stage_device(i).str();
  return o;
}

std::vector<ExportedTensor> export_run(const std::string& dir, const SafeCapturer& capturer,
                                       const Model& model, const ExportFaults& faults) {
  std::vector<std::pair<std::string, at::Tensor>> points;
  for (const PointInfo& p : capturer.plan()) points.emplace_back(p.name, capturer.get(p.name));
  return export_rows(
      dir, capture_origin(model), points, capturer.row_seq(), capturer.row_pos(),
      capturer.row_token(), [&] { capturer.verify(); }, faults);
}

namespace {

// export_rows with `generation`, when not null, recorded in the manifest (which then plans the
// rows' `__rows__.step`, `row_step`).
std::vector<ExportedTensor> export_rows_of(
    const std::string& dir, const CaptureOrigin& origin,
    const std::vector<std::pair<std::string, at::Tensor>>& points,
    const std::vector<int64_t>& row_seq, const std::vector<int64_t>& row_pos,
    const std::vector<int64_t>& row_token, const json& generation,
    const std::vector<int64_t>& row_step, const std::function<void()>& reverify,
    const ExportFaults& faults) {
  const int64_t rows = static_cast<int64_t>(row_seq.size());
  if (row_pos.size() != row_seq.size())
    throw InputError(
        concat("rows: ", row_seq.size(), " sequence indices but ", row_pos.size(), " positions"));
  if (!row_token.empty() && row_token.size() != row_seq.size())
    throw InputError(
        concat("rows: ", row_seq.size(), " sequence indices but ", row_token.size(), " tokens"));
  std::vector<PointInfo> plan;
  ShardContents shard;
  shard.rows = rows;
  for (const auto& [name, t] : points) {
    if (name.empty() || name.rfind("__rows__", 0) == 0)
      throw InputError(concat("'", name, "' cannot name a captured point"));
    if (t.dim() < 1 || t.size(0) != rows)
      throw InputError(concat("point '", name, "' has ", t.dim() < 1 ? 0 : t.size(0),
                              " rows; the capture has ", rows));
    plan.push_back({name, t.sizes().slice(1).vec(), t.scalar_type()});
    shard.tensors.emplace_back(name, t.device().is_cpu() ? t : t.to(at::kCPU));
  }
  shard.tensors.emplace_back("__rows__.seq", at::tensor(row_seq, at::kLong));
  shard.tensors.emplace_back("__rows__.pos", at::tensor(row_pos, at::kLong));
  // -1 for each row when the token ids are not known (docs/format.md).
  shard.tensors.emplace_back("__rows__.token", row_token.empty()
                                                   ? at::full({rows}, -1, at::kLong)
                                                   : at::tensor(row_token, at::kLong));
  if (!generation.is_null()) {
    if (row_step.size() != row_seq.size())
      throw InputError(
          concat("rows: ", row_seq.size(), " sequence indices but ", row_step.size(), " steps"));
    shard.tensors.emplace_back("__rows__.step", at::tensor(row_step, at::kLong));
  }
  // Checksums first, then the snapshots re-checked against their fingerprints: the bytes the
  // checksums cover are the captured ones (what changes after this is caught on read-back).
  shard.checksums = tensor_checksums(shard.tensors);
  if (reverify) reverify();

  json manifest = manifest_head(origin, plan);
  if (!generation.is_null()) manifest["generation"] = generation;
  std::string problem;
  const std::optional<ShardSchema> schema = shard_schema(manifest, problem);
  if (!schema) throw RunError(concat("cannot describe the capture's shard: manifest ", problem));
  FaultPoints fault_points(faults);
  const json entry = write_checked_shard(dir, 0, shard, *schema, &fault_points);
  std::vector<ExportedTensor> out;
  for (const auto& [name, t] : shard.tensors)
    out.push_back({name, t.sizes().vec(), safetensors_dtype_name(t.scalar_type()),
                   shard.checksums[name].get<std::string>()});
  manifest["complete"] = true;
  manifest["rows"] = rows;
  manifest["shards"].push_back(entry);
  write_manifest(dir, manifest, &fault_points);
  return out;
}

}  // namespace

std::vector<ExportedTensor> export_rows(
    const std::string& dir, const CaptureOrigin& origin,
    const std::vector<std::pair<std::string, at::Tensor>>& points,
    const std::vector<int64_t>& row_seq, const std::vector<int64_t>& row_pos,
    const std::vector<int64_t>& row_token, const std::function<void()>& reverify,
    const ExportFaults& faults) {
  return export_rows_of(dir, origin, points, row_seq, row_pos, row_token, json(), {}, reverify,
                        faults);
}

std::vector<ExportedTensor> export_generation(const std::string& dir,
                                              const GenerateCapture& capture, const Model& model,
                                              const ExportFaults& faults) {
  json generation = {
      {"sequences", capture.row_seq.empty() ? 0 : capture.row_seq.back() + 1},
      {"steps", capture.row_step.empty()
                    ? 0
                    : *std::max_element(capture.row_step.begin(), capture.row_step.end())}};
  return export_rows_of(dir, capture_origin(model), capture.points, capture.row_seq,
                        capture.row_pos, capture.row_token, generation, capture.row_step, nullptr,
                        faults);
}

std::vector<ExportedTensor> export_snapshots(const std::string& dir, SnapshotStore& store,
                                             const CaptureOrigin& origin,
                                             std::vector<std::string> points) {
  const std::vector<Snapshot>& snaps = store.snapshots();
  if (points.empty()) points = store.points();
  if (points.empty()) throw RunError("nothing captured to save");
  std::vector<int64_t> steps;
  for (const Snapshot& s : snaps)
    if (std::find(steps.begin(), steps.end(), s.step) == steps.end()) steps.push_back(s.step);
  std::map<std::string, std::vector<at::Tensor>> parts;
  std::vector<int64_t> row_seq, row_pos, row_token;
  bool tokens_known = true;  // every forward's selection was made with its input ids
  int64_t seq_offset = 0;
  for (int64_t step : steps) {
    const RowSelection* rows = nullptr;
    int64_t batch = -1, seq = -1;
    for (const std::string& point : points) {
      std::vector<size_t> found;
      for (size_t i = 0; i < snaps.size(); ++i)
        if (snaps[i].step == step && snaps[i].point == point) found.push_back(i);
      if (found.size() != 1)
        throw RunError(concat(
            "cannot save forward ", step, ": hook point '", point, "' fired ", found.size(),
            " times in it; a saved capture holds one row set per point and forward (read the "
            "calls one by one with get(point, call), or capture a point that fires once)"));
      const Snapshot& s = snaps[found[0]];
      const RowSelection* sel = store.selection(found[0]).get();
      at::Tensor t = s.rows;
      int64_t b = 0, n = 0;
      if (sel) {
        b = sel->batch;
        n = sel->rows();
      } else {
        if (t.dim() < 2)
          throw RunError(concat("cannot save hook point '", point, "': its tensor has shape ",
                                t.sizes(), ", not [batch, seq, ...]"));
        b = t.size(0);
        n = t.size(0) * t.size(1);
        t = t.flatten(0, 1);
      }
      if (batch < 0) {
        rows = sel;
        batch = b;
        seq = sel ? sel->seq : s.rows.size(1);
        if (sel) {
          for (int64_t r = 0; r < n; ++r) {
            row_seq.push_back(seq_offset + sel->row_seq[r]);
            row_pos.push_back(sel->row_pos[r]);
          }
          if (sel->row_token.size() == static_cast<size_t>(n))
            row_token.insert(row_token.end(), sel->row_token.begin(), sel->row_token.end());
          else
            tokens_known = false;
        } else {
          tokens_known = false;
          for (int64_t r = 0; r < n; ++r) {
            row_seq.push_back(seq_offset + r / seq);
            row_pos.push_back(r % seq);
          }
        }
      } else if (sel != rows || b != batch || (!sel && s.rows.size(1) != seq)) {
        throw RunError(concat("cannot save forward ", step, ": hook point '", point,
                              "' holds other rows than '", points[0],
                              "' (a different batch, sequence length or row selection)"));
      }
      parts[point].push_back(t);
    }
    seq_offset += batch;
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& point : points) {
    const auto& p = parts[point];
    tensors.emplace_back(point, p.size() == 1 ? p[0] : at::cat(p, 0));
  }
  if (!tokens_known) row_token.clear();
  return export_rows(dir, origin, tensors, row_seq, row_pos, row_token, [&] { store.verify(); });
}

}  // namespace actcap
