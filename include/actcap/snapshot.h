// Snapshots of borrowed tensors for producers outside actcap's engine: the Python package's
// SafeCapturer over any torch.nn.Module (python/), or a LibTorch program's own hooks. The same
// copy the engine's SafeCapturer makes (capture.h): rows selected and copied on the producing
// device and its current stream into fresh memory, then moved to a stable device; an accelerator's
// copy to the host is asynchronous, into pinned memory, and fenced by an event before anything
// reads it; every snapshot is fingerprinted (chunked XXH3) once its bytes are final and re-checked
// on every read.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actcap/capture.h"

namespace actcap {

struct PendingCopy;  // an accelerator -> host copy in flight (snapshot.cpp)
// An empty DeviceIndex (src/capture/device_index.h).
std::shared_ptr<DeviceIndex> new_device_index();

// The rows of a [batch, seq, ...] tensor a capture keeps, in (sequence, position) order: flat
// indices b * seq + t, with each row's sequence and position. A position counts the real tokens
// of its sequence from 0, wherever the padding is.
struct RowSelection {
  int64_t batch = 0, seq = 0;
  at::Tensor index;  // int64 [rows] on the CPU
  std::vector<int64_t> row_seq, row_pos;
  // The token id of each row (__rows__.token); empty when the ids were not given.
  std::vector<int64_t> row_token;
  bool all = false;  // every (b, t) in order: the copy needs no gather
  int64_t rows() const { return static_cast<int64_t>(row_seq.size()); }
  // `index` on `device`, for a gather queued on that device's current stream. On an accelerator,
  // copied from pinned memory without waiting, once per stream (later calls, from any thread,
  // return that copy): a blocking copy from pageable memory would stall the host on the stream in
  // every hook.
  at::Tensor index_on(c10::Device device) const;

  // From an attention mask [batch, seq] (nonzero = real token; left, right or any padding): the
  // positions `positions` selects among each sequence's real tokens. InputError for a mask that
  // is not 2-D.
  // With `ids` (integer, the mask's shape), each row's token id too (InputError for another shape).
  // `window` > 0: the tensor holds only the mask's last `window` columns, as in a decoding step
  // with a KV cache (the mask covers the cached tokens and the new ones, the tensor the new ones):
  // `positions` still selects among each whole sequence's real tokens and row_pos counts from its
  // start, but only the selected tokens inside the window become rows (index b * window + column
  // in the window); `ids`, when given, are [batch, window].
  static RowSelection from_mask(const at::Tensor& attention_mask, const PositionSpec& positions,
                                const at::Tensor& ids = {}, int64_t window = 0);
  // Every sequence `seq` tokens long, no padding; `ids` [batch, seq] as for from_mask.
  static RowSelection dense(int64_t batch, int64_t seq, const PositionSpec& positions,
                            const at::Tensor& ids = {});

  // Every selection, built by from_mask/dense or by hand, caches index_on's copies (a selection
  // without the cache would copy the index in every hook, blocking). Copies of a selection share
  // it; an entry is used only for the very `index` tensor, unmodified, it was made from.
  std::shared_ptr<DeviceIndex> device_index = new_device_index();
};

// The copy every capture makes of a borrowed tensor: `rows` of `borrowed` (flattened over its
// first two dimensions; null = the whole tensor) in `dtype`, in fresh memory on the producing
// device, then on `stable`. `fingerprint`: the chunked XXH3 of the result (0 when not asked for,
// or when the copy is still in flight: see `pending`). Never a view of `borrowed`.
struct SnapshotCopy {
  at::Tensor rows;
  uint64_t xxh3 = 0;
  // An accelerator -> host copy still in flight: wait() on it before reading `rows`.
  std::shared_ptr<PendingCopy> pending;
};
SnapshotCopy snapshot_copy(const at::Tensor& borrowed, const RowSelection* rows,
                           c10::ScalarType dtype, c10::Device stable, bool fingerprint);
// Waits for an asynchronous snapshot_copy (a no-op for a finished one).
void wait(PendingCopy& pending);

// RunError naming the point and call when a fingerprinted snapshot's bytes changed since capture.
void check_snapshot(const Snapshot& s, bool fingerprinted);
// The kept snapshots of `point` (call < 0: every call, in order), each checked as above, stacked
// along rows (RunError when the calls' shapes do not stack); undefined when none matches.
at::Tensor read_snapshots(const std::vector<Snapshot>& snapshots, const std::string& point,
                          int64_t call, bool fingerprinted);

struct SnapshotStoreOptions {
  c10::Device stable_device = c10::kCPU;
  std::optional<c10::ScalarType> dtype;  // floating tensors are cast to it; integers stay
  std::optional<uint64_t> budget_bytes;  // snapshots kept at once
  bool fingerprint = true;
};

// Every call of every point, kept with its index. Reads (get, verify, snapshots) first fence: they
// wait for the copies still in flight and fingerprint them.
class SnapshotStore {
 public:
  explicit SnapshotStore(SnapshotStoreOptions options = {});
  ~SnapshotStore();  // waits for copies in flight: their memory must outlive them
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  const SnapshotStoreOptions& options() const { return options_; }

  // Snapshots `borrowed` as call N of `point` (returned), part of forward `step`. With `rows`,
  // `borrowed` must be [rows->batch, rows->seq, ...] (InputError naming the point and the shapes
  // otherwise) and only those rows are kept. RunError, keeping nothing, when the snapshot would
  // take the store over its budget.
  int64_t capture(const std::string& point, const at::Tensor& borrowed,
                  std::shared_ptr<const RowSelection> rows, int64_t step);

  // Waits for every copy in flight and fingerprints it; returns how many had not landed yet.
  int64_t fence();
  // Verified read (fenced): the rows of call `call` of `point`, or (call < 0) all its calls
  // concatenated in order. RunError when nothing matches or a snapshot's bytes changed.
  at::Tensor get(const std::string& point, int64_t call = -1);
  // Re-hashes every snapshot (fenced); RunError naming the first that changed.
  void verify();
  const std::vector<Snapshot>& snapshots();  // fenced
  // The row selection a snapshot was taken with (null: the whole tensor).
  const std::shared_ptr<const RowSelection>& selection(size_t snapshot) const;

  std::vector<std::string> points() const;  // of the kept snapshots, in first-capture order
  // Calls of `point` since the store was created (clear() keeps counting).
  int64_t calls(const std::string& point) const;
  uint64_t bytes() const { return bytes_; }
  int64_t in_flight() const;
  void clear();  // drops every snapshot (fenced)

 private:
  SnapshotStoreOptions options_;
  std::vector<Snapshot> snapshots_;
  std::vector<std::shared_ptr<const RowSelection>> selections_;
  std::vector<std::shared_ptr<PendingCopy>> pending_;  // parallel to snapshots_ (null: done)
  std::map<std::string, int64_t> calls_;
  uint64_t bytes_ = 0;
};

}  // namespace actcap
