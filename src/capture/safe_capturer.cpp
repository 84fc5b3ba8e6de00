#include "actcap/capture.h"

#include <set>

#include "actcap/error.h"
#include "actcap/hash.h"

namespace actcap {

SafeCapturer::SafeCapturer(Model& model, CaptureOptions options) : model_(model), options_(std::move(options)) {
  if (options_.patterns.empty()) throw InputError("no --capture pattern given");
  const std::vector<PointInfo> all = model_.points();
  std::set<std::string> chosen;
  for (const std::string& pattern : options_.patterns) {
    bool any = false;
    for (const PointInfo& p : all)
      if (match_point(pattern, p.name)) {
        any = true;
        chosen.insert(p.name);
      }
    if (!any) {
      std::vector<std::string> names;
      for (const PointInfo& p : all) names.push_back(p.name);
      std::string near;
      for (const auto& n : nearest_points(pattern, names)) near += (near.empty() ? "" : ", ") + n;
      throw InputError(concat("capture pattern '", pattern, "' matches no hook point of ", model_.origin(),
                           "; nearest: ", near, " (run `actcap points` for the full list)"));
    }
  }
  for (const PointInfo& p : all)
    if (chosen.count(p.name)) plan_.push_back(p);
  // One hook per point (not per pattern), so overlapping patterns never capture twice.
  for (const PointInfo& p : plan_) {
    handles_.push_back(model_.register_forward_hook(p.name, [this](const HookContext& ctx, const at::Tensor& t) {
      // Copy inside the hook: index_select writes fresh memory, so the borrowed tensor is not kept.
      at::Tensor flat = t.flatten(0, 1);  // [B, T, ...] -> [B*T, ...]
      at::Tensor rows = flat.index_select(0, row_index_.to(flat.device())).to(options_.stable_device);
      Snapshot s{ctx.point, ctx.call_index, ctx.step, rows, tensor_xxh3(rows)};
      snapshots_.push_back(std::move(s));
    }));
  }
}

SafeCapturer::~SafeCapturer() {
  for (auto& h : handles_) h.remove();
}

int64_t SafeCapturer::bytes_per_token() const {
  int64_t total = 0;
  for (const PointInfo& p : plan_) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    total += n * static_cast<int64_t>(c10::elementSize(p.dtype));
  }
  return total;
}

at::Tensor SafeCapturer::run(const Batch& batch) {
  const int64_t T = batch.ids.size(1);
  std::vector<int64_t> idx;
  idx.reserve(batch.tokens());
  for (int64_t b = 0; b < batch.size(); ++b)
    for (int64_t t = 0; t < batch.lengths[b]; ++t) idx.push_back(b * T + t);
  row_index_ = at::tensor(idx, at::kLong);
  return model_.forward(batch);
}

void SafeCapturer::verify() const {
  for (const Snapshot& s : snapshots_)
    if (tensor_xxh3(s.rows) != s.xxh3)
      throw RunError(concat("captured tensor '", s.point, "' (call ", s.call, ") changed after capture: checksum ",
                         hex64(s.xxh3), " now ", hex64(tensor_xxh3(s.rows))));
}

at::Tensor SafeCapturer::rows(const std::string& point) const {
  std::vector<at::Tensor> parts;
  for (const Snapshot& s : snapshots_)
    if (s.point == point) parts.push_back(s.rows);
  if (parts.empty()) throw RunError(concat("hook point '", point, "' never fired"));
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

}  // namespace actcap
