// What the Llama-style decoders share (Llama, Mistral, Qwen2, Qwen3, and the others built on it:
// OLMo, OLMo 2, Gemma 1-3, the mixtures of experts): the config fields
// (LlamaParams), reading and writing them, three shared presets, and the builder composing
// RMSNorm, RoPE, grouped-query attention (optional biases, per-head q/k norms, per-layer windows)
// and the gated MLP. Each architecture's file sets its HF defaults and its own fields, then calls
// these.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actcap/config.h"
#include "models/arch/architecture.h"
#include "models/parts/attention.h"
#include "models/parts/norm.h"

namespace actcap {

class ConfigReader;

struct LlamaParams : ArchParams {
  int64_t intermediate_size = 0;
  int64_t num_key_value_heads = 0;  // None in HF -> num_attention_heads
  int64_t head_dim = 0;             // None in HF -> the architecture's default
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool attention_bias = false;  // config.json's field, where the architecture reads it
  bool qkv_bias = false;        // effective q/k/v projection biases
  bool o_bias = false;          // effective o_proj bias
  bool mlp_bias = false;
  std::optional<double> clip_qkv;  // clamp q, k and v to [-clip_qkv, clip_qkv] (OLMo, OLMoE)
  bool qk_norm = false;  // RMSNorm over head_dim on each q and k head, before RoPE (Qwen3)
  // The RMSNorms scale by the weight in float32 and round last (OLMo 2, gpt-oss), with the weight
  // unrounded under a float16 compute dtype (gpt-oss's norms stay float32 there): RMSNormOptions.
  bool norms_scale_in_float32 = false;
  bool norms_kept_float32 = false;
  // RoPE rotates in float32 under a 16-bit compute dtype, rounded once (OLMo, OLMo 2): Rope.
  bool rope_in_float32 = false;

  // Sliding-window attention: key j is visible from query i iff i - window < j <= i.
  enum class Windows {
    kNone,
    kEveryLayer,  // Mistral: sliding_window on every layer (when set)
    kQwen,        // use_sliding_window and layers >= max_window_layers, or as layer_types says
    kOlmo3,       // as layer_types says, by default every layer but each fourth
    kSmolLM3,     // as layer_types says, by default the NoPE layers when use_sliding_window
  } windows = Windows::kNone;
  std::optional<int64_t> sliding_window;
  bool use_sliding_window = false;
  int64_t max_window_layers = 28;
  std::vector<std::string> layer_types;  // transformers 5: per layer, full_ or sliding_attention
  // NoPE layers (SmolLM3): no_rope_layers, one 0 (no RoPE) or 1 per layer; empty: every
  // no_rope_layer_interval-th layer is NoPE (0: every layer rotates).
  std::vector<int64_t> no_rope_layers;
  int64_t no_rope_layer_interval = 0;

  // The window a layer uses, or nullopt for full causal attention.
  std::optional<int64_t> window_for_layer(int64_t layer) const;
  // Whether `layer` is a sliding_attention layer under kOlmo3's / kSmolLM3's rule.
  bool olmo3_sliding(int64_t layer) const;
  bool smollm3_sliding(int64_t layer) const;
  // Whether `layer` applies RoPE (no_rope_layers, no_rope_layer_interval).
  bool uses_rope(int64_t layer) const;
  int64_t max_positions(int64_t max_position_embeddings) const override;
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<LlamaParams>(*this);
  }
};

// What Gemma 2 and Gemma 3 add to the Llama family's fields.
struct GemmaParams : LlamaParams {
  std::string hidden_activation = "gelu_pytorch_tanh";  // the MLP's; hidden_act is not read
  double query_pre_attn_scalar = 256;                   // attention scale: its inverse square root
  std::optional<double> attn_logit_softcapping;         // nullopt: off
  std::optional<double> final_logit_softcapping;        // nullopt: off
  bool explicit_layer_types = false;                    // layer_types came from config.json

  // Whether `layer` attends within sliding_window: as layer_types says, else the architecture's
  // rule (Gemma 2: the even layers).
  virtual bool sliding(int64_t layer) const {
    if (!layer_types.empty()) return layer_types[layer] == "sliding_attention";
    return layer % 2 == 0;
  }
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<GemmaParams>(*this);
  }
};

