#include "models/arch/llama_family.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/block.h"
#include "models/parts/mlp.h"
#include "models/parts/norm.h"
#include "models/parts/rope.h"
#include "models/parts/scaled_io.h"
#include "models/parts/sublayer_norm_block.h"

namespace actcap {

std::optional<int64_t> LlamaParams::window_for_layer(int64_t layer) const {
  switch (windows) {
    case Windows::kNone:
      return std::nullopt;
    case Windows::kEveryLayer:
      return sliding_window;
    case Windows::kQwen:
      if (!use_sliding_window) return std::nullopt;
      if (!layer_types.empty())
        return layer < static_cast<int64_t>(layer_types.size()) &&
                       layer_types[layer] == "sliding_attention"
                   ? sliding_window
                   : std::nullopt;
      return layer >= max_window_layers ? sliding_window : std::nullopt;
    case Windows::kOlmo3:
      return olmo3_sliding(layer) ? sliding_window : std::nullopt;
    case Windows::kSmolLM3:
      return smollm3_sliding(layer) ? sliding_window : std::nullopt;
  }
  return std::nullopt;
}

// Olmo3Config's layer_types when config.json has none: sliding but (i + 1) % 4 == 0.
bool LlamaParams::olmo3_sliding(int64_t layer) const {
  if (layer_types.empty()) return (layer + 1) % 4 != 0;
  return layer < static_cast<int64_t>(layer_types.size()) &&
         layer_types[layer] == "sliding_attention";
}

// SmolLM3Config's layer_types when config.json has none: the NoPE layers slide when
// use_sliding_window and a sliding_window are set. Listed, they decide alone (SmolLM3Model masks
// by them; use_sliding_window only picks the default).
bool LlamaParams::smollm3_sliding(int64_t layer) const {
  if (!layer_types.empty())
    return layer < static_cast<int64_t>(layer_types.size()) &&
           layer_types[layer] == "sliding_attention";
  return use_sliding_window && sliding_window && !uses_rope(layer);
}

bool LlamaParams::uses_rope(int64_t layer) const {
  if (!no_rope_layers.empty())
    return layer >= static_cast<int64_t>(no_rope_layers.size()) || no_rope_layers[layer] != 0;
  return no_rope_layer_interval <= 0 || (layer + 1) % no_rope_layer_interval != 0;
}

// Dynamic NTK RoPE exists to run past max_position_embeddings: factor times it.
int64_t LlamaParams::max_positions(int64_t max_position_embeddings) const {
  return rope_max_positions(rope, max_position_embeddings);
}

LlamaDefaults gemma_defaults(int64_t max_position_embeddings) {
  LlamaDefaults d;
  d.max_position_embeddings = max_position_embeddings;
  d.head_dim = 256;
  d.bos_token_id = 2;
  d.eos_token_id = 1;
  return d;
}

void parse_llama_family(const ConfigReader& f, const LlamaDefaults& d, ModelConfig& c,
                        LlamaParams& p) {
  c.vocab_size = f.positive({"vocab_size"}, std::nullopt);
  c.hidden_size = f.positive({"hidden_size"}, std::nullopt);
  p.intermediate_size = f.positive({"intermediate_size"}, std::nullopt);
  c.num_hidden_layers = f.positive({"num_hidden_layers"}, std::nullopt);
  c.num_attention_heads = f.positive({"num_attention_heads"}, std::nullopt);
  const bool kv_default = d.num_key_value_heads && !f.root().contains("num_key_value_heads");
  p.num_key_value_heads = kv_default ? *d.num_key_value_heads
                                     : f.positive({"num_key_value_heads"}, c.num_attention_heads);
  if (c.num_attention_heads % p.num_key_value_heads != 0 && kv_default)
    throw InputError(concat(f.origin(), ": num_key_value_heads is absent, so ",
                            p.num_key_value_heads, " (", d.config_class,
                            "'s default), which does not divide num_attention_heads=",
                            c.num_attention_heads, "; set num_key_value_heads"));
  if (c.num_attention_heads % p.num_key_value_heads != 0)
    throw InputError(concat(f.origin(), ": num_key_value_heads=", p.num_key_value_heads,
                            " does not divide num_attention_heads=", c.num_attention_heads));
  if (f.has("head_dim") || d.head_dim) {
    p.head_dim = f.positive({"head_dim"}, d.head_dim);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size));
    p.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (p.head_dim % 2 != 0)
    throw InputError(concat(f.origin(), ": head_dim=", p.head_dim, " must be even for RoPE"));
  p.hidden_act = f.string({"hidden_act"}, p.hidden_act);
  check_activation(p.hidden_act, "hidden_act", f.origin());
  c.max_position_embeddings = f.positive({"max_position_embeddings"}, d.max_position_embeddings);
  p.rms_norm_eps = f.number({"rms_norm_eps"}, p.rms_norm_eps);
  // These attentions rotate the whole head (their apply_rotary_pos_emb has no pass-through part),
  // so transformers cannot run a smaller rotary width for them.
  for (const char* key : {"", "rope_parameters", "rope_scaling"}) {
    const json* where = *key ? f.find({key}) : &f.root();
    if (!where || !where->is_object()) continue;
    auto it = where->find("partial_rotary_factor");
    if (it == where->end() || it->is_null()) continue;
    if (!it->is_number() || it->get<double>() != 1.0)
      throw InputError(concat(
          f.origin(), *key ? concat(" (", key, ")") : "", ": field 'partial_rotary_factor' is ",
          it->dump(), "; only 1.0 is supported (", c.model_type, " rotates the whole head)"));
  }
  p.rope = parse_rope(f, p.head_dim, c.max_position_embeddings, d.rope_theta);
  c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
  c.bos_token_id = f.token_id("bos_token_id", d.bos_token_id);
  c.eos_token_id = f.token_id("eos_token_id", d.eos_token_id);
}

