// A residual block whose norms also (or only) act on the sublayers' outputs, before the residual
// add:
//   h = x + post1(attn(pre1(x))),  out = h + post2(mlp(pre2(h)))
// with pre1 / pre2 optional. OLMo 2 has none (post_attention_layernorm and
// post_feedforward_layernorm only); Gemma 2 has all four (input_layernorm, self_attn,
// post_attention_layernorm, pre_feedforward_layernorm, mlp, post_feedforward_layernorm). Children
// run, and are listed, in that order, each with its HF name and hook points.
#pragma once

#include "models/module.h"

namespace actcap {

struct SublayerNormParts {
  std::unique_ptr<Module> pre1, attn, post1, pre2, mlp, post2;  // pre1 / pre2 may be null
};

class SublayerNormBlock : public Module {
 public:
  SublayerNormBlock(const std::string& name, int64_t width, SublayerNormParts parts);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  Module *pre1_ = nullptr, *attn_, *post1_, *pre2_ = nullptr, *mlp_, *post2_;
};

}  // namespace actcap
