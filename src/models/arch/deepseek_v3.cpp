// DeepSeek-V3 (transformers configuration_deepseek_v3.py, modeling_deepseek_v3.py: DeepSeek-V3 and
// R1, Moonlight, models of that shape): Llama's pre-norm layer with multi-head latent attention
// (LatentAttention: low-rank queries unless q_lora_rank is null, compressed keys and values, a
// rotated key part every head shares; RoPE over qk_rope_head_dim, interleaved with rope_interleave;
// scale (qk_nope_head_dim + qk_rope_head_dim)^-0.5, times mscale^2 for a scaled RoPE with
// mscale_all_dim) and, from layer first_k_dense_replace on, a mixture of experts: a float32 router
// `mlp.gate` with grouped sigmoid routing (GroupedSigmoidRouting: n_group groups, topk_group kept,
// num_experts_per_tok experts, e_score_correction_bias, routed_scaling_factor) over
// n_routed_experts experts of moe_intermediate_size, plus shared experts `mlp.shared_experts` (a
// gated MLP n_shared_experts times as wide) run after them. The layers before run a dense MLP of
// intermediate_size. Weights as the Hub's checkpoints name them (experts one tensor each) or
// stacked as transformers 5 holds them; the multi-token-prediction layers stored after the last
// layer (num_nextn_predict_layers of them) are not run, as transformers ignores them. FP8
// block-quantized checkpoints (quantization_config) are refused.
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/moe_family.h"
#include "models/config_reader.h"
#include "models/parts/latent_attention.h"
#include "models/parts/moe.h"

