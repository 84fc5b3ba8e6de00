#include "models/parts/parallel_block.h"

namespace actcap {

ParallelBlock::ParallelBlock(const std::string& name, int64_t width, std::unique_ptr<Module> norm1,
                             std::unique_ptr<Module> attn, std::unique_ptr<Module> norm2,
                             std::unique_ptr<Module> mlp)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      norm1_(add(std::move(norm1))),
      attn_(add(std::move(attn))),
      norm2_(norm2 ? add(std::move(norm2)) : nullptr),
      mlp_(add(std::move(mlp))) {}

at::Tensor ParallelBlock::forward(const at::Tensor& x, ForwardState& st) {
  auto n = norm1_->call(x, st);
  auto a = attn_->call(n, st);
  auto m = mlp_->call(norm2_ ? norm2_->call(x, st) : n, st);
  // HF sums the two outputs first, then the input: mlp_output + attn_output + hidden_states
  // (NeoX), attn_output + feed_forward_hidden_states + residual (GPT-J); the same bits.
  return st.residual_add(m + a, x);
}

}  // namespace actcap
