// Execution across devices: each top-level stage runs on its planned device; at a device boundary
// the hidden state is copied into the next device's arena and (by default) verified.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actcap/devices.h"

namespace actcap {

// Test-only fault injection: damage the copies over chosen links. The CLI reads them from
// ACTCAP_FAULT:
//   transfer:SRC->DST:bitflip | zeros          corrupt every transfer of that ordered pair
//   transfer:SRC->DST:bitflip-once | zeros-once corrupt only the first (the retry then succeeds)
//   transfer:SRC->DST:bitflip-direct | zeros-direct (also with -once) corrupt only direct copies:
//                                               copies staged through host memory arrive intact
//                                               (a broken peer-to-peer link)
// Several faults may be separated by ';'.
struct TransferFault {
  DeviceId src, dst;
  enum class Kind { kBitflip, kZeros } kind;
  bool once = false;
  bool direct_only = false;  // host-staged copies are not damaged
  int64_t fired = 0;         // copies damaged so far
};

// Test-only faults of the asynchronous execution (docs/execution.md), read by the CLI from
// ACTCAP_FAULT together with the transfer faults:
//   delay:copy:MS            every copy (boundary transfer, capture copy) first sleeps MS ms
//   delay:stage:MS           every stage first sleeps MS ms
//   nofence:transfer-out     a boundary copy after a block does not wait for that block
//   nofence:transfer-in      a stage after a boundary does not wait for the copy of its input
//   nofence:capture-read     reads of captures (get, verify, export) do not wait for their copies
//   nofence:capture-source   a capture copy reads the borrowed tensor itself, later, instead of a
//                            snapshot taken on the producer's queue when the hook ran
// With a delay, each removed fence makes wrong values (tests/unit/test_async.cpp shows it); the
// fences are what make them exact.
struct AsyncFaults {
  int delay_copy_ms = 0, delay_stage_ms = 0;
  bool nofence_transfer_out = false, nofence_transfer_in = false;
  bool nofence_capture_read = false, nofence_capture_source = false;
  bool any() const;
};

struct ExecutionOptions {
  std::vector<DeviceId> stage_device;    // one per stage; empty = everything on `cpu`
  std::map<DeviceId, uint64_t> budgets;  // enforced on weights + arena; absent = unlimited
  bool verify_transfers = true;          // checksum both sides of every inter-device copy
  std::vector<TransferFault> faults;     // test-only (above); Model::placement() counts `fired`
  AsyncFaults async_faults;              // test-only (above)
  // Links (ordered device pairs) whose copies go through host memory from the first transfer on:
  // direct copies over them arrived corrupted when probed (split_model fills it from the plan). A
  // link whose direct copy arrives corrupted during a run is added for the rest of the run.
  std::vector<std::pair<DeviceId, DeviceId>> host_routes;
  // Capture copies a device may have in flight (bytes): a hook that would go over waits for the
  // oldest to land (back-pressure: it blocks, never drops; DeviceStats::copy_waits counts it). 0:
  // no copy queued at all: each capture is copied to the host inside its hook, blocking.
  uint64_t copy_window_bytes = uint64_t{256} << 20;
};

struct DeviceStats {
  DeviceId device;
  uint64_t weight_bytes = 0;
  uint64_t arena_bytes = 0;  // current arena reservation
  uint64_t peak_bytes = 0;   // weights + largest arena reservation seen
  int64_t slot_reuses = 0;   // times an arena slot was handed out again (memory reused)
  int64_t transfers_in = 0;
  uint64_t bytes_in = 0;
  // Capture copies queued on the device's capture queue, their bytes, and the times a hook waited
  // for room in the copy window (ExecutionOptions::copy_window_bytes).
  int64_t capture_copies = 0;
  uint64_t capture_bytes = 0;
  int64_t copy_waits = 0;
};

struct TransferStats {
  int64_t transfers = 0;
  int64_t verified = 0;
  int64_t retried = 0;   // mismatches repaired by the host-staged retry
  int64_t injected = 0;  // copies damaged on purpose by a TransferFault (test-only)
  int64_t via_host = 0;  // copies sent through host memory because their link is routed there
  uint64_t bytes = 0;
};

// Parse the ACTCAP_FAULT syntax above: the transfer faults, and the delays and removed fences. Each
// skips the other's items and throws InputError (setting "transfer_faults") for a malformed one.
std::vector<TransferFault> parse_faults(const std::string& text);
AsyncFaults parse_async_faults(const std::string& text);
// The links (ordered device pairs) a forward over stages placed on `stage_device`, in order,
// crosses. Throws InputError when a fault names a link that is not one of them, naming it and the
// links there are: such a fault could never fire, so a test relying on it would prove nothing.
void check_fault_links(const std::vector<TransferFault>& faults,
                       const std::vector<DeviceId>& stage_device);

}  // namespace actcap

namespace actcap {

// `actcap doctor`: copies test patterns of several sizes between every ordered pair of devices
// and checks every byte arrived (the peer-to-peer probe behind "only with 3+ GPUs" reports).
struct LinkResult {
  uint64_t bytes = 0;
  bool ok = false;
  bool retried = false;  // first copy was damaged, the host-staged retry was intact
  std::string detail;
  bool host_ok = true;  // a copy staged through host memory arrived intact
  std::string host_detail;
};
struct LinkProbe {
  DeviceId src, dst;
  std::vector<LinkResult> results;
  bool ok() const;       // every copy arrived intact (directly or by the retry through the host)
  bool host_ok() const;  // every copy through host memory arrived intact
};
std::vector<LinkProbe> probe_links(const std::vector<DeviceId>& devices,
                                   const std::vector<uint64_t>& sizes = {4096, 1 << 20, 16 << 20},
                                   std::vector<TransferFault> faults = {});

}  // namespace actcap