void refuse_bidirectional_attention(const ConfigReader& f) {
  if (f.boolean({"use_bidirectional_attention"}, false))
    throw InputError(concat(f.origin(),
                            ": use_bidirectional_attention is true; only causal attention "
                            "is supported"));
}

nlohmann::json clip_qkv_json(const LlamaParams& p) {
  return p.clip_qkv ? nlohmann::json(*p.clip_qkv) : nlohmann::json(nullptr);
}

std::optional<double> parse_clip_qkv(const ConfigReader& f) {
  if (!f.has("clip_qkv")) return std::nullopt;
  const double v = f.number({"clip_qkv"}, 0);
  if (!(v > 0) || !std::isfinite(v))
    throw InputError(concat(f.origin(), ": field 'clip_qkv' is ", f.root()["clip_qkv"].dump(),
                            "; it must be a positive number or null"));
  return v;
}

void parse_qwen_windows(const ConfigReader& f, const ModelConfig& c, LlamaParams& p) {
  p.windows = LlamaParams::Windows::kQwen;
  p.use_sliding_window = f.boolean({"use_sliding_window"}, false);
  // Absent: HF's default 4096. null: no window on any layer (HF sets sliding_window None). 0
  // without use_sliding_window: none (Qwen2-MoE's config writes 0 then).
  if (f.has("sliding_window"))
    p.sliding_window = !p.use_sliding_window && f.integer({"sliding_window"}, 0) == 0
                           ? std::nullopt
                           : std::optional<int64_t>(f.positive({"sliding_window"}, std::nullopt));
  else
    p.sliding_window =
        f.root().contains("sliding_window") ? std::nullopt : std::optional<int64_t>(4096);
  p.max_window_layers = f.integer({"max_window_layers"}, 28);
  p.layer_types = parse_layer_types(f, c);
  for (const std::string& t : p.layer_types)
    // HF leaves sliding_window None without use_sliding_window and refuses a sliding layer then.
    if (t == "sliding_attention" && !p.use_sliding_window)
      throw InputError(concat(f.origin(),
                              ": layer_types has a sliding_attention layer but use_sliding_window "
                              "is false (transformers refuses this config)"));
}

