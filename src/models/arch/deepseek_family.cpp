#include "models/arch/deepseek_family.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "models/config_reader.h"

namespace actcap {

namespace {

const MoeNames kNames{"mlp", "gate_proj", "up_proj", "down_proj",
                      /*weights_in_compute_dtype=*/false};

// The softmax scale: qk_head_dim^-0.5, times mscale^2 when a scaled RoPE (any type but default)
// sets mscale_all_dim (DeepseekV3Attention; mscale = 0.1 * mscale_all_dim * ln(factor) + 1 for
// factor > 1).
double attention_scale(const DeepseekParams& p) {
  double scale = 1.0 / std::sqrt(static_cast<double>(p.qk_nope_head_dim + p.qk_rope_head_dim));
  const RopeConfig& r = p.rope;
  const double all_dim = r.mscale_all_dim.value_or(0);
  if (r.rope_type != "default" && all_dim != 0 && r.factor > 1) {
    const double m = 0.1 * all_dim * std::log(r.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

LatentAttentionShape shape(const ModelConfig& c, std::shared_ptr<const Rope> rope) {
  const auto& p = c.params<DeepseekParams>();
  LatentAttentionShape s;
  s.hidden = c.hidden_size;
  s.heads = c.num_attention_heads;
  s.kv_lora_rank = p.kv_lora_rank;
  s.qk_nope_head_dim = p.qk_nope_head_dim;
  s.qk_rope_head_dim = p.qk_rope_head_dim;
  s.v_head_dim = p.v_head_dim;
  s.scale = attention_scale(p);
  s.rope_layout = p.rope_layout;
  s.rope = std::move(rope);
  return s;
}

std::unique_ptr<Module> latent_attention(const ModelConfig& c, WeightSource a,
                                         const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<DeepseekParams>();
  const int64_t H = c.hidden_size, heads = c.num_attention_heads;
  const int64_t qk = p.qk_nope_head_dim + p.qk_rope_head_dim;
  // The RMSNorm class's own eps (1e-6), not rms_norm_eps: transformers builds these two without it.
  auto norm = [&](const char* name, int64_t width) {
    WeightSource v = a.pp(name);
    return std::make_unique<RMSNorm>(v.path(), v.get("weight", {width}, Init::kGain), 1e-6);
  };
  LatentAttentionParts parts;
  if (p.q_lora_rank) {
    parts.q_a = linear_layer(a, "q_a_proj", H, *p.q_lora_rank, p.attention_bias);
    parts.q_a_norm = norm("q_a_layernorm", *p.q_lora_rank);
    parts.q_b = linear_layer(a, "q_b_proj", *p.q_lora_rank, heads * qk, false);
  } else {
    parts.q = linear_layer(a, "q_proj", H, heads * qk, false);
  }
  parts.kv_a = linear_layer(a, "kv_a_proj_with_mqa", H, p.kv_lora_rank + p.qk_rope_head_dim,
                            p.attention_bias);
  parts.kv_a_norm = norm("kv_a_layernorm", p.kv_lora_rank);
  parts.kv_b = linear_layer(a, "kv_b_proj", p.kv_lora_rank,
                            heads * (p.qk_nope_head_dim + p.v_head_dim), false);
  parts.o = linear_layer(a, "o_proj", heads * p.v_head_dim, H, p.attention_bias);
  return std::make_unique<LatentAttention>(a.path(), shape(c, rope), std::move(parts));
}

std::unique_ptr<Module> sparse_block(const ModelConfig& c, WeightSource layer) {
  const auto& p = c.params<DeepseekParams>();
  const int64_t H = c.hidden_size, E = p.num_experts;
  const std::string name = layer.path() + ".mlp";
  WeightSource block = moe_block(layer, kNames);
  WeightSource gate = block.pp("gate");
  auto router = std::make_unique<Float32Router>(gate.path(), gate.get("weight", {E, H}));
  SparseMoeOptions o;
  o.top_k = p.top_k;
  o.normalize_top_k = p.norm_topk_prob;
  o.deepseek.kind = p.routing;
  o.deepseek.groups = p.n_group;
  o.deepseek.top_groups = p.topk_group;
  o.deepseek.scale = p.routed_scaling_factor;
  // DeepSeek-V3's buffer, which transformers keeps float32 (_keep_in_fp32_modules_strict).
  if (p.routing == DeepseekRouting::Kind::kSigmoid)
    o.deepseek.correction = gate.get("e_score_correction_bias", {E}, Init::kBias);
  SharedExpert shared;
  shared.mlp = llama_gated_mlp(c, block.pp("shared_experts"), p.hidden_act,
                               p.shared_expert_intermediate_size);
  shared.after_routed = true;
  return std::make_unique<SparseMoe>(name, H, std::move(router), expert_weights(c, block, kNames),
                                     p.hidden_act, o, std::move(shared));
}

}  // namespace

void refuse_nulls(const ConfigReader& f, std::initializer_list<const char*> keys,
                  const char* config_class) {
  for (const char* key : keys)
    if (f.root().contains(key) && f.root()[key].is_null())
      throw InputError(concat(f.origin(), ": field '", key, "' is null, which ", config_class,
                              " refuses or cannot run; give a value, or leave the field out for "
                              "the default"));
}

void parse_deepseek_attention(const ConfigReader& f, LlamaDefaults d, bool saved_dims,
                              ModelConfig& c, DeepseekParams& p) {
  const json& root = f.root();
  refuse_nulls(f, {"qk_rope_head_dim", "qk_nope_head_dim", "kv_lora_rank", "v_head_dim"},
               d.config_class);
  // The RoPE's width is qk_rope_head_dim (both configs set head_dim to it).
  p.qk_rope_head_dim = f.positive({"qk_rope_head_dim"}, 64);
  if (p.qk_rope_head_dim % 2 != 0)
    throw InputError(
        concat(f.origin(), ": qk_rope_head_dim=", p.qk_rope_head_dim, " must be even for RoPE"));
  p.qk_nope_head_dim = f.positive({"qk_nope_head_dim"}, 128);
  // transformers 5 saves the derived head_dim and qk_head_dim; DeepSeek-V3's config reads them
  // back over its derivation: a file where they differ from it cannot run there.
  const std::pair<const char*, int64_t> derived[] = {
      {"head_dim", p.qk_rope_head_dim}, {"qk_head_dim", p.qk_nope_head_dim + p.qk_rope_head_dim}};
  for (const auto& [key, want] : derived)
    if (saved_dims && f.has(key) && f.integer({key}, 0) != want)
      throw InputError(concat(f.origin(), ": field '", key, "' is ", root[key].dump(), " but ",
                              c.model_type, " derives ", want,
                              " (qk_rope_head_dim, qk_nope_head_dim); remove it or set it so"));
  d.head_dim = p.qk_rope_head_dim;
  json without = root;  // a head_dim the config class overwrites is not read
  if (!saved_dims) without.erase("head_dim");
  parse_llama_family(saved_dims ? f : ConfigReader(without, f.origin()), d, c, p);
  if (p.num_key_value_heads != c.num_attention_heads)
    throw InputError(concat(f.origin(), ": num_key_value_heads=", p.num_key_value_heads,
                            root.contains("num_key_value_heads")
                                ? ""
                                : concat(" (absent: ", d.config_class, "'s default)"),
                            " differs from num_attention_heads=", c.num_attention_heads,
                            "; the latent attention gives every head its own keys "
                            "(set them equal)"));
  p.attention_bias = f.boolean({"attention_bias"}, false);
  if (root.contains("q_lora_rank") && root["q_lora_rank"].is_null())
    p.q_lora_rank.reset();
  else
    p.q_lora_rank = f.positive({"q_lora_rank"}, 1536);
  p.kv_lora_rank = f.positive({"kv_lora_rank"}, 512);
  p.v_head_dim = f.positive({"v_head_dim"}, 128);
  p.num_nextn_predict_layers = f.integer({"num_nextn_predict_layers"}, 0);
  if (p.num_nextn_predict_layers < 0 || p.num_nextn_predict_layers > 1024)
    throw InputError(
        concat(f.origin(), ": field 'num_nextn_predict_layers' must be between 0 and 1024"));
}

void parse_deepseek_experts(const ConfigReader& f, const char* config_class, int64_t inner_default,
                            int64_t shared_default, double scale_default, int64_t dense_default,
                            DeepseekParams& p) {
  refuse_nulls(f,
               {"moe_intermediate_size", "n_shared_experts", "routed_scaling_factor",
                "first_k_dense_replace"},
               config_class);
  if (p.num_experts == 0)
    throw InputError(concat(f.origin(),
                            ": n_routed_experts is 0; the sparse layers need experts (set "
                            "first_k_dense_replace to num_hidden_layers for a dense model)"));
  p.moe_intermediate_size = f.positive({"moe_intermediate_size"}, inner_default);
  // transformers runs every sparse layer's shared experts (0 of them: a zero-width MLP).
  if (f.integer({"n_shared_experts"}, shared_default) == 0)
    throw InputError(concat(f.origin(),
                            ": n_shared_experts is 0, a shared MLP of no width; set it to at "
                            "least 1"));
  p.n_shared_experts = f.positive({"n_shared_experts"}, shared_default);
  p.shared_expert_intermediate_size = p.moe_intermediate_size * p.n_shared_experts;
  p.routed_scaling_factor = f.number({"routed_scaling_factor"}, scale_default);
  if (!std::isfinite(p.routed_scaling_factor))
    throw InputError(concat(f.origin(), ": field 'routed_scaling_factor' must be finite"));
  p.first_k_dense_replace = f.integer({"first_k_dense_replace"}, dense_default);
  if (p.first_k_dense_replace < 0)
    throw InputError(concat(f.origin(), ": field 'first_k_dense_replace' must be >= 0"));
  if (p.n_group == 0) return;
  // Groups of at least 2 for DeepSeek-V3, which ranks a group by its two best experts.
  const int64_t least = p.routing == DeepseekRouting::Kind::kSigmoid ? 2 : 1;
  if (p.num_experts % p.n_group != 0 || p.num_experts / p.n_group < least)
    throw InputError(concat(f.origin(), ": n_group=", p.n_group,
                            " must divide n_routed_experts=", p.num_experts, " into groups",
                            least > 1 ? " of at least 2 (each group is ranked by its two best "
                                        "experts)"
                                      : ""));
  if (p.topk_group > p.n_group)
    throw InputError(
        concat(f.origin(), ": topk_group=", p.topk_group, " exceeds n_group=", p.n_group));
  // More would choose experts of groups not kept (transformers then takes masked ones).
  if (p.top_k > p.topk_group * (p.num_experts / p.n_group))
    throw InputError(concat(f.origin(), ": num_experts_per_tok=", p.top_k, " exceeds the ",
                            p.topk_group * (p.num_experts / p.n_group),
                            " experts of the topk_group=", p.topk_group,
                            " groups kept; raise topk_group or lower num_experts_per_tok"));
}

void write_deepseek(const ModelConfig& c, nlohmann::json& j) {
  const auto& p = c.params<DeepseekParams>();
  write_llama_family(c, j);
  j.erase("head_dim");  // derived
  j["attention_bias"] = p.attention_bias;
  j["q_lora_rank"] = p.q_lora_rank ? json(*p.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = p.kv_lora_rank;
  j["qk_nope_head_dim"] = p.qk_nope_head_dim;
  j["qk_rope_head_dim"] = p.qk_rope_head_dim;
  j["v_head_dim"] = p.v_head_dim;
  j["n_routed_experts"] = p.num_experts;
  j["num_experts_per_tok"] = p.top_k;
  j["moe_intermediate_size"] = p.moe_intermediate_size;
  j["n_shared_experts"] = p.n_shared_experts;
  j["routed_scaling_factor"] = p.routed_scaling_factor;
  j["n_group"] = p.n_group > 0 ? json(p.n_group) : json(nullptr);
  j["topk_group"] = p.topk_group > 0 ? json(p.topk_group) : json(nullptr);
  j["first_k_dense_replace"] = p.first_k_dense_replace;
}

ModelConfig deepseek_preset(const std::string& arch, const std::string& preset) {
  ModelConfig c = moe_preset(arch, preset, 8, 2, 0);
  auto p = std::make_unique<DeepseekParams>();
  static_cast<MoeParams&>(*p) = c.params<MoeParams>();
  const int64_t head = c.hidden_size / c.num_attention_heads;
  // The family's sizes in latent form: each head's query/key half unrotated, half rotated; a q
  // bottleneck and a kv bottleneck of half the width; values as wide as a head.
  p->num_key_value_heads = c.num_attention_heads;
  p->qk_rope_head_dim = p->head_dim = head / 2;
  p->qk_nope_head_dim = head / 2;
  p->v_head_dim = head;
  p->q_lora_rank = c.hidden_size / 2;
  p->kv_lora_rank = c.hidden_size / 2;
  p->num_experts = 8, p->top_k = 2, p->n_group = 4, p->topk_group = 2;
  p->moe_intermediate_size = p->intermediate_size / 4;
  p->n_shared_experts = 1;
  p->shared_expert_intermediate_size = p->moe_intermediate_size;
  p->first_k_dense_replace = 1;  // one dense layer, so that both kinds run
  c.arch_params = std::move(p);
  c.bos_token_id = 0, c.eos_token_id = 1;
  return c;
}

BuiltModel build_deepseek(const ModelConfig& c, WeightSource& w) {
  const auto& p = c.params<DeepseekParams>();
  for (int64_t i = 0; i < p.num_nextn_predict_layers; ++i)
    w.ignore_prefix(concat("model.layers.", c.num_hidden_layers + i, "."));
  LlamaBuild b;
  b.attention = [](const ModelConfig& c, WeightSource a, int64_t,
                   const std::shared_ptr<const Rope>& rope) {
    return latent_attention(c, a, rope);
  };
  b.mlp = [](const ModelConfig& c, WeightSource layer, int64_t i) {
    const auto& p = c.params<DeepseekParams>();
    return p.sparse(i) ? sparse_block(c, layer) : llama_gated_mlp(c, layer.pp("mlp"), p.hidden_act);
  };
  BuiltModel m = build_moe_family(c, w, kNames, b);
  m.attention_width =
      LatentAttention::width_per_token(shape(c, nullptr), p.q_lora_rank.value_or(0));
  return m;
}

}  // namespace actcap
