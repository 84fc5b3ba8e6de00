// OLMo 1 (transformers configuration_olmo.py, modeling_olmo.py: allenai's OLMo-1B-hf, OLMo-7B-hf
// and their 0424 / 0724 releases). The Llama family's pre-norm layer, RoPE and SwiGLU MLP with:
//   - non-parametric LayerNorms (OlmoLayerNorm: no weight, no bias, eps 1e-5, in float32) for
//     input_layernorm, post_attention_layernorm and model.norm; the checkpoints hold no norm
//     tensors;
//   - clip_qkv: when set, q, k and v are clamped to [-clip_qkv, clip_qkv] after their projections,
//     before RoPE. The q_proj / k_proj / v_proj points are the projections as they returned,
//     unclamped (transformers clamps their outputs in place after its hooks ran);
//   - RoPE in float32 under a 16-bit compute dtype (float32 cos/sin, rounded once, as OLMo 2);
//   - q, k, v and o biases with attention_bias; untied unless config.json ties; no BOS token
//     (bos_token_id None: it stands as the EOS id, as for OLMo 2).
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"
#include "models/parts/norm.h"

namespace actcap {

namespace {

// OlmoLayerNorm: F.layer_norm(x.float(), (hidden,), None, None, eps=1e-5).to(x.dtype).
std::unique_ptr<Module> olmo_layer_norm(const ModelConfig&, WeightSource w, const std::string& name,
                                        int64_t width) {
  return std::make_unique<LayerNorm>(w.pp(name).path(), width, 1e-5);
}

class Olmo : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "olmo"; }
  std::vector<std::string> model_types() const override { return {"olmo"}; }
  std::vector<std::string> class_names() const override { return {"OlmoForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    LlamaDefaults d;  // max_position_embeddings 2048, head_dim hidden / heads, kv heads = heads
    d.eos_token_id = 50279;
    parse_llama_family(f, d, c, *p);
    if (!f.has("bos_token_id")) c.bos_token_id = c.eos_token_id;
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->clip_qkv = parse_clip_qkv(f);
    p->rope_in_float32 = true;  // float32 cos/sin: q and k rotated in float32
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<LlamaParams>();
    write_llama_family(c, j);
    j.erase("rms_norm_eps");  // OlmoLayerNorm's eps is fixed
    // OlmoConfig has no head_dim field (transformers reads one it is given, as an extra attribute)
    if (p.head_dim * c.num_attention_heads == c.hidden_size) j.erase("head_dim");
    j["attention_bias"] = p.attention_bias;
    j["clip_qkv"] = clip_qkv_json(p);
    if (c.bos_token_id == c.eos_token_id) j.erase("bos_token_id");  // None, as parse() reads it
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"olmo-1b", "olmo-7b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "olmo-1b" || name == "olmo-7b";
    ModelConfig c = LlamaFamilyArchitecture::preset(real ? "tiny" : name);
    auto& p = c.params<LlamaParams>();
    p.rope_in_float32 = true;
    if (!real) return c;
    // OLMo 1B's and 7B's sizes (1B ties its embeddings).
    c.vocab_size = 50304, c.max_position_embeddings = 2048, p.rope.rope_theta = 10000.0;
    c.bos_token_id = c.eos_token_id = 50279;
    if (name == "olmo-1b") {
      c.hidden_size = 2048, p.intermediate_size = 8192, c.num_hidden_layers = 16;
      c.num_attention_heads = p.num_key_value_heads = 16;
      c.tie_word_embeddings = true;
    } else {
      c.hidden_size = 4096, p.intermediate_size = 11008, c.num_hidden_layers = 32;
      c.num_attention_heads = p.num_key_value_heads = 32;
    }
    p.head_dim = c.hidden_size / c.num_attention_heads;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    LlamaBuild b;
    b.norm = olmo_layer_norm;
    return build_llama_family(c, w, b);
  }
};

}  // namespace

const Architecture& olmo_architecture() {
  static const Olmo arch;
  return arch;
}

}  // namespace actcap
