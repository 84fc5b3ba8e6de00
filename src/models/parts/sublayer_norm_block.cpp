#include "models/parts/sublayer_norm_block.h"

namespace actcap {

SublayerNormBlock::SublayerNormBlock(const std::string& name, int64_t width, SublayerNormParts p)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)) {
  auto take = [&](std::unique_ptr<Module>& m) { return m ? add(std::move(m)) : nullptr; };
  pre1_ = take(p.pre1);
  attn_ = take(p.attn);
  post1_ = take(p.post1);
  pre2_ = take(p.pre2);
  mlp_ = take(p.mlp);
  post2_ = take(p.post2);
}

at::Tensor SublayerNormBlock::forward(const at::Tensor& x, ForwardState& st) {
  auto a = attn_->call(pre1_ ? pre1_->call(x, st) : x, st);
  auto h = x + post1_->call(a, st);
  auto m = mlp_->call(pre2_ ? pre2_->call(h, st) : h, st);
  return st.residual_add(h, post2_->call(m, st));
}

}  // namespace actcap
