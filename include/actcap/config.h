// Hugging Face config.json: the fields every architecture has (sizes, tying, token ids) in one
// struct, and each architecture's own fields in its own (src/models/arch/<name>.cpp). Names and
// defaults mirror transformers' configuration_*.py; each is written once, in its architecture's
// file.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace actcap {

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
  std::optional<double> mscale_all_dim;    // yarn; any scaled type (DeepSeek's softmax scale)
  bool truncate = true;                    // yarn: round the correction range to whole dims
  std::vector<double> short_factor;        // longrope: head_dim / 2 divisors each
  std::vector<double> long_factor;         // longrope: used when a forward exceeds the original
};

// An architecture's own fields (GPT-2's activation and attention scaling, the Llama family's
// head_dim, RoPE, biases and windows...). Each architecture derives its struct in its own file;
// ModelConfig::params<T>() reads it back.
struct ArchParams {
  virtual ~ArchParams() = default;
  virtual std::unique_ptr<ArchParams> clone() const = 0;
  // The longest sequence a forward accepts, given config.json's max_position_embeddings.
  virtual int64_t max_positions(int64_t max_position_embeddings) const {
    return max_position_embeddings;
  }
};

// FP8 weights, from config.json's quantization_config: "quant_method": "fp8" (transformers'
// fine-grained FP8: DeepSeek-V3/R1, Kimi-K2, the Qwen3 FP8 releases; scales in
// `<weight>_scale_inv`) or "compressed-tensors" with 8-bit float weights (llm-compressor's FP8
// schemes: per tensor, per channel, per group or per block; scales in `<weight>_scale`). F8_E4M3
// weights, each with one scale per block, decoded as each layer runs (weights dtype keep) or at
// load (docs/devices.md).
struct Fp8Weights {
  std::string method = "fp8";               // quant_method
  std::string scale_suffix = "_scale_inv";  // a weight's scales: its name and this
  // Rows and columns of a block, each 0 for the whole dimension: (0, 0) one scale per matrix
  // (weight_block_size null; per tensor), (1, 0) per output channel, (1, g) groups of g inputs.
  int64_t block_rows = 128, block_cols = 128;
  // What the weights decode to: config.json's dtype (or torch_dtype), "bfloat16", "float16" or
  // "float32"; "float32" when it names none.
  std::string dtype = "float32";
};

struct ModelConfig {
  std::string arch;        // the registry's name: gpt2, llama, mistral, qwen2, qwen3
  std::string model_type;  // as config.json says it
  // Fields every architecture has, under transformers' common names (GPT-2's n_embd, n_layer,
  // n_head and n_positions are read into them).
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 0;
  std::optional<Fp8Weights> fp8;  // quantization_config "fp8"; never written back (config_to_json)
  std::unique_ptr<ArchParams> arch_params;

  ModelConfig() = default;
  ModelConfig(const ModelConfig& o);
  ModelConfig& operator=(const ModelConfig& o);
  ModelConfig(ModelConfig&&) = default;
  ModelConfig& operator=(ModelConfig&&) = default;

  int64_t num_layers() const { return num_hidden_layers; }
  // The longest sequence a forward accepts: max_position_embeddings, except where the
  // architecture's positions go further (dynamic NTK RoPE runs to factor times it: HF's "a factor
  // of x enables sequences of length x * the original maximum").
  int64_t max_positions() const {
    return arch_params ? arch_params->max_positions(max_position_embeddings)
                       : max_position_embeddings;
  }

  // The architecture's own fields; throws std::logic_error when they are another type.
  template <typename T>
  const T& params() const {
    const T* p = dynamic_cast<const T*>(arch_params.get());
    if (!p) wrong_params();
    return *p;
  }
  template <typename T>
  T& params() {
    T* p = dynamic_cast<T*>(arch_params.get());
    if (!p) wrong_params();
    return *p;
  }

 private:
  [[noreturn]] void wrong_params() const;
};

// The model_type values we run, in registry order ("gpt2", "llama", ...).
std::vector<std::string> supported_model_types();

// Parses config.json text. `origin` names the file in errors. Throws InputError for malformed JSON,
// unknown model_type, missing required fields (the architecture's sizes have no sensible default),
// wrong JSON types, and inconsistent sizes (heads not dividing the width, kv heads not dividing
// heads, unsupported rope types or activations).
ModelConfig parse_config(const std::string& text, const std::string& origin);
ModelConfig load_config(const std::string& path);
// Serialises to HF's config.json layout (as save_pretrained would write it).
std::string config_to_json(const ModelConfig& c);

}  // namespace actcap
