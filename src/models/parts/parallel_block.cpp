#include "models/parts/parallel_block.h"

namespace actcap {

ParallelBlock::ParallelBlock(const std::string& name, int64_t width, std::unique_ptr<Module> norm1,
                             std::unique_ptr<Module> attn, std::unique_ptr<Module> norm2,
                             std::unique_ptr<Module> mlp)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      norm1_(add(std::move(norm1))),
      attn_(add(std::move(attn))),
      norm2_(add(std::move(norm2))),
      mlp_(add(std::move(mlp))) {}

at::Tensor ParallelBlock::forward(const at::Tensor& x, ForwardState& st) {
  auto a = attn_->call(norm1_->call(x, st), st);
  auto m = mlp_->call(norm2_->call(x, st), st);
  // HF: mlp_output + attn_output + hidden_states, summed in that order.
  return st.residual_add(m + a, x);
}

}  // namespace actcap
