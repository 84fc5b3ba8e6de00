// Hugging Face config.json, one struct per family, mirroring HF's field names and defaults
// (transformers configuration_gpt2.py, configuration_llama.py, configuration_mistral.py,
// configuration_qwen2.py). Defaults are written once, in config.cpp.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace actcap {

enum class Arch { kGpt2, kLlama, kMistral, kQwen2 };

const char* arch_name(Arch a);  // "gpt2", "llama", "mistral", "qwen2"
// Parses a model_type; throws InputError listing the supported ones.
Arch parse_arch(const std::string& model_type, const std::string& origin);
std::vector<std::string> supported_model_types();

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;      // alias max_position_embeddings
  int64_t n_embd = 768;            // alias hidden_size
  int64_t n_layer = 12;            // alias num_hidden_layers
  int64_t n_head = 12;             // alias num_attention_heads
  std::optional<int64_t> n_inner;  // None -> 4 * n_embd
  std::string activation_function = "gelu_new";
  double layer_norm_epsilon = 1e-5;
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  bool reorder_and_upcast_attn = false;
  bool tie_word_embeddings = true;
  int64_t bos_token_id = 50256;
  int64_t eos_token_id = 50256;

  int64_t inner() const { return n_inner ? *n_inner : 4 * n_embd; }
  int64_t head_dim() const { return n_embd / n_head; }
};

// RoPE parameters, from top-level rope_theta/rope_scaling (transformers v4) or rope_parameters
// (v5), with HF's defaults (modeling_rope_utils.py). Fields a type does not use keep their
// defaults. What HF derives when the file leaves it out (original_max_position_embeddings, the
// longrope factor) is stored resolved, so config_to_json writes it and the round trip is exact.
struct RopeConfig {
  std::string rope_type = "default";  // default | linear | dynamic | yarn | longrope | llama3
  double rope_theta = 10000.0;
  double factor = 1.0;            // every type but default
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3, yarn, longrope: the pre-training context. From the top level of config.json when
  // present (Phi-3's layout, which HF prefers), else the rope dict, else max_position_embeddings.
  int64_t original_max_position_embeddings = 0;
  std::optional<double> attention_factor;  // yarn, longrope: nullopt = HF's formula from factor
  double beta_fast = 32.0;                 // yarn
  double beta_slow = 1.0;                  // yarn
  std::optional<double> mscale;            // yarn (with mscale_all_dim; 0 counts as unset, as HF)
  std::optional<double> mscale_all_dim;    // yarn
  bool truncate = true;                    // yarn: round the correction range to whole dims
  std::vector<double> short_factor;        // longrope: head_dim / 2 divisors each
  std::vector<double> long_factor;         // longrope: used when a forward exceeds the original
};

// Llama, Mistral and Qwen2 share one structure; model_type picks HF's defaults for each.
struct LlamaConfig {
  Arch arch = Arch::kLlama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // None in HF -> num_attention_heads
  int64_t head_dim = 128;            // None in HF -> hidden_size / num_attention_heads
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v/o biases (Llama); Qwen2 always has q/k/v biases
  bool qkv_bias = false;        // effective q/k/v bias
  bool o_bias = false;          // effective o_proj bias
  bool mlp_bias = false;
  // Sliding-window attention: key j is visible from query i iff i - window < j <= i.
  std::optional<int64_t> sliding_window;  // Mistral: applies to every layer when set
  bool use_sliding_window = false;        // Qwen2
  int64_t max_window_layers = 28;         // Qwen2: layers >= this use the window
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;

  // The window a given layer uses, or nullopt for full causal attention.
  std::optional<int64_t> window_for_layer(int64_t layer) const;
};

struct ModelConfig {
  Arch arch = Arch::kGpt2;
  std::string model_type;
  Gpt2Config gpt2;    // valid when arch == kGpt2
  LlamaConfig llama;  // valid otherwise

  int64_t vocab_size() const;
  int64_t hidden_size() const;
  int64_t num_layers() const;
  // The longest sequence a forward accepts: n_positions / max_position_embeddings, except for
  // dynamic NTK RoPE, whose purpose is to run past max_position_embeddings: factor times it (HF:
  // "a factor of x enables sequences of length x * the original maximum").
  int64_t max_positions() const;
  bool tie_word_embeddings() const;
};

// Parses config.json text. `origin` names the file in errors. Throws InputError for malformed JSON,
// unknown model_type, missing required fields (the architecture's sizes have no sensible default),
// wrong JSON types, and inconsistent sizes (heads not dividing the width, kv heads not dividing
// heads, unsupported rope types or activations).
ModelConfig parse_config(const std::string& text, const std::string& origin);
ModelConfig load_config(const std::string& path);
// Serialises to HF's config.json layout (as save_pretrained would write it).
std::string config_to_json(const ModelConfig& c);

}  // namespace actcap
