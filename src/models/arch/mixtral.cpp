// Mixtral (transformers configuration_mixtral.py, modeling_mixtral.py): Mistral's attention (no
// biases, a sliding window on every layer when sliding_window is set, none by default) with a
// sparse mixture of experts in place of the MLP: a router over num_local_experts experts, the
// num_experts_per_tok most probable run each token, their weights renormalised to sum 1 and kept
// in float32. The checkpoint stores the block under `block_sparse_moe` with experts' w1 (gate),
// w3 (up) and w2 (down); transformers 5 names the module `mlp`, and so do actcap's hook points.
#include <nlohmann/json.hpp>

#include "models/arch/moe_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

const MoeNames kNames{"block_sparse_moe", "w1", "w3", "w2", /*weights_in_compute_dtype=*/false};

class Mixtral : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "mixtral"; }
  std::vector<std::string> model_types() const override { return {"mixtral"}; }
  std::vector<std::string> class_names() const override { return {"MixtralForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<MoeParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 4096 * 32;
    d.rope_theta = 1e6;      // MixtralConfig.default_theta
    p->rms_norm_eps = 1e-5;  // MixtralConfig's
    d.num_key_value_heads = 8, d.config_class = "MixtralConfig";
    parse_llama_family(f, d, c, *p);
    p->windows = LlamaParams::Windows::kEveryLayer;
    if (f.has("sliding_window")) p->sliding_window = f.positive({"sliding_window"}, std::nullopt);
    parse_expert_counts(f, {"num_experts", "num_local_experts"}, 8, 2, *p);
    if (p->num_experts == 0)
      throw InputError(concat(f.origin(), ": num_local_experts is 0; Mixtral needs experts"));
    p->moe_intermediate_size = p->intermediate_size;
    p->norm_topk_prob = true;
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<MoeParams>();
    write_llama_family(c, j);
    j["sliding_window"] = p.sliding_window ? nlohmann::json(*p.sliding_window) : nlohmann::json();
    j["num_local_experts"] = p.num_experts;
    j["num_experts_per_tok"] = p.top_k;
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"mixtral-8x7b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "mixtral-8x7b";
    ModelConfig c = moe_preset(this->name(), real ? "tiny" : name, 4, 2, 0);
    auto& p = c.params<MoeParams>();
    p.windows = LlamaParams::Windows::kEveryLayer;
    p.rope.rope_theta = 1e6, p.rms_norm_eps = 1e-5;
    if (real) {
      // mistralai/Mixtral-8x7B-v0.1's config.json: 46.7B parameters, 12.9B active per token.
      c.vocab_size = 32000, c.hidden_size = 4096, p.intermediate_size = 14336;
      c.num_hidden_layers = 32, c.num_attention_heads = 32, p.num_key_value_heads = 8;
      p.head_dim = 128, c.max_position_embeddings = 32768;
      p.num_experts = 8, p.top_k = 2;
    }
    p.moe_intermediate_size = p.intermediate_size;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    return build_moe_family(c, w, kNames);
  }
};

}  // namespace

const Architecture& mixtral_architecture() {
  static const Mixtral arch;
  return arch;
}

}  // namespace actcap
