// The module tree every architecture is built from. A Module has an HF name; call() runs its
// hooks around forward(), so hooks live in exactly one place and cost one pointer test when none
// is registered.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actcap/hooks.h"
#include "models/parts/fp8.h"

namespace actcap {

struct KvCache;  // kv_cache.h

// Per-forward state shared by every module on one device: sizes, positions, masks, and the
// tables parts compute once per forward (RoPE cos/sin), kept by the part that owns them.
struct ForwardState {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t step = 0;
  BareRefPolicy bare_ref = BareRefPolicy::kError;
  // Points the guard already warned about (kWarn warns once per point and model); null: warn on
  // every call.
  std::set<std::string>* bare_ref_warned = nullptr;
  at::Tensor positions;  // [T] int64: 0..T-1
  // Cached decoding (src/generate/): the position of each row's tokens, [B, T] int64 (undefined:
  // `positions` for every row), the cache the attention modules write their keys and values into
  // (null: none), and how many cached positions the keys span (max position + 1).
  at::Tensor row_positions;
  KvCache* kv = nullptr;
  int64_t kv_len = 0;
  // The sequence length RoPE scaling sees: HF's max(position_ids) + 1.
  int64_t rope_len = 0;
  at::Tensor causal_bias;                     // [T, T] compute dtype: 0 where visible, -inf not
  std::map<int64_t, at::Tensor> window_bias;  // sliding-window variants, by window size
  // Arena slot the running stage writes its output into (undefined: allocate). Set by the
  // executor for each stage; blocks write their final residual sum here.
  at::Tensor stage_out;
  // The dtype activations are computed in (Model::compute_dtype()).
  at::ScalarType compute = at::kFloat;
  // The running lane's conversion scratch (compute dtype, at least as large as the largest matrix
  // of the stage stored in another dtype; set by the executor for each stage, undefined when the
  // stage has none).
  at::Tensor widen_scratch;

  // `w` in the compute dtype: itself when it is in it; a matrix converted into widen_scratch
  // (valid until the next call: use it before converting another weight); a vector (bias, norm
  // weight) or, without scratch, anything else as a fresh tensor.
  at::Tensor in_compute(const at::Tensor& w);
  // A linear layer's weight in the compute dtype: as above, or its FP8 codes decoded into
  // widen_scratch (the same validity).
  at::Tensor in_compute(const LinearWeight& w);

  // a + b, into the arena slot when one is set (only the stage-level module may call this).
  at::Tensor residual_add(const at::Tensor& a, const at::Tensor& b) {
    if (!stage_out.defined()) return a + b;
    return at::add_out(stage_out, a, b);
  }

  // Additive attention bias for full causal attention or a sliding window: [T, T], or with
  // row_positions [B, 1, T, kv_len] (each row sees its cached keys up to its own position).
  const at::Tensor& bias(std::optional<int64_t> window);

  // Tables `owner` computes once per forward (make() runs on first use; layers sharing an owner
  // share the tables).
  template <typename F>
  const std::vector<at::Tensor>& table(const void* owner, F make) {
    auto it = tables_.find(owner);
    if (it == tables_.end()) it = tables_.emplace(owner, make()).first;
    return it->second;
  }

 private:
  std::map<const void*, std::vector<at::Tensor>> tables_;
};

struct HookEntry {
  int64_t id;
  HookFn fn;
  int64_t calls = 0;
};

struct ModuleHooks {
  std::vector<HookEntry> pre;   // observe the input (`NAME:input`)
  std::vector<HookEntry> post;  // observe the output (`NAME`)
};

class Module {
 public:
  // `name` empty: a structural unit with no hook point of its own (e.g. GPT-2's embedding sum).
  Module(std::string name, PointInfo in, PointInfo out);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }
  const PointInfo& input_point() const { return in_; }
  const PointInfo& output_point() const { return out_; }
  bool has_points() const { return !name_.empty(); }
  // A point that is no Hugging Face module (an attention module's `:scores` / `:probs`, Tap): it
  // has no `:input` and is not named in device maps.
  virtual bool is_tap() const { return false; }
  // The output is float32 whatever the compute dtype (DeepSeek-V3's router logits, as in
  // transformers); other floating outputs are in the compute dtype.
  virtual bool float32_output() const { return false; }

  at::Tensor call(const at::Tensor& x, ForwardState& st) {
    if (!hooks_) return forward(x, st);
    return call_hooked(x, st);
  }

