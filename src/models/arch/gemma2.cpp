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
#include "models/parts/attention.h"
#include "models/parts/sublayer_norm_block.h"

namespace actcap {

namespace {

using json = nlohmann::json;

struct Gemma2Params : LlamaParams {
  std::string hidden_activation = "gelu_pytorch_tanh";
  double query_pre_attn_scalar = 256;
  std::optional<double> attn_logit_softcapping = 50.0;
  std::optional<double> final_logit_softcapping = 30.0;
  bool explicit_layer_types = false;  // layer_types came from config.json (written back)

  // layer_types, or HF's default: sliding on even layers.
  bool sliding(int64_t layer) const {
    if (!layer_types.empty()) return layer_types[layer] == "sliding_attention";
    return layer % 2 == 0;
  }
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<Gemma2Params>(*this);
  }
};

std::optional<double> optional_positive(const ConfigReader& f, const char* key,
                                        std::optional<double> dflt) {
  if (!f.root().contains(key)) return dflt;
  if (!f.has(key)) return std::nullopt;  // null: off
  const double v = f.number({key}, 0);
  if (!(v > 0) || !std::isfinite(v))
    throw InputError(concat(f.origin(), ": field '", key, "' must be positive or null"));
  return v;
}

json optional_json(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

std::unique_ptr<Module> gemma2_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                     const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<Gemma2Params>();
  const int64_t H = c.hidden_size;
  auto norm = [&](const char* name) {
    return llama_rms_norm(p, w, name, H, 0, /*unit_offset=*/true);
  };
  WeightSource a = w.pp("self_attn");
  AttentionShape shape = llama_attention_shape(c, layer, rope);
  shape.scale = 1.0 / std::sqrt(p.query_pre_attn_scalar);
  shape.window = p.sliding(layer) ? p.sliding_window : std::nullopt;
  shape.softcap = p.attn_logit_softcapping;
  SublayerNormParts b;
  b.pre1 = norm("input_layernorm");
  b.attn = std::make_unique<Attention>(a.path(), shape, llama_attention_projections(c, a));
  b.post1 = norm("post_attention_layernorm");
  b.pre2 = norm("pre_feedforward_layernorm");
  b.mlp = llama_gated_mlp(c, w.pp("mlp"), p.hidden_activation);
  b.post2 = norm("post_feedforward_layernorm");
  return std::make_unique<SublayerNormBlock>(w.path(), H, std::move(b));
}

class Gemma2 : public Architecture {
 public:
  std::string name() const override { return "gemma2"; }
  std::vector<std::string> model_types() const override { return {"gemma2"}; }
  std::vector<std::string> class_names() const override { return {"Gemma2ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<Gemma2Params>();
    p->hidden_act = "gelu_pytorch_tanh";
    LlamaDefaults d;
    d.max_position_embeddings = 8192;
    d.head_dim = 256;
    d.bos_token_id = 2;
    d.eos_token_id = 1;
    parse_llama_family(f, d, c, *p);
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
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
    p->hidden_activation = f.string({"hidden_activation"}, p->hidden_activation);
    check_activation(p->hidden_activation, "hidden_activation", f.origin());
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    const double scalar = f.number({"query_pre_attn_scalar"}, 256);
    if (!(scalar > 0) || !std::isfinite(scalar))
      throw InputError(concat(f.origin(), ": field 'query_pre_attn_scalar' must be positive"));
    p->query_pre_attn_scalar = scalar;
    p->attn_logit_softcapping = optional_positive(f, "attn_logit_softcapping", 50.0);
    p->final_logit_softcapping = optional_positive(f, "final_logit_softcapping", 30.0);
    if (f.boolean({"use_bidirectional_attention"}, false))
      throw InputError(concat(f.origin(),
                              ": use_bidirectional_attention is true; only causal attention "
                              "is supported"));
    // Absent: 4096. null: no window, which a sliding layer cannot run with.
    if (f.has("sliding_window"))
      p->sliding_window = f.positive({"sliding_window"}, std::nullopt);
    else if (!f.root().contains("sliding_window"))
      p->sliding_window = 4096;
    p->layer_types = parse_layer_types(f, c);
    p->explicit_layer_types = !p->layer_types.empty();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      if (p->sliding(i) && !p->sliding_window)
        throw InputError(concat(f.origin(), ": layer ", i,
                                " uses sliding-window attention but sliding_window is null"));
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, json& j) const override {
    const auto& p = c.params<Gemma2Params>();
    write_llama_family(c, j);
    j["hidden_activation"] = p.hidden_activation;
    j["attention_bias"] = p.attention_bias;
    j["query_pre_attn_scalar"] = p.query_pre_attn_scalar;
    j["attn_logit_softcapping"] = optional_json(p.attn_logit_softcapping);
    j["final_logit_softcapping"] = optional_json(p.final_logit_softcapping);
    j["sliding_window"] = p.sliding_window ? json(*p.sliding_window) : json(nullptr);
    if (p.explicit_layer_types) j["layer_types"] = p.layer_types;
  }

  std::vector<std::string> presets() const override {
    std::vector<std::string> out = llama_family_presets();
    out.push_back("gemma-2-2b");
    return out;
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "gemma-2-2b";
    ModelConfig base = llama_family_preset(this->name(), real ? "tiny" : name);
    auto p = std::make_unique<Gemma2Params>();
    static_cast<LlamaParams&>(*p) = base.params<LlamaParams>();
    p->hidden_act = p->hidden_activation;
    base.arch_params = std::move(p);
    ModelConfig c = std::move(base);
    c.tie_word_embeddings = true;
    c.bos_token_id = 2, c.eos_token_id = 1;
    auto& q = c.params<Gemma2Params>();
    if (!real) {
      // A small window, so that it matters at test lengths.
      q.query_pre_attn_scalar = static_cast<double>(q.head_dim);
      q.sliding_window = name == "tiny" ? 4 : 256;
      return c;
    }
    // google/gemma-2-2b's config.json.
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
