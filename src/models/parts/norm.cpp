#include "models/parts/norm.h"

namespace actcap {

namespace {
// The point's per-token shape: the normalised width, with the heads in front when per head.
PointInfo norm_point(const std::string& name, const at::Tensor& weight, int64_t heads = 0) {
  PointInfo p = hidden_point(name, weight.size(0));
  if (heads > 0) p.shape.insert(p.shape.begin(), heads);
  return p;
}
}  // namespace

LayerNorm::LayerNorm(const std::string& name, at::Tensor weight, at::Tensor bias, double eps)
    : Module(name, norm_point(name + ":input", weight), norm_point(name, weight)),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      width_(weight_.size(0)),
      eps_(eps) {
  parameter(weight_);
  parameter(bias_);
}

LayerNorm::LayerNorm(const std::string& name, int64_t width, double eps)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      width_(width),
      eps_(eps) {}

at::Tensor LayerNorm::forward(const at::Tensor& x, ForwardState&) {
  // Norm weights are float32 (vectors are widened at load). A 16-bit input is normalised in
  // float32 and rounded once, as torch's 16-bit layer_norm kernels accumulate in float32.
  if (x.scalar_type() == at::kFloat)
    return at::layer_norm(x, {width_}, weight_, bias_, eps_, /*cudnn_enable=*/false);
  return at::layer_norm(x.to(at::kFloat), {width_}, weight_, bias_, eps_, false)
      .to(x.scalar_type());
}

RMSNorm::RMSNorm(const std::string& name, at::Tensor weight, double eps, RMSNormOptions o)
    : Module(name, norm_point(name + ":input", weight, o.heads), norm_point(name, weight, o.heads)),
      weight_(std::move(weight)),
      eps_(eps),
      o_(o) {
  parameter(weight_);
}

at::Tensor RMSNorm::forward(const at::Tensor& x, ForwardState& st) {
  // HF: normalised in float32. Llama-style norms round to the input dtype and then scale by the
  // weight in the model's dtype; Gemma's (1 + w), OLMo 2's and gpt-oss's scale in float32 and
  // round last.
  auto xf = x.to(at::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  auto normed = xf * at::rsqrt(var + eps_);
  if (o_.unit_offset) return ((weight_ + 1.0) * normed).to(x.scalar_type());
  if (o_.scale_in_float32) {
    const bool kept = o_.weight_kept_float32 && st.compute == at::kHalf;
    const at::Tensor& w = kept ? weight_ : st.in_compute(weight_);
    return (w.to(at::kFloat) * normed).to(x.scalar_type());
  }
  return st.in_compute(weight_) * normed.to(x.scalar_type());
}

}  // namespace actcap
