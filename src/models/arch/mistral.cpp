// Mistral (transformers configuration_mistral.py, modeling_mistral.py): the Llama family's
// structure without biases, with a sliding window on every layer.
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class Mistral : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "mistral"; }
  std::vector<std::string> model_types() const override { return {"mistral"}; }
  std::vector<std::string> class_names() const override { return {"MistralForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 4096 * 32;
    parse_llama_family(f, d, c, *p);
    // Transformers' Mistral has no biases, whatever attention_bias says. sliding_window: 4096
    // when absent, none when null.
    p->windows = LlamaParams::Windows::kEveryLayer;
    p->sliding_window = f.has("sliding_window")
                            ? std::optional<int64_t>(f.positive({"sliding_window"}, std::nullopt))
                        : f.root().count("sliding_window") ? std::nullopt
                                                           : std::optional<int64_t>(4096);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    write_llama_family(c, j);
    const auto& p = c.params<LlamaParams>();
    j["sliding_window"] = p.sliding_window ? nlohmann::json(*p.sliding_window) : nlohmann::json();
  }

 protected:
  void preset_fields(const std::string& preset, LlamaParams& p) const override {
    p.windows = LlamaParams::Windows::kEveryLayer;
    p.sliding_window = preset == "tiny" ? 8 : 256;  // small windows get exercised
  }
};

}  // namespace

const Architecture& mistral_architecture() {
  static const Mistral arch;
  return arch;
}

}  // namespace actcap