std::vector<std::string> parse_layer_types(const ConfigReader& f, const ModelConfig& c) {
  std::vector<std::string> out;
  const json* types = f.find({"layer_types"});
  if (!types) return out;
  if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers)
    throw InputError(concat(f.origin(), ": field 'layer_types' must list one type per layer (",
                            c.num_hidden_layers, " layers)"));
  for (const json& t : *types) {
    if (!t.is_string() || (t != "full_attention" && t != "sliding_attention"))
      throw InputError(concat(f.origin(), ": field 'layer_types' holds ", t.dump(),
                              "; supported: \"full_attention\", \"sliding_attention\""));
    out.push_back(t.get<std::string>());
  }
  return out;
}

void write_llama_family(const ModelConfig& c, nlohmann::json& j) {
  const auto& p = c.params<LlamaParams>();
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = p.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = p.num_key_value_heads;
  j["head_dim"] = p.head_dim;
  j["hidden_act"] = p.hidden_act;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = p.rms_norm_eps;
  j["rope_theta"] = p.rope.rope_theta;
  j["rope_scaling"] = rope_to_json(p.rope);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = 0.02;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
}

void write_qwen_windows(const LlamaParams& p, nlohmann::json& j) {
  j["use_sliding_window"] = p.use_sliding_window;
  j["sliding_window"] = p.sliding_window ? json(*p.sliding_window) : json(nullptr);
  j["max_window_layers"] = p.max_window_layers;
  if (!p.layer_types.empty()) j["layer_types"] = p.layer_types;
}

