// Rotary position embeddings of the Llama family, as transformers computes them
// (modeling_rope_utils.py and LlamaRotaryEmbedding): inv_freq and the attention factor from the
// config, cos/sin per forward. Every RoPE type lives here: default, linear, dynamic (NTK), yarn,
// longrope, llama3.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "actcap/config.h"
#include "models/module.h"

namespace actcap {

class Rope {
 public:
  // head_dim: the rotated width; max_position_embeddings: the config's (dynamic scaling starts
  // past it). The config was validated by parse_config.
  Rope(const RopeConfig& config, int64_t head_dim, int64_t max_position_embeddings);

  // inv_freq [head_dim / 2] float32 for a forward over positions 0..seq_len-1, as a fresh HF
  // rotary module computes it in that forward (dynamic_rope_update sees seq_len = the largest
  // position id + 1): dynamic recomputes its base when seq_len > max_position_embeddings, longrope
  // takes long_factor when seq_len > original_max_position_embeddings. HF's module also keeps a
  // grown dynamic table for later forwards; actcap computes each forward on its own.
  at::Tensor inv_freq(int64_t seq_len) const;
  // HF's attention_scaling, which multiplies cos and sin: yarn's and longrope's attention factor,
  // 1 for the other types.
  double attention_factor() const { return attention_factor_; }
  // st.rope_cos / st.rope_sin [T, head_dim] for st.positions (T = st.seq).
  void prepare(ForwardState& st) const;

 private:
  at::Tensor dynamic_inv_freq(int64_t seq_len) const;

  RopeConfig c_;
  int64_t dim_;
  int64_t max_positions_;
  at::Tensor inv_freq_;       // the table a forward uses unless the cases above apply
  at::Tensor long_inv_freq_;  // longrope: long_factor's table
  double attention_factor_ = 1.0;
};

}  // namespace actcap
