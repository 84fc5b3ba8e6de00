// Rotary position embeddings, as transformers computes them
// (modeling_rope_utils.py and LlamaRotaryEmbedding): inv_freq and the attention factor from the
// config, cos/sin per forward. Every RoPE type lives here: default, linear, dynamic (NTK), yarn,
// longrope, llama3.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <nlohmann/json_fwd.hpp>

#include "actcap/config.h"
#include "models/module.h"

namespace actcap {

class ConfigReader;

// RoPE from config.json, as transformers resolves it (standardize_rope_params and the
// _compute_*_parameters functions of modeling_rope_utils.py): top-level rope_theta and
// rope_scaling (v4) or rope_parameters (v5). head_dim is the rotated width.
// `default_theta`: the architecture's rope_theta where config.json gives none (transformers'
// default_theta).
RopeConfig parse_rope(const ConfigReader& f, int64_t head_dim, int64_t max_position_embeddings,
                      double default_theta = 10000.0);
// rope_scaling as transformers v4 writes it (null for default), every resolved field explicit.
nlohmann::json rope_to_json(const RopeConfig& r);

// Which features of a head rotate together: kHalves pairs feature i with i + dim / 2 (HF's
// rotate_half: Llama and nearly every other model), kInterleaved pairs 2i with 2i + 1 (GPT-J's
// rotate_every_two, cos and sin repeated per pair).
enum class RopePairs { kHalves, kInterleaved };

class Rope {
 public:
  // head_dim: the rotated width (the head's, or less for partial rotary); max_position_embeddings:
  // the config's (dynamic scaling starts past it). The config was validated by parse_config.
  // rotate_in_float32: under a 16-bit compute dtype, cos/sin stay float32 and the rotation runs in
  // float32, rounded once (OLMo's and OLMo 2's apply_rotary_pos_emb); otherwise cos/sin are
  // rounded to the compute dtype and the rotation runs in it (every other transformers model).
  // pairs: which features rotate together.
  Rope(const RopeConfig& config, int64_t head_dim, int64_t max_position_embeddings,
       bool rotate_in_float32 = false, RopePairs pairs = RopePairs::kHalves);

  // inv_freq [head_dim / 2] float32 for a forward over positions 0..seq_len-1, as a fresh HF
  // rotary module computes it in that forward (dynamic_rope_update sees seq_len = the largest
  // position id + 1): dynamic recomputes its base when seq_len > max_position_embeddings, longrope
  // takes long_factor when seq_len > original_max_position_embeddings. HF's module also keeps a
  // grown dynamic table for later forwards; actcap computes each forward on its own.
  at::Tensor inv_freq(int64_t seq_len) const;
  // HF's attention_scaling, which multiplies cos and sin: yarn's and longrope's attention factor,
  // 1 for the other types.
  double attention_factor() const { return attention_factor_; }
  // {cos, sin} [T, rotary dim] for st.positions (T = st.seq), computed once per forward and device.
  const std::vector<at::Tensor>& cos_sin(ForwardState& st) const;
  // x [B, heads, T, head_dim] rotated; when head_dim exceeds the rotary dim, only the first
  // rotary-dim features rotate and the rest pass through (partial rotary).
  at::Tensor apply(const at::Tensor& x, ForwardState& st) const;
  // DeepSeek-V2's apply_rotary_emb: x [B, heads, T, rotary dim] in float32, its features as
  // interleaved pairs (x0, x1), (x2, x3)... taken as complex numbers, times
  // polar(1, angle) * attention factor (complex float32), back to interleaved real pairs and
  // rounded to x's dtype once; with transformers' ops on tensors of transformers' layouts (x as
  // its q / k views), so that the product rounds as there.
  at::Tensor apply_complex(const at::Tensor& x, ForwardState& st) const;

 private:
  at::Tensor dynamic_inv_freq(int64_t seq_len) const;
  // inv_freq(seq_len) for this forward (HF's seq_len: st.rope_len, else st.seq) on the positions'
  // device.
  at::Tensor forward_inv_freq(ForwardState& st) const;

  RopeConfig c_;
  int64_t dim_;
  int64_t max_positions_;
  at::Tensor inv_freq_;       // the table a forward uses unless the cases above apply
  at::Tensor long_inv_freq_;  // longrope: long_factor's table
  double attention_factor_ = 1.0;
  bool rotate_in_float32_ = false;
  RopePairs pairs_ = RopePairs::kHalves;
};

}  // namespace actcap
