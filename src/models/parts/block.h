// Residual blocks. PreNormBlock is the sequential pre-norm block GPT-2 and the Llama family share:
// h = x + attn(norm1(x)), out = h + mlp(norm2(h)); its four parts are children with their own HF
// names and hook points, run in this order (GPT-2: ln_1, attn, ln_2, mlp; Llama:
// input_layernorm, self_attn, post_attention_layernorm, mlp).
#pragma once

#include "models/module.h"

namespace actcap {

class PreNormBlock : public Module {
 public:
  PreNormBlock(const std::string& name, int64_t width, std::unique_ptr<Module> norm1,
               std::unique_ptr<Module> attn, std::unique_ptr<Module> norm2,
               std::unique_ptr<Module> mlp);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  Module *norm1_, *attn_, *norm2_, *mlp_;
};

}  // namespace actcap
