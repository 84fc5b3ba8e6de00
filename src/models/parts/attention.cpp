#include "models/parts/attention.h"

#include "models/kv_cache.h"

namespace actcap {

Attention::Attention(const std::string& name, AttentionShape shape, AttentionParts p)
    : Module(name, hidden_point(name + ":input", shape.hidden), hidden_point(name, shape.hidden)),
      s_(std::move(shape)) {
  auto take = [&](std::unique_ptr<Module>& m) { return m ? add(std::move(m)) : nullptr; };
  // Children in the order the forward runs them (the points list): each norm after its own
  // projection, or all three projections first (Gemma 3).
  const bool norms_last = s_.qk_norms_last && !s_.qk_norm_whole;
  qkv_ = take(p.qkv);
  q_ = take(p.q);
  if (!norms_last) q_norm_ = take(p.q_norm);
  k_ = take(p.k);
  if (!norms_last) k_norm_ = take(p.k_norm);
  v_ = take(p.v);
  if (norms_last) q_norm_ = take(p.q_norm), k_norm_ = take(p.k_norm);
  // After the projections, before o_proj: the order the forward shows them in. The key length is
  // the run's (CaptureOptions::attention_keys), 0 here.
  taps_.scores = add(std::make_unique<Tap>(name + ":scores", std::vector<int64_t>{s_.heads, 0}));
  taps_.probs = add(std::make_unique<Tap>(name + ":probs", std::vector<int64_t>{s_.heads, 0}));
  o_ = take(p.o);
  sinks_ = std::move(p.sinks);
  parameter(sinks_);
}

at::Tensor Attention::forward(const at::Tensor& x, ForwardState& st) {
  const int64_t B = x.size(0), T = x.size(1), D = s_.head_dim;
  at::Tensor q, k, v;
  if (qkv_ && s_.qkv_layout == AttentionShape::QkvLayout::kPerHead) {  // [heads, 3, D] (NeoX)
    auto qkv = qkv_->call(x, st).view({B, T, s_.heads, 3, D}).permute({3, 0, 2, 1, 4});
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else if (qkv_ && s_.kv_heads == s_.heads) {  // rows [q; k; v], heads of equal count (GPT-2)
    auto qkv = qkv_->call(x, st).view({B, T, 3, s_.heads, D}).permute({2, 0, 3, 1, 4});
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else if (qkv_) {  // rows [q; k; v] with grouped-query sizes (Phi-3)
    auto qkv = qkv_->call(x, st);
    const int64_t Q = s_.heads * D, KV = s_.kv_heads * D;
    q = qkv.narrow(-1, 0, Q).view({B, T, s_.heads, D}).transpose(1, 2);
    k = qkv.narrow(-1, Q, KV).view({B, T, s_.kv_heads, D}).transpose(1, 2);
    v = qkv.narrow(-1, Q + KV, KV).view({B, T, s_.kv_heads, D}).transpose(1, 2);
  } else {
    // [B, T, heads, D]: the per-head norms see each head's features (HF views before the norm).
    const bool whole = s_.qk_norm_whole, last = s_.qk_norms_last && !whole;
    q = q_->call(x, st);
    if (q_norm_ && whole) q = q_norm_->call(q, st);
    q = q.view({B, T, s_.heads, D});
    if (q_norm_ && !whole && !last) q = q_norm_->call(q, st);
    k = k_->call(x, st);
    if (k_norm_ && whole) k = k_norm_->call(k, st);
    k = k.view({B, T, s_.kv_heads, D});
    if (k_norm_ && !whole && !last) k = k_norm_->call(k, st);
    v = v_->call(x, st).view({B, T, s_.kv_heads, D}).transpose(1, 2);
    if (q_norm_ && last) q = q_norm_->call(q, st);
    if (k_norm_ && last) k = k_norm_->call(k, st);
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
  }
  if (s_.clip_qkv) {  // out of place: the projections' outputs are what their points captured
    const double c = *s_.clip_qkv;
    q = q.clamp(-c, c);
    k = k.clamp(-c, c);
    v = v.clamp(-c, c);
  }
  if (s_.rope) {
    q = s_.rope->apply(q, st);
    k = s_.rope->apply(k, st);
  }
  cache_keys_values(this, k, v, st);
  at::Tensor bias = st.bias(s_.window);
  if (s_.scores_in_float32 && q.scalar_type() != at::kFloat) {
    q = q.to(at::kFloat);
    k = k.to(at::kFloat);
    bias = bias.to(at::kFloat);
  }
  auto ctx = attention(q, k, v, bias, s_.scale, s_.softcap, &taps_, &st, st.in_compute(sinks_));
  return o_->call(ctx, st);
}

void cache_keys_values(const void* owner, at::Tensor& k, at::Tensor& v, ForwardState& st) {
  if (!st.kv) return;  // generation: keep this step's keys and values, attend over the cached ones
  const int64_t B = k.size(0), Hkv = k.size(1), T = k.size(2), D = k.size(3), Dv = v.size(3);
  KvCache::Entry& e = st.kv->entry(owner);
  if (!e.k.defined()) {
    // Zeroed, not empty: the masked slots past a row's position are still multiplied (by a
    // probability of exactly 0), and 0 * NaN from stale memory would be NaN.
    e.k = at::zeros({B, Hkv, st.kv->capacity, D}, k.options());
    e.v = at::zeros({B, Hkv, st.kv->capacity, Dv}, v.options());
  }
  if (!st.row_positions.defined()) {  // the prompt pass: positions 0..T-1, attends as without
    e.k.narrow(2, 0, T).copy_(k);
    e.v.narrow(2, 0, T).copy_(v);
    return;
  }
  auto at_row = st.row_positions.view({B, 1, T, 1});
  e.k.scatter_(2, at_row.expand({B, Hkv, T, D}), k);
  e.v.scatter_(2, at_row.expand({B, Hkv, T, Dv}), v);
  k = e.k.narrow(2, 0, st.kv_len);
  v = e.v.narrow(2, 0, st.kv_len);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& bias, double scale, std::optional<double> softcap,
                     const AttentionTaps* taps, ForwardState* st, const at::Tensor& sinks) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), K = k.size(2), Dv = v.size(3);
  at::Tensor kk = k, vv = v;
  if (Hkv != H) {  // repeat_kv: each kv head serves H / Hkv consecutive query heads
    kk = k.unsqueeze(2).expand({B, Hkv, H / Hkv, K, D}).reshape({B, H, K, D});
    vv = v.unsqueeze(2).expand({B, Hkv, H / Hkv, K, Dv}).reshape({B, H, K, Dv});
  }
  // A per-row bias (cached decoding) broadcast over the heads.
  const at::Tensor mask = bias.dim() == 4 ? bias.expand({B, H, T, K}).reshape({B * H, T, K}) : bias;
  at::Tensor scores;
  if (softcap) {  // HF: scores * scaling, then softcap * tanh(scores / softcap), then the mask
    scores = at::bmm(q.reshape({B * H, T, D}), kk.reshape({B * H, K, D}).transpose(1, 2)) * scale;
    scores = (scores / *softcap).tanh_().mul_(*softcap).add_(mask);
  } else {
    // One GEMM computes bias + scale * q k^T: no separate passes over the [T, K] scores.
    scores = at::baddbmm(mask, q.reshape({B * H, T, D}), kk.reshape({B * H, K, D}).transpose(1, 2),
                         /*beta=*/1.0, /*alpha=*/scale);
  }
  // [B * H, T, K] -> [B, T, H, K]: a query token's row of every head (a view; the capture copies).
  auto show = [&](Tap* tap, const at::Tensor& t) {
    if (taps && st && tap && tap->hooked())
      tap->call(t.view({B, H, T, K}).permute({0, 2, 1, 3}), *st);
  };
  if (taps) show(taps->scores, scores);
  at::Tensor probs;
  if (sinks.defined()) {
    // gpt-oss's eager attention: the sink as a last column, the row's maximum subtracted, softmax
    // in the scores' dtype, the sink's column dropped.
    at::Tensor sink = sinks.to(scores.scalar_type()).view({1, H, 1, 1}).expand({B, H, T, 1});
    at::Tensor all = at::cat({scores, sink.reshape({B * H, T, 1})}, -1);
    all = all - std::get<0>(all.max(-1, /*keepdim=*/true));
    probs = at::softmax(all, -1).narrow(-1, 0, K);
  } else {
    // In float32 and rounded to the compute dtype (HF's eager softmax(..., dtype=torch.float32)).
    probs = scores.scalar_type() == at::kFloat
                ? at::softmax(scores, -1)
                : at::softmax(scores, -1, at::kFloat).to(scores.scalar_type());
  }
  // Scores upcast for 16-bit values (AttentionShape::scores_in_float32): rounded to v's dtype.
  if (probs.scalar_type() != vv.scalar_type()) probs = probs.to(vv.scalar_type());
  if (taps) show(taps->probs, probs);
  auto ctx = at::bmm(probs, vv.reshape({B * H, K, Dv}));  // [B*H, T, Dv]
  return ctx.view({B, H, T, Dv}).transpose(1, 2).reshape({B, T, H * Dv});
}

}  // namespace actcap
