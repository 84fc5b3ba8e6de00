// OLMoE (transformers configuration_olmoe.py, modeling_olmoe.py): the Llama family's pre-norm
// layer whose attention normalises the whole q and k projections (RMSNorm over
// num_attention_heads * head_dim and num_key_value_heads * head_dim, hook points of that width,
// before the head split and RoPE, as OLMo 2), and a sparse mixture of experts in place of every
// MLP: a router over num_experts experts of intermediate_size, the num_experts_per_tok most
// probable per token, weights renormalised only with norm_topk_prob and rounded to the compute
// dtype (as Qwen3-MoE). Weights under `mlp`: `gate` (the router) and
// `experts.E.{gate,up,down}_proj`. attention_bias gives q, k, v and o biases. clip_qkv clamps q,
// k and v after the projections and q/k norms, before RoPE (the points stay unclamped).
#include <nlohmann/json.hpp>

#include "models/arch/moe_family.h"
#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/block.h"

namespace actcap {

namespace {

const MoeNames kNames{"mlp", "gate_proj", "up_proj", "down_proj",
                      /*weights_in_compute_dtype=*/true};

std::unique_ptr<Module> olmoe_layer(const ModelConfig& c, WeightSource w, int64_t layer,
                                    const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<MoeParams>();
  const int64_t H = c.hidden_size, D = p.head_dim;
  WeightSource a = w.pp("self_attn");
  AttentionParts parts = llama_attention_projections(c, a);
  parts.q_norm = llama_rms_norm(p, a, "q_norm", c.num_attention_heads * D);
  parts.k_norm = llama_rms_norm(p, a, "k_norm", p.num_key_value_heads * D);
  AttentionShape shape = llama_attention_shape(c, layer, rope);
  shape.qk_norm_whole = true;
  auto in_norm = llama_rms_norm(p, w, "input_layernorm", H);
  auto attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  auto post_norm = llama_rms_norm(p, w, "post_attention_layernorm", H);
  return std::make_unique<PreNormBlock>(w.path(), H, std::move(in_norm), std::move(attn),
                                        std::move(post_norm), build_sparse_moe(c, w, kNames));
}

class Olmoe : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "olmoe"; }
  std::vector<std::string> model_types() const override { return {"olmoe"}; }
  std::vector<std::string> class_names() const override { return {"OlmoeForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<MoeParams>();
    p->rms_norm_eps = 1e-5;  // OlmoeConfig's default
    LlamaDefaults d;
    d.max_position_embeddings = 4096;
    d.eos_token_id = 50279;
    parse_llama_family(f, d, c, *p);
    // transformers sizes q_norm by hidden_size and k_norm by hidden_size / heads * kv_heads: a
    // head_dim apart from hidden_size / num_attention_heads cannot load there.
    if (p->head_dim * c.num_attention_heads != c.hidden_size)
      throw InputError(concat(f.origin(), ": head_dim=", p->head_dim, " times num_attention_heads=",
                              c.num_attention_heads, " is not hidden_size=", c.hidden_size,
                              "; OLMoE normalises q over hidden_size"));
    // No BOS token (OlmoeConfig's bos_token_id is None): it stands as the EOS id, as for OLMo 2.
    if (!f.has("bos_token_id")) c.bos_token_id = c.eos_token_id;
    p->attention_bias = f.boolean({"attention_bias"}, false);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    p->clip_qkv = parse_clip_qkv(f);
    parse_expert_counts(f, {"num_local_experts", "num_experts"}, 64, 8, *p);
    if (p->num_experts == 0)
      throw InputError(concat(f.origin(), ": num_experts is 0; OLMoE needs experts"));
    p->moe_intermediate_size = p->intermediate_size;
    p->norm_topk_prob = f.boolean({"norm_topk_prob"}, false);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<MoeParams>();
    write_llama_family(c, j);
    j.erase("head_dim");  // OlmoeConfig has none: hidden_size / num_attention_heads
    j["attention_bias"] = p.attention_bias;
    j["clip_qkv"] = clip_qkv_json(p);
    j["num_experts"] = p.num_experts;
    j["num_experts_per_tok"] = p.top_k;
    j["norm_topk_prob"] = p.norm_topk_prob;
    if (c.bos_token_id == c.eos_token_id) j.erase("bos_token_id");  // None, as parse() reads it
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"olmoe-1b-7b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "olmoe-1b-7b";
    ModelConfig c = moe_preset(this->name(), real ? "tiny" : name, 8, 2, 0);
    auto& p = c.params<MoeParams>();
    p.rms_norm_eps = 1e-5;
    p.norm_topk_prob = false;  // OlmoeConfig's default
    if (real) {
      // allenai/OLMoE-1B-7B-0924's sizes: 6.9B parameters, 1.3B used per token.
      c.vocab_size = 50304, c.hidden_size = 2048, p.intermediate_size = 1024;
      c.num_hidden_layers = 16, c.num_attention_heads = 16, p.num_key_value_heads = 16;
      p.head_dim = 128, c.max_position_embeddings = 4096;
      p.num_experts = 64, p.top_k = 8;
      c.bos_token_id = c.eos_token_id = 50279;
    }
    p.moe_intermediate_size = p.intermediate_size;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    LlamaBuild b;
    b.layer = olmoe_layer;
    return build_moe_family(c, w, kNames, std::move(b));
  }
};

}  // namespace

const Architecture& olmoe_architecture() {
  static const Olmoe arch;
  return arch;
}

}  // namespace actcap
