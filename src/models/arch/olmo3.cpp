// OLMo 3 (transformers configuration_olmo3.py, modular_olmo3.py): OLMo 2's decoder layer (no
// pre-norm, RMSNorms on the sublayer outputs before the residual adds, q_norm / k_norm over the
// whole projections) with sliding-window attention on the layers layer_types calls
// "sliding_attention" (by default every layer but each fourth, i.e. (i + 1) % 4 != 0) within
// sliding_window (default 4096). Its rotary module is Gemma 2's: cos and sin in the compute dtype,
// so q and k are rotated in it (OLMo 2 rotates in float32). One RoPE for every layer, of any type
// (the released models: yarn, factor 8 over 8192 positions).
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "models/arch/llama_family.h"
#include "models/config_reader.h"
#include "util/strings.h"

namespace actcap {

namespace {

class Olmo3 : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "olmo3"; }
  std::vector<std::string> model_types() const override { return {"olmo3"}; }
  std::vector<std::string> class_names() const override { return {"Olmo3ForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<LlamaParams>();
    p->rms_norm_eps = 1e-5;  // Olmo3Config's default
    LlamaDefaults d;         // max_position_embeddings 2048, head_dim hidden / heads
    d.eos_token_id = 50279;
    parse_llama_family(f, d, c, *p);
    // No BOS token, as OLMo 2 (Olmo3Config's bos_token_id is None): it stands as the EOS id here.
    if (!f.has("bos_token_id")) c.bos_token_id = c.eos_token_id;
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->norms_scale_in_float32 = true;  // Olmo3RMSNorm is Olmo2RMSNorm
    p->windows = LlamaParams::Windows::kOlmo3;
    // Absent: 4096. null is refused even where no layer slides: Olmo3Model builds the sliding
    // mask on every forward, and transformers refuses a null window there.
    if (f.root().contains("sliding_window") && !f.has("sliding_window"))
      throw InputError(concat(f.origin(),
                              ": field 'sliding_window' is null; OLMo 3 needs a window ",
                              "(transformers builds its sliding mask on every forward): set one"));
    p->sliding_window = f.positive({"sliding_window"}, 4096);
    p->layer_types = parse_layer_types(f, c);  // empty: Olmo3Config's default (olmo3_sliding)
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<LlamaParams>();
    write_llama_family(c, j);
    j["attention_bias"] = p.attention_bias;
    j["sliding_window"] = *p.sliding_window;
    if (!p.layer_types.empty()) j["layer_types"] = p.layer_types;
    if (c.bos_token_id == c.eos_token_id) j.erase("bos_token_id");  // None, as parse() reads it
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"olmo-3-7b", "olmo-3-32b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "olmo-3-7b" || name == "olmo-3-32b";
    ModelConfig c = LlamaFamilyArchitecture::preset(real ? "tiny" : name);
    auto& p = c.params<LlamaParams>();
    p.rms_norm_eps = 1e-6;
    p.norms_scale_in_float32 = true;
    p.windows = LlamaParams::Windows::kOlmo3;
    p.sliding_window = name == "tiny" ? 8 : 256;
    if (real) {
      // The released OLMo 3 7B and 32B config.json files, as quoted publicly (no bos_token_id:
      // see parse()).
      const bool big = name == "olmo-3-32b";
      c.vocab_size = 100278, c.hidden_size = big ? 5120 : 4096;
      p.intermediate_size = big ? 27648 : 11008;
      c.num_hidden_layers = big ? 64 : 32, c.num_attention_heads = big ? 40 : 32;
      p.num_key_value_heads = big ? 8 : 32, p.head_dim = 128;
      c.max_position_embeddings = 65536, p.sliding_window = 4096;
      p.rope.rope_type = "yarn", p.rope.rope_theta = 500000.0, p.rope.factor = 8.0;
      p.rope.original_max_position_embeddings = 8192, p.rope.attention_factor = 1.2079441541679836;
      p.rope.beta_fast = 32.0, p.rope.beta_slow = 1.0;
      c.bos_token_id = c.eos_token_id = 100257;
    }
    return c;  // layer_types: Olmo3Config's default, as the released configs list them
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    LlamaBuild b;
    b.layer = olmo2_decoder_layer;
    return build_llama_family(c, w, b);
  }
};

}  // namespace

const Architecture& olmo3_architecture() {
  static const Olmo3 arch;
  return arch;
}

}  // namespace actcap
