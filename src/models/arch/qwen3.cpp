// Qwen3 (transformers configuration_qwen3.py, modeling_qwen3.py): the Llama family's structure
// with an RMSNorm over head_dim on every q and k head before RoPE (q_norm / k_norm, hook points
// `...self_attn.q_norm` [heads, head_dim] per token), head_dim 128 unless config.json says, q/k/v/o
// biases only with attention_bias, and Qwen2's sliding-window rules.
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class Qwen3 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "qwen3"; }
  std::vector<std::string> model_types() const override { return {"qwen3"}; }
  std::vector<std::string> class_names() const override { return {"Qwen3ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 32768;
    d.head_dim = 128;  // Qwen3Config's default, not hidden_size / num_attention_heads
    d.bos_token_id = d.eos_token_id = 151643;
    d.num_key_value_heads = 32, d.config_class = "Qwen3Config";
    parse_llama_family(f, d, c, *p);
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->qk_norm = true;
    parse_qwen_windows(f, c, *p);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<LlamaParams>();
    write_llama_family(c, j);
    j["attention_bias"] = p.attention_bias;
    write_qwen_windows(p, j);
  }

  std::vector<std::string> presets() const override {
    std::vector<std::string> out = llama_family_presets();
    out.push_back("qwen3-0.6b");
    return out;
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "qwen3-0.6b";
    ModelConfig c = LlamaFamilyArchitecture::preset(real ? "tiny" : name);
    c.tie_word_embeddings = true;  // as the small Qwen3s (0.6B to 4B)
    if (!real) return c;
    // Qwen/Qwen3-0.6B's config.json.
    auto& p = c.params<LlamaParams>();
    c.vocab_size = 151936, c.hidden_size = 1024, p.intermediate_size = 3072;
    c.num_hidden_layers = 28, c.num_attention_heads = 16, p.num_key_value_heads = 8;
    p.head_dim = 128, c.max_position_embeddings = 40960, p.rope.rope_theta = 1000000.0;
    c.bos_token_id = 151643, c.eos_token_id = 151645;
    p.sliding_window = std::nullopt;
    return c;
  }

 protected:
  void preset_fields(const std::string&, LlamaParams& p) const override {
    p.qk_norm = true;
    p.windows = LlamaParams::Windows::kQwen;
    p.sliding_window = 4096;
  }
};

}  // namespace

const Architecture& qwen3_architecture() {
  static const Qwen3 arch;
  return arch;
}

}  // namespace actcap
