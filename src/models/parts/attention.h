// Self-attention as the architectures compose it: separate q/k/v projections or one fused
// projection, grouped-query heads, an explicit head_dim, RoPE (full or partial), per-layer sliding
// windows, a custom scale, logit soft-capping and optional q/k norms, each part a child module with
// its HF name and hook points.
#pragma once

#include <memory>
#include <optional>

#include "models/module.h"
#include "models/parts/rope.h"

namespace actcap {

struct AttentionShape {
  int64_t hidden = 0;  // the block's width (input and output of the attention)
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  double scale = 0;               // multiplies q k^T (usually 1 / sqrt(head_dim))
  std::optional<int64_t> window;  // sliding window of this layer; nullopt = full causal
  std::optional<double> softcap;  // scores -> softcap * tanh(scores / softcap) (Gemma 2)
  // q, k and v clamped to [-clip_qkv, clip_qkv] after their projections (and q/k norms), before
  // RoPE (OLMo, OLMoE). The projection points stay unclamped, as transformers' hooks see them.
  std::optional<double> clip_qkv;
  std::shared_ptr<const Rope> rope;  // null: no rotary (GPT-2)
  // q_norm / k_norm normalise the whole projection (heads * head_dim) before the head split
  // (OLMo 2), instead of each head; their points are then [heads * head_dim] per token.
  bool qk_norm_whole = false;
  // Per-head q_norm / k_norm run after all three projections (Gemma 3: q_proj, k_proj, v_proj,
  // q_norm, k_norm) instead of each right after its own (Qwen3: q_proj, q_norm, k_proj, ...).
  bool qk_norms_last = false;
  // How a fused qkv projection's rows are laid out: kStacked [q (heads * D); k (kv_heads * D);
  // v (kv_heads * D)] (GPT-2's c_attn, Phi-3's qkv_proj), kPerHead [heads, 3, D] (GPT-NeoX's
  // query_key_value: each head's q, k and v rows side by side; kv_heads == heads).
  enum class QkvLayout { kStacked, kPerHead } qkv_layout = QkvLayout::kStacked;
  // Under a 16-bit compute dtype, q and k go to float32 for the scores (after RoPE and the cache),
  // the softmax runs in float32 and the probabilities are rounded to v's dtype before they
  // multiply it (GPT-J's _attn); otherwise the scores are in the compute dtype.
  bool scores_in_float32 = false;
};

// The projections, in the order the forward runs them. Either `qkv` (fused, laid out as
// AttentionShape::qkv_layout says) or q, k and v. q_norm / k_norm (optional) normalise each head
// after its projection, before RoPE (Qwen3, OLMo 2 per-head norms: RMSNorm over head_dim).
struct AttentionParts {
  std::unique_ptr<Module> qkv;
  std::unique_ptr<Module> q, q_norm, k, k_norm, v;
  std::unique_ptr<Module> o;
  // Optional per-head sink logits, [heads] (gpt-oss's `sinks`): see attention().
  at::Tensor sinks;
};

// The attention pattern points of one attention module: `NAME:scores` (q k^T after the scale,
// soft-cap and mask: -inf where a key is not visible) and `NAME:probs` (after softmax), each
// [B, T, heads, K] at the tap (the capture stores [heads, keys] per query token).
struct AttentionTaps {
  Tap* scores = nullptr;
  Tap* probs = nullptr;
};

class Attention : public Module {
 public:
  Attention(const std::string& name, AttentionShape shape, AttentionParts parts);
  int64_t kv_elements_per_token() const override { return 2 * s_.kv_heads * s_.head_dim; }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  AttentionShape s_;
  AttentionTaps taps_;
  at::Tensor sinks_;
  Module *qkv_ = nullptr, *q_ = nullptr, *q_norm_ = nullptr, *k_ = nullptr, *k_norm_ = nullptr,
         *v_ = nullptr, *o_ = nullptr;
};

// Generation (st.kv set): stores this step's keys k [B, Hkv, T, D] and values v [B, Hkv, T, Dv]
// in `owner`'s cache entry at the rows' positions and, when decoding, points k and v at every
// cached position; without a cache, nothing.
void cache_keys_values(const void* owner, at::Tensor& k, at::Tensor& v, ForwardState& st);

// softmax(q k^T * scale + bias) v with grouped-query heads: q [B, H, T, D], k [B, Hkv, K, D], v
// [B, Hkv, K, Dv] (K = T, or the cached positions when decoding; Dv = D except in DeepSeek's
// multi-head latent attention), bias [T, K] or [B, 1, T, K]. Returns [B, T, H * Dv]. `softcap` caps
// the scores before the bias, as Gemma 2. `sinks` ([H], optional): each head's sink logit joins its
// row as one more key with no value (gpt-oss): the softmax runs over the keys and the sink, in the
// scores' dtype after the row's maximum is subtracted, and the sink's share is dropped, so a row's
// probabilities sum to less than 1. `taps` (with `st`) are shown the scores (without the sink) and
// the probabilities when hooked.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& bias, double scale, std::optional<double> softcap = {},
                     const AttentionTaps* taps = nullptr, ForwardState* st = nullptr,
                     const at::Tensor& sinks = {});

}  // namespace actcap
