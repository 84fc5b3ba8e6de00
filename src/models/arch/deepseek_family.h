// What DeepSeek-V2 and DeepSeek-V3 share: Llama's pre-norm layer with multi-head latent attention
// (LatentAttention) and, from layer first_k_dense_replace on, a mixture of experts with a float32
// router `mlp.gate`, DeepSeek's routing (DeepseekRouting) and shared experts `mlp.shared_experts`
// run after the routed ones; the config fields (DeepseekParams), reading and writing those both
// read alike, the shared presets and the builder. Each architecture's file sets its defaults, its
// routing and its RoPE layout.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "models/arch/moe_family.h"
#include "models/parts/latent_attention.h"
#include "models/parts/moe.h"

namespace actcap {

struct DeepseekParams : MoeParams {
  std::optional<int64_t> q_lora_rank;  // nullopt: one q_proj
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;  // also head_dim, the RoPE's width
  int64_t v_head_dim = 128;
  int64_t n_shared_experts = 1;
  double routed_scaling_factor = 1.0;
  DeepseekRouting::Kind routing = DeepseekRouting::Kind::kSigmoid;
  int64_t n_group = 0;  // DeepSeek-V2's greedy routing: 0 (no group limit)
  int64_t topk_group = 0;
  LatentAttentionShape::RopeLayout rope_layout = LatentAttentionShape::RopeLayout::kInterleaved;
  int64_t num_nextn_predict_layers = 0;  // stored after the last layer, not run
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<DeepseekParams>(*this);
  }
};

// Reads what both read alike (the Hub's FP8 checkpoints are decoded at load, models/fp8_weights.h):
// the Llama family's fields with `d` (head_dim is qk_rope_head_dim, as both configs derive it);
// num_key_value_heads must equal num_attention_heads; attention_bias, q_lora_rank (absent: 1536;
// null: a plain q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim (even), v_head_dim;
// num_nextn_predict_layers. With `saved_dims`, a head_dim or qk_head_dim in config.json must equal
// the derivation (DeepSeek-V3's config reads them back over it).
void parse_deepseek_attention(const ConfigReader& f, LlamaDefaults d, bool saved_dims,
                              ModelConfig& c, DeepseekParams& p);
// The experts' fields both read alike after the counts: moe_intermediate_size, n_shared_experts
// (at least 1), routed_scaling_factor, first_k_dense_replace (nulls refused); then the group
// checks for n_group / topk_group when set.
void parse_deepseek_experts(const ConfigReader& f, const char* config_class, int64_t inner_default,
                            int64_t shared_default, double scale_default, int64_t dense_default,
                            DeepseekParams& p);
// A null in any of `keys`, which `config_class` keeps as None and then fails on, is refused
// (exit 2) rather than read as the default.
void refuse_nulls(const ConfigReader& f, std::initializer_list<const char*> keys,
                  const char* config_class);
// write_llama_family and the shared fields (head_dim left out: derived).
void write_deepseek(const ModelConfig& c, nlohmann::json& j);
// tiny, small, gpt2-small in latent form (heads of half unrotated, half rotated features, q and kv
// bottlenecks half the width, values a head wide; 8 experts choosing 2 in 4 groups keeping 2, one
// shared expert, the first layer dense), BOS 0, EOS 1.
ModelConfig deepseek_preset(const std::string& arch, const std::string& preset);
BuiltModel build_deepseek(const ModelConfig& c, WeightSource& w);

}  // namespace actcap
