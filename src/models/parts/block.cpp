#include "models/parts/block.h"

namespace actcap {

PreNormBlock::PreNormBlock(const std::string& name, int64_t width, std::unique_ptr<Module> norm1,
                           std::unique_ptr<Module> attn, std::unique_ptr<Module> norm2,
                           std::unique_ptr<Module> mlp)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      norm1_(add(std::move(norm1))),
      attn_(add(std::move(attn))),
      norm2_(add(std::move(norm2))),
      mlp_(add(std::move(mlp))) {}

at::Tensor PreNormBlock::forward(const at::Tensor& x, ForwardState& st) {
  auto h = x + attn_->call(norm1_->call(x, st), st);
  return st.residual_add(h, mlp_->call(norm2_->call(h, st), st));
}

}  // namespace actcap
