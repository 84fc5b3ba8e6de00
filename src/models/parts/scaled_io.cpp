#include "models/parts/scaled_io.h"

namespace actcap {

ScaledEmbedding::ScaledEmbedding(const std::string& name, at::Tensor weight, float scale)
    : Module(name, ids_point(name + ":input"), hidden_point(name, weight.size(1))),
      weight_(std::move(weight)),
      scale_(scale) {
  parameter(weight_, /*widened=*/false);
}

at::Tensor ScaledEmbedding::forward(const at::Tensor& ids, ForwardState& st) {
  // Scaled in the compute dtype by the scale rounded to it, as HF's normalizer
  // (torch.tensor(hidden_size**0.5, dtype=hidden_states.dtype)).
  at::Tensor rows = embedding_rows(weight_, ids, st.compute);
  return rows.mul_(at::scalar_tensor(scale_, rows.options()));
}

SoftcappedHead::SoftcappedHead(std::unique_ptr<Module> head, int64_t width, double cap)
    : Module("", hidden_point("", width), head->output_point()), cap_(cap) {
  head_ = add(std::move(head));
}

at::Tensor SoftcappedHead::forward(const at::Tensor& x, ForwardState& st) {
  // Out of place first: lm_head's output stays as its hooks saw it.
  return (head_->call(x, st) / cap_).tanh_().mul_(cap_);
}

}  // namespace actcap
