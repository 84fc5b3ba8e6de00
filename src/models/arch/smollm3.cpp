// SmolLM3 (transformers configuration_smollm3.py, modular_smollm3.py): Llama's decoder with NoPE
// layers, whose attention applies no rotary embedding at all: no_rope_layers (1 = RoPE, 0 =
// NoPE, one per layer), by default every no_rope_layer_interval-th (4th) layer NoPE. Sliding
// windows on the layers layer_types calls sliding_attention (SmolLM3Model masks by them); by
// default, when use_sliding_window and a sliding_window are set, the NoPE layers. Its config's
// defaults differ from Llama's: 4 key/value heads, rope_theta 2e6, tied embeddings.
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "models/arch/llama_family.h"
#include "models/config_reader.h"
#include "util/strings.h"

namespace actcap {

namespace {

// config.json's no_rope_layers: null or absent (empty), else 0 or 1 per layer (at least as many as
// layers: transformers indexes it by layer).
std::vector<int64_t> parse_no_rope_layers(const ConfigReader& f, const ModelConfig& c) {
  std::vector<int64_t> out;
  const nlohmann::json* list = f.find({"no_rope_layers"});
  if (!list) return out;
  if (!list->is_array() || static_cast<int64_t>(list->size()) < c.num_hidden_layers)
    throw InputError(concat(f.origin(), ": field 'no_rope_layers' must list 0 (no RoPE) or 1 ",
                            "for each of the ", c.num_hidden_layers, " layers"));
  for (const nlohmann::json& v : *list) {
    if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1))
      throw InputError(concat(f.origin(), ": field 'no_rope_layers' holds ", v.dump(),
                              "; each entry is 0 (no RoPE) or 1 (RoPE)"));
    out.push_back(v.get<int64_t>());
  }
  return out;
}

class SmolLM3 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "smollm3"; }
  std::vector<std::string> model_types() const override { return {"smollm3"}; }
  std::vector<std::string> class_names() const override { return {"SmolLM3ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    LlamaDefaults d;  // SmolLM3Config's
    d.max_position_embeddings = 32768;
    d.bos_token_id = 128000, d.eos_token_id = 128001;
    d.rope_theta = 2000000.0;
    d.num_key_value_heads = 4;
    d.config_class = "SmolLM3Config";
    parse_llama_family(f, d, c, *p);
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->mlp_bias = f.boolean({"mlp_bias"}, false);
    p->no_rope_layer_interval = f.positive({"no_rope_layer_interval"}, 4);
    p->no_rope_layers = parse_no_rope_layers(f, c);
    p->windows = LlamaParams::Windows::kSmolLM3;
    p->use_sliding_window = f.boolean({"use_sliding_window"}, false);
    if (f.has("sliding_window")) p->sliding_window = f.positive({"sliding_window"}, std::nullopt);
    p->layer_types = parse_layer_types(f, c);  // empty: SmolLM3Config's default (smollm3_sliding)
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      if (p->smollm3_sliding(i) && !p->sliding_window)
        throw InputError(concat(f.origin(), ": layer ", i,
                                " is sliding_attention (layer_types) but sliding_window is null; "
                                "set a window or make the layer full_attention"));
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<LlamaParams>();
    write_llama_family(c, j);
    j["attention_bias"] = p.attention_bias;
    j["mlp_bias"] = p.mlp_bias;
    j["use_sliding_window"] = p.use_sliding_window;
    j["sliding_window"] = p.sliding_window ? nlohmann::json(*p.sliding_window) : nullptr;
    j["no_rope_layer_interval"] = p.no_rope_layer_interval;
    if (!p.no_rope_layers.empty()) j["no_rope_layers"] = p.no_rope_layers;
    if (!p.layer_types.empty()) j["layer_types"] = p.layer_types;
    // SmolLM3Config's default pad id, 128004, is nn.Embedding's padding_idx and must lie inside the
    // vocabulary (transformers refuses to build the model otherwise): smaller ones get none.
    j["pad_token_id"] = c.vocab_size > 128004 ? nlohmann::json(128004) : nlohmann::json(nullptr);
  }

  std::vector<std::string> presets() const override { return llama_family_presets({"smollm3-3b"}); }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "smollm3-3b";
    ModelConfig c = LlamaFamilyArchitecture::preset(real ? "tiny" : name);
    auto& p = c.params<LlamaParams>();
    p.windows = LlamaParams::Windows::kSmolLM3;
    p.no_rope_layer_interval = 4;  // layer 3 of the tiny preset is NoPE
    c.tie_word_embeddings = true;
    if (!real) return c;
    // HuggingFaceTB/SmolLM3-3B's config.json as public repositories quote it (no_rope_layers
    // lists the default pattern: every fourth layer NoPE).
    c.vocab_size = 128256, c.hidden_size = 2048, p.intermediate_size = 11008;
    c.num_hidden_layers = 36, c.num_attention_heads = 16, p.num_key_value_heads = 4;
    p.head_dim = 128, c.max_position_embeddings = 65536, p.rms_norm_eps = 1e-6;
    p.rope.rope_theta = 5000000.0;
    c.bos_token_id = 128000, c.eos_token_id = 128012;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    LlamaBuild b;
    b.attention = [](const ModelConfig& c, WeightSource a, int64_t layer,
                     const std::shared_ptr<const Rope>& rope) -> std::unique_ptr<Module> {
      const auto& p = c.params<LlamaParams>();
      AttentionShape shape = llama_attention_shape(c, layer, p.uses_rope(layer) ? rope : nullptr);
      return std::make_unique<Attention>(a.path(), shape, llama_attention_projections(c, a));
    };
    return build_llama_family(c, w, b);
  }
};

}  // namespace

const Architecture& smollm3_architecture() {
  static const SmolLM3 arch;
  return arch;
}

}  // namespace actcap
