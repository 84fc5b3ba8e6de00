// SafeCapturer: capture that is safe against the hazards docs/safety.md lists. It resolves
// hook-point patterns to a plan before anything runs (loud on zero matches), copies each captured
// tensor inside the hook on the producing device (never keeps the borrowed one), moves the copy to
// a stable device, keeps every call with its index, fingerprints each snapshot when it is taken
// and re-checks the fingerprint on every read.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actcap/model.h"
#include "actcap/observer.h"

namespace actcap {

struct RowSelection;  // snapshot.h
struct PendingCopy;   // src/capture/pending_copy.h
class DeviceIndex;    // src/capture/device_index.h

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
  // Attention patterns (`NAME:scores`, `NAME:probs`): the key positions each query row stores
  // (the longest sequence a forward of the run attends over; required when such a point is
  // captured), and the heads kept, in the order given (empty: every head). Keys a query cannot see
  // (later positions, padding, outside its window, past the forward's keys) hold probability 0 and
  // score -inf.
  int64_t attention_keys = 0;
  std::vector<int64_t> attention_heads;
};

// True for an attention pattern point (`NAME:scores` or `NAME:probs`).
bool is_attention_point(const std::string& name);
// Parses "0,3,7" (the --heads list): distinct non-negative head indices (InputError otherwise).
std::vector<int64_t> parse_heads(const std::string& text);

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

// An observer (observer.h) of the planned points: once constructed, every forward of the model
// captures, run() or a plain Model::forward, until the capturer is destroyed.
class SafeCapturer : public Observer {
 public:
  // Attaches to `model`. Throws InputError when a pattern matches no point (listing the nearest
  // names).
  SafeCapturer(Model& model, CaptureOptions options);
  ~SafeCapturer() override;  // detaches
  SafeCapturer(const SafeCapturer&) = delete;
  SafeCapturer& operator=(const SafeCapturer&) = delete;

  // Points that will be captured, in model order, with the dtype they will be stored in.
  const std::vector<PointInfo>& plan() const { return plan_; }
  int64_t bytes_per_token() const;
  // Bytes the snapshots of `batch` will take; throws InputError when over the budget.
  uint64_t check_budget(const Batch& batch) const;
  // The same for `rows` captured tokens.
  uint64_t checked_bytes_for_rows(uint64_t rows) const;

  // Every forward captures the selected real (unpadded) tokens of its batch in (sequence,
  // position) order: the positions CaptureOptions::positions selects, or these, given per
  // sequence (increasing, < its length), for the next forward only. They are checked, with the
  // budget, when that forward begins (InputError, and the forward does not run); a planned point
  // that never fired is a RunError when it ends.
  void set_positions(std::vector<std::vector<int64_t>> positions);

  // Runs one forward of `batch`, checking the budget and the positions before it runs. Throws
  // RunError if a planned point never fired. Returns what Model::forward returns: the logits,
  // unless `logits` lets it skip lm_head.
  at::Tensor run(const Batch& batch, Model::Logits logits = Model::Logits::kCompute);
  // As run(batch), with the positions to keep given per sequence (increasing, < its length). A
  // set_positions() still pending is dropped.
  at::Tensor run(const Batch& batch, const std::vector<std::vector<int64_t>>& positions,
                 Model::Logits logits = Model::Logits::kCompute);

  // Row provenance of the last forward: sequence index and position of each captured row.
  const std::vector<int64_t>& row_seq() const;
  const std::vector<int64_t>& row_pos() const;
  const std::vector<int64_t>& row_token() const;  // each row's token id

  // Fenced (see fence()).
  const std::vector<Snapshot>& snapshots() const;
  // Waits for the snapshot copies still in flight and fingerprints them; returns how many had not
  // landed yet. On a virtual CPU or accelerator device a hook only queues the copy of what it
  // captured on the device's capture queue (docs/execution.md); every read (get, verify, snapshots,
  // clear) fences first.
  int64_t fence() const;
  // Verified read: the rows of one call of `point` (call < 0: all calls concatenated in order).
  // Throws RunError when a snapshot's bytes no longer match its fingerprint, or nothing was
  // captured.
  at::Tensor get(const std::string& point, int64_t call = -1) const;
  // Re-hashes every snapshot; throws RunError naming the first that changed.
  void verify() const;
  void clear();  // fenced

 private:
  // Tests only (tests/unit/test_capture.cpp): stops observing a planned point, the one way to make
  // a planned point not fire, so the never-fired check can be exercised.
  friend struct SafeCapturerTestPeer;
  // The observer events: select the rows when a forward begins, copy them at each planned point,
  // check every planned point fired when it ends.
  void on_forward_begin(const ForwardBegin& event) override;
  void on_point(const HookContext& ctx, const at::Tensor& borrowed) override;
  void on_forward_end(const ForwardEnd& event) override;
  // CaptureOptions::positions for each sequence of `batch`.
  std::vector<std::vector<int64_t>> default_positions(const Batch& batch) const;
  // Checks `positions` against `batch` and the budget; makes them the rows the forward captures.
  void select_rows(const Batch& batch, const std::vector<std::vector<int64_t>>& positions);
  // Throws RunError naming the first planned point with no snapshot from `first` on.
  void check_all_fired(size_t first) const;

  Model& model_;
  CaptureOptions options_;
  std::vector<PointInfo> plan_;
  std::map<std::string, c10::ScalarType> dtype_;  // each planned point's stored dtype
  // The attention pattern points planned, with the heads they keep (a view shown to the hook is
  // cut to those heads and padded to attention_keys before its snapshot).
  std::map<std::string, bool> pattern_probs_;  // true: probabilities (pad 0), false: scores (-inf)
  at::Tensor heads_index_;                     // int64 on the CPU; undefined: every head
  std::shared_ptr<DeviceIndex> heads_on_device_;  // its copies on accelerator streams
  ObserverHandle handle_;
  // Mutable: a fence (in const reads) fills in the copies that landed.
  mutable std::vector<Snapshot> snapshots_;
  mutable std::vector<std::shared_ptr<PendingCopy>> pending_;  // parallel (null: landed)
  mutable int64_t in_flight_ = 0;
  std::optional<std::vector<std::vector<int64_t>>> next_positions_;  // set_positions()
  bool rows_selected_ = false;  // run() selected the rows of the forward it is starting
  bool forward_ended_ = false;  // the forward run() started reached its end event
  size_t forward_first_ = 0;    // snapshots_.size() when the current forward began
  // The selected tokens of the current batch (snapshot.h).
  std::unique_ptr<RowSelection> rows_;
};

}  // namespace actcap
