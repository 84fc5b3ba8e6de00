// A Hugging Face causal LM (GPT-2 or Llama family) loaded for inference, with hook points on every
// HF module name.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actcap/config.h"
#include "actcap/executor.h"
#include "actcap/hooks.h"
#include "actcap/planner.h"

namespace actcap {

class Module;
class HookRegistry;
class Executor;
class Observer;

// What a top-level stage (a unit a device map places) is. Every architecture builds, in order:
// one kEmbeddings, its kBlocks, one kFinalNorm and one kHead (lm_head).
enum class StageKind { kEmbeddings, kBlock, kFinalNorm, kHead };
const char* stage_kind_name(StageKind kind);  // "embeddings", "block", "final_norm", "head"

// A right-padded batch: ids [B, T] int64, lengths[b] real tokens in row b (positions >= lengths[b]
// are padding and never influence real positions).
struct Batch {
  at::Tensor ids;
  std::vector<int64_t> lengths;
  int64_t size() const { return static_cast<int64_t>(lengths.size()); }
  int64_t max_len() const;
  int64_t tokens() const;
  // Builds a batch; throws InputError for empty sequences or ids outside [0, vocab_size).
  static Batch from_sequences(const std::vector<std::vector<int64_t>>& seqs, int64_t vocab_size,
                              int64_t max_positions);
};

// Removes a hook. Handles are explicit (like PyTorch's RemovableHandle): dropping one keeps the
// hook registered; call remove(). Safe to call after the model is gone.
class HookHandle {
 public:
  HookHandle() = default;
  void remove();
  bool active() const;

