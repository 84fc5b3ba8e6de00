// One Architecture per file in this folder holds everything architecture-specific: the model_type
// values and `architectures` class names it accepts, reading its config.json (common fields into
// ModelConfig, its own into its ArchParams), writing it back (init-model), its presets, and
// building its modules from the parts in models/parts/. registry.cpp names them all in one table;
// adding an architecture is one new file and one line there (docs/architecture.md walks through
// Qwen3's).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "actcap/config.h"
#include "actcap/model.h"
#include "models/module.h"
#include "models/weights.h"

namespace actcap {

class ConfigReader;

struct BuiltStage {
  StageKind kind;
  std::unique_ptr<Module> module;
};

struct BuiltModel {
  std::vector<BuiltStage> stages;  // embeddings, blocks..., final norm, lm_head
  // lm_head multiplies by the embedding matrix itself (tied): its bytes are resident once when
  // both stages share a device.
  bool head_shares_embedding = false;
  int64_t mlp_width = 0;  // the MLP's inner width (the planner's workspace estimate)
  // Elements per token the attention holds for its queries, keys, values and context (the
  // planner's estimate; 0: four hidden-wide tensors).
  int64_t attention_width = 0;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual std::string name() const = 0;                      // "qwen3"
  virtual std::vector<std::string> model_types() const = 0;  // config.json model_type values
  // config.json `architectures` class names; the first is written back.
  virtual std::vector<std::string> class_names() const = 0;
  // Reads config.json into c: the common fields and c.arch_params. c.arch and c.model_type are set.
  virtual void parse(const ConfigReader& f, ModelConfig& c) const = 0;
  // Writes the architecture's fields in HF's layout (model_type, architectures and torch_dtype are
  // written by config_to_json).
  virtual void write(const ModelConfig& c, nlohmann::json& j) const = 0;
  virtual std::vector<std::string> presets() const = 0;
  // The config a preset (one of presets()) stands for.
  virtual ModelConfig preset(const std::string& name) const = 0;
  // The modules, asking `w` for every weight by name as it builds.
  virtual BuiltModel build(const ModelConfig& c, WeightSource& w) const = 0;
};

// Every architecture, in the registry's order.
const std::vector<const Architecture*>& architectures();
// The architecture of a model_type; throws InputError naming `origin` and the supported types.
const Architecture& architecture_for(const std::string& model_type, const char* origin);
// The architecture a parsed config belongs to (by c.arch).
const Architecture& architecture_of(const ModelConfig& c);

// nn.Linear `name` under `w`: weight [out, in], bias [out] when `bias`.
std::unique_ptr<Linear> linear_layer(WeightSource w, const std::string& name, int64_t in,
                                     int64_t out, bool bias);
// nn.LayerNorm `name` under `w`: weight and bias [width], eps (GPT-2, GPT-NeoX, GPT-J, Phi).
std::unique_ptr<Module> layer_norm(WeightSource w, const std::string& name, int64_t width,
                                   double eps);
// The MLP of two nn.Linear layers with biases around an activation (GPT-NeoX, GPT-J, Phi), under
// `w`: `up` [hidden -> inner], the activation `activation` as the child `act`, then `down`.
std::unique_ptr<Module> biased_mlp(WeightSource w, const char* up, const char* act,
                                   const char* down, const std::string& activation, int64_t hidden,
                                   int64_t inner);
// The embeddings stage of GPT-2 and GPT-Neo, from `t` (their `transformer.`):
// wte(ids) + wpe(positions), each a hook point (wte.weight [vocab, hidden], also lm_head.weight
// when tied; wpe.weight [max_position_embeddings, hidden]). `wte` receives the token embedding
// matrix.
std::unique_ptr<Module> learned_position_embeddings(const ModelConfig& c, WeightSource& t,
                                                    at::Tensor& wte);
// lm_head: its own weight, or the embedding matrix when tied (`embedding` is that weight).
BuiltStage head_stage(const ModelConfig& c, WeightSource& w, const at::Tensor& embedding);

// The longest forward a RoPE allows: max_position_embeddings, or factor times it for dynamic NTK.
int64_t rope_max_positions(const RopeConfig& r, int64_t max_position_embeddings);
// The share of each head RoPE rotates, for the architectures that rotate part of it (GPT-NeoX,
// Phi): partial_rotary_factor in the rope dict (where transformers 5 keeps it), else the
// top-level field `top_level` (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor), else `dflt`.
double partial_rotary_fraction(const ConfigReader& f, const char* top_level, double dflt);

}  // namespace actcap
