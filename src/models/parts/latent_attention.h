// DeepSeek's multi-head latent attention (transformers' DeepseekV3Attention): queries through a
// low-rank bottleneck (q_a_proj, q_a_layernorm, q_b_proj) or one q_proj; keys and values from one
// compressed projection (kv_a_proj_with_mqa) whose first kv_lora_rank features are normalised
// (kv_a_layernorm) and expanded per head (kv_b_proj) into each head's unrotated key part and its
// value, and whose last qk_rope_head_dim features are one rotated key part every head shares. Each
// head's query and key are [unrotated (qk_nope_head_dim); rotated (qk_rope_head_dim)]; values are
// v_head_dim wide. Each part is a child module with its HF name and hook points.
#pragma once

#include <memory>

#include "models/module.h"
#include "models/parts/attention.h"
#include "models/parts/rope.h"

namespace actcap {

struct LatentAttentionShape {
  int64_t hidden = 0;  // the block's width
  int64_t heads = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double scale = 0;  // multiplies q k^T
  // How the rotated features are laid out and rotated:
  //   kRotateHalf: transformers' apply_rotary_pos_emb (DeepSeek-V3 without rope_interleave);
  //   kInterleaved: in pairs (x0, x1), (x2, x3)... each rotated by one frequency, leaving in
  //     rotate-half order, evens then odds (DeepSeek-V3's apply_rotary_pos_emb_interleave);
  //   kComplex: in pairs taken as complex numbers times float32 e^(i * angle), leaving interleaved,
  //     rounded to the compute dtype once (DeepSeek-V2's apply_rotary_emb: Rope::apply_complex).
  enum class RopeLayout {
    kRotateHalf,
    kInterleaved,
    kComplex
  } rope_layout = RopeLayout::kInterleaved;
  std::shared_ptr<const Rope> rope;  // over qk_rope_head_dim
};

// The projections and norms, in the order the forward runs them: `q` (q_proj) or q_a, q_a_norm
// and q_b; then kv_a, kv_a_norm, kv_b; o last.
struct LatentAttentionParts {
  std::unique_ptr<Module> q;
  std::unique_ptr<Module> q_a, q_a_norm, q_b;
  std::unique_ptr<Module> kv_a, kv_a_norm, kv_b;
  std::unique_ptr<Module> o;
};

class LatentAttention : public Module {
 public:
  LatentAttention(const std::string& name, LatentAttentionShape shape, LatentAttentionParts parts);
  // transformers caches the expanded keys and values of every head, as actcap does.
  int64_t kv_elements_per_token() const override {
    return s_.heads * (s_.qk_nope_head_dim + s_.qk_rope_head_dim + s_.v_head_dim);
  }
  // Elements per token a forward holds beyond the block's hidden-wide tensors: the queries, keys,
  // values and context of every head and the compressed projections.
  static int64_t width_per_token(const LatentAttentionShape& s, int64_t q_lora_rank);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  LatentAttentionShape s_;
  AttentionTaps taps_;
  Module *q_ = nullptr, *q_a_ = nullptr, *q_a_norm_ = nullptr, *q_b_ = nullptr;
  Module *kv_a_ = nullptr, *kv_a_norm_ = nullptr, *kv_b_ = nullptr, *o_ = nullptr;
};

}  // namespace actcap
