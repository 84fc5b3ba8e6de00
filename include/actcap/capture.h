// SafeCapturer: capture that is safe against the hazards docs/safety.md lists. It resolves
// hook-point patterns to a plan before anything runs (loud on zero matches), copies each captured
// tensor inside the hook on the producing device (never keeps the borrowed one), moves the copy to
// a stable device, keeps every call with its index, fingerprints each snapshot when it is taken
// and re-checks the fingerprint on every read.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actcap/model.h"

namespace actcap {

// Which token positions of each sequence to keep.
//   "all" | "first" | "last" | comma-separated Python-style ranges "0:8,-4:,10" (negative counts
//   from each sequence's end). Positions are kept once each, in increasing order.
struct PositionSpec {
  struct Range {
    std::optional<int64_t> start, stop;  // half-open, Python slice semantics
  };
  std::vector<Range> ranges;                           // empty = all
  static PositionSpec parse(const std::string& text);  // throws InputError
  std::vector<int64_t> select(int64_t length) const;   // positions of a sequence of `length` tokens
};

struct CaptureOptions {
  std::vector<std::string> patterns;      // e.g. {"transformer.h.*", "**:input"}
  c10::Device stable_device = c10::kCPU;  // where snapshots are kept
  std::optional<c10::ScalarType> dtype;   // cast snapshots (nullopt = keep the point's dtype)
  PositionSpec positions;                 // all by default
  std::optional<uint64_t> budget_bytes;   // refuse a run whose snapshots would exceed this
  bool fingerprint = true;  // XXH3 at capture, checked on read (off only to measure its cost)
};

// Parses "keep" | "f32" | "f16" | "bf16" (throws InputError).
std::optional<c10::ScalarType> parse_capture_dtype(const std::string& text);

// One snapshot: the selected rows of one call of one point.
struct Snapshot {
  std::string point;
  int64_t call = 0;   // per point, counting every call since the capturer was created
  int64_t step = 0;   // the model's forward() index
  at::Tensor rows;    // [rows, ...per-token shape], on the stable device, owned
  uint64_t xxh3 = 0;  // chunked_xxh3() (actcap/hash.h) of `rows` when it was taken
};

// The points `options` select on `model`, in model order, with the dtype they would be stored in
// (what SafeCapturer::plan() will be), without registering anything. Throws InputError when a
// pattern matches no point (listing the nearest names) or no pattern is given.
std::vector<PointInfo> plan_capture(const Model& model, const CaptureOptions& options);

class SafeCapturer {
 public:
  // Throws InputError when a pattern matches no point (listing the nearest names).
  SafeCapturer(Model& model, CaptureOptions options);
  ~SafeCapturer();  // removes its hooks
  SafeCapturer(const SafeCapturer&) = delete;
  SafeCapturer& operator=(const SafeCapturer&) = delete;

  // Points that will be captured, in model order, with the dtype they will be stored in.
  const std::vector<PointInfo>& plan() const { return plan_; }
  int64_t bytes_per_token() const;
  // Bytes the snapshots of `batch` will take; throws InputError when over the budget.
  uint64_t check_budget(const Batch& batch) const;
  // The same for `rows` captured tokens.
  uint64_t check_rows(uint64_t rows) const;

  // Runs one forward of `batch` with the hooks attached, capturing the selected real (unpadded)
  // tokens in (sequence, position) order. Throws RunError if a planned point never fired.
  // Returns what Model::forward returns: the logits, unless `logits` lets it skip lm_head.
  at::Tensor run(const Batch& batch, Model::Logits logits = Model::Logits::kCompute);
  // As run(batch), with the positions to keep given per sequence (increasing, < its length).
  at::Tensor run(const Batch& batch, const std::vector<std::vector<int64_t>>& positions,
                 Model::Logits logits = Model::Logits::kCompute);

  // Row provenance of the last run: sequence index and position of each captured row.
  const std::vector<int64_t>& row_seq() const { return row_seq_; }
  const std::vector<int64_t>& row_pos() const { return row_pos_; }

  const std::vector<Snapshot>& snapshots() const { return snapshots_; }
  // Verified read: the rows of one call of `point` (call < 0: all calls concatenated in order).
  // Throws RunError when a snapshot's bytes no longer match its fingerprint, or nothing was
  // captured.
  at::Tensor get(const std::string& point, int64_t call = -1) const;
  // Re-hashes every snapshot; throws RunError naming the first that changed.
  void verify() const;
  void clear() { snapshots_.clear(); }

 private:
  // Tests only (tests/unit/test_capture.cpp): detaches a planned point's hook, the one way to make
  // a planned point not fire, so the never-fired check in run() can be exercised.
  friend struct SafeCapturerTestPeer;
  Model& model_;
  CaptureOptions options_;
  std::vector<PointInfo> plan_;
  std::vector<HookHandle> handles_;
  std::vector<Snapshot> snapshots_;
  at::Tensor row_index_;   // flat b*T + t of the selected tokens of the current batch
  bool all_rows_ = false;  // row_index_ is every token in order (no padding, all positions)
  std::vector<int64_t> row_seq_, row_pos_;
};

}  // namespace actcap
