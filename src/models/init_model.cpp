#include "actcap/init_model.h"

#include <algorithm>
#include <filesystem>

#include "actcap/error.h"
#include "actcap/safetensors.h"
#include "io/atomic_file.h"
#include "models/arch/architecture.h"
#include "models/weights.h"
#include "util/strings.h"

namespace actcap {

ModelConfig preset_config(const std::string& arch_name, const std::string& preset) {
  const Architecture& arch = architecture_for(arch_name, "architecture");
  const std::vector<std::string> presets = arch.presets();
  if (std::find(presets.begin(), presets.end(), preset) == presets.end())
    throw InputError(concat("unknown preset '", preset, "' for ", arch.name(),
                            "; supported: ", join(presets, ", ")));
  return arch.preset(preset);
}

std::map<std::string, at::Tensor> random_weights(const ModelConfig& c, uint64_t seed,
                                                 at::ScalarType dtype) {
  WeightSource w = WeightSource::random(seed, dtype);
  architecture_of(c).build(c, w);
  return w.stored();
}

namespace {

int64_t parameter_count(const ModelConfig& c) {
  WeightSource w = WeightSource::shapes();
  architecture_of(c).build(c, w);
  int64_t n = 0;
  for (const WeightSpec& s : w.specs()) {
    int64_t k = 1;
    for (int64_t d : s.shape) k *= d;
    n += k;
  }
  return n;
}

}  // namespace

InitModelResult init_model(const std::string& dir, const InitModelOptions& o) {
  ModelConfig c = preset_config(o.arch, o.preset);
  if (o.tie_word_embeddings) c.tie_word_embeddings = *o.tie_word_embeddings;
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
  InitModelResult r{c, 0};
  if (o.config_only) {
    r.parameters = parameter_count(c);
  } else {
    auto tensors = random_weights(c, o.seed, dtype);
    std::vector<std::pair<std::string, at::Tensor>> ordered(tensors.begin(), tensors.end());
    write_safetensors(dir + "/model.safetensors", ordered, {});
    for (const auto& [n, t] : tensors) r.parameters += t.numel();
  }
  std::string json = config_to_json(c);
  const std::string f32 = "\"torch_dtype\": \"float32\"";
  auto pos = json.find(f32);
  if (pos != std::string::npos)
    json.replace(pos, f32.size(), "\"torch_dtype\": \"" + torch_dtype + "\"");
  write_file_atomic(dir + "/config.json", json);
  return r;
}

}  // namespace actcap
