// A sparse mixture-of-experts feed-forward block (Mixtral's, Qwen3-MoE's, OLMoE's SparseMoeBlock,
// gpt-oss's GptOssMLP): a router (nn.Linear hidden -> experts) scores every token, the top k
// experts run it through their own MLP, and their outputs are summed weighted by the routing
// weights, in transformers 5's order (its default grouped_mm experts: per token, the k in slot
// order).
//   - Mixtral, Qwen3-MoE, OLMoE: the router is `gate` (no bias); the k most probable experts by
//     softmax, their probabilities renormalised to sum 1 when configured; each expert a gated MLP
//     down(act(gate(x)) * up(x)).
//   - gpt-oss: the router is `router` (with a bias); the k largest logits, softmaxed among
//     themselves; each expert GptOssExperts' clamped SwiGLU with biases (ClampedExpertWeights).
//   - Qwen2-MoE adds a shared expert every token runs (SharedExpert).
//   - DeepSeek-V2 and V3: a float32 router (Float32Router), their routing (DeepseekRouting) and
//     ungated shared experts after the routed ones.
//
// Hook points: the block (NAME, NAME:input, [hidden] per token) and the router (NAME.gate or
// NAME.router: its logits, [experts] per token, the first element of transformers' router output);
// with a shared expert, NAME.shared_expert (and its own points) and NAME.shared_expert_gate ([1]
// per token), or DeepSeek-V3's NAME.shared_experts. The experts are not points: each sees a
// different number of tokens.
#pragma once

#include "models/module.h"
#include "models/parts/mxfp4.h"

namespace actcap {

// One expert's gated MLP, each matrix as the checkpoint holds it (a tensor of its own, a view of
// transformers 5's stacked experts, or FP8 codes decoded as the expert runs): nothing is copied at
// load.
struct ExpertWeights {
  LinearWeight gate, up;  // [inner, hidden] each
  LinearWeight down;      // [hidden, inner]
};

// gpt-oss's expert (GptOssExperts): gu = gate_up x + gate_up_bias, its even features the gate and
// its odd ones the up projection; gate clamped above at 7, up to [-7, 7];
// h = (up + 1) * gate * sigmoid(1.702 gate); out = down h + down_bias. Each matrix as nn.Linear
// holds it ([out, in]: a transposed view of the checkpoint's [in, out]), or MXFP4-packed.
struct ClampedExpertWeights {
  at::Tensor gate_up;  // [2 * inner, hidden], or undefined with gate_up_mxfp4
  Mxfp4Matrix gate_up_mxfp4;
  at::Tensor gate_up_bias;  // [2 * inner]
  at::Tensor down;          // [hidden, inner], or undefined with down_mxfp4
  Mxfp4Matrix down_mxfp4;
  at::Tensor down_bias;  // [hidden]
};

// Qwen2-MoE's shared expert: every token also runs `mlp` (NAME.shared_expert, a gated MLP), before
// the router as transformers does; the block's output is the routed sum plus
// sigmoid(gate(x)) * mlp(x), with `gate` NAME.shared_expert_gate (Linear hidden -> 1), each step in
// the compute dtype. DeepSeek-V3's shared experts (NAME.shared_experts): no gate, run after the
// routed experts, their output added to the routed sum. Both null: none.
struct SharedExpert {
  std::unique_ptr<Module> mlp, gate;
  bool after_routed = false;
};

// DeepSeek's router (NAME.gate: DeepseekV3TopkRouter; DeepSeek-V2's nn.Linear, whose weight
// transformers uses without calling the module, so its hooks see nothing there): float32 logits
// F.linear(x.float(), W.float()) whatever the compute dtype (the weight as the compute dtype holds
// it, widened), so its point is float32.
class Float32Router : public Module {
 public:
  Float32Router(const std::string& name, at::Tensor weight);
  bool float32_output() const override { return true; }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  at::Tensor weight_;
};

// DeepSeek's routing, in float32 on the router's logits, the k experts chosen by topk unsorted
// (its order is the slots' order, as in transformers):
//   - kSigmoid (DeepseekV3MoE.route_tokens_to_experts): scores = sigmoid(logits); the choice adds
//     `correction` (the router's e_score_correction_bias, float32 as transformers keeps it); the
//     experts fall into `groups` equal groups, each ranked by the sum of its two best choice
//     scores, and the `top_groups` best are kept; the k best experts among them; their weights
//     are the uncorrected scores, divided by their sum + 1e-20 when normalize_top_k;
//   - kSoftmax (DeepseekV2Moe.route_tokens_to_experts): scores = softmax(logits); with groups > 0
//     (group_limited_greedy) each group ranked by its best score, the `top_groups` best kept and
//     the others' scores set to 0; the k best; their weights are those scores (never
//     renormalised).
// Either way the weights are then times `scale` (routed_scaling_factor) and kept float32.
struct DeepseekRouting {
  enum class Kind { kNone, kSigmoid, kSoftmax } kind = Kind::kNone;
  int64_t groups = 0;  // kSoftmax: 0 is greedy (no group limit)
  int64_t top_groups = 0;
  double scale = 1.0;
  at::Tensor correction;  // kSigmoid: [experts] float32
};

struct SparseMoeOptions {
  int64_t top_k = 2;
  // Mixtral's order: softmax over every expert, then the k most probable. gpt-oss's: the k largest
  // logits, then softmax over those k in the logits' dtype (normalize_top_k and
  // weights_in_compute_dtype do not apply).
  bool top_k_before_softmax = false;
  // Divide the k probabilities by their sum (Mixtral always; Qwen3-MoE's norm_topk_prob).
  bool normalize_top_k = true;
  // Round the routing weights to the compute dtype before they scale the expert outputs
  // (Qwen3-MoE, OLMoE); Mixtral keeps them float32 and rounds the product.
  bool weights_in_compute_dtype = false;
  DeepseekRouting deepseek;  // kind set: replaces the routing above
};

class SparseMoe : public Module {
 public:
  // `router`: the Linear named NAME.gate; `act`: the experts' activation (HF ACT2FN name).
  SparseMoe(const std::string& name, int64_t width, std::unique_ptr<Module> router,
            std::vector<ExpertWeights> experts, const std::string& act, SparseMoeOptions o,
            SharedExpert shared = {});
  // gpt-oss's experts (o.top_k_before_softmax is set).
  SparseMoe(const std::string& name, int64_t width, std::unique_ptr<Module> router,
            std::vector<ClampedExpertWeights> experts, SparseMoeOptions o);

