#include "actcap/init_model.h"

#include <filesystem>

#include "actcap/error.h"
#include "actcap/safetensors.h"
#include "io/atomic_file.h"
#include "models/weights.h"

namespace actcap {

ModelConfig preset_config(const std::string& arch, const std::string& preset) {
  if (preset != "tiny" && preset != "small" && preset != "gpt2-small")
    throw InputError(concat("unknown preset '", preset, "'; supported: tiny, small, gpt2-small"));
  ModelConfig c;
  c.model_type = arch;
  c.arch = parse_arch(arch, "architecture");
  if (c.arch == Arch::kGpt2) {
    Gpt2Config& g = c.gpt2;
    if (preset == "tiny") {
      g.vocab_size = 512, g.n_positions = 128, g.n_embd = 64, g.n_layer = 4, g.n_head = 4;
    } else if (preset == "small") {
      g.vocab_size = 2048, g.n_positions = 512, g.n_embd = 256, g.n_layer = 6, g.n_head = 8;
    }  // gpt2-small: HF's GPT2Config defaults are GPT-2 124M
    return c;
  }
  LlamaConfig& l = c.llama;
  l.arch = c.arch;
  if (preset == "tiny") {
    l.vocab_size = 512, l.hidden_size = 64, l.intermediate_size = 160, l.num_hidden_layers = 4;
    l.num_attention_heads = 4, l.num_key_value_heads = 2, l.max_position_embeddings = 256;
  } else if (preset == "small") {
    l.vocab_size = 2048, l.hidden_size = 256, l.intermediate_size = 688, l.num_hidden_layers = 6;
    l.num_attention_heads = 8, l.num_key_value_heads = 2, l.max_position_embeddings = 1024;
  } else {  // a Llama of GPT-2 124M's size
    l.vocab_size = 32000, l.hidden_size = 768, l.intermediate_size = 2048, l.num_hidden_layers = 12;
    l.num_attention_heads = 12, l.num_key_value_heads = 4, l.max_position_embeddings = 2048;
  }
  l.head_dim = l.hidden_size / l.num_attention_heads;
  l.qkv_bias = c.arch == Arch::kQwen2;
  if (c.arch == Arch::kMistral)
    l.sliding_window = preset == "tiny" ? 8 : 256;  // small windows get exercised
  if (c.arch == Arch::kQwen2) l.sliding_window = 4096;
  if (c.arch == Arch::kLlama) l.sliding_window = std::nullopt;
  return c;
}

InitModelResult init_model(const std::string& dir, const InitModelOptions& o) {
  ModelConfig c = preset_config(o.arch, o.preset);
  if (o.tie_word_embeddings) {
    if (c.arch == Arch::kGpt2)
      c.gpt2.tie_word_embeddings = *o.tie_word_embeddings;
    else
      c.llama.tie_word_embeddings = *o.tie_word_embeddings;
  }
  at::ScalarType dtype;
  std::string torch_dtype;
  if (o.dtype == "f32")
    dtype = at::kFloat, torch_dtype = "float32";
  else if (o.dtype == "f16")
    dtype = at::kHalf, torch_dtype = "float16";
  else if (o.dtype == "bf16")
    dtype = at::kBFloat16, torch_dtype = "bfloat16";
  else
    throw InputError(concat("unknown weight dtype '", o.dtype, "'; supported: f32, f16, bf16"),
                     {"dtype"});

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(concat("cannot create ", dir, ": ", ec.message()));
  auto tensors = init_weights(weight_plan(c), o.seed, dtype);
  std::vector<std::pair<std::string, at::Tensor>> ordered(tensors.begin(), tensors.end());
  write_safetensors(dir + "/model.safetensors", ordered, {});
  std::string json = config_to_json(c);
  const std::string f32 = "\"torch_dtype\": \"float32\"";
  auto pos = json.find(f32);
  if (pos != std::string::npos)
    json.replace(pos, f32.size(), "\"torch_dtype\": \"" + torch_dtype + "\"");
  write_file_atomic(dir + "/config.json", json);
  InitModelResult r{c, 0};
  for (const auto& [n, t] : tensors) r.parameters += t.numel();
  return r;
}

}  // namespace actcap
