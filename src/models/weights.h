// Weight loading as a declarative table: each architecture lists the HF tensors it needs (name,
// HF shape, transform, init rule, other names it may be stored under) and the buffers to ignore.
// The same table drives loading, shape checks and `init-model`.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "actcap/config.h"

namespace actcap {

enum class Transform {
  kNone,
  kTranspose,  // GPT-2 Conv1D stores [in, out]; we use nn.Linear's [out, in] (as a transposed view)
};

enum class Init {
  kMatrix,  // N(0, 0.02) as HF's _init_weights
  kBias,    // N(0, 0.02): HF zeroes biases; perturbed so tests see a wrong bias
  kGain,    // 1 + N(0, 0.02): HF uses ones; perturbed for the same reason
};

struct WeightSpec {
  std::string name;            // canonical HF name (the engine looks it up by this)
  std::vector<int64_t> shape;  // shape as stored in the checkpoint
  Transform transform = Transform::kNone;
  Init init = Init::kMatrix;
  std::vector<std::string> aliases;  // other names the same tensor may be stored under
};

struct WeightPlan {
  std::vector<WeightSpec> specs;
  std::vector<std::string> ignored_suffixes;  // buffers that may be present and are not weights
};

WeightPlan gpt2_weight_plan(const Gpt2Config& c);
WeightPlan llama_weight_plan(const LlamaConfig& c);
WeightPlan weight_plan(const ModelConfig& c);

// Resolves every spec in `tensors` (checkpoint names), checks dtype (floating) and shape against
// the spec, converts to float32 on CPU and applies the transform. Returns canonical name -> tensor.
// Throws InputError naming the tensor, `origin` and the config field behind an expected shape.
// Unused tensors that are not ignored buffers are reported on stderr as one warning line.
std::map<std::string, at::Tensor> load_weights(const WeightPlan& plan,
                                               const std::map<std::string, at::Tensor>& tensors,
                                               const std::string& origin);

// Deterministic random tensors for every spec, in checkpoint layout and the given dtype.
// Independent of LibTorch's RNG so the same seed gives the same bytes on every build.
std::map<std::string, at::Tensor> init_weights(const WeightPlan& plan, uint64_t seed,
                                               at::ScalarType dtype);

}  // namespace actcap
