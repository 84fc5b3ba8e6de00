// The next token of each row from its logits: greedy, or sampled after temperature, top-k and top-p
// (transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, in that order).
#pragma once

#include <ATen/ATen.h>

#include "actcap/generate.h"

namespace actcap {

class Sampler {
 public:
  explicit Sampler(const GenerateOptions& options);
  // logits [B, V] (any floating dtype, any device) -> token ids, B int64 on the host. Computed in
  // float32 on the host, so a split run picks what one device picks.
  std::vector<int64_t> next(const at::Tensor& logits);

 private:
  GenerateOptions o_;
  at::Generator gen_;
};

}  // namespace actcap
