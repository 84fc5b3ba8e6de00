// Weights named once: a builder asks a WeightSource for each weight by its name relative to the
// module being built, its shape as stored and how a fresh one is initialised, as it builds
// (candle's VarBuilder: vb.pp("model").pp("layers").pp(i)). The same walk
//   - loads a checkpoint: finds each tensor (or an alias), checks dtype and shape, converts to
//     float32 (16-bit matrices may stay as stored: keep_16bit), and afterwards names the tensors
//     nothing asked for;
//   - makes init-model's deterministic random weights, exactly the names the builder asks for;
//   - records the specs (name, shape, init), which tests and tools list.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actcap/config.h"
#include "models/parts/fp8.h"

namespace actcap {

enum class Init {
  kMatrix,  // N(0, 0.02) as HF's _init_weights
  kBias,    // N(0, 0.02): HF zeroes biases; perturbed so tests see a wrong bias
  kGain,    // 1 + N(0, 0.02): HF uses ones; perturbed for the same reason
};

enum class Layout {
  kAsStored,
  kTransposed,  // GPT-2 Conv1D stores [in, out]; modules get nn.Linear's [out, in] as a view
};

struct WeightSpec {
  std::string name;            // canonical HF name
  std::vector<int64_t> shape;  // as stored in the checkpoint
  Init init = Init::kMatrix;
};

// The deterministic random float32 weight init-model writes for `spec` under `seed` (what
// WeightSource::random() hands out): the same bytes on every build and thread count.
at::Tensor random_weight(uint64_t seed, const WeightSpec& spec);

class WeightSource {
 public:
  // Weights from a checkpoint's tensors (any floating dtype); `origin` names it in errors.
  // keep_16bit: BF16/F16 matrices (2 or more dimensions) are returned as stored, for Linear and
  // Embedding to widen as they run (WeightsDtype::kKeep); vectors are float32 either way.
  // `fp8` (an "fp8" quantization_config): a tensor of one-byte codes with a `<name>_scale_inv`
  // beside it is an FP8 weight (models/fp8_weights.h), decoded by get() to the checkpoint's dtype
  // (then held as a 16-bit one), or kept packed by get_linear() under keep_16bit.
  static WeightSource load(const std::map<std::string, at::Tensor>& tensors, std::string origin,
                           bool keep_16bit = false, std::optional<Fp8Weights> fp8 = {});
  // Deterministic random weights (init-model, the demo model): the same seed gives the same bytes
  // on every build, whatever LibTorch's RNG; `stored` is the dtype stored() returns them in.
  static WeightSource random(uint64_t seed, at::ScalarType stored = at::kFloat);
  // Uninitialised tensors of the right shapes, for walking a model's weights without their values
  // (counting parameters): nothing is read or written.
  static WeightSource shapes();

  // The same source under a longer prefix: pp("model").pp("layers").pp(3) asks for
  // "model.layers.3.<name>".
  WeightSource pp(const std::string& part) const;
  WeightSource pp(int64_t index) const;
  const std::string& prefix() const { return prefix_; }
  // The module name the prefix stands for: "model.layers.3" for "model.layers.3.".
  std::string path() const { return prefix_.empty() ? "" : prefix_.substr(0, prefix_.size() - 1); }

  // The weight `name` (relative to the prefix), stored with `shape`: float32, or as stored for a
  // 16-bit matrix under keep_16bit. `aliases` are other
  // full names it may be stored under (a tied lm_head.weight). Throws InputError naming the tensor
  // and the checkpoint when it is missing, not floating point or of another shape.
  at::Tensor get(const std::string& name, const std::vector<int64_t>& shape,
                 Init init = Init::kMatrix, Layout layout = Layout::kAsStored,
                 const std::vector<std::string>& aliases = {});

  // A linear layer's weight [out, in]: what get() returns, or an FP8 weight's codes and scales as
  // stored when weights stay stored (keeps_stored()), for the layer to decode as it runs.
  LinearWeight get_linear(const std::string& name, const std::vector<int64_t>& shape);

  // A packed weight (MXFP4 blocks and scales: uint8) as stored, of exactly `dtype` and `shape`:
  // never converted. Only for a layout the checkpoint holds (has()): random() and shapes() make
  // the unpacked layout.
  at::Tensor get_packed(const std::string& name, const std::vector<int64_t>& shape,
                        at::ScalarType dtype);
  // Whether weights stay in their stored form (load(..., keep_16bit = true)): packed ones are then
  // decoded as they run, else at load.
  bool keeps_stored() const;
  // Whether the checkpoint holds `name` (relative to the prefix), under it or a prefix alias: for
  // an architecture whose checkpoints come in two layouts. Always false for random() and shapes(),
  // which make the layout the builder asks for first.
  bool has(const std::string& name) const;

  // Every name beginning with `prefix` may also be stored with `alternative` in its place (GPT-2's
  // hub checkpoint stores `h.0.attn...` without the `transformer.` prefix).
  void alias_prefix(const std::string& prefix, const std::string& alternative);
  // Tensors ending with `suffix` are buffers, not weights: present or not, never reported.
  void ignore_suffix(const std::string& suffix);
  // Tensors beginning with `prefix` belong to parts actcap does not run (a multimodal checkpoint's
  // vision tower): present or not, never reported.
  void ignore_prefix(const std::string& prefix);

  // After the build: warns (actcap::warn) about checkpoint tensors nothing asked for.
  void warn_unused() const;
  // What the builder asked for, in order.
  const std::vector<WeightSpec>& specs() const;
  // random(): the weights in checkpoint layout and the stored dtype, by name.
  const std::map<std::string, at::Tensor>& stored() const;

 private:
  struct State;
  WeightSource(std::shared_ptr<State> state, std::string prefix);
  std::shared_ptr<State> state_;
  std::string prefix_;
};

}  // namespace actcap
