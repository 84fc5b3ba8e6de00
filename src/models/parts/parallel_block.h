// The parallel residual block: both sublayers read the block's input. GPT-NeoX (with
// use_parallel_residual) has a norm for each, out = mlp(norm2(x)) + attn(norm1(x)) + x, its
// children running input_layernorm, attention, post_attention_layernorm, mlp; GPT-J one norm for
// both (norm2 null), out = attn(norm1(x)) + mlp(norm1(x)) + x, running ln_1, attn, mlp. Each child
// has its HF name and hook points. The sequential form is PreNormBlock (block.h).
#pragma once

#include "models/module.h"

namespace actcap {

class ParallelBlock : public Module {
 public:
  // norm2 null: the MLP reads norm1's output too.
  ParallelBlock(const std::string& name, int64_t width, std::unique_ptr<Module> norm1,
                std::unique_ptr<Module> attn, std::unique_ptr<Module> norm2,
                std::unique_ptr<Module> mlp);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  Module *norm1_, *attn_, *norm2_, *mlp_;
};

}  // namespace actcap