  // This module and its descendants in execution order.
  void collect(std::vector<Module*>& out);
  // Moves parameters to a physical device (no-op when already there).
  void to_device(c10::Device device);
  // Bytes of the parameters this module and its descendants hold, in their stored dtype (tied
  // weights counted where held).
  uint64_t parameter_bytes() const;
  // Keys and values an attention module here or below caches per token (kv_heads * head_dim * 2,
  // summed): what a KV cache costs per position and sequence.
  virtual int64_t kv_elements_per_token() const;
  // Elements of the largest matrix here or below held in a floating dtype other than `compute`
  // (0 when none), or decoded from a packed one (FP8 weights, MXFP4 experts): the scratch Linear
  // converts such weights into must hold this many.
  virtual int64_t widen_elements(at::ScalarType compute) const;
  ModuleHooks& hooks();  // creates the lists on first use
  // Whether a hook is registered on this module (its output or its :input).
  bool hooked() const;
  void drop_hooks_if_empty();

 protected:
  virtual at::Tensor forward(const at::Tensor& x, ForwardState& st) = 0;
  template <typename M>
  M* add(std::unique_ptr<M> child) {
    M* raw = child.get();
    children_.push_back(std::move(child));
    return raw;
  }
  // Registers a parameter tensor (a member of the derived module; undefined = absent) so
  // to_device() moves it and parameter_bytes() counts it.
  // `widened`: forward() converts it whole when its dtype is not the compute dtype (Linear), so a
  // matrix sizes the conversion scratch; lookup tables that convert only the rows they gather pass
  // false.
  void parameter(at::Tensor& t, bool widened = true) {
    parameters_.push_back(&t);
    use_.push_back(widened ? Use::kConverted : Use::kAsIs);
  }
  // A linear layer's weight: its dense matrix (converted), or FP8 codes (each decoded into the
  // scratch as it runs: it sizes the scratch whatever the compute dtype) and their scales.
  void parameter(LinearWeight& w) {
    parameter(w.dense);
    parameters_.push_back(&w.fp8.codes);
    use_.push_back(Use::kDecoded);
    parameter(w.fp8.scales, false);
  }

 private:
  at::Tensor call_hooked(const at::Tensor& x, ForwardState& st);
  std::string name_;
  PointInfo in_, out_;
  std::vector<std::unique_ptr<Module>> children_;
  std::vector<at::Tensor*> parameters_;
  enum class Use : uint8_t { kConverted, kAsIs, kDecoded };
  std::vector<Use> use_;                // per parameter, see parameter()
  std::shared_ptr<ModuleHooks> hooks_;  // null when no hook: call() stays one test
};

// A hook point inside a module's forward, named `MODULE:KIND` (attention patterns): call() with the
// tensor to show; forward() returns it unchanged. Only its output is a point. The owner builds the
// tensor only when hooked() says someone looks, so an unobserved tap costs one pointer test.
class Tap : public Module {
 public:
  Tap(const std::string& name, std::vector<int64_t> shape)
      : Module(name, PointInfo{"", {}, at::kFloat}, PointInfo{name, std::move(shape), at::kFloat}) {
  }
  bool is_tap() const override { return true; }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState&) override { return x; }
};

// Point descriptions for the common cases.
PointInfo hidden_point(const std::string& name, int64_t width);
PointInfo ids_point(const std::string& name);

// ---- leaf modules (norms, attention, MLPs and blocks: models/parts/)
// ----------------------------------------------

class Linear : public Module {
 public:
  // weight [out, in] (PyTorch nn.Linear layout; dense or FP8 codes), bias [out] or undefined.
  Linear(const std::string& name, LinearWeight weight, at::Tensor bias);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  LinearWeight weight_;
  at::Tensor bias_;
};

// weight[ids] in `dtype`: the table is looked up as stored and only the gathered rows are converted
// (Embedding, ScaledEmbedding).
at::Tensor embedding_rows(const at::Tensor& weight, const at::Tensor& ids, at::ScalarType dtype);

class Embedding : public Module {
 public:
  Embedding(const std::string& name, at::Tensor weight);
  const at::Tensor& weight() const { return weight_; }

 protected:
  at::Tensor forward(const at::Tensor& ids, ForwardState& st) override;

 private:
  at::Tensor weight_;
};

// HF ACT2FN by name: gelu_new / gelu_pytorch_tanh / gelu_fast (tanh GELU), gelu, relu, silu/swish.
class Activation : public Module {
 public:
  Activation(const std::string& name, const std::string& kind, int64_t width);
  // The function itself, without hooks (what forward() returns).
  at::Tensor apply(const at::Tensor& x) const;

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  enum class Kind { kGeluTanh, kGelu, kRelu, kSilu } kind_;
};

}  // namespace actcap
