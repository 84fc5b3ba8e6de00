// Gemma 3 (transformers configuration_gemma3.py, modular_gemma3.py / modeling_gemma3.py): the
// Gemma 2 decoder (four (1 + w) norms per layer, scaled embedding, GeGLU with hidden_activation,
// attention scale query_pre_attn_scalar^-0.5, head_dim 256 by default, tied) with
//   - q_norm / k_norm: (1 + w) RMSNorm over head_dim on every q and k head, run after the three
//     projections and before RoPE (HF: q_proj, k_proj, v_proj, q_norm, k_norm);
//   - local and global layers: layer i is global ("full_attention") iff
//     (i + 1) % sliding_window_pattern == 0 (default 6), unless layer_types says; local layers
//     attend within sliding_window (default 4096) and rotate with base rope_local_base_freq
//     (default 10000) without scaling, global ones with rope_theta (default 1e6) and rope_scaling.
//     transformers 5 keeps both in rope_parameters keyed by layer type; rope_scaling, rope_theta
//     and rope_local_base_freq fill it in as Gemma3TextConfig.convert_rope_params_to_dict does;
//   - attn_logit_softcapping is read and written back but never applied (Gemma3Attention does not
//     pass it to the attention); final_logit_softcapping (default null) caps Gemma3ForCausalLM's
//     logits after lm_head;
//   - the embedding scale is part of HF's embed_tokens module (Gemma3TextScaledWordEmbedding), so
//     the `embed_tokens` point is what HF's hook on that module sees;
//   - every Gemma3TextConfig field has a default (vocab 262208, hidden 2304, 26 layers, 8 heads,
//     4 kv heads, intermediate 9216, 131072 positions).
// Gemma3ForConditionalGeneration checkpoints (model_type gemma3, Gemma 3 4B and larger) run their
// text model: its settings from text_config, its weights under model.language_model. and lm_head
// (checkpoints saved before transformers 4.52: language_model.model. and language_model.lm_head),
// the vision tower and the projector ignored. Points are named as that class's named_modules():
// model.language_model.embed_tokens, model.language_model.layers.N..., model.language_model.norm,
// lm_head. Its forward applies no final soft-cap.
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"
#include "models/parts/rope.h"
#include "util/strings.h"

namespace actcap {

namespace {

struct Gemma3Params : GemmaParams {
  int64_t sliding_window_pattern = 6;
  RopeConfig local_rope;                // sliding layers (LlamaParams::rope: the global layers)
  bool conditional_generation = false;  // model_type gemma3: the text model of the multimodal one
  // Size fields config.json leaves out (Gemma3TextConfig's defaults apply): named when the weights
  // do not fit them. Not a setting: not written back.
  std::vector<std::string> defaulted;

