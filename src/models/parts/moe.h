// A sparse mixture-of-experts feed-forward block (Mixtral's, Qwen3-MoE's, OLMoE's SparseMoeBlock):
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

// One expert's gated MLP, each matrix as the checkpoint holds it (a tensor of its own, or a view
// of transformers 5's stacked experts): nothing is copied at load.
struct ExpertWeights {
  at::Tensor gate, up;  // [inner, hidden] each
  at::Tensor down;      // [hidden, inner]
};

struct SparseMoeOptions {
  int64_t top_k = 2;
  // Divide the k probabilities by their sum (Mixtral always; Qwen3-MoE's norm_topk_prob).
  bool normalize_top_k = true;
  // Round the routing weights to the compute dtype before they scale the expert outputs
  // (Qwen3-MoE, OLMoE); Mixtral keeps them float32 and rounds the product.
  bool weights_in_compute_dtype = false;
};

class SparseMoe : public Module {
 public:
  // `router`: the Linear named NAME.gate; `act`: the experts' activation (HF ACT2FN name).
  SparseMoe(const std::string& name, int64_t width, std::unique_ptr<Module> router,
            std::vector<ExpertWeights> experts, const std::string& act, SparseMoeOptions o);

  // The working memory of a forward, in elements per token as the planner counts an MLP's inner
  // width (three intermediates of that width, in the compute dtype): the k weighted outputs of each
  // token (float32 whatever the compute dtype: counted twice for a 16-bit one) and their sum, the
  // router's float32 logits and probabilities, and an expert's rows and intermediates.
  static int64_t width_per_token(int64_t hidden, int64_t inner, int64_t experts, int64_t top_k);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  int64_t width_;
  Module* router_;
  std::vector<ExpertWeights> experts_;
  std::unique_ptr<Activation> act_;  // not a child: no hook point
  SparseMoeOptions o_;
};

}  // namespace actcap
