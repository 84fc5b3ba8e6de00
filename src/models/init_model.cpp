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

// What the builder asks for, by name (the order random_weights' map and the file list them),
// found by a walk that touches no weight memory.
std::map<std::string, WeightSpec> weight_specs(const ModelConfig& c) {
  WeightSource w = WeightSource::shapes();
  architecture_of(c).build(c, w);
  std::map<std::string, WeightSpec> out;
  for (const WeightSpec& s : w.specs()) out.emplace(s.name, s);
  return out;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t k = 1;
  for (int64_t d : shape) k *= d;
  return k;
}

// The same bytes write_safetensors(random_weights(c, seed, dtype)) writes, one tensor at a time:
// an 8B-parameter checkpoint never needs more than its largest tensor in memory.
int64_t write_random_checkpoint(const std::string& path, const ModelConfig& c, uint64_t seed,
                                at::ScalarType dtype) {
  const std::map<std::string, WeightSpec> specs = weight_specs(c);
  std::vector<std::pair<std::string, at::Tensor>> layout;  // shapes and dtypes, no storage
  const auto meta = at::TensorOptions().dtype(dtype).device(at::kMeta);
  int64_t parameters = 0;
  for (const auto& [name, spec] : specs) {
    layout.emplace_back(name, at::empty(spec.shape, meta));
    parameters += element_count(spec.shape);
  }
  const std::string prefix = safetensors_prefix(layout, {});
  write_file_atomic(path, [&](int fd) {
    write_all(fd, prefix.data(), prefix.size(), path);
    for (const auto& [name, spec] : specs) {
      const at::Tensor t = random_weight(seed, spec).to(dtype);
      const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
      if (nbytes > 0) write_all(fd, t.data_ptr(), nbytes, path);
    }
  });
  return parameters;
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
    for (const auto& [name, spec] : weight_specs(c)) r.parameters += element_count(spec.shape);
  } else {
    r.parameters = write_random_checkpoint(dir + "/model.safetensors", c, o.seed, dtype);
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
