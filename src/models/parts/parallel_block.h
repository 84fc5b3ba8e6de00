// The parallel residual block (GPT-NeoX with use_parallel_residual, GPT-J style): both sublayers
// read the block's input, out = mlp(norm2(x)) + attn(norm1(x)) + x. Children run in this order
// (NeoX: input_layernorm, attention, post_attention_layernorm, mlp), each with its HF name and
// hook points. The sequential form is PreNormBlock (block.h).
#pragma once

#include "models/module.h"

namespace actcap {

class ParallelBlock : public Module {
 public:
  ParallelBlock(const std::string& name, int64_t width, std::unique_ptr<Module> norm1,
                std::unique_ptr<Module> attn, std::unique_ptr<Module> norm2,
                std::unique_ptr<Module> mlp);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  Module *norm1_, *attn_, *norm2_, *mlp_;
};

}  // namespace actcap