 private:
  friend class Model;
  HookHandle(std::weak_ptr<HookRegistry> reg, int64_t id) : reg_(std::move(reg)), id_(id) {}
  std::weak_ptr<HookRegistry> reg_;
  int64_t id_ = -1;
};

// How weight matrices stored in 16 bits (BF16, F16) are held in memory. Either way every
// computation is float32 on the same values, so outputs are bit-identical.
enum class WeightsDtype {
  // As stored, memory-mapped from the checkpoint: resident once, at the file's size. Each matrix
  // is widened to float32 into one reused scratch per device just before its GEMM.
  kKeep,
  // Widened to float32 at load: twice the file's size in memory, no widening per forward.
  kF32,
};
// "keep" / "f32"; parse_weights_dtype throws InputError naming the choices.
const char* weights_dtype_name(WeightsDtype d);
WeightsDtype parse_weights_dtype(const std::string& name);

// The dtype the forward computes in (docs/execution.md, "16-bit compute"): kFloat (the default:
// every computation float32, 16-bit weights widened), kBFloat16 or kHalf (activations, GEMMs and
// residual sums in 16 bits with weights used in that dtype; norms, softmax and RoPE tables computed
// in float32 and rounded, as transformers does for a model loaded in that dtype). Hook points carry
// the compute dtype. float16 needs a device whose kernels have it (not Debian's CPU LibTorch 1.13).
// "f32" / "bf16" / "f16"; parse_compute_dtype throws InputError naming the choices.
const char* compute_dtype_name(c10::ScalarType dtype);
c10::ScalarType parse_compute_dtype(const std::string& name);

struct LoadOptions {
  WeightsDtype weights_dtype = WeightsDtype::kKeep;
  c10::ScalarType compute_dtype = c10::ScalarType::Float;
};

class Model {
 public:
  // `path` is a checkpoint directory or the built-in name "demo". Throws InputError on bad input.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& options = {});
  // Builds from config and tensors in HF layout and names (checkpoint or in-memory).
  static std::unique_ptr<Model> from_tensors(const ModelConfig& config,
                                             const std::map<std::string, at::Tensor>& tensors,
                                             const std::string& origin,
                                             const LoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const std::string& origin() const { return origin_; }
  // XXH3 over the weights as loaded (name, dtype, shape, bytes), 16 hex digits.
  const std::string& fingerprint() const { return fingerprint_; }
  // LoadOptions::compute_dtype: the dtype of every floating hook point and of the logits.
  c10::ScalarType compute_dtype() const { return compute_dtype_; }

  // Every hook point in execution order, outputs and `:input`s.
  std::vector<PointInfo> points() const;
  std::vector<std::string> point_names() const;

  // Points matching `pattern`, in model order. Throws InputError when nothing matches, listing the
  // nearest names.
  std::vector<PointInfo> resolve(const std::string& pattern) const;

  // Registers a hook on every point matching `pattern` (output points for forward hooks,
  // `:input` points for pre-hooks; a pattern ending in ":input" given to register_forward_hook
  // is routed to the pre-hook of that module). Throws InputError when nothing matches, listing
  // the nearest names.
  HookHandle register_forward_hook(const std::string& pattern, HookFn fn);
  HookHandle register_forward_pre_hook(const std::string& pattern, HookFn fn);
  // Number of hooks currently registered (observers' points included).
  size_t hook_count() const;

  // Attaches an observer (observer.h): every forward then tells it its events, and its on_point
  // sees each point matching one of `patterns` (routed as register_forward_hook routes them; a
  // point matched twice is seen once). Throws InputError when a pattern matches nothing. The
  // handle's remove() detaches it; so does destroying the observer.
  HookHandle attach_observer(Observer& observer, const std::vector<std::string>& patterns = {});

  // Whether forward runs lm_head. kSkipIfUnhooked leaves it out when no hook is registered on it
  // (lm_head or lm_head:input) and returns the final norm's output [B, T, hidden] instead: the
  // [hidden x vocab] GEMM is about a third of GPT-2 small's forward, and activation extraction
  // rarely needs logits.
  enum class Logits { kCompute, kSkipIfUnhooked };
  // Runs the model under c10::InferenceMode; returns logits [B, T, vocab] (compute dtype) on the
  // last stage's device, or the final norm's output (see Logits).
  at::Tensor forward(const Batch& batch, Logits logits = Logits::kCompute);

  // Places each stage on a device (weights move to accelerators; virtual CPU devices share host
  // memory and only account for it). Throws InputError for a wrong stage count, RunError when the
  // weights alone exceed a budget.
  void place(const ExecutionOptions& options);
  const ExecutionOptions& placement() const;
  DeviceId stage_device(size_t stage) const;
  StageKind stage_kind(size_t stage) const { return stage_kinds_.at(stage); }
  // What the planner needs to know per stage for a batch x seq run. `logits` false: forward will
  // skip lm_head (Logits::kSkipIfUnhooked with no hook on it), so no logits workspace is reserved.
  std::vector<StageCost> stage_costs(int64_t batch, int64_t seq, bool logits = true) const;
  // HF module names each stage covers (GPT-2's embedding stage: transformer.wte and
  // transformer.wpe).
  std::vector<std::vector<std::string>> stage_modules() const;
  std::vector<DeviceStats> device_stats() const;
  const TransferStats& transfer_stats() const;
  int64_t steps() const;  // forward() calls so far
  // Bare-reference guard policy for hooks (default kError), see hooks.h.
  void set_bare_ref_policy(BareRefPolicy p) { bare_ref_ = p; }
  BareRefPolicy bare_ref_policy() const { return bare_ref_; }

  // Top-level modules in execution order (embeddings, blocks, final norm, lm_head): the units a
  // device map places.
  const std::vector<Module*>& stages() const { return stages_; }

  struct Impl;

 private:
  friend struct ModelParts;  // src/models/model_parts.h: what the executor needs beyond this API
  // Placement and forward live in src/executor/ (Executor); this file and model.cpp see it only as
  // an opaque pointer with a deleter defined there.
  struct ExecutorDeleter {
    void operator()(Executor* executor) const;
  };
  Model() = default;
  ModelConfig config_;
  std::string origin_;
  std::string fingerprint_;
  c10::ScalarType compute_dtype_ = c10::ScalarType::Float;
  std::unique_ptr<Impl> impl_;
  std::vector<Module*> stages_;
  std::vector<StageKind> stage_kinds_;
  std::shared_ptr<HookRegistry> hooks_;
  BareRefPolicy bare_ref_ = BareRefPolicy::kError;
  std::unique_ptr<Executor, ExecutorDeleter> executor_;  // set by the first place()
};

}  // namespace actcap
