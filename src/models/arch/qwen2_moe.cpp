// Qwen2-MoE (transformers configuration_qwen2_moe.py, modeling_qwen2_moe.py: Qwen1.5-MoE-A2.7B,
// Qwen2-57B-A14B): Qwen2's attention (q/k/v biases with qkv_bias, default true; o_proj unbiased)
// with a sparse mixture of experts on layer i when i is not in mlp_only_layers and (i + 1) is a
// multiple of decoder_sparse_step, as Qwen3-MoE: a router over num_experts experts of
// moe_intermediate_size, the num_experts_per_tok most probable per token, weights renormalised only
// with norm_topk_prob and rounded to the compute dtype. Each sparse block also runs a shared expert
// on every token, a gated MLP of shared_expert_intermediate_size scaled by
// sigmoid(shared_expert_gate(x)) and added to the routed sum. Other layers run a dense MLP of
// intermediate_size. Sliding windows on the layers layer_types marks; without it, transformers 5's
// default: with use_sliding_window, the even layers below max_window_layers. Weights under `mlp`:
// `gate`, `experts.E.{gate,up,down}_proj`, `shared_expert.{gate,up,down}_proj`,
// `shared_expert_gate`.
#include <nlohmann/json.hpp>

#include "models/arch/moe_family.h"
#include "models/config_reader.h"

namespace actcap {

namespace {

const MoeNames kNames{"mlp", "gate_proj", "up_proj", "down_proj",
                      /*weights_in_compute_dtype=*/true};

class Qwen2Moe : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "qwen2_moe"; }
  std::vector<std::string> model_types() const override { return {"qwen2_moe"}; }
  std::vector<std::string> class_names() const override { return {"Qwen2MoeForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<MoeParams>();
    LlamaDefaults d;
    d.max_position_embeddings = 32768;
    d.bos_token_id = d.eos_token_id = 151643;
    d.num_key_value_heads = 16, d.config_class = "Qwen2MoeConfig";
    const nlohmann::json* kv =
        f.root().contains("num_key_value_heads") ? &f.root()["num_key_value_heads"] : nullptr;
    if (kv && kv->is_null())  // Qwen2MoeConfig keeps the None, and its attention cannot run it
      throw InputError(
          concat(f.origin(), ": num_key_value_heads is null; give the number of key/value heads"));
    parse_llama_family(f, d, c, *p);
    p->qkv_bias = f.boolean({"qkv_bias"}, true);
    parse_qwen_windows(f, c, *p);
    if (p->use_sliding_window && !p->sliding_window)  // transformers' sliding mask needs one
      throw InputError(concat(f.origin(),
                              ": use_sliding_window is true but sliding_window is null; set "
                              "sliding_window or use_sliding_window false"));
    if (p->layer_types.empty() && p->use_sliding_window)  // Qwen2MoeConfig.__post_init__
      for (int64_t i = 0; i < c.num_hidden_layers; ++i)
        p->layer_types.push_back((i + 1) % 2 != 0 && i < p->max_window_layers ? "sliding_attention"
                                                                              : "full_attention");
    parse_expert_counts(f, {"num_experts"}, 60, 4, *p);  // no num_local_experts alias
    parse_qwen_moe_fields(f, 1408, *p);
    p->shared_expert_intermediate_size = f.positive({"shared_expert_intermediate_size"}, 5632);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<MoeParams>();
    write_llama_family(c, j);
    write_qwen_windows(p, j);
    j["qkv_bias"] = p.qkv_bias;
    write_qwen_moe_fields(p, j);
    j["shared_expert_intermediate_size"] = p.shared_expert_intermediate_size;
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"qwen1.5-moe-a2.7b", "qwen2-57b-a14b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool a27 = name == "qwen1.5-moe-a2.7b", a14 = name == "qwen2-57b-a14b";
    ModelConfig c = moe_preset(this->name(), a27 || a14 ? "tiny" : name, 8, 2, 0);
    auto& p = c.params<MoeParams>();
    p.qkv_bias = true;
    p.windows = LlamaParams::Windows::kQwen;
    p.sliding_window = 4096;
    p.norm_topk_prob = false;
    p.moe_intermediate_size = p.intermediate_size / 4;
    p.shared_expert_intermediate_size = p.intermediate_size / 2;
    // One dense layer (the first) before the sparse ones, so that both kinds run.
    p.mlp_only_layers = {0};
    if (!a27 && !a14) return c;
    p.mlp_only_layers.clear();
    c.vocab_size = 151936, p.rope.rope_theta = 1000000.0;
    c.bos_token_id = c.eos_token_id = 151643;
    if (a27) {  // Qwen1.5-MoE-A2.7B's sizes: 14.3B parameters, 2.7B active per token
      c.hidden_size = 2048, p.intermediate_size = 5632, c.num_hidden_layers = 24;
      c.num_attention_heads = p.num_key_value_heads = 16, c.max_position_embeddings = 8192;
      p.num_experts = 60, p.top_k = 4, p.moe_intermediate_size = 1408;
      p.shared_expert_intermediate_size = 5632;
    } else {  // Qwen2-57B-A14B's sizes
      c.hidden_size = 3584, p.intermediate_size = 18944, c.num_hidden_layers = 28;
      c.num_attention_heads = 28, p.num_key_value_heads = 4, c.max_position_embeddings = 32768;
      p.num_experts = 64, p.top_k = 8, p.moe_intermediate_size = 2560;
      p.shared_expert_intermediate_size = 20480;
    }
    p.head_dim = c.hidden_size / c.num_attention_heads;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    return build_moe_family(c, w, kNames);
  }
};

}  // namespace

const Architecture& qwen2_moe_architecture() {
  static const Qwen2Moe arch;
  return arch;
}

}  // namespace actcap
