// Inter-device copies with end-to-end verification.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "actcap/executor.h"

namespace actcap {

// Fingerprint of a tensor's bytes computed where it lives: XXH3-64 on CPU, a position-weighted
// integer reduction on accelerators (so no host copy is needed to check a device-side buffer).
uint64_t device_fingerprint(const at::Tensor& t);

struct TransferRequest {
  const at::Tensor* src;
  at::Tensor dst;  // preallocated destination (arena slot) on the target device
  DeviceId from, to;
  std::string into;  // the stage that will read it, for error messages
  bool verify = true;
  bool via_host = false;  // stage through host memory instead of a direct copy
};

// Copies src into dst (directly, or through host memory with `via_host`). When verifying, a
// mismatch is retried once through host staging; a second mismatch throws RunError (exit 1) naming
// the stage and the device pair. Returns true when a direct copy arrived corrupted and the
// host-staged retry intact: the caller routes the link through the host.
bool transfer(const TransferRequest& req, std::vector<TransferFault>& faults, TransferStats& stats);

}  // namespace actcap