namespace {

// A soft-cap: absent -> `dflt`, null -> off, else a positive number.
std::optional<double> optional_cap(const ConfigReader& f, const char* key,
                                   std::optional<double> dflt) {
  if (!f.root().contains(key)) return dflt;
  if (!f.has(key)) return std::nullopt;  // null: off
  const double v = f.number({key}, 0);
  if (!(v > 0) || !std::isfinite(v))
    throw InputError(concat(f.origin(), ": field '", key, "' must be positive or null"));
  return v;
}

json optional_json(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

}  // namespace

void parse_gemma_fields(const ConfigReader& f, ModelConfig& c, GemmaParams& p,
                        std::optional<double> attn_softcap, std::optional<double> final_softcap) {
  c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
  p.hidden_activation = f.string({"hidden_activation"}, p.hidden_activation);
  check_activation(p.hidden_activation, "hidden_activation", f.origin());
  p.attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
  p.qkv_bias = p.o_bias = p.attention_bias;
  const double scalar = f.number({"query_pre_attn_scalar"}, 256);
  if (!(scalar > 0) || !std::isfinite(scalar))
    throw InputError(concat(f.origin(), ": field 'query_pre_attn_scalar' must be positive"));
  p.query_pre_attn_scalar = scalar;
  p.attn_logit_softcapping = optional_cap(f, "attn_logit_softcapping", attn_softcap);
  p.final_logit_softcapping = optional_cap(f, "final_logit_softcapping", final_softcap);
  refuse_bidirectional_attention(f);
  // Absent: 4096. null: no window, which a sliding layer cannot run with.
  if (f.has("sliding_window"))
    p.sliding_window = f.positive({"sliding_window"}, std::nullopt);
  else if (!f.root().contains("sliding_window"))
    p.sliding_window = 4096;
  p.layer_types = parse_layer_types(f, c);
  p.explicit_layer_types = !p.layer_types.empty();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (p.sliding(i) && !p.sliding_window)
      throw InputError(concat(f.origin(), ": layer ", i,
                              " uses sliding-window attention but sliding_window is null"));
}

void write_gemma_fields(const ModelConfig& c, nlohmann::json& j) {
  const auto& p = c.params<GemmaParams>();
  write_llama_family(c, j);
  j["hidden_activation"] = p.hidden_activation;
  j["attention_bias"] = p.attention_bias;
  // An integer where it is one, as the released configs write it: transformers 5 validates the
  // field as an int and refuses 16.0.
  const double scalar = p.query_pre_attn_scalar;
  if (scalar == std::floor(scalar) && scalar < 9.0e15)
    j["query_pre_attn_scalar"] = static_cast<int64_t>(scalar);
  else
    j["query_pre_attn_scalar"] = scalar;
  j["attn_logit_softcapping"] = optional_json(p.attn_logit_softcapping);
  j["final_logit_softcapping"] = optional_json(p.final_logit_softcapping);
  j["sliding_window"] = p.sliding_window ? json(*p.sliding_window) : json(nullptr);
  if (p.explicit_layer_types) j["layer_types"] = p.layer_types;
}

std::vector<std::string> llama_family_presets(const std::vector<std::string>& own) {
  std::vector<std::string> out = {"tiny", "small", "gpt2-small"};
  out.insert(out.end(), own.begin(), own.end());
  return out;
}

ModelConfig llama_family_preset(const std::string& arch, const std::string& preset) {
  ModelConfig c;
  c.arch = c.model_type = arch;
  auto p = std::make_unique<LlamaParams>();
  if (preset == "tiny") {
    c.vocab_size = 512, c.hidden_size = 64, p->intermediate_size = 160, c.num_hidden_layers = 4;
    c.num_attention_heads = 4, p->num_key_value_heads = 2, c.max_position_embeddings = 256;
  } else if (preset == "small") {
    c.vocab_size = 2048, c.hidden_size = 256, p->intermediate_size = 688, c.num_hidden_layers = 6;
    c.num_attention_heads = 8, p->num_key_value_heads = 2, c.max_position_embeddings = 1024;
  } else {  // gpt2-small: a Llama-style model of GPT-2 124M's size
    c.vocab_size = 32000, c.hidden_size = 768, p->intermediate_size = 2048;
    c.num_hidden_layers = 12, c.num_attention_heads = 12, p->num_key_value_heads = 4;
    c.max_position_embeddings = 2048;
  }
  p->head_dim = c.hidden_size / c.num_attention_heads;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  c.arch_params = std::move(p);
  return c;
}

ModelConfig gemma_preset(const std::string& arch, const std::string& preset,
                         std::unique_ptr<GemmaParams> p) {
  ModelConfig c = llama_family_preset(arch, preset);
  static_cast<LlamaParams&>(*p) = c.params<LlamaParams>();
  p->hidden_act = p->hidden_activation;
  p->query_pre_attn_scalar = static_cast<double>(p->head_dim);
  p->sliding_window = preset == "tiny" ? 4 : 256;  // small, so that it matters at test lengths
  c.arch_params = std::move(p);
  c.tie_word_embeddings = true;
  c.bos_token_id = 2, c.eos_token_id = 1;
  return c;
}

std::unique_ptr<RMSNorm> llama_rms_norm(const LlamaParams& p, WeightSource w,
                                        const std::string& name, int64_t width, int64_t heads,
                                        bool unit_offset) {
  WeightSource v = w.pp(name);
  RMSNormOptions o;
  o.heads = heads;
  o.unit_offset = unit_offset;
  o.scale_in_float32 = p.norms_scale_in_float32;
  o.weight_kept_float32 = p.norms_kept_float32;
  // A (1 + w) weight is an offset from one: HF initialises it to zero (kBias: small noise).
  return std::make_unique<RMSNorm>(
      v.path(), v.get("weight", {width}, unit_offset ? Init::kBias : Init::kGain), p.rms_norm_eps,
      o);
}

AttentionParts llama_attention_projections(const ModelConfig& c, WeightSource a) {
  const auto& p = c.params<LlamaParams>();
  const int64_t H = c.hidden_size, D = p.head_dim;
  const int64_t Q = c.num_attention_heads * D, KV = p.num_key_value_heads * D;
  AttentionParts parts;
  parts.q = linear_layer(a, "q_proj", H, Q, p.qkv_bias);
  parts.k = linear_layer(a, "k_proj", H, KV, p.qkv_bias);
  parts.v = linear_layer(a, "v_proj", H, KV, p.qkv_bias);
  parts.o = linear_layer(a, "o_proj", Q, H, p.o_bias);
  return parts;
}

AttentionShape llama_attention_shape(const ModelConfig& c, int64_t layer,
                                     std::shared_ptr<const Rope> rope) {
  const auto& p = c.params<LlamaParams>();
  AttentionShape shape;
  shape.hidden = c.hidden_size;
  shape.heads = c.num_attention_heads;
  shape.kv_heads = p.num_key_value_heads;
  shape.head_dim = p.head_dim;
  shape.scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  shape.window = p.window_for_layer(layer);
  shape.clip_qkv = p.clip_qkv;
  shape.rope = std::move(rope);
  return shape;
}

std::unique_ptr<Module> llama_gated_mlp(const ModelConfig& c, WeightSource m,
                                        const std::string& act, int64_t inner) {
  const auto& p = c.params<LlamaParams>();
  const int64_t H = c.hidden_size, I = inner > 0 ? inner : p.intermediate_size;
  auto gate = linear_layer(m, "gate_proj", H, I, p.mlp_bias);
  auto fn = std::make_unique<Activation>(m.path() + ".act_fn", act, I);
  auto up = linear_layer(m, "up_proj", H, I, p.mlp_bias);
  auto down = linear_layer(m, "down_proj", I, H, p.mlp_bias);
  return std::make_unique<GatedMlp>(m.path(), H, std::move(gate), std::move(fn), std::move(up),
                                    std::move(down));
}

std::unique_ptr<Module> gemma_decoder_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                            const std::shared_ptr<const Rope>& rope,
                                            bool attn_softcap, bool qk_norm) {
  const auto& p = c.params<GemmaParams>();
  const int64_t H = c.hidden_size, D = p.head_dim;
  auto norm = [&](WeightSource v, const char* name, int64_t width, int64_t heads) {
    return llama_rms_norm(p, v, name, width, heads, /*unit_offset=*/true);
  };
  WeightSource a = w.pp("self_attn");
  AttentionShape shape = llama_attention_shape(c, layer, rope);
  shape.scale = 1.0 / std::sqrt(p.query_pre_attn_scalar);
  shape.window = p.sliding(layer) ? p.sliding_window : std::nullopt;
  if (attn_softcap) shape.softcap = p.attn_logit_softcapping;
  AttentionParts parts = llama_attention_projections(c, a);
  if (qk_norm) {
    parts.q_norm = norm(a, "q_norm", D, c.num_attention_heads);
    parts.k_norm = norm(a, "k_norm", D, p.num_key_value_heads);
    shape.qk_norms_last = true;
  }
  SublayerNormParts b;
  b.pre1 = norm(w, "input_layernorm", H, 0);
  b.attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  b.post1 = norm(w, "post_attention_layernorm", H, 0);
  b.pre2 = norm(w, "pre_feedforward_layernorm", H, 0);
  b.mlp = llama_gated_mlp(c, w.pp("mlp"), p.hidden_activation);
  b.post2 = norm(w, "post_feedforward_layernorm", H, 0);
  return std::make_unique<SublayerNormBlock>(w.path(), H, std::move(b));
}

