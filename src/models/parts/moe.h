// A sparse mixture-of-experts feed-forward block (Mixtral's and Qwen3-MoE's SparseMoeBlock):
// a router (`gate`, nn.Linear hidden -> experts, no bias) scores every token, the top k experts by
// softmax probability run it through their own gated MLP down(act(gate(x)) * up(x)), and their
// outputs are summed weighted by those probabilities (renormalised to sum 1 when configured), in
// transformers 5's order (its default grouped_mm experts: per token, the k in slot order).
//
// Hook points: the block (NAME, NAME:input, [hidden] per token) and the router (NAME.gate: its
// logits, [experts] per token, the first element of transformers' router output). The experts are
// not points: each sees a different number of tokens.
#pragma once

#include "models/module.h"

namespace actcap {

// One expert's gated MLP: gate and up stacked in one matrix, as transformers 5 holds them (its
// MoE experts' gate_up_proj): one GEMM for both, and the rounding of transformers' own.
struct ExpertWeights {
  at::Tensor gate_up;  // [2 * inner, hidden]: the gate's rows, then up's
  at::Tensor down;     // [hidden, inner]
};

struct SparseMoeOptions {
  int64_t top_k = 2;
  // Divide the k probabilities by their sum (Mixtral always; Qwen3-MoE's norm_topk_prob).
  bool normalize_top_k = true;
  // Round the routing weights to the compute dtype before they scale the expert outputs
  // (Qwen3-MoE); Mixtral keeps them float32 and rounds the product.
  bool weights_in_compute_dtype = false;
};

class SparseMoe : public Module {
 public:
  // `router`: the Linear named NAME.gate; `act`: the experts' activation (HF ACT2FN name).
  SparseMoe(const std::string& name, int64_t width, std::unique_ptr<Module> router,
            std::vector<ExpertWeights> experts, const std::string& act, SparseMoeOptions o);

  // The working memory of a forward, in elements per token as the planner counts an MLP's inner
  // width (three intermediates of that width): the k weighted outputs of each token (float32 at
  // most) and their sum, the router's float32 logits and probabilities, and an expert's rows and
  // intermediates.
  static int64_t width_per_token(int64_t hidden, int64_t inner, int64_t experts, int64_t top_k);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  int64_t width_, inner_ = 0;
  Module* router_;
  std::vector<ExpertWeights> experts_;
  std::unique_ptr<Activation> act_;  // not a child: no hook point
  SparseMoeOptions o_;
};

}  // namespace actcap
