// Gemma 1 and 1.1 (transformers configuration_gemma.py, modeling_gemma.py). Llama's pre-norm layer
// with what Gemma 2 kept of it:
//   - every RMSNorm scales by (1 + w), in float32 before casting back (HF: (x * (1 +
//   w)).type_as(x));
//   - the embedding is multiplied by sqrt(hidden_size) rounded to the activation dtype; the
//     `model.embed_tokens` point is the scaled embedding (HF's GemmaTextScaledWordEmbedding);
//   - GeGLU: the MLP's activation is hidden_activation when config.json has it, else hidden_act,
//     else gelu_pytorch_tanh. Gemma configs may carry the legacy "hidden_act": "gelu" beside
//     "hidden_activation": "gelu_pytorch_tanh", the activation the models were trained with, which
//     transformers 4.x ran after its Gemma fixes (#29402); transformers 5 reads only hidden_act and
//     runs exact GELU there. A warning names the two when they differ;
//   - head_dim 256 and num_key_value_heads 16 when absent (GemmaConfig's defaults), q/k/v/o biases
//     with attention_bias, tied by default, bos 2, eos 1.
// Unlike Gemma 2: two norms per layer, attention scaled by head_dim^-0.5, no soft-caps, no windows.
#include <cmath>
#include <nlohmann/json.hpp>

#include "actcap/diagnostics.h"
#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class Gemma : public Architecture {
 public:
  std::string name() const override { return "gemma"; }
  std::vector<std::string> model_types() const override { return {"gemma"}; }
  std::vector<std::string> class_names() const override { return {"GemmaForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    p->hidden_act = "gelu_pytorch_tanh";
    LlamaDefaults d = gemma_defaults(8192);
    d.num_key_value_heads = 16, d.config_class = "GemmaConfig";
    parse_llama_family(f, d, c, *p);
    if (f.has("hidden_activation")) {
      const std::string act = f.string({"hidden_activation"}, p->hidden_act);
      check_activation(act, "hidden_activation", f.origin());
      if (act != p->hidden_act)
        warn(concat(f.origin(), ": hidden_activation '", act, "' runs, not hidden_act '",
                    p->hidden_act, "' (transformers 5 runs hidden_act on this config)"));
      p->hidden_act = act;
    }
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    refuse_bidirectional_attention(f);
    c.arch_params = std::move(p);
  }

  // Both activation fields, equal: transformers 4 and 5 then run the same model.
  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<LlamaParams>();
    write_llama_family(c, j);
    j["hidden_activation"] = p.hidden_act;
    j["attention_bias"] = p.attention_bias;
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"gemma-2b", "gemma-7b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "gemma-2b" || name == "gemma-7b";
    ModelConfig c = llama_family_preset(this->name(), real ? "tiny" : name);
    auto& p = c.params<LlamaParams>();
    p.hidden_act = "gelu_pytorch_tanh";
    c.tie_word_embeddings = true;
    c.bos_token_id = 2, c.eos_token_id = 1;
    if (!real) return c;
    // google/gemma-2b's and google/gemma-7b's config.json.
    c.vocab_size = 256000, p.head_dim = 256, c.max_position_embeddings = 8192;
    p.rope.rope_theta = 10000.0;
    if (name == "gemma-2b") {
      c.hidden_size = 2048, p.intermediate_size = 16384, c.num_hidden_layers = 18;
      c.num_attention_heads = 8, p.num_key_value_heads = 1;
    } else {
      c.hidden_size = 3072, p.intermediate_size = 24576, c.num_hidden_layers = 28;
      c.num_attention_heads = 16, p.num_key_value_heads = 16;
    }
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    LlamaBuild b;
    b.unit_offset_norms = true;
    // HF: torch.tensor(hidden_size ** 0.5).to(weight dtype), i.e. rounded to float32 first.
    b.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
    return build_llama_family(c, w, b);
  }
};

}  // namespace

const Architecture& gemma_architecture() {
  static const Gemma arch;
  return arch;
}

}  // namespace actcap