// HF defaults that differ per architecture, for fields config.json may leave out.
struct LlamaDefaults {
  int64_t max_position_embeddings = 2048;
  std::optional<int64_t> head_dim;  // nullopt: hidden_size / num_attention_heads
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  double rope_theta = 10000.0;  // transformers' default_theta
  // num_key_value_heads when config.json has no such field (nullopt, or the field null:
  // num_attention_heads), and the config class whose default it is (for errors).
  std::optional<int64_t> num_key_value_heads;
  const char* config_class = "";
};

// The Gemmas': head_dim 256, bos 2, eos 1, and their context.
LlamaDefaults gemma_defaults(int64_t max_position_embeddings);

// Reads the shared fields into c and p (sizes, kv heads, head_dim, activation, eps, RoPE, tying,
// token ids). Biases and windows are the architecture's to read.
void parse_llama_family(const ConfigReader& f, const LlamaDefaults& d, ModelConfig& c,
                        LlamaParams& p);
// config.json's clip_qkv: null or absent (none) or a positive number; and as written back.
std::optional<double> parse_clip_qkv(const ConfigReader& f);
nlohmann::json clip_qkv_json(const LlamaParams& p);
// Gemma's use_bidirectional_attention: true is refused (exit 2).
void refuse_bidirectional_attention(const ConfigReader& f);
// Reads Qwen2/Qwen3's window fields (use_sliding_window, sliding_window, max_window_layers,
// layer_types) and sets p.windows = kQwen.
void parse_qwen_windows(const ConfigReader& f, const ModelConfig& c, LlamaParams& p);
// config.json's layer_types (transformers 5): one "full_attention" or "sliding_attention" per
// layer, checked; empty when absent or null.
std::vector<std::string> parse_layer_types(const ConfigReader& f, const ModelConfig& c);
void write_llama_family(const ModelConfig& c, nlohmann::json& j);
void write_qwen_windows(const LlamaParams& p, nlohmann::json& j);
// After parse_llama_family, what Gemma 2 and Gemma 3 share: tying (default true),
// hidden_activation, attention_bias (q/k/v/o), query_pre_attn_scalar, the two soft-caps (absent:
// the defaults given; null: off), sliding_window (absent: 4096; null: none, refused when a layer
// slides: call after whatever p.sliding() depends on) and layer_types; use_bidirectional_attention
// is refused.
void parse_gemma_fields(const ConfigReader& f, ModelConfig& c, GemmaParams& p,
                        std::optional<double> attn_softcap, std::optional<double> final_softcap);
// write_llama_family and those fields.
void write_gemma_fields(const ModelConfig& c, nlohmann::json& j);

// tiny, small and gpt2-small (a Llama-style model of GPT-2 124M's size), then `own` (the
// architecture's real-model presets): sizes only; the caller sets its architecture's fields.
std::vector<std::string> llama_family_presets(const std::vector<std::string>& own = {});
ModelConfig llama_family_preset(const std::string& arch, const std::string& preset);
// The shared preset's sizes in a Gemma architecture's params `p` (with that architecture's
// defaults): tied, token ids 2 (bos) and 1 (eos), GeGLU, query_pre_attn_scalar = head_dim, a
// sliding window of 4 (tiny) or 256.
ModelConfig gemma_preset(const std::string& arch, const std::string& preset,
                         std::unique_ptr<GemmaParams> p);

