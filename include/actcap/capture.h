// SafeCapturer: resolves hook-point patterns to a capture plan before anything runs, copies each
// captured tensor inside the hook (never keeps the borrowed one), keeps every call, and
// fingerprints each snapshot when it is taken.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "actcap/model.h"

namespace actcap {

struct CaptureOptions {
  std::vector<std::string> patterns;      // e.g. {"transformer.h.*", "**:input"}
  c10::Device stable_device = c10::kCPU;  // where snapshots are kept
};

// One snapshot: the real-token rows of one call of one point.
struct Snapshot {
  std::string point;
  int64_t call = 0;
  int64_t step = 0;
  at::Tensor rows;    // [rows, ...per-token shape], on the stable device, owned
  uint64_t xxh3 = 0;  // of `rows` at capture time
};

class SafeCapturer {
 public:
  // Throws InputError when a pattern matches no point (listing the nearest names).
  SafeCapturer(Model& model, CaptureOptions options);
  ~SafeCapturer();
  SafeCapturer(const SafeCapturer&) = delete;
  SafeCapturer& operator=(const SafeCapturer&) = delete;

  // Points that will be captured, in model order.
  const std::vector<PointInfo>& plan() const { return plan_; }
  int64_t bytes_per_token() const;

  // Runs one forward of `batch` with the hooks attached; snapshots only real (unpadded) tokens in
  // (sequence, position) order. Returns the logits.
  at::Tensor run(const Batch& batch);

  const std::vector<Snapshot>& snapshots() const { return snapshots_; }
  // Re-hashes every snapshot; throws RunError naming the first whose bytes changed.
  void verify() const;
  // All rows of one point, calls concatenated in order.
  at::Tensor rows(const std::string& point) const;

 private:
  Model& model_;
  CaptureOptions options_;
  std::vector<PointInfo> plan_;
  std::vector<HookHandle> handles_;
  std::vector<Snapshot> snapshots_;
  at::Tensor row_index_;  // flat b*T + t of the real tokens of the current batch
};

}  // namespace actcap
