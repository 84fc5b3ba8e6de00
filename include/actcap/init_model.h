// Deterministic random-init checkpoints in exact Hugging Face layout: the fixtures every test and
// benchmark uses (no network, no hub).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "actcap/config.h"

namespace actcap {

struct InitModelOptions {
  std::string arch = "gpt2";    // gpt2 | llama | mistral | qwen2
  std::string preset = "tiny";  // tiny | small | gpt2-small
  uint64_t seed = 0;
  std::string dtype = "f32";                // f32 | f16 | bf16
  std::optional<bool> tie_word_embeddings;  // default: the preset's (HF default per family)
};

// The config a preset stands for. Throws InputError for unknown arch or preset.
ModelConfig preset_config(const std::string& arch, const std::string& preset);

struct InitModelResult {
  ModelConfig config;
  int64_t parameters = 0;
};

// Writes DIR/config.json and DIR/model.safetensors (creating DIR).
InitModelResult init_model(const std::string& dir, const InitModelOptions& options);

}  // namespace actcap
