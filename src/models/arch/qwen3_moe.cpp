// Qwen3-MoE (transformers configuration_qwen3_moe.py, modeling_qwen3_moe.py): Qwen3's attention
// (per-head RMSNorm on q and k before RoPE, head_dim = hidden_size / num_attention_heads unless
// config.json says, q/k/v/o biases only with attention_bias, a sliding window on every layer only
// with use_sliding_window) with a sparse mixture of experts on layer i when i is not in
// mlp_only_layers and (i + 1) is a multiple of decoder_sparse_step: a router over num_experts
// experts of moe_intermediate_size, the num_experts_per_tok most probable per token, weights
// renormalised when norm_topk_prob and rounded to the compute dtype. Other layers run Qwen3's
// dense MLP of intermediate_size. Weights under `mlp`: `gate` (the router) and `experts.E.
// {gate,up,down}_proj`.
#include <nlohmann/json.hpp>

#include "models/arch/moe_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

const MoeNames kNames{"mlp", "gate_proj", "up_proj", "down_proj",
                      /*weights_in_compute_dtype=*/true};

class Qwen3Moe : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "qwen3_moe"; }
  std::vector<std::string> model_types() const override { return {"qwen3_moe"}; }
  std::vector<std::string> class_names() const override { return {"Qwen3MoeForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<MoeParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 32768;
    d.bos_token_id = d.eos_token_id = 151643;
    d.num_key_value_heads = 4, d.config_class = "Qwen3MoeConfig";
    parse_llama_family(f, d, c, *p);
    p->attention_bias = f.boolean({"attention_bias"}, false);
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->qk_norm = true;
    // HF: sliding_window (absent: 4096, null: none) only with use_sliding_window, on every layer.
    p->windows = LlamaParams::Windows::kEveryLayer;
    p->use_sliding_window = f.boolean({"use_sliding_window"}, false);
    if (p->use_sliding_window) {
      if (f.has("sliding_window"))
        p->sliding_window = f.positive({"sliding_window"}, std::nullopt);
      else if (!f.root().contains("sliding_window"))
        p->sliding_window = 4096;
    }
    parse_expert_counts(f, {"num_local_experts", "num_experts"}, 128, 8, *p);
    parse_qwen_moe_fields(f, 768, *p);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<MoeParams>();
    write_llama_family(c, j);
    j["attention_bias"] = p.attention_bias;
    j["use_sliding_window"] = p.use_sliding_window;
    j["sliding_window"] = p.sliding_window ? nlohmann::json(*p.sliding_window) : nlohmann::json();
    write_qwen_moe_fields(p, j);
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"qwen3-30b-a3b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "qwen3-30b-a3b";
    ModelConfig c = moe_preset(this->name(), real ? "tiny" : name, 8, 2, 0);
    auto& p = c.params<MoeParams>();
    p.qk_norm = true;
    p.windows = LlamaParams::Windows::kEveryLayer;
    p.norm_topk_prob = true;
    p.moe_intermediate_size = p.intermediate_size / 4;
    // One dense layer (the first) before the sparse ones, so that both kinds run.
    p.mlp_only_layers = {0};
    if (!real) return c;
    // Qwen/Qwen3-30B-A3B's config.json: 30.5B parameters, 3.3B active per token.
    c.vocab_size = 151936, c.hidden_size = 2048, p.intermediate_size = 6144;
    c.num_hidden_layers = 48, c.num_attention_heads = 32, p.num_key_value_heads = 4;
    p.head_dim = 128, c.max_position_embeddings = 40960, p.rope.rope_theta = 1000000.0;
    p.num_experts = 128, p.top_k = 8, p.moe_intermediate_size = 768;
    p.mlp_only_layers.clear();
    c.bos_token_id = 151643, c.eos_token_id = 151645;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    return build_moe_family(c, w, kNames);
  }
};

}  // namespace

const Architecture& qwen3_moe_architecture() {
  static const Qwen3Moe arch;
  return arch;
}

}  // namespace actcap