std::unique_ptr<Module> olmo2_decoder_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                            const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<LlamaParams>();
  const int64_t H = c.hidden_size, D = p.head_dim;
  WeightSource a = w.pp("self_attn");
  AttentionParts parts = llama_attention_projections(c, a);
  parts.q_norm = llama_rms_norm(p, a, "q_norm", c.num_attention_heads * D);
  parts.k_norm = llama_rms_norm(p, a, "k_norm", p.num_key_value_heads * D);
  AttentionShape shape = llama_attention_shape(c, layer, rope);
  shape.qk_norm_whole = true;
  SublayerNormParts b;
  b.attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  b.post1 = llama_rms_norm(p, w, "post_attention_layernorm", H);
  b.mlp = llama_gated_mlp(c, w.pp("mlp"), p.hidden_act);
  b.post2 = llama_rms_norm(p, w, "post_feedforward_layernorm", H);
  return std::make_unique<SublayerNormBlock>(w.path(), H, std::move(b));
}

namespace {

// The pre-norm layer's norms and the final norm: the architecture's (b.norm) or the RMSNorm.
std::unique_ptr<Module> family_norm(const ModelConfig& c, const LlamaBuild& b, WeightSource w,
                                    const char* name, int64_t width) {
  return b.norm ? b.norm(c, w, name, width)
                : llama_rms_norm(c.params<LlamaParams>(), w, name, width, 0, b.unit_offset_norms);
}

std::unique_ptr<Module> decoder_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                      const std::shared_ptr<const Rope>& rope,
                                      const LlamaBuild& b) {
  const auto& p = c.params<LlamaParams>();
  const int64_t H = c.hidden_size, D = p.head_dim;
  const std::string name = w.path();
  auto in_norm = family_norm(c, b, w, "input_layernorm", H);
  WeightSource a = w.pp("self_attn");
  std::unique_ptr<Module> attn;
  if (b.attention) {
    attn = b.attention(c, a, layer, rope);
  } else {
    AttentionParts parts = llama_attention_projections(c, a);
    if (p.qk_norm) parts.q_norm = llama_rms_norm(p, a, "q_norm", D, c.num_attention_heads);
    if (p.qk_norm) parts.k_norm = llama_rms_norm(p, a, "k_norm", D, p.num_key_value_heads);
    if (b.attention_sinks) parts.sinks = a.get("sinks", {c.num_attention_heads}, Init::kBias);
    attn = std::make_unique<Attention>(a.path(), llama_attention_shape(c, layer, rope),
                                       std::move(parts));
  }
  auto post_norm = family_norm(c, b, w, "post_attention_layernorm", H);
  auto mlp = b.mlp ? b.mlp(c, w, layer) : llama_gated_mlp(c, w.pp("mlp"), p.hidden_act);
  return std::make_unique<PreNormBlock>(name, H, std::move(in_norm), std::move(attn),
                                        std::move(post_norm), std::move(mlp));
}

}  // namespace

