// Qwen2 (transformers configuration_qwen2.py, modeling_qwen2.py): the Llama family's structure
// with q/k/v biases (always, whatever attention_bias says) and sliding windows on the layers
// use_sliding_window / max_window_layers or layer_types select.
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

class Qwen2 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "qwen2"; }
  std::vector<std::string> model_types() const override { return {"qwen2"}; }
  std::vector<std::string> class_names() const override { return {"Qwen2ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 32768;
    d.bos_token_id = d.eos_token_id = 151643;
    parse_llama_family(f, d, c, *p);
    p->qkv_bias = true;
    parse_qwen_windows(f, c, *p);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    write_llama_family(c, j);
    write_qwen_windows(c.params<LlamaParams>(), j);
  }

 protected:
  void preset_fields(const std::string&, LlamaParams& p) const override {
    p.qkv_bias = true;
    p.windows = LlamaParams::Windows::kQwen;
    p.sliding_window = 4096;
  }
};

}  // namespace

const Architecture& qwen2_architecture() {
  static const Qwen2 arch;
  return arch;
}

}  // namespace actcap
