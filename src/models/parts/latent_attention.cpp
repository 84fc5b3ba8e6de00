#include "models/parts/latent_attention.h"

namespace actcap {

LatentAttention::LatentAttention(const std::string& name, LatentAttentionShape shape,
                                 LatentAttentionParts p)
    : Module(name, hidden_point(name + ":input", shape.hidden), hidden_point(name, shape.hidden)),
      s_(std::move(shape)) {
  auto take = [&](std::unique_ptr<Module>& m) { return m ? add(std::move(m)) : nullptr; };
  // Children in the order the forward runs them (the points list).
  q_ = take(p.q);
  q_a_ = take(p.q_a);
  q_a_norm_ = take(p.q_a_norm);
  q_b_ = take(p.q_b);
  kv_a_ = take(p.kv_a);
  kv_a_norm_ = take(p.kv_a_norm);
  kv_b_ = take(p.kv_b);
  taps_.scores = add(std::make_unique<Tap>(name + ":scores", std::vector<int64_t>{s_.heads, 0}));
  taps_.probs = add(std::make_unique<Tap>(name + ":probs", std::vector<int64_t>{s_.heads, 0}));
  o_ = take(p.o);
}

int64_t LatentAttention::width_per_token(const LatentAttentionShape& s, int64_t q_lora_rank) {
  const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
  // q_a and its norm, the compressed kv and its norm, the queries (projected and assembled), the
  // kv_b expansion, the keys, the values and the context.
  return 2 * q_lora_rank + 2 * (s.kv_lora_rank + s.qk_rope_head_dim) +
         s.heads * (2 * qk + (s.qk_nope_head_dim + s.v_head_dim) + qk + 2 * s.v_head_dim);
}

at::Tensor LatentAttention::forward(const at::Tensor& x, ForwardState& st) {
  const int64_t B = x.size(0), T = x.size(1), H = s_.heads;
  const int64_t nope = s_.qk_nope_head_dim, rot = s_.qk_rope_head_dim, L = s_.kv_lora_rank;
  at::Tensor q = q_ ? q_->call(x, st) : q_b_->call(q_a_norm_->call(q_a_->call(x, st), st), st);
  q = q.view({B, T, H, nope + rot}).transpose(1, 2);  // [B, H, T, qk]
  at::Tensor q_pass = q.narrow(-1, 0, nope), q_rot = q.narrow(-1, nope, rot);

  at::Tensor compressed = kv_a_->call(x, st);  // [B, T, L + rot]
  at::Tensor kv = kv_b_->call(kv_a_norm_->call(compressed.narrow(-1, 0, L), st), st);
  kv = kv.view({B, T, H, nope + s_.v_head_dim}).transpose(1, 2);
  at::Tensor k_pass = kv.narrow(-1, 0, nope), v = kv.narrow(-1, nope, s_.v_head_dim);
  at::Tensor k_rot = compressed.narrow(-1, L, rot).view({B, 1, T, rot});

  using Layout = LatentAttentionShape::RopeLayout;
  if (s_.rope_layout == Layout::kComplex) {
    q_rot = s_.rope->apply_complex(q_rot, st);
    k_rot = s_.rope->apply_complex(k_rot, st);
  } else {
    if (s_.rope_layout == Layout::kInterleaved) {
      // Evens then odds: the rotate-half rotation then equals the pairwise one, op for op.
      auto split = [&](const at::Tensor& t) {
        return at::cat({t.slice(-1, 0, rot, 2), t.slice(-1, 1, rot, 2)}, -1);
      };
      q_rot = split(q_rot), k_rot = split(k_rot);
    }
    q_rot = s_.rope->apply(q_rot, st);
    k_rot = s_.rope->apply(k_rot, st);
  }
  k_rot = k_rot.expand({B, H, T, rot});
  at::Tensor query = at::cat({q_pass, q_rot}, -1);
  at::Tensor key = at::cat({k_pass, k_rot}, -1);
  cache_keys_values(this, key, v, st);
  auto ctx = attention(query, key, v, st.bias(std::nullopt), s_.scale, std::nullopt, &taps_, &st);
  return o_->call(ctx, st);
}

}  // namespace actcap
