// Normalisations, computed in float32 whatever the activation dtype.
#pragma once

#include "models/module.h"

namespace actcap {

// nn.LayerNorm over the last dimension; bias undefined = without bias.
class LayerNorm : public Module {
 public:
  LayerNorm(const std::string& name, at::Tensor weight, at::Tensor bias, double eps);
  // Without weight and bias, over `width` (OLMo's OlmoLayerNorm).
  LayerNorm(const std::string& name, int64_t width, double eps);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  at::Tensor weight_, bias_;
  int64_t width_;
  double eps_;
};

// RMSNorm as LlamaRMSNorm: x / sqrt(mean(x^2) + eps) in float32, cast back, times the weight.
// Over the last dimension, so it also normalises per head ([B, T, heads, head_dim], Qwen3's q/k
// norms).
struct RMSNormOptions {
  bool unit_offset = false;  // the weight is an offset from one: scale by (1 + w), as Gemma's
  // Scale by the weight in float32 and round to the input dtype last (OLMo 2's and gpt-oss's
  // `(weight * x).to(input_dtype)`), the weight as the compute dtype holds it, except under a
  // float16 compute dtype with weight_kept_float32: then as stored, unrounded (gpt-oss's
  // _keep_in_fp32_modules, which transformers applies to float16 models only).
  bool scale_in_float32 = false;
  bool weight_kept_float32 = false;
  int64_t heads = 0;  // > 0: applied per head; the hook points are [heads, width] per token
};

class RMSNorm : public Module {
 public:
  RMSNorm(const std::string& name, at::Tensor weight, double eps, RMSNormOptions options = {});

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  at::Tensor weight_;
  double eps_;
  RMSNormOptions o_;
};

}  // namespace actcap
