// `actcap repro`: the seed's minimal reproduction, run for real in this engine. A GPT-2-style model
// with 12 blocks (or another architecture's tiny preset with 12 layers) is split over N virtual
// devices and run for two steps in inference mode while hooks capture every block output four
// ways; each capture is compared with the block's true output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace actcap {

struct ReproResult {
  std::string name;  // naive | guarded | clone | safe
  int devices = 1;
  int64_t mismatched = -1;  // captures differing from the true output; -1 when the run stopped
  int64_t total = 0;        // captures compared
  double max_abs_err = 0.0;
  std::string error;  // the run's error, empty when it completed
};

// arch: an architecture as `init-model --arch` names it; InputError for an unknown one.
std::vector<ReproResult> run_repro(const std::vector<int>& device_counts,
                                   const std::string& arch = "gpt2");

}  // namespace actcap
