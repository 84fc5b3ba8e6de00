// Deterministic random-init checkpoints in exact Hugging Face layout: the fixtures every test and
// benchmark uses (no network, no hub).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "actcap/config.h"

namespace actcap {

struct InitModelOptions {
  std::string arch = "gpt2";    // a supported model_type (supported_model_types())
  std::string preset = "tiny";  // tiny | small | gpt2-small, and the architecture's own
  bool config_only = false;     // write config.json only (no weights)
  uint64_t seed = 0;
  std::string dtype = "f32";                // f32 | f16 | bf16
  std::optional<bool> tie_word_embeddings;  // default: the preset's (HF default per family)
};

// The config a preset stands for. Throws InputError for unknown arch or preset.
ModelConfig preset_config(const std::string& arch, const std::string& preset);

// Deterministic random weights for `config` in checkpoint layout and names, stored as `dtype`:
// exactly the tensors the architecture's builder asks for. The same seed gives the same bytes on
// every build.
std::map<std::string, at::Tensor> random_weights(const ModelConfig& config, uint64_t seed,
                                                 c10::ScalarType dtype = c10::ScalarType::Float);

struct InitModelResult {
  ModelConfig config;
  int64_t parameters = 0;
};

// Writes DIR/config.json and DIR/model.safetensors (creating DIR); config.json only with
// config_only.
InitModelResult init_model(const std::string& dir, const InitModelOptions& options);

}  // namespace actcap