BuiltModel build_llama_family(const ModelConfig& c, WeightSource& w, const LlamaBuild& b) {
  const auto& p = c.params<LlamaParams>();
  w.ignore_suffix(".rotary_emb.inv_freq");  // a buffer older checkpoints saved
  WeightSource model = w.pp(b.base);
  std::vector<std::string> tied;
  if (c.tie_word_embeddings) tied.push_back("lm_head.weight");
  at::Tensor embed = model.get("embed_tokens.weight", {c.vocab_size, c.hidden_size}, Init::kMatrix,
                               Layout::kAsStored, tied);
  const std::string embed_name = model.prefix() + "embed_tokens";
  BuiltModel m;
  if (b.embedding_scale)
    m.stages.push_back({StageKind::kEmbeddings,
                        std::make_unique<ScaledEmbedding>(embed_name, embed, *b.embedding_scale)});
  else
    m.stages.push_back({StageKind::kEmbeddings, std::make_unique<Embedding>(embed_name, embed)});
  // One table for every layer: these architectures rotate all layers alike.
  auto rope = std::make_shared<const Rope>(p.rope, p.head_dim, c.max_position_embeddings,
                                           p.rope_in_float32);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    WeightSource layer = model.pp("layers").pp(i);
    m.stages.push_back({StageKind::kBlock, b.layer ? b.layer(c, layer, i, rope)
                                                   : decoder_layer(c, layer, i, rope, b)});
  }
  m.stages.push_back({StageKind::kFinalNorm, family_norm(c, b, model, "norm", c.hidden_size)});
  BuiltStage head = head_stage(c, w, embed);
  if (b.logit_softcap)
    head.module =
        std::make_unique<SoftcappedHead>(std::move(head.module), c.hidden_size, *b.logit_softcap);
  m.stages.push_back(std::move(head));
  m.head_shares_embedding = c.tie_word_embeddings;
  m.mlp_width = p.intermediate_size;
  return m;
}

}  // namespace actcap