namespace actcap {

namespace {

struct DeepseekParams : MoeParams {
  std::optional<int64_t> q_lora_rank;  // nullopt: one q_proj
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;  // also head_dim, the RoPE's width
  int64_t v_head_dim = 128;
  int64_t n_shared_experts = 1;
  double routed_scaling_factor = 2.5;
  int64_t n_group = 8;
  int64_t topk_group = 4;
  bool rope_interleave = true;
  double mscale_all_dim = 0;             // of a scaled RoPE's dict: scales the softmax (0: not set)
  int64_t num_nextn_predict_layers = 0;  // stored after the last layer, not run
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<DeepseekParams>(*this);
  }
};

const MoeNames kNames{"mlp", "gate_proj", "up_proj", "down_proj",
                      /*weights_in_compute_dtype=*/false};

// The softmax scale: qk_head_dim^-0.5, times mscale^2 when a scaled RoPE (any type but default)
// sets mscale_all_dim (DeepseekV3Attention; mscale = 0.1 * mscale_all_dim * ln(factor) + 1 for
// factor > 1).
double attention_scale(const DeepseekParams& p) {
  double scale = 1.0 / std::sqrt(static_cast<double>(p.qk_nope_head_dim + p.qk_rope_head_dim));
  const RopeConfig& r = p.rope;
  if (r.rope_type != "default" && p.mscale_all_dim != 0 && r.factor > 1) {
    const double m = 0.1 * p.mscale_all_dim * std::log(r.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

// mscale_all_dim of the RoPE dict parse_rope reads (a non-empty rope_scaling, else
// rope_parameters), whatever its type; 0 when absent.
double rope_mscale_all_dim(const ConfigReader& f) {
  const json* dict = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const json* d = f.find({key});
    if (d && d->is_object() && !(dict && d->empty())) dict = d;
  }
  if (!dict) return 0;
  const double v = ConfigReader(*dict, f.origin()).number({"mscale_all_dim"}, 0);
  if (!std::isfinite(v))
    throw InputError(concat(f.origin(), ": rope field 'mscale_all_dim' must be finite"));
  return v;
}

// A boolean whose null transformers reads as false (DeepseekV3Config keeps the None and tests it).
bool flag(const ConfigReader& f, const char* key, bool absent) {
  if (f.root().contains(key) && f.root()[key].is_null()) return false;
  return f.boolean({key}, absent);
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
  s.interleave = p.rope_interleave;
  s.rope = std::move(rope);
  return s;
}

std::unique_ptr<Module> latent_attention(const ModelConfig& c, WeightSource a,
                                         const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<DeepseekParams>();
  const int64_t H = c.hidden_size, heads = c.num_attention_heads;
  const int64_t qk = p.qk_nope_head_dim + p.qk_rope_head_dim;
  // DeepseekV3RMSNorm's own eps (1e-6), not rms_norm_eps: transformers builds these two without it.
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
  o.grouped.groups = p.n_group;
  o.grouped.top_groups = p.topk_group;
  o.grouped.scale = p.routed_scaling_factor;
  // A buffer transformers keeps float32 (_keep_in_fp32_modules_strict) and zeroes at init.
  o.grouped.correction = gate.get("e_score_correction_bias", {E}, Init::kBias);
  SharedExpert shared;
  shared.mlp = llama_gated_mlp(c, block.pp("shared_experts"), p.hidden_act,
                               p.shared_expert_intermediate_size);
  shared.after_routed = true;
  return std::make_unique<SparseMoe>(name, H, std::move(router), expert_weights(c, block, kNames),
                                     p.hidden_act, o, std::move(shared));
}

class DeepseekV3 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "deepseek_v3"; }
  std::vector<std::string> model_types() const override { return {"deepseek_v3"}; }
  std::vector<std::string> class_names() const override { return {"DeepseekV3ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    const json& root = f.root();
    if (const json* q = f.find({"quantization_config"}))
      throw InputError(concat(f.origin(), ": quantization_config ", q->dump(),
                              " is not supported; DeepSeek-V3 runs unquantized weights (a "
                              "BF16 or F32 conversion of an FP8 checkpoint)"));
    auto p = std::make_unique<DeepseekParams>();
    // The RoPE's width is qk_rope_head_dim (DeepseekV3Config sets head_dim to it).
    p->qk_rope_head_dim = f.positive({"qk_rope_head_dim"}, 64);
    if (p->qk_rope_head_dim % 2 != 0)
      throw InputError(
          concat(f.origin(), ": qk_rope_head_dim=", p->qk_rope_head_dim, " must be even for RoPE"));
    p->qk_nope_head_dim = f.positive({"qk_nope_head_dim"}, 128);
    // transformers 5 saves the derived head_dim and qk_head_dim, and reads them back over its
    // derivation: a file where they differ from it cannot run there.
    const std::pair<const char*, int64_t> derived[] = {
        {"head_dim", p->qk_rope_head_dim},
        {"qk_head_dim", p->qk_nope_head_dim + p->qk_rope_head_dim}};
    for (const auto& [key, want] : derived)
      if (f.has(key) && f.integer({key}, 0) != want)
        throw InputError(concat(f.origin(), ": field '", key, "' is ", root[key].dump(),
                                " but DeepSeek-V3 derives ", want,
                                " (qk_rope_head_dim, qk_nope_head_dim); remove it or set it so"));
    LlamaDefaults d;
    d.max_position_embeddings = 4096;
    d.head_dim = p->qk_rope_head_dim;
    d.bos_token_id = 0, d.eos_token_id = 1;
    // An absent field is DeepseekV3Config's default, 128; only a null means num_attention_heads.
    d.num_key_value_heads = 128;
    d.config_class = "DeepseekV3Config";
    parse_llama_family(f, d, c, *p);
    if (p->num_key_value_heads != c.num_attention_heads)
      throw InputError(concat(
          f.origin(), ": num_key_value_heads=", p->num_key_value_heads,
          root.contains("num_key_value_heads") ? "" : " (absent: DeepseekV3Config's default)",
          " differs from num_attention_heads=", c.num_attention_heads,
          "; DeepSeek-V3's latent attention gives every head its own keys "
          "(set them equal)"));
    p->attention_bias = f.boolean({"attention_bias"}, false);
    if (root.contains("q_lora_rank") && root["q_lora_rank"].is_null())
      p->q_lora_rank.reset();
    else
      p->q_lora_rank = f.positive({"q_lora_rank"}, 1536);
    p->kv_lora_rank = f.positive({"kv_lora_rank"}, 512);
    p->v_head_dim = f.positive({"v_head_dim"}, 128);
    p->rope_interleave = flag(f, "rope_interleave", true);
    p->mscale_all_dim = rope_mscale_all_dim(f);

    // transformers maps num_local_experts to n_routed_experts; with both, num_local_experts wins.
    parse_expert_counts(f, {"num_local_experts", "n_routed_experts"}, 256, 8, *p);
    if (p->num_experts == 0)
      throw InputError(concat(f.origin(),
                              ": n_routed_experts is 0; DeepSeek-V3's sparse layers "
                              "need experts (set first_k_dense_replace to "
                              "num_hidden_layers for a dense model)"));
    p->moe_intermediate_size = f.positive({"moe_intermediate_size"}, 2048);
    p->n_shared_experts = f.positive({"n_shared_experts"}, 1);
    p->shared_expert_intermediate_size = p->moe_intermediate_size * p->n_shared_experts;
    p->routed_scaling_factor = f.number({"routed_scaling_factor"}, 2.5);
    if (!std::isfinite(p->routed_scaling_factor))
      throw InputError(concat(f.origin(), ": field 'routed_scaling_factor' must be finite"));
    p->norm_topk_prob = flag(f, "norm_topk_prob", true);
    p->n_group = f.positive({"n_group"}, 8);
    p->topk_group = f.positive({"topk_group"}, 4);
    if (p->num_experts % p->n_group != 0 || p->num_experts / p->n_group < 2)
      throw InputError(concat(f.origin(), ": n_group=", p->n_group,
                              " must divide n_routed_experts=", p->num_experts,
                              " into groups of at least 2 (each group is ranked by its two best "
                              "experts)"));
    if (p->topk_group > p->n_group)
      throw InputError(
          concat(f.origin(), ": topk_group=", p->topk_group, " exceeds n_group=", p->n_group));
    // More would choose experts of groups not kept (transformers then takes masked ones).
    if (p->top_k > p->topk_group * (p->num_experts / p->n_group))
      throw InputError(concat(f.origin(), ": num_experts_per_tok=", p->top_k, " exceeds the ",
                              p->topk_group * (p->num_experts / p->n_group),
                              " experts of the topk_group=", p->topk_group,
                              " groups kept; raise topk_group or lower num_experts_per_tok"));
    p->first_k_dense_replace = f.integer({"first_k_dense_replace"}, 3);
    if (p->first_k_dense_replace < 0)
      throw InputError(concat(f.origin(), ": field 'first_k_dense_replace' must be >= 0"));
    p->num_nextn_predict_layers = f.integer({"num_nextn_predict_layers"}, 0);
    if (p->num_nextn_predict_layers < 0 || p->num_nextn_predict_layers > 1024)
      throw InputError(
          concat(f.origin(), ": field 'num_nextn_predict_layers' must be between 0 and 1024"));
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<DeepseekParams>();
    write_llama_family(c, j);
    j.erase("head_dim");  // DeepseekV3Config derives it
    j["attention_bias"] = p.attention_bias;
    j["q_lora_rank"] = p.q_lora_rank ? json(*p.q_lora_rank) : json(nullptr);
    j["kv_lora_rank"] = p.kv_lora_rank;
    j["qk_nope_head_dim"] = p.qk_nope_head_dim;
    j["qk_rope_head_dim"] = p.qk_rope_head_dim;
    j["v_head_dim"] = p.v_head_dim;
    j["rope_interleave"] = p.rope_interleave;
    j["n_routed_experts"] = p.num_experts;
    j["num_experts_per_tok"] = p.top_k;
    j["moe_intermediate_size"] = p.moe_intermediate_size;
    j["n_shared_experts"] = p.n_shared_experts;
    j["routed_scaling_factor"] = p.routed_scaling_factor;
    j["norm_topk_prob"] = p.norm_topk_prob;
    j["n_group"] = p.n_group;
    j["topk_group"] = p.topk_group;
    j["first_k_dense_replace"] = p.first_k_dense_replace;
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"deepseek-v3"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool v3 = name == "deepseek-v3";
    ModelConfig base = moe_preset(this->name(), v3 ? "tiny" : name, 8, 2, 0);
    auto p = std::make_unique<DeepseekParams>();
    static_cast<MoeParams&>(*p) = base.params<MoeParams>();
    base.arch_params = std::move(p);
    ModelConfig c = std::move(base);
    auto& q = c.params<DeepseekParams>();
    const int64_t heads_dim = c.hidden_size / c.num_attention_heads;
    // The family's sizes in latent form: each head's query/key half unrotated, half rotated; a
    // q bottleneck and a kv bottleneck of half the width; values as wide as a head.
    q.num_key_value_heads = c.num_attention_heads;
    q.qk_rope_head_dim = q.head_dim = heads_dim / 2;
    q.qk_nope_head_dim = heads_dim / 2;
    q.v_head_dim = heads_dim;
    q.q_lora_rank = c.hidden_size / 2;
    q.kv_lora_rank = c.hidden_size / 2;
    q.num_experts = 8, q.top_k = 2, q.n_group = 4, q.topk_group = 2;
    q.moe_intermediate_size = q.intermediate_size / 4;
    q.n_shared_experts = 1;
    q.shared_expert_intermediate_size = q.moe_intermediate_size;
    q.first_k_dense_replace = 1;  // one dense layer, so that both kinds run
    c.bos_token_id = 0, c.eos_token_id = 1;
    if (!v3) return c;
    // DeepSeek-V3's sizes (671B parameters, 37B active per token), its YaRN context.
    c.vocab_size = 129280, c.hidden_size = 7168, q.intermediate_size = 18432;
    c.num_hidden_layers = 61, c.num_attention_heads = q.num_key_value_heads = 128;
    c.max_position_embeddings = 163840;
    q.qk_rope_head_dim = q.head_dim = 64, q.qk_nope_head_dim = 128, q.v_head_dim = 128;
    q.q_lora_rank = 1536, q.kv_lora_rank = 512;
    q.num_experts = 256, q.top_k = 8, q.n_group = 8, q.topk_group = 4;
    q.moe_intermediate_size = 2048, q.n_shared_experts = 1;
    q.shared_expert_intermediate_size = 2048;
    q.routed_scaling_factor = 2.5, q.first_k_dense_replace = 3;
    q.rope.rope_type = "yarn", q.rope.factor = 40, q.rope.original_max_position_embeddings = 4096;
    q.rope.beta_fast = 32, q.rope.beta_slow = 1, q.rope.mscale = 1.0, q.rope.mscale_all_dim = 1.0;
    q.mscale_all_dim = 1.0;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
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
      return p.sparse(i) ? sparse_block(c, layer)
                         : llama_gated_mlp(c, layer.pp("mlp"), p.hidden_act);
    };
    BuiltModel m = build_moe_family(c, w, kNames, b);
    m.attention_width =
        LatentAttention::width_per_token(shape(c, nullptr), p.q_lora_rank.value_or(0));
    return m;
  }
};

}  // namespace

const Architecture& deepseek_v3_architecture() {
  static const DeepseekV3 arch;
  return arch;
}

}  // namespace actcap
