// The export path's test-only faults (ExportFaults, actcap/export.h) while a run uses them: which
// buffers to damage, and the kill moments counted across the threads that reach them.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "actcap/export.h"

namespace actcap {

class FaultPoints {
 public:
  explicit FaultPoints(ExportFaults faults = {}) : faults_(std::move(faults)) {}
  FaultPoints(const FaultPoints&) = delete;
  FaultPoints& operator=(const FaultPoints&) = delete;

  const ExportFaults& faults() const { return faults_; }
  // Counts this moment and kills the process with SIGKILL on the occurrence asked for.
  void reached(ExportFaults::Moment moment);

 private:
  ExportFaults faults_;
  // One count per moment (kStart is the last).
  std::atomic<int64_t> seen_[static_cast<int>(ExportFaults::Moment::kStart) + 1] = {};
};

// Whether `want` names shard `index`.
inline bool names_shard(const std::optional<int64_t>& want, int64_t index) {
  return want && *want == index;
}
// Flips the lowest bit of the last byte of `t` (a CPU tensor), in place.
void flip_last_byte(const at::Tensor& t);
// The same for the last byte of the file at `path`.
void flip_last_byte(const std::string& path);

}  // namespace actcap
