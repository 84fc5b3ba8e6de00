// OLMo 2 (transformers configuration_olmo2.py, modeling_olmo2.py): the Llama family's sizes, RoPE
// and SwiGLU MLP with its norms moved: no pre-norm, post_attention_layernorm and
// post_feedforward_layernorm on the sublayer outputs before the residual add
// (h = x + norm1(attn(x)), out = h + norm2(mlp(h))), and q_norm / k_norm RMSNorms over the whole
// q / k projection (heads * head_dim, hook points [heads * head_dim]) before the head split and
// RoPE. Its RMSNorms scale by the weight in float32 and round last, and q and k are rotated in
// float32 (its rotary module returns float32 cos/sin) and rounded once. attention_bias gives q, k,
// v and o biases; no MLP bias; untied unless config.json ties.
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class Olmo2 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "olmo2"; }
  std::vector<std::string> model_types() const override { return {"olmo2"}; }
  std::vector<std::string> class_names() const override { return {"Olmo2ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    p->rms_norm_eps = 1e-5;  // Olmo2Config's default
    LlamaDefaults d;         // max_position_embeddings 2048, head_dim hidden / heads
    d.eos_token_id = 50279;
    parse_llama_family(f, d, c, *p);
    // OLMo 2 has no BOS token: Olmo2Config's bos_token_id is None, and the released config.json
    // files leave it out. It stands as the EOS id here, and write() leaves it out again.
    if (!f.has("bos_token_id")) c.bos_token_id = c.eos_token_id;
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->norms_scale_in_float32 = true;  // Olmo2RMSNorm: (weight * x).to(input_dtype)
    p->rope_in_float32 = true;         // float32 cos/sin: q and k rotated in float32
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    write_llama_family(c, j);
    j["attention_bias"] = c.params<LlamaParams>().attention_bias;
    if (c.bos_token_id == c.eos_token_id) j.erase("bos_token_id");  // None, as parse() reads it
  }

  std::vector<std::string> presets() const override {
    std::vector<std::string> out = llama_family_presets();
    out.push_back("olmo-2-1b");
    return out;
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "olmo-2-1b";
    ModelConfig c = LlamaFamilyArchitecture::preset(real ? "tiny" : name);
    auto& p = c.params<LlamaParams>();
    p.rms_norm_eps = 1e-6;
    p.norms_scale_in_float32 = true;
    p.rope_in_float32 = true;
    if (!real) return c;
    // allenai/OLMo-2-0425-1B's config.json (no bos_token_id: see parse()).
    c.vocab_size = 100352, c.hidden_size = 2048, p.intermediate_size = 8192;
    c.num_hidden_layers = 16, c.num_attention_heads = 16, p.num_key_value_heads = 16;
    p.head_dim = 128, c.max_position_embeddings = 4096, p.rope.rope_theta = 500000.0;
    c.bos_token_id = c.eos_token_id = 100257;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    LlamaBuild b;
    b.layer = olmo2_decoder_layer;
    return build_llama_family(c, w, b);
  }
};

}  // namespace

const Architecture& olmo2_architecture() {
  static const Olmo2 arch;
  return arch;
}

}  // namespace actcap
