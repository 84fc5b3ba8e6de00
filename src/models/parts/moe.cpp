#include "models/parts/moe.h"

#include <algorithm>

#include "actcap/error.h"
#include "util/strings.h"

namespace actcap {

SparseMoe::SparseMoe(const std::string& name, int64_t width, std::unique_ptr<Module> router,
                     std::vector<ExpertWeights> experts, const std::string& act, SparseMoeOptions o,
                     SharedExpert shared)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      width_(width),
      experts_(std::move(experts)),
      o_(o) {
  // Children in execution order (the points list): the shared expert runs before the router.
  if (shared.mlp) shared_ = add(std::move(shared.mlp));
  router_ = add(std::move(router));
  if (shared.gate) shared_gate_ = add(std::move(shared.gate));
  const int64_t n = static_cast<int64_t>(experts_.size());
  check_top_k(n);
  const int64_t inner = n > 0 ? experts_[0].down.size(1) : 0;
  act_ = std::make_unique<Activation>(name + ".experts.act_fn", act, inner);
  for (ExpertWeights& e : experts_) {
    parameter(e.gate);
    parameter(e.up);
    parameter(e.down);
  }
}

SparseMoe::SparseMoe(const std::string& name, int64_t width, std::unique_ptr<Module> router,
                     std::vector<ClampedExpertWeights> experts, SparseMoeOptions o)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      width_(width),
      router_(add(std::move(router))),
      clamped_(std::move(experts)),
      o_(o) {
  check_top_k(static_cast<int64_t>(clamped_.size()));
  for (ClampedExpertWeights& e : clamped_) {
    parameter(e.gate_up);
    parameter(e.gate_up_mxfp4.blocks, /*widened=*/false);  // decoded, not converted
    parameter(e.gate_up_mxfp4.scales, false);
    parameter(e.gate_up_bias);
    parameter(e.down);
    parameter(e.down_mxfp4.blocks, false);
    parameter(e.down_mxfp4.scales, false);
    parameter(e.down_bias);
  }
}

int64_t SparseMoe::widen_elements(at::ScalarType compute) const {
  int64_t n = Module::widen_elements(compute);
  for (const ClampedExpertWeights& e : clamped_)
    for (const Mxfp4Matrix* m : {&e.gate_up_mxfp4, &e.down_mxfp4})
      if (m->defined()) n = std::max(n, m->blocks.size(0) * m->blocks.size(1) * 32);
  return n;
}

void SparseMoe::check_top_k(int64_t experts) const {
  if (o_.top_k < 1 || o_.top_k > experts)
    throw InputError(concat(name(), ": num_experts_per_tok=", o_.top_k, " must be between 1 and ",
                            "the number of experts (", experts, ")"));
}

int64_t SparseMoe::width_per_token(int64_t hidden, int64_t inner, int64_t experts, int64_t top_k,
                                   int64_t shared_inner) {
  const int64_t routed = inner + ((4 * top_k + 1) * hidden + 4 * experts + 2) / 3;
  return shared_inner > 0 ? std::max(routed, shared_inner) + (hidden + 2) / 3 : routed;
}

at::Tensor SparseMoe::expert(int64_t e, const at::Tensor& in, ForwardState& st) const {
  if (clamped_.empty()) {
    const ExpertWeights& w = experts_[e];
    // Each matrix is converted into the lane's scratch just before its GEMM (16-bit weights).
    at::Tensor g = act_->apply(at::linear(in, st.in_compute(w.gate)));
    at::Tensor h = g * at::linear(in, st.in_compute(w.up));
    return at::linear(h, st.in_compute(w.down));
  }
  // GptOssExperts._apply_gate, op for op (each rounds in a 16-bit compute dtype as there); the
  // biases added after the GEMM, as transformers' grouped linear adds them.
  const ClampedExpertWeights& w = clamped_[e];
  constexpr double kAlpha = 1.702, kLimit = 7.0;
  auto matrix = [&](const at::Tensor& dense, const Mxfp4Matrix& packed) {
    return dense.defined() ? st.in_compute(dense)
                           : mxfp4_decode(packed, st.compute, st.widen_scratch);
  };
  at::Tensor gu = at::linear(in, matrix(w.gate_up, w.gate_up_mxfp4));
  gu.add_(st.in_compute(w.gate_up_bias));
  at::Tensor gate = gu.slice(-1, 0, gu.size(-1), 2).clamp_max(kLimit);
  at::Tensor up = gu.slice(-1, 1, gu.size(-1), 2).clamp(-kLimit, kLimit);
  at::Tensor glu = gate * at::sigmoid(gate * kAlpha);
  at::Tensor h = (up + 1) * glu;
  at::Tensor out = at::linear(h, matrix(w.down, w.down_mxfp4));
  return out.add_(st.in_compute(w.down_bias));
}

at::Tensor SparseMoe::forward(const at::Tensor& x, ForwardState& st) {
  // Qwen2-MoE: the shared expert runs first, as in transformers; its gate after the experts.
  at::Tensor shared = shared_ ? shared_->call(x, st) : at::Tensor();
  at::Tensor out = routed(x, st);
  if (shared_) out = out + at::sigmoid(shared_gate_->call(x, st)) * shared;
  return out;
}

at::Tensor SparseMoe::routed(const at::Tensor& x, ForwardState& st) {
  const int64_t E = static_cast<int64_t>(clamped_.empty() ? experts_.size() : clamped_.size());
  const int64_t k = o_.top_k;
  at::Tensor logits = router_->call(x, st);  // [B, T, E], the router's hook point
  at::Tensor flat = x.reshape({-1, width_});
  const int64_t N = flat.size(0);
  if (N == 0) return at::zeros_like(x);
  at::Tensor weight, chosen;  // [N, k]
  if (o_.top_k_before_softmax) {
    // gpt-oss: the k largest logits (ties to the lower expert index, as topk), softmax over them
    // in the logits' dtype.
    auto top = at::topk(logits.reshape({N, E}), k, -1);
    weight = at::softmax(std::get<0>(top), -1), chosen = std::get<1>(top);
  } else {
    // transformers: softmax in float32, the k largest, optionally renormalised.
    at::Tensor probs = at::softmax(logits.reshape({N, E}), -1, at::kFloat);
    auto top = at::topk(probs, k, -1);
    weight = std::get<0>(top), chosen = std::get<1>(top);
    if (o_.normalize_top_k) weight = weight / weight.sum(-1, /*keepdim=*/true);
    if (o_.weights_in_compute_dtype) weight = weight.to(logits.scalar_type());
  }

  // Every (token, slot) pair, entry n * k + s, grouped by expert (transformers 5's default
  // experts path, grouped_mm: sort by expert, one GEMM per expert's rows).
  at::Tensor entry_expert = chosen.reshape(-1);
  auto by_expert = at::sort(entry_expert, /*stable=*/true, /*dim=*/0, false);
  const at::Tensor& sorted = std::get<0>(by_expert);
  const at::Tensor& order = std::get<1>(by_expert);
  at::Tensor token = at::div(order, k, "trunc");
  at::Tensor entry_weight = weight.reshape(-1).index_select(0, order);
  // Where each expert's entries start and end in that order: the one value the host must read
  // (a device sync on an accelerator, as the loop over transformers' eager experts has; bincount
  // would read the ids' min and max first).
  at::Tensor bounds = at::searchsorted(sorted, at::arange(E + 1, sorted.options())).to(at::kCPU);
  const int64_t* bound = bounds.data_ptr<int64_t>();

  // Each entry's weighted output in place, then the k of a token summed in slot order (highest
  // probability first) in the product's dtype (float32 with Mixtral's float32 weights) and
  // rounded to the compute dtype once: transformers' reshape + sum, with no atomics, so the same on
  // every run and device.
  at::Tensor weighted;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t at_row = bound[e], n = bound[e + 1] - bound[e];
    if (n == 0) continue;
    at::Tensor in = flat.index_select(0, token.narrow(0, at_row, n));
    at::Tensor y = expert(e, in, st) * entry_weight.narrow(0, at_row, n).unsqueeze(1);
    if (!weighted.defined()) weighted = at::empty({N * k, width_}, y.options());
    weighted.index_copy_(0, order.narrow(0, at_row, n), y);
  }
  at::Tensor out = weighted.view({N, k, width_}).sum(1);
  weighted.reset();
  if (out.scalar_type() != x.scalar_type()) out = out.to(x.scalar_type());
  return out.view(x.sizes());
}

}  // namespace actcap
