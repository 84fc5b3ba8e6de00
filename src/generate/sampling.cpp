#include "generate/sampling.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

namespace actcap {

Sampler::Sampler(const GenerateOptions& options)
    : o_(options), gen_(at::detail::createCPUGenerator(options.seed)) {}

std::vector<int64_t> Sampler::next(const at::Tensor& logits) {
  at::Tensor l = logits.to(at::kCPU).to(at::kFloat).contiguous();
  at::Tensor picked;
  if (o_.temperature <= 0) {
    picked = l.argmax(-1);  // the first maximum: the lowest id among ties
  } else {
    l = l / o_.temperature;
    const float kMinus = -std::numeric_limits<float>::infinity();
    if (o_.top_k > 0 && o_.top_k < l.size(-1)) {
      at::Tensor kth = std::get<0>(l.topk(o_.top_k, -1)).narrow(-1, o_.top_k - 1, 1);
      l = l.masked_fill(l < kth, kMinus);
    }
    if (o_.top_p < 1.0) {
      // Most likely first: a token goes when the tokens more likely than it already reach top_p
      // (the most likely always stays).
      auto [sorted, order] = l.sort(-1, /*descending=*/true);
      at::Tensor probs = sorted.softmax(-1);
      at::Tensor before = probs.cumsum(-1) - probs;
      at::Tensor drop_sorted = before >= o_.top_p;
      at::Tensor drop = at::zeros_like(drop_sorted).scatter_(-1, order, drop_sorted);
      l = l.masked_fill(drop, kMinus);
    }
    picked = at::multinomial(l.softmax(-1), 1, /*replacement=*/false, gen_).squeeze(-1);
  }
  picked = picked.to(at::kLong).contiguous();
  return std::vector<int64_t>(picked.data_ptr<int64_t>(),
                              picked.data_ptr<int64_t>() + picked.numel());
}

}  // namespace actcap
