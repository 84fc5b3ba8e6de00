// Llama (transformers configuration_llama.py, modeling_llama.py): the Llama family's structure
// with optional attention and MLP biases.
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class Llama : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "llama"; }
  std::vector<std::string> model_types() const override { return {"llama"}; }
  std::vector<std::string> class_names() const override { return {"LlamaForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    parse_llama_family(f, LlamaDefaults{}, c, *p);
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->mlp_bias = f.boolean({"mlp_bias"}, false);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    write_llama_family(c, j);
    j["attention_bias"] = c.params<LlamaParams>().attention_bias;
    j["mlp_bias"] = c.params<LlamaParams>().mlp_bias;
  }
};

}  // namespace

const Architecture& llama_architecture() {
  static const Llama arch;
  return arch;
}

}  // namespace actcap