  bool sliding(int64_t layer) const override {
    if (!layer_types.empty()) return layer_types[layer] == "sliding_attention";
    return (layer + 1) % sliding_window_pattern != 0;
  }
  int64_t max_positions(int64_t max_position_embeddings) const override {
    return std::max(rope_max_positions(rope, max_position_embeddings),
                    rope_max_positions(local_rope, max_position_embeddings));
  }
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<Gemma3Params>(*this);
  }
};

// Gemma3TextConfig's defaults for the sizes (every field has one).
constexpr std::pair<const char*, int64_t> kDefaultSizes[] = {
    {"vocab_size", 262208},    {"hidden_size", 2304},      {"intermediate_size", 9216},
    {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
};

double positive_number(const ConfigReader& f, const char* key, double dflt) {
  const double v = f.number({key}, dflt);
  if (!(v > 0) || !std::isfinite(v))
    throw InputError(concat(f.origin(), ": field '", key, "' must be a positive number, got ", v));
  return v;
}

// One layer type's rope dict: an object or absent (null) in rope_parameters.
json rope_entry(const ConfigReader& f, const json* params, const char* layer_type) {
  json out = {{"rope_type", "default"}};
  if (!params) return out;
  auto it = params->find(layer_type);
  if (it == params->end() || it->is_null()) return out;
  if (!it->is_object())
    throw InputError(
        concat(f.origin(), ": field 'rope_parameters.", layer_type, "' must be an object"));
  return *it;
}

// The RoPE of global and local layers, as Gemma3TextConfig.convert_rope_params_to_dict resolves
// them: rope_parameters keyed by layer type (transformers 5), rope_scaling merged into the
// full_attention entry, rope_theta (default 1e6) and rope_local_base_freq (default 1e4) where an
// entry has no rope_theta; then each entry as modeling_rope_utils reads it.
void parse_gemma3_ropes(const ConfigReader& f, int64_t max_positions, Gemma3Params& p) {
  const json* params = f.find({"rope_parameters"});
  if (params && !params->is_object())
    throw InputError(concat(f.origin(), ": field 'rope_parameters' must be an object"));
  if (params) {
    const bool by_layer_type =
        params->contains("full_attention") || params->contains("sliding_attention");
    for (const auto& [key, value] : params->items()) {
      if (key == "full_attention" || key == "sliding_attention") continue;
      // transformers 5 writes a default "rope_type" and a "rope_theta" beside the layer types'
      // entries when the model has layers of one type only (standardize_rope_params takes it for
      // one global dict); its Gemma 3 reads only the entries.
      if (by_layer_type && ((key == "rope_type" && (value.is_null() || value == "default")) ||
                            (key == "rope_theta" && (value.is_null() || value.is_number()))))
        continue;
      throw InputError(concat(f.origin(),
                              ": field 'rope_parameters' must be keyed by layer type "
                              "(\"full_attention\", \"sliding_attention\"), got key '",
                              key, "'"));
    }
  }
  json full = rope_entry(f, params, "full_attention");
  json local = rope_entry(f, params, "sliding_attention");
  if (const json* scaling = f.find({"rope_scaling"})) {
    if (!scaling->is_object())
      throw InputError(concat(f.origin(), ": field 'rope_scaling' must be an object"));
    // 4.x's Gemma3RotaryEmbedding reads a legacy "type"; 5.x merges it into the entry, whose
    // "rope_type" (default) then wins. Where they disagree, refuse rather than pick one.
    auto type = scaling->find("type");
    if (!scaling->contains("rope_type") && type != scaling->end() && *type != "default")
      throw InputError(concat(f.origin(),
                              ": field 'rope_scaling' names its type with the legacy key "
                              "'type' (",
                              type->dump(),
                              "), which transformers 4.x applies to the global layers and 5.x "
                              "ignores for Gemma 3; write it as 'rope_type'"));
    full.update(*scaling);
  }
  if (!full.contains("rope_theta") || full["rope_theta"].is_null())
    full["rope_theta"] = positive_number(f, "rope_theta", 1e6);
  if (!local.contains("rope_theta") || local["rope_theta"].is_null())
    local["rope_theta"] = positive_number(f, "rope_local_base_freq", 1e4);
  const char* key = params ? "rope_parameters" : "rope_scaling";
  auto parse = [&](const json& entry, const char* layer_type) {
    auto it = entry.find("partial_rotary_factor");
    if (it != entry.end() && !it->is_null() && (!it->is_number() || it->get<double>() != 1.0))
      throw InputError(concat(f.origin(), " (", layer_type, "): field 'partial_rotary_factor' is ",
                              it->dump(),
                              "; only 1.0 is supported (Gemma 3 rotates the whole head)"));
    const json wrapper = {{key, entry}};
    return parse_rope(ConfigReader(wrapper, concat(f.origin(), ", ", layer_type, " layers")),
                      p.head_dim, max_positions);
  };
  p.rope = parse(full, "full_attention");
  p.local_rope = parse(local, "sliding_attention");
}

// rope_scaling-style entry with its rope_theta, for rope_parameters.
json rope_parameters_entry(const RopeConfig& r) {
  json e = rope_to_json(r);
  if (e.is_null()) e = {{"rope_type", "default"}};
  e["rope_theta"] = r.rope_theta;
  return e;
}

class Gemma3 : public Architecture {
 public:
  std::string name() const override { return "gemma3_text"; }
  std::vector<std::string> model_types() const override { return {"gemma3_text", "gemma3"}; }
  std::vector<std::string> class_names() const override {
    return {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"};
  }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<Gemma3Params>();
    p->conditional_generation = c.model_type == "gemma3";
    // The text model's settings: config.json itself, or its text_config (absent: all defaults).
    json text = json::object();
    std::string origin = f.origin();
    if (p->conditional_generation) {
      if (const json* t = f.find({"text_config"})) {
        if (!t->is_object())
          throw InputError(concat(origin, ": field 'text_config' must be an object"));
        text = *t;
      }
      origin = concat(origin, " (text_config)");
      auto mt = text.find("model_type");
      if (mt != text.end() && !mt->is_null() && *mt != "gemma3_text")
        throw InputError(concat(origin, ": field 'model_type' is ", mt->dump(),
                                "; a Gemma 3 text config is \"gemma3_text\""));
    } else {
      text = f.root();
    }
    for (const auto& [key, value] : kDefaultSizes)
      if (!text.contains(key)) {
        text[key] = value;
        p->defaulted.push_back(key);
      }
    const ConfigReader t(text, origin);
    p->hidden_act = "gelu_pytorch_tanh";
    p->qk_norm = true;
    parse_llama_family(t, gemma_defaults(131072), c, *p);
    p->sliding_window_pattern = t.integer({"sliding_window_pattern"}, 6);
    if (!t.has("layer_types") && p->sliding_window_pattern < 1)
      throw InputError(concat(origin, ": field 'sliding_window_pattern' must be at least 1, got ",
                              p->sliding_window_pattern));
    parse_gemma_fields(t, c, *p, /*attn_softcap=*/std::nullopt, /*final_softcap=*/std::nullopt);
    parse_gemma3_ropes(t, c.max_position_embeddings, *p);
    if (p->conditional_generation) {  // Gemma3Config's own fields win over text_config's
      c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, c.tie_word_embeddings);
      c.bos_token_id = f.token_id("bos_token_id", c.bos_token_id);
      c.eos_token_id = f.token_id("eos_token_id", c.eos_token_id);
    }
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<Gemma3Params>();
    json t = json::object();
    write_gemma_fields(c, t);
    t["sliding_window_pattern"] = p.sliding_window_pattern;
    if (p.local_rope.rope_type == "default") {  // transformers 4.x's layout (5.x reads it too)
      t["rope_local_base_freq"] = p.local_rope.rope_theta;
    } else {  // only rope_parameters can say how local layers scale
      t.erase("rope_theta");
      t.erase("rope_scaling");
      t["rope_parameters"] = {{"full_attention", rope_parameters_entry(p.rope)},
                              {"sliding_attention", rope_parameters_entry(p.local_rope)}};
    }
    if (!p.conditional_generation) {
      j.update(t);
      return;
    }
    t["model_type"] = "gemma3_text";
    j["architectures"] = {"Gemma3ForConditionalGeneration"};
    j["text_config"] = t;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
  }

  std::vector<std::string> presets() const override { return llama_family_presets({"gemma-3-1b"}); }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "gemma-3-1b";
    ModelConfig c =
        gemma_preset(this->name(), real ? "tiny" : name, std::make_unique<Gemma3Params>());
    auto& q = c.params<Gemma3Params>();
    q.qk_norm = true;
    q.rope.rope_theta = 1e6, q.local_rope.rope_theta = 1e4;
    q.sliding_window_pattern = 3;  // both kinds of layer (tiny: local, local, global, local)
    if (!real) return c;
    // google/gemma-3-1b-pt's config.json.
    c.vocab_size = 262144, c.hidden_size = 1152, q.intermediate_size = 6912;
    c.num_hidden_layers = 26, c.num_attention_heads = 4, q.num_key_value_heads = 1;
    q.head_dim = 256, c.max_position_embeddings = 32768;
    q.query_pre_attn_scalar = 256, q.sliding_window = 512, q.sliding_window_pattern = 6;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<Gemma3Params>();
    LlamaBuild b;
    if (p.conditional_generation) {
      b.base = "model.language_model";
      w.alias_prefix("model.language_model.", "language_model.model.");  // before 4.52
      w.alias_prefix("lm_head.", "language_model.lm_head.");
      for (const char* part : {"model.vision_tower.", "vision_tower.",
                               "model.multi_modal_projector.", "multi_modal_projector."})
        w.ignore_prefix(part);
    }
    auto local = std::make_shared<const Rope>(p.local_rope, p.head_dim, c.max_position_embeddings);
    b.layer = [local](const ModelConfig& c, WeightSource w, int64_t layer,
                      const std::shared_ptr<const Rope>& global) {
      const bool sliding = c.params<Gemma3Params>().sliding(layer);
      return gemma_decoder_layer(c, w, layer, sliding ? local : global, /*attn_softcap=*/false,
                                 /*qk_norm=*/true);
    };
    b.unit_offset_norms = true;
    // HF: torch.tensor(hidden_size ** 0.5) cast to the embedding's dtype, float32 here.
    b.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
    if (!p.conditional_generation) b.logit_softcap = p.final_logit_softcapping;
    try {
      return build_llama_family(c, w, b);
    } catch (const InputError& e) {
      std::string note;
      if (p.conditional_generation)
        note = concat(
            " (a Gemma3ForConditionalGeneration checkpoint: the text model's weights "
            "are read from model.language_model.* or language_model.model.*, the "
            "vision tower's ignored)");
      if (!p.defaulted.empty())
        note += concat(" (config.json leaves out ", join(p.defaulted, ", "),
                       ": Gemma3TextConfig's defaults apply)");
      if (note.empty()) throw;
      throw InputError(e.what() + note, e.settings());
    }
  }
};

}  // namespace

const Architecture& gemma3_architecture() {
  static const Gemma3 arch;
  return arch;
}

}  // namespace actcap
