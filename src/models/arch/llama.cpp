// Llama (transformers configuration_llama.py, modeling_llama.py): the Llama family's structure
// with optional attention and MLP biases.
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class Llama : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "llama"; }
  std::vector<std::string> model_types() const override { return {"llama"}; }
  std::vector<std::string> class_names() const override { return {"LlamaForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    parse_llama_family(f, LlamaDefaults{}, c, *p);
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->mlp_bias = f.boolean({"mlp_bias"}, false);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    write_llama_family(c, j);
    j["attention_bias"] = c.params<LlamaParams>().attention_bias;
    j["mlp_bias"] = c.params<LlamaParams>().mlp_bias;
  }

  std::vector<std::string> presets() const override {
    std::vector<std::string> out = llama_family_presets();
    out.push_back("llama-3.1-8b");
    return out;
  }

  ModelConfig preset(const std::string& name) const override {
    if (name != "llama-3.1-8b") return LlamaFamilyArchitecture::preset(name);
    // meta-llama/Llama-3.1-8B's config.json (Llama Scope's model): 8.03B parameters, 16 GB in
    // bf16.
    ModelConfig c = LlamaFamilyArchitecture::preset("tiny");
    auto& p = c.params<LlamaParams>();
    c.vocab_size = 128256, c.hidden_size = 4096, p.intermediate_size = 14336;
    c.num_hidden_layers = 32, c.num_attention_heads = 32, p.num_key_value_heads = 8;
    p.head_dim = 128, c.max_position_embeddings = 131072, p.rms_norm_eps = 1e-5;
    p.rope.rope_type = "llama3", p.rope.rope_theta = 500000.0, p.rope.factor = 8.0;
    p.rope.low_freq_factor = 1.0, p.rope.high_freq_factor = 4.0;
    p.rope.original_max_position_embeddings = 8192;
    c.bos_token_id = 128000, c.eos_token_id = 128001;
    c.tie_word_embeddings = false;
    return c;
  }
};

}  // namespace

const Architecture& llama_architecture() {
  static const Llama arch;
  return arch;
}

}  // namespace actcap
