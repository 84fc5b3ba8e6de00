// Gemma 2 (transformers configuration_gemma2.py, modeling_gemma2.py). Differences from the Llama
// family:
//   - RMSNorm scales by (1 + w), in float32 before casting back (HF: (x * (1 + w)).type_as(x));
//   - the embedding is multiplied by sqrt(hidden_size) rounded to the activation dtype; the
//     `model.embed_tokens` point is the scaled embedding (HF scales right after the module);
//   - four norms per layer: h = x + post_attention_layernorm(self_attn(input_layernorm(x))),
//     out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
//   - attention scale query_pre_attn_scalar^-0.5, scores soft-capped by attn_logit_softcapping
//     before the mask; logits soft-capped by final_logit_softcapping after lm_head (the `lm_head`
//     point is uncapped, the model's logits capped);
//   - sliding_window on the layers layer_types names, by default the even ones (0, 2, ...);
//   - GeGLU with hidden_activation (hidden_act is ignored), head_dim 256 unless config.json says,
//     num_key_value_heads 4 when absent, q/k/v/o biases with attention_bias, tied by default.
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

struct Gemma2Params : GemmaParams {
  Gemma2Params() {  // Gemma2Config's caps (the presets keep them)
    attn_logit_softcapping = 50.0;
    final_logit_softcapping = 30.0;
  }
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<Gemma2Params>(*this);
  }
};

std::unique_ptr<Module> gemma2_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                     const std::shared_ptr<const Rope>& rope) {
  return gemma_decoder_layer(c, w, layer, rope, /*attn_softcap=*/true, /*qk_norm=*/false);
}

class Gemma2 : public Architecture {
 public:
  std::string name() const override { return "gemma2"; }
  std::vector<std::string> model_types() const override { return {"gemma2"}; }
  std::vector<std::string> class_names() const override { return {"Gemma2ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<Gemma2Params>();
    p->hidden_act = "gelu_pytorch_tanh";
    parse_llama_family(f, gemma_defaults(8192), c, *p);
    if (!f.has("num_key_value_heads")) {  // Gemma2Config's default is 4, not num_attention_heads
      p->num_key_value_heads = 4;
      if (c.num_attention_heads % 4 != 0)
        throw InputError(concat(f.origin(),
                                ": num_key_value_heads is absent, so 4 (Gemma2Config's default), "
                                "which does not divide num_attention_heads=",
                                c.num_attention_heads, "; set num_key_value_heads"));
    }
    if (c.hidden_size % c.num_attention_heads != 0)  // Gemma2Config.validate_architecture
      throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size,
                              " (transformers refuses this config)"));
    parse_gemma_fields(f, c, *p, /*attn_softcap=*/50.0, /*final_softcap=*/30.0);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override { write_gemma_fields(c, j); }

  std::vector<std::string> presets() const override { return llama_family_presets({"gemma-2-2b"}); }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "gemma-2-2b";
    ModelConfig c =
        gemma_preset(this->name(), real ? "tiny" : name, std::make_unique<Gemma2Params>());
    if (!real) return c;
    // google/gemma-2-2b's config.json.
    auto& q = c.params<Gemma2Params>();
    c.vocab_size = 256000, c.hidden_size = 2304, q.intermediate_size = 9216;
    c.num_hidden_layers = 26, c.num_attention_heads = 8, q.num_key_value_heads = 4;
    q.head_dim = 256, c.max_position_embeddings = 8192, q.rope.rope_theta = 10000.0;
    q.query_pre_attn_scalar = 256, q.sliding_window = 4096;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<Gemma2Params>();
    LlamaBuild b;
    b.layer = gemma2_layer;
    b.unit_offset_norms = true;
    // HF: torch.tensor(hidden_size ** 0.5, dtype=hidden dtype), i.e. rounded to float32.
    b.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
    b.logit_softcap = p.final_logit_softcapping;
    return build_llama_family(c, w, b);
  }
};

}  // namespace

const Architecture& gemma2_architecture() {
  static const Gemma2 arch;
  return arch;
}

}  // namespace actcap
