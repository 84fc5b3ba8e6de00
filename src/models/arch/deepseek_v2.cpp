// DeepSeek-V2 (transformers configuration_deepseek_v2.py, modeling_deepseek_v2.py: DeepSeek-V2 and
// V2-Lite, DeepSeek-Coder-V2): the DeepSeek family (deepseek_family.h) with RoPE as complex
// multiplication over interleaved pairs (apply_rotary_emb), the softmax scale times mscale^2 for
// a scaled RoPE with mscale_all_dim (DeepSeek's code, and transformers from PR #47435 on;
// 5.12.1 leaves it out), MLPs with mlp_bias, and softmax routing: topk_method "greedy" (the k
// most probable experts) or "group_limited_greedy" (n_group groups ranked by their best expert,
// topk_group kept; transformers 5.12.1 fails on it, reading an attribute it never sets, so this is
// DeepSeek's rule), weights the probabilities times routed_scaling_factor (never renormalised).
// Its router's module is never called in transformers (the weight is used directly), so
// transformers' hooks see nothing at `mlp.gate`; actcap's point there is the float32 logits.
#include <nlohmann/json.hpp>

#include "models/arch/deepseek_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class DeepseekV2 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "deepseek_v2"; }
  std::vector<std::string> model_types() const override { return {"deepseek_v2"}; }
  std::vector<std::string> class_names() const override { return {"DeepseekV2ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<DeepseekParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 2048;
    d.bos_token_id = 1, d.eos_token_id = 2;
    d.config_class = "DeepseekV2Config";
    // DeepseekV2Config sets head_dim to qk_rope_head_dim whatever the file says.
    parse_deepseek_attention(f, d, /*saved_dims=*/false, c, *p);
    if (c.hidden_size % c.num_attention_heads != 0)  // DeepseekV2Config.validate_architecture
      throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size,
                              " (DeepseekV2Config refuses this)"));
    p->rope_layout = LatentAttentionShape::RopeLayout::kComplex;
    // apply_rotary_emb views the rotated parts, which start after qk_nope_head_dim and
    // kv_lora_rank features, as complex pairs: torch's view_as_complex needs both even.
    for (const auto& [key, value] :
         {std::pair<const char*, int64_t>{"qk_nope_head_dim", p->qk_nope_head_dim},
          {"kv_lora_rank", p->kv_lora_rank}})
      if (value % 2 != 0)
        throw InputError(concat(f.origin(), ": ", key, "=", value,
                                " is odd; DeepSeek-V2's rotary embedding views the features after "
                                "it as complex pairs, which needs it even"));
    p->mlp_bias = f.boolean({"mlp_bias"}, false);
    if (!f.has("num_experts_per_tok"))
      throw InputError(concat(f.origin(),
                              ": num_experts_per_tok is absent or null; DeepseekV2Config has no "
                              "default (set the number of experts each token chooses)"));
    refuse_nulls(f, {"n_routed_experts", "topk_method"}, d.config_class);
    parse_expert_counts(f, {"n_routed_experts"}, 64, 0, *p);
    p->routing = DeepseekRouting::Kind::kSoftmax;
    const std::string method = f.string({"topk_method"}, "greedy");
    if (method == "group_limited_greedy") {
      for (const char* key : {"n_group", "topk_group"})
        if (!f.has(key))
          throw InputError(concat(f.origin(), ": topk_method is group_limited_greedy but ", key,
                                  " is absent or null; set it"));
      p->n_group = f.positive({"n_group"}, std::nullopt);
      p->topk_group = f.positive({"topk_group"}, std::nullopt);
    } else if (method != "greedy") {
      throw InputError(concat(f.origin(), ": topk_method '", method,
                              "' is not supported; DeepSeek-V2 routes with \"greedy\" or "
                              "\"group_limited_greedy\""));
    }
    p->norm_topk_prob = false;  // not read: DeepseekV2Moe never renormalises
    parse_deepseek_experts(f, d.config_class, 1407, 2, 1.0, 0, *p);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<DeepseekParams>();
    write_deepseek(c, j);
    j["mlp_bias"] = p.mlp_bias;
    j["topk_method"] = p.n_group > 0 ? "group_limited_greedy" : "greedy";
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"deepseek-v2-lite"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool lite = name == "deepseek-v2-lite";
    ModelConfig c = deepseek_preset(this->name(), lite ? "tiny" : name);
    auto& q = c.params<DeepseekParams>();
    q.routing = DeepseekRouting::Kind::kSoftmax;
    q.rope_layout = LatentAttentionShape::RopeLayout::kComplex;
    q.norm_topk_prob = false;
    q.routed_scaling_factor = 1.5;  // so that it shows
    // Greedy, as DeepSeek-V2-Lite routes: transformers 5.12.1 cannot run group_limited_greedy.
    q.n_group = q.topk_group = 0;
    if (!lite) return c;
    // DeepSeek-V2-Lite's sizes (15.7B parameters, 2.4B active per token), greedy routing, its
    // YaRN context.
    c.vocab_size = 102400, c.hidden_size = 2048, q.intermediate_size = 10944;
    c.num_hidden_layers = 27, c.num_attention_heads = q.num_key_value_heads = 16;
    c.max_position_embeddings = 163840;
    c.bos_token_id = 100000, c.eos_token_id = 100001;
    q.qk_rope_head_dim = q.head_dim = 64, q.qk_nope_head_dim = 128, q.v_head_dim = 128;
    q.q_lora_rank.reset(), q.kv_lora_rank = 512;
    q.num_experts = 64, q.top_k = 6;
    q.moe_intermediate_size = 1408, q.n_shared_experts = 2;
    q.shared_expert_intermediate_size = 2 * 1408;
    q.routed_scaling_factor = 1.0, q.first_k_dense_replace = 1;
    q.rope.rope_type = "yarn", q.rope.factor = 40, q.rope.original_max_position_embeddings = 4096;
    q.rope.beta_fast = 32, q.rope.beta_slow = 1, q.rope.mscale = 0.707,
    q.rope.mscale_all_dim = 0.707;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    return build_deepseek(c, w);
  }
};

}  // namespace

const Architecture& deepseek_v2_architecture() {
  static const DeepseekV2 arch;
  return arch;
}

}  // namespace actcap
