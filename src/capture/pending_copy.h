// A snapshot's copy to the host still in flight, and the copy the engine's hooks queue on their
// lane (streams.h). Internal to src/capture/.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "actcap/snapshot.h"
#include "executor/streams.h"

namespace actcap {

struct PendingCopy {
  // snapshot_copy() from an accelerator outside the engine: an event after the copy on the
  // producer's stream.
  std::optional<c10::Event> event;
  // snapshot_copy_on_lane(): the capture queue's marker after the copy.
  Marker landed;
  at::Tensor source;  // the device-side rows the copy reads, kept alive until it finished
  // Accelerator lanes: device_hash() of the source, computed on the device, and its host copy.
  at::Tensor device_hash, host_hash;
  // Virtual lanes: the copy fingerprints the bytes as it copies them. Accelerator lanes: the lane's
  // check worker fingerprints the host copy once it landed, and recomputes the device hash over it
  // (`recomputed`, compared with `host_hash` by finish_copy); done when `checked` completed.
  uint64_t xxh3 = 0;
  bool hashed = false;
  Marker checked;
  uint64_t recomputed = 0;
  bool host_checked = false;
  std::exception_ptr error;  // a copy that failed
  // False from when snapshot_copy_on_lane() queued the copy until its work ran: a queue stops
  // running work after a failed wait (streams.h), so a copy can land without having run.
  bool ran = true;
  bool fenced = true;  // false only under the test fault nofence:capture-read
};

// Called by a hook running on `lane`'s compute queue: snapshots `rows` of `borrowed` in `dtype`
// on the producer's queue (fresh device memory: never a view of `borrowed`), then queues the copy
// to host memory (pinned from an accelerator) on the lane's capture queue, after waiting for room
// in the lane's copy window. The result's rows are final once `pending` was finished (below).
SnapshotCopy snapshot_copy_on_lane(const LaneContext& lane, const at::Tensor& borrowed,
                                   const RowSelection* rows, c10::ScalarType dtype,
                                   bool fingerprint);
// Whether `pending` had not landed yet (a later wait() will block).
bool in_flight(const PendingCopy& pending);
// Whether a hook on `lane` keeping snapshots on `stable` copies through the lane's capture queue (a
// virtual CPU or accelerator lane, snapshots on the host).
bool copies_on_lane(const LaneContext* lane, c10::Device stable);

// Waits for `pending` (unless unfenced), checks an accelerator copy's device hash against the host
// bytes (RunError naming `point` and `call` on a mismatch) and returns the XXH3 fingerprint of
// `rows` (0 when `fingerprint` is off).
uint64_t finish_copy(PendingCopy& pending, const at::Tensor& rows, bool fingerprint,
                     const std::string& point, int64_t call);
// finish_copy() of every copy still in `pending` (parallel to `snapshots`, null: finished), each
// snapshot's fingerprint filled in; returns how many had not landed yet. The fence of SafeCapturer
// and SnapshotStore.
int64_t finish_copies(std::vector<Snapshot>& snapshots,
                      std::vector<std::shared_ptr<PendingCopy>>& pending, bool fingerprint);

}  // namespace actcap