  // The working memory of a forward, in elements per token as the planner counts an MLP's inner
  // width (three intermediates of that width, in the compute dtype): the k weighted outputs of each
  // token (float32 whatever the compute dtype: counted twice for a 16-bit one) and their sum, the
  // router's float32 logits and probabilities, and an expert's rows and intermediates; with a
  // shared expert of `shared_inner`, its intermediates or those, and its output held meanwhile.
  static int64_t width_per_token(int64_t hidden, int64_t inner, int64_t experts, int64_t top_k,
                                 int64_t shared_inner = 0);
  // With MXFP4 experts, also the largest decoded matrix (each is decoded into the scratch).
  int64_t widen_elements(at::ScalarType compute) const override;

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  // The routed experts' weighted sum, [B, T, width] in the compute dtype.
  at::Tensor routed(const at::Tensor& x, ForwardState& st);
  // The k experts of each of the N tokens and their weights ([N, k] each), from the router's
  // logits [N, E].
  std::pair<at::Tensor, at::Tensor> route(const at::Tensor& logits) const;
  // Expert e's output for its rows `in` (compute dtype).
  at::Tensor expert(int64_t e, const at::Tensor& in, ForwardState& st) const;
  void check_top_k(int64_t experts) const;

  int64_t width_;
  Module* router_ = nullptr;
  Module* shared_ = nullptr;                   // Qwen2-MoE's shared expert and
  Module* shared_gate_ = nullptr;              // its gate (null: unscaled, DeepSeek-V3's)
  bool shared_after_ = false;                  // the shared expert runs after the routed ones
  std::vector<ExpertWeights> experts_;         // gated experts, or
  std::vector<ClampedExpertWeights> clamped_;  // gpt-oss's
  std::unique_ptr<Activation> act_;            // not a child: no hook point
  SparseMoeOptions o_;
};

}  // namespace actcap
