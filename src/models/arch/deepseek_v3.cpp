// DeepSeek-V3 (transformers configuration_deepseek_v3.py, modeling_deepseek_v3.py: DeepSeek-V3 and
// R1, Moonlight, Kimi-K2's shape): the DeepSeek family (deepseek_family.h) with RoPE over
// qk_rope_head_dim, interleaved with rope_interleave (default true), the softmax scale times
// mscale^2 for a scaled RoPE with mscale_all_dim, and grouped sigmoid routing (n_group groups,
// topk_group kept, e_score_correction_bias, renormalised with norm_topk_prob,
// routed_scaling_factor).
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/deepseek_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

// A boolean whose null transformers reads as false (DeepseekV3Config keeps the None and tests it).
bool flag(const ConfigReader& f, const char* key, bool absent) {
  if (f.root().contains(key) && f.root()[key].is_null()) return false;
  return f.boolean({key}, absent);
}

class DeepseekV3 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "deepseek_v3"; }
  std::vector<std::string> model_types() const override { return {"deepseek_v3"}; }
  std::vector<std::string> class_names() const override { return {"DeepseekV3ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<DeepseekParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 4096;
    d.bos_token_id = 0, d.eos_token_id = 1;
    // An absent field is DeepseekV3Config's default, 128; only a null means num_attention_heads.
    d.num_key_value_heads = 128;
    d.config_class = "DeepseekV3Config";
    parse_deepseek_attention(f, d, /*saved_dims=*/true, c, *p);
    p->rope_layout = flag(f, "rope_interleave", true)
                         ? LatentAttentionShape::RopeLayout::kInterleaved
                         : LatentAttentionShape::RopeLayout::kRotateHalf;
    refuse_nulls(f, {"n_routed_experts", "num_experts_per_tok", "n_group", "topk_group"},
                 d.config_class);
    // transformers maps num_local_experts to n_routed_experts; with both, num_local_experts wins.
    parse_expert_counts(f, {"num_local_experts", "n_routed_experts"}, 256, 8, *p);
    p->routing = DeepseekRouting::Kind::kSigmoid;
    p->norm_topk_prob = flag(f, "norm_topk_prob", true);
    p->n_group = f.positive({"n_group"}, 8);
    p->topk_group = f.positive({"topk_group"}, 4);
    parse_deepseek_experts(f, d.config_class, 2048, 1, 2.5, 3, *p);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<DeepseekParams>();
    write_deepseek(c, j);
    j["rope_interleave"] = p.rope_layout == LatentAttentionShape::RopeLayout::kInterleaved;
    j["norm_topk_prob"] = p.norm_topk_prob;
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"deepseek-v3"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool v3 = name == "deepseek-v3";
    ModelConfig c = deepseek_preset(this->name(), v3 ? "tiny" : name);
    auto& q = c.params<DeepseekParams>();
    q.routing = DeepseekRouting::Kind::kSigmoid;
    q.routed_scaling_factor = 2.5;
    q.norm_topk_prob = true;
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
    q.first_k_dense_replace = 3;
    q.rope.rope_type = "yarn", q.rope.factor = 40, q.rope.original_max_position_embeddings = 4096;
    q.rope.beta_fast = 32, q.rope.beta_slow = 1, q.rope.mscale = 1.0, q.rope.mscale_all_dim = 1.0;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    return build_deepseek(c, w);
  }
};

}  // namespace

const Architecture& deepseek_v3_architecture() {
  static const DeepseekV3 arch;
  return arch;
}

}  // namespace actcap
