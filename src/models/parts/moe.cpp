#include "models/parts/moe.h"

#include <algorithm>
#include <limits>

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
  // Children in execution order (the points list): Qwen2-MoE's shared expert runs before the
  // router, DeepSeek-V3's after the routed experts.
  shared_after_ = shared.after_routed;
  if (shared.mlp && !shared_after_) shared_ = add(std::move(shared.mlp));
  router_ = add(std::move(router));
  if (shared.gate) shared_gate_ = add(std::move(shared.gate));
  if (shared.mlp && shared_after_) shared_ = add(std::move(shared.mlp));
  parameter(o_.deepseek.correction, /*widened=*/false);
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

Float32Router::Float32Router(const std::string& name, at::Tensor weight)
    : Module(name, hidden_point(name + ":input", weight.size(1)),
             hidden_point(name, weight.size(0))),
      weight_(std::move(weight)) {
  parameter(weight_);
}

at::Tensor Float32Router::forward(const at::Tensor& x, ForwardState& st) {
  // transformers holds the weight in the model's dtype and widens it: round, then widen.
  return at::linear(x.to(at::kFloat), st.in_compute(weight_).to(at::kFloat));
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
  // DeepSeek-V3: the shared experts after the routed ones, unscaled.
  at::Tensor shared = shared_ && !shared_after_ ? shared_->call(x, st) : at::Tensor();
  at::Tensor out = routed(x, st);
  if (shared_after_) return out + shared_->call(x, st);
  if (shared_) out = out + at::sigmoid(shared_gate_->call(x, st)) * shared;
  return out;
}

namespace {

// [N, E] true for the experts of each token's `top_groups` best groups by `group_scores` [N, G]
// (topk unsorted, a scatter into a group mask, expanded over each group's E / G experts).
at::Tensor kept_groups(const at::Tensor& group_scores, const DeepseekRouting& g, int64_t E) {
  const int64_t N = group_scores.size(0);
  at::Tensor kept =
      std::get<1>(at::topk(group_scores, g.top_groups, -1, /*largest=*/true, /*sorted=*/false));
  at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, kept, 1);
  return group_mask.unsqueeze(-1).expand({N, g.groups, E / g.groups}).reshape({N, E}).to(at::kBool);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> SparseMoe::route(const at::Tensor& logits) const {
  const int64_t N = logits.size(0), E = logits.size(1), k = o_.top_k;
  const DeepseekRouting& g = o_.deepseek;
  if (g.kind == DeepseekRouting::Kind::kSigmoid) {
    // DeepseekV3MoE.route_tokens_to_experts, op for op in float32.
    at::Tensor scores = logits.sigmoid();
    at::Tensor choice = scores + g.correction;
    at::Tensor group_scores =
        std::get<0>(choice.view({N, g.groups, E / g.groups}).topk(2, -1)).sum(-1);
    choice = choice.masked_fill(kept_groups(group_scores, g, E).logical_not(),
                                -std::numeric_limits<float>::infinity());
    at::Tensor chosen = std::get<1>(at::topk(choice, k, -1, /*largest=*/true, /*sorted=*/false));
    at::Tensor weight = scores.gather(1, chosen);
    if (o_.normalize_top_k) weight = weight / (weight.sum(-1, /*keepdim=*/true) + 1e-20);
    return {chosen, weight * g.scale};
  }
  if (g.kind == DeepseekRouting::Kind::kSoftmax) {
    // DeepseekV2Moe.route_tokens_to_experts: greedy, or group_limited_greedy with groups.
    at::Tensor scores = at::softmax(logits, -1, at::kFloat);
    if (g.groups > 0) {
      at::Tensor group_scores = std::get<0>(scores.view({N, g.groups, E / g.groups}).max(-1));
      scores = scores.masked_fill(kept_groups(group_scores, g, E).logical_not(), 0.0);
    }
    auto top = at::topk(scores, k, -1, /*largest=*/true, /*sorted=*/false);
    return {std::get<1>(top), std::get<0>(top) * g.scale};
  }
  if (o_.top_k_before_softmax) {
    // gpt-oss: the k largest logits (ties to the lower expert index, as topk), softmax over them
    // in the logits' dtype.
    auto top = at::topk(logits, k, -1);
    return {std::get<1>(top), at::softmax(std::get<0>(top), -1)};
  }
  // transformers: softmax in float32, the k largest, optionally renormalised.
  at::Tensor probs = at::softmax(logits, -1, at::kFloat);
  auto top = at::topk(probs, k, -1);
  at::Tensor weight = std::get<0>(top);
  if (o_.normalize_top_k) weight = weight / weight.sum(-1, /*keepdim=*/true);
  if (o_.weights_in_compute_dtype) weight = weight.to(logits.scalar_type());
  return {std::get<1>(top), weight};
}

at::Tensor SparseMoe::routed(const at::Tensor& x, ForwardState& st) {
  const int64_t E = static_cast<int64_t>(clamped_.empty() ? experts_.size() : clamped_.size());
  const int64_t k = o_.top_k;
  at::Tensor logits = router_->call(x, st);  // [B, T, E], the router's hook point
  at::Tensor flat = x.reshape({-1, width_});
  const int64_t N = flat.size(0);
  if (N == 0) return at::zeros_like(x);
  auto [chosen, weight] = route(logits.reshape({N, E}));  // [N, k] each

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