// What a Llama-style architecture changes in the family's model: its decoder layer (null: the
// Llama pre-norm layer) or that layer's MLP, (1 + w) norms (the final norm and the pre-norm
// layer's: Gemma), a scaled embedding and soft-capped logits (Gemma 2), the decoder's module path
// (Gemma 3's multimodal checkpoints nest it under the vision model's).
struct LlamaBuild {
  std::string base = "model";  // the decoder's module path: model.embed_tokens, model.layers.N
  std::function<std::unique_ptr<Module>(const ModelConfig& c, WeightSource w, int64_t layer,
                                        const std::shared_ptr<const Rope>& rope)>
      layer;
  // The Llama pre-norm layer's feed-forward part, given the layer's weights (null: the gated MLP
  // under `mlp`); a mixture of experts sets it.
  std::function<std::unique_ptr<Module>(const ModelConfig& c, WeightSource w, int64_t layer)> mlp;
  // The pre-norm layer's attention, given its weights (`self_attn`) and the model's RoPE (null:
  // grouped-query Attention); DeepSeek-V3's latent attention sets it.
  std::function<std::unique_ptr<Module>(const ModelConfig& c, WeightSource a, int64_t layer,
                                        const std::shared_ptr<const Rope>& rope)>
      attention;
  bool unit_offset_norms = false;
  // The pre-norm layer's two norms and the final norm, `name` under `w` (null: RMSNorms with the
  // config's eps, (1 + w) with unit_offset_norms, which a set `norm` replaces; OLMo's are
  // non-parametric LayerNorms).
  std::function<std::unique_ptr<Module>(const ModelConfig& c, WeightSource w,
                                        const std::string& name, int64_t width)>
      norm;
  // Each layer's attention has a learned per-head sink logit, `self_attn.sinks` (gpt-oss).
  bool attention_sinks = false;
  std::optional<float> embedding_scale;
  std::optional<double> logit_softcap;
};

BuiltModel build_llama_family(const ModelConfig& c, WeightSource& w, const LlamaBuild& b = {});

// The parts the Llama-style builders share, each asking `w` for its weights by HF name.
// RMSNorm `name` of `width` with p.rms_norm_eps; per head when heads > 0; (1 + w) when
// unit_offset (Gemma's).
std::unique_ptr<RMSNorm> llama_rms_norm(const LlamaParams& p, WeightSource w,
                                        const std::string& name, int64_t width, int64_t heads = 0,
                                        bool unit_offset = false);
// q_proj, k_proj, v_proj and o_proj under `a` (self_attn), with the config's biases.
AttentionParts llama_attention_projections(const ModelConfig& c, WeightSource a);
// The attention of `layer`: the config's sizes, scale head_dim^-0.5, its window, `rope`.
AttentionShape llama_attention_shape(const ModelConfig& c, int64_t layer,
                                     std::shared_ptr<const Rope> rope);
// gate_proj, act_fn (activation `act`), up_proj, down_proj under `m` (mlp), `inner` wide (0:
// intermediate_size).
std::unique_ptr<Module> llama_gated_mlp(const ModelConfig& c, WeightSource m,
                                        const std::string& act, int64_t inner = 0);
// Gemma's decoder layer (GemmaParams): four (1 + w) RMSNorms around attention and the GeGLU MLP
// (SublayerNormBlock), attention scaled by query_pre_attn_scalar^-0.5, its window as p.sliding()
// says, rotated by `rope`; scores soft-capped when `attn_softcap` and the config sets a cap (Gemma
// 2); with `qk_norm`, per-head (1 + w) q_norm / k_norm after the three projections (Gemma 3).
std::unique_ptr<Module> gemma_decoder_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                            const std::shared_ptr<const Rope>& rope,
                                            bool attn_softcap, bool qk_norm);

// OLMo 2's decoder layer (and OLMo 3's): no pre-norm; post_attention_layernorm and
// post_feedforward_layernorm RMSNorms on the sublayer outputs before each residual add
// (SublayerNormBlock); q_norm / k_norm over the whole q / k projection before the head split;
// its window as p.window_for_layer() says.
std::unique_ptr<Module> olmo2_decoder_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                            const std::shared_ptr<const Rope>& rope);

// The presets and the builder every Llama-style architecture shares; each sets its own fields on
// the shared presets in preset_fields().
class LlamaFamilyArchitecture : public Architecture {
 public:
  std::vector<std::string> presets() const override { return llama_family_presets(); }
  ModelConfig preset(const std::string& name) const override {
    ModelConfig c = llama_family_preset(this->name(), name);
    preset_fields(name, c.params<LlamaParams>());
    return c;
  }
  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    return build_llama_family(c, w);
  }

 protected:
  virtual void preset_fields(const std::string& preset, LlamaParams& p) const {}
};

}  // namespace actcap
