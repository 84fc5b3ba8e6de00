// `actcap repro`: the seed's minimal reproduction, run for real in this engine. A GPT-2-style model
// with 12 blocks (or another architecture's tiny preset with 12 layers) is split over N virtual
// devices and run for two steps in inference mode while hooks capture every block output four
// ways; each capture is compared with the block's true output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actcap/devices.h"

namespace actcap {

struct ReproResult {
  std::string name;  // naive | guarded | clone | safe
  int devices = 1;
  std::string
      device_list;  // the devices the blocks were split over: "cpu", "cpu:0,cpu:1", "cuda:0"
  int64_t mismatched = -1;  // captures differing from the true output; -1 when the run stopped
  int64_t total = 0;        // captures compared
  double max_abs_err = 0.0;
  std::string error;  // the run's error, empty when it completed
};

// arch: an architecture as `init-model --arch` names it; InputError for an unknown one. A device
// count N is plain `cpu` for 1, else N virtual CPU devices.
std::vector<ReproResult> run_repro(const std::vector<int>& device_counts,
                                   const std::string& arch = "gpt2");
// The same over named devices, one list per run, the blocks split evenly over its devices in order
// (`cuda:0`, `cuda:0,cpu:1,cpu:2`); InputError for a device this machine cannot run. On a GPU the
// truth is copied in each hook on the block's stream, so every comparison is still bit for bit.
std::vector<ReproResult> run_repro_on(const std::vector<std::vector<DeviceId>>& device_maps,
                                      const std::string& arch = "gpt2");

}  // namespace actcap
