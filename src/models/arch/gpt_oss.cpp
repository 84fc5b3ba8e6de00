// gpt-oss (transformers configuration_gpt_oss.py, modeling_gpt_oss.py; OpenAI's gpt-oss-20b and
// gpt-oss-120b): the Llama family's pre-norm layer with
//   - attention with q, k, v and o biases, a learned sink logit per head (`self_attn.sinks`,
//     attention()'s sinks) and a sliding window of sliding_window (128) on the layers layer_types
//     names (by default the even ones);
//   - RMSNorms that scale by their weight in float32 and round last, the weights kept float32 in a
//     float16 compute dtype (transformers' _keep_in_fp32_modules, which bfloat16 does not use);
//   - YaRN RoPE by default (factor 32 over 4096 positions, rope_theta 150000);
//   - a mixture of experts on every layer (`mlp`): a router with a bias (`mlp.router`, its logits
//     a hook point) whose num_experts_per_tok largest logits are softmaxed among themselves, and
//     experts with biases and a clamped SwiGLU, stacked as transformers holds them
//     (`mlp.experts.gate_up_proj` [E, hidden, 2 * inner] with gate and up interleaved,
//     `down_proj` [E, inner, hidden]) or MXFP4-packed as the released checkpoints store them
//     (`*_blocks` and `*_scales`, quantization_config.quant_method "mxfp4"; decoded per expert as
//     it runs, models/parts/mxfp4.h). transformers' decoded experts fix the limit at 7 and alpha
//     at 1.702; a config.json swiglu_limit other than 7 is refused.
#include <nlohmann/json.hpp>

#include "models/arch/moe_family.h"
#include "models/config_reader.h"
#include "models/parts/moe.h"

namespace actcap {

namespace {

using nlohmann::json;

struct GptOssParams : MoeParams {
  bool mxfp4 = false;  // quantization_config.quant_method is "mxfp4"
  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<GptOssParams>(*this);
  }
};

// What every gpt-oss model has, whatever its config.json: float32-scaled norms and windows as
// layer_types says.
void set_fixed_fields(GptOssParams& p) {
  p.norms_scale_in_float32 = p.norms_kept_float32 = true;
  p.windows = LlamaParams::Windows::kQwen;
  p.use_sliding_window = true;
}

// GptOssConfig's layer_types: the even layers slide.
std::vector<std::string> alternating_layer_types(int64_t layers) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < layers; ++i)
    out.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  return out;
}

// GptOssConfig's rope_parameters when config.json has none.
json default_rope() {
  return {{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
          {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
}

std::unique_ptr<Module> gpt_oss_moe(const ModelConfig& c, WeightSource layer, int64_t) {
  const auto& p = c.params<GptOssParams>();
  const int64_t H = c.hidden_size, I = p.moe_intermediate_size, E = p.num_experts;
  WeightSource m = layer.pp("mlp");
  WeightSource r = m.pp("router");
  auto router =
      std::make_unique<Linear>(r.path(), r.get("weight", {E, H}), r.get("bias", {E}, Init::kBias));
  WeightSource x = m.pp("experts");
  std::vector<ClampedExpertWeights> experts(static_cast<size_t>(E));
  if (x.has("gate_up_proj_blocks")) {
    if (!p.mxfp4)
      throw InputError(concat(x.path(), ": the experts are MXFP4 blocks but config.json has no ",
                              "quantization_config with \"quant_method\": \"mxfp4\"; transformers ",
                              "would not decode them (add it, as the released checkpoints have)"));
    if (H % 32 != 0 || I % 32 != 0)
      throw InputError(concat(x.path(), ": MXFP4 experts need hidden_size (", H,
                              ") and intermediate_size (", I, ") to be multiples of 32"));
    at::Tensor gu = x.get_packed("gate_up_proj_blocks", {E, 2 * I, H / 32, 16}, at::kByte);
    at::Tensor gu_scales = x.get_packed("gate_up_proj_scales", {E, 2 * I, H / 32}, at::kByte);
    at::Tensor down = x.get_packed("down_proj_blocks", {E, H, I / 32, 16}, at::kByte);
    at::Tensor down_scales = x.get_packed("down_proj_scales", {E, H, I / 32}, at::kByte);
    // Packed, decoded per expert as it runs (--weights-dtype keep), or decoded to float32 at load
    // (f32: four times bf16's memory, 7.5 times the packed bytes).
    const bool packed = x.keeps_stored();
    for (int64_t e = 0; e < E; ++e) {
      Mxfp4Matrix g{gu[e], gu_scales[e]}, d{down[e], down_scales[e]};
      if (packed)
        experts[e].gate_up_mxfp4 = g, experts[e].down_mxfp4 = d;
      else
        experts[e].gate_up = mxfp4_decode(g, at::kFloat),
        experts[e].down = mxfp4_decode(d, at::kFloat);
    }
  } else {
    // [in, out] per expert: nn.Linear's [out, in] is a transposed view (no copy).
    at::Tensor gu = x.get("gate_up_proj", {E, H, 2 * I});
    at::Tensor down = x.get("down_proj", {E, I, H});
    for (int64_t e = 0; e < E; ++e) experts[e].gate_up = gu[e].t(), experts[e].down = down[e].t();
  }
  at::Tensor gu_bias = x.get("gate_up_proj_bias", {E, 2 * I}, Init::kBias);
  at::Tensor down_bias = x.get("down_proj_bias", {E, H}, Init::kBias);
  for (int64_t e = 0; e < E; ++e)
    experts[e].gate_up_bias = gu_bias[e], experts[e].down_bias = down_bias[e];
  SparseMoeOptions o;
  o.top_k = p.top_k;
  o.top_k_before_softmax = true;
  return std::make_unique<SparseMoe>(m.path(), H, std::move(router), std::move(experts), o);
}

class GptOss : public LlamaFamilyArchitecture {
 public:
  std::string name() const override { return "gpt_oss"; }
  std::vector<std::string> model_types() const override { return {"gpt_oss"}; }
  std::vector<std::string> class_names() const override { return {"GptOssForCausalLM"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    const json& root = f.root();
    auto p = std::make_unique<GptOssParams>();
    if (const json* q = f.find({"quantization_config"})) {
      const json* method =
          q->is_object() ? ConfigReader(*q, f.origin()).find({"quant_method"}) : nullptr;
      if (!method || *method != "mxfp4")
        throw InputError(concat(f.origin(), ": quantization_config ", q->dump(),
                                " is not supported; gpt-oss runs unquantized or MXFP4 experts "
                                "(\"quant_method\": \"mxfp4\")"));
      p->mxfp4 = true;
    }
    // transformers' dequantized experts clamp at 7 whatever swiglu_limit says (its Triton MXFP4
    // kernels read the field): refuse a value on which the two would differ.
    if (f.has("swiglu_limit") && f.number({"swiglu_limit"}, 7.0) != 7.0)
      throw InputError(concat(f.origin(), ": swiglu_limit is ", root["swiglu_limit"].dump(),
                              "; only 7 (transformers' fixed limit) is supported"));
    // GptOssConfig's defaults: rope_parameters (YaRN) when the file has none, head_dim 64 (null:
    // hidden_size / num_attention_heads), 8 KV heads, rope_theta 150000, eps 1e-5.
    // (An empty rope_parameters is plain RoPE: only a missing or null one is YaRN; transformers
    // 5 reads a v4 rope_scaling only when it is non-empty.)
    json j = root;
    auto given = [&](const char* key, bool empty_counts) {
      auto it = j.find(key);
      return it != j.end() && !it->is_null() && (empty_counts || !it->empty());
    };
    if (!given("rope_parameters", true) && !given("rope_scaling", false))
      j["rope_parameters"] = default_rope();
    const ConfigReader g(j, f.origin());
    p->rms_norm_eps = 1e-5;
    LlamaDefaults d;
    d.max_position_embeddings = 131072;
    d.rope_theta = 150000.0;
    auto head_dim = root.find("head_dim");
    if (head_dim == root.end()) d.head_dim = 64;
    d.num_key_value_heads = 8, d.config_class = "GptOssConfig";
    // No BOS token (GptOssConfig's is None): it stands as the EOS id, which defaults to the
    // released checkpoints' <|return|> (200002).
    d.eos_token_id = 200002;
    parse_llama_family(g, d, c, *p);
    if (!g.has("bos_token_id")) c.bos_token_id = c.eos_token_id;
    p->attention_bias = g.boolean({"attention_bias"}, true);  // q, k, v and o
    p->qkv_bias = p->o_bias = p->attention_bias;
    set_fixed_fields(*p);
    // sliding_window: absent 128; null refused, as transformers' mask builder refuses it.
    if (!root.contains("sliding_window"))
      p->sliding_window = 128;
    else if (g.has("sliding_window"))
      p->sliding_window = g.positive({"sliding_window"}, std::nullopt);
    else
      throw InputError(concat(f.origin(), ": sliding_window is null; gpt-oss needs a window ",
                              "(transformers builds the sliding mask for every model)"));
    p->layer_types = parse_layer_types(g, c);
    if (p->layer_types.empty()) p->layer_types = alternating_layer_types(c.num_hidden_layers);
    parse_expert_counts(g, {"num_experts", "num_local_experts"}, 128, 4, *p);
    if (p->num_experts == 0)
      throw InputError(concat(f.origin(), ": num_local_experts is 0; gpt-oss needs experts"));
    p->moe_intermediate_size = p->intermediate_size;
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<GptOssParams>();
    write_llama_family(c, j);
    // Plain RoPE written as such: a null rope_scaling alone reads back as GptOssConfig's YaRN.
    if (p.rope.rope_type == "default")
      j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", p.rope.rope_theta}};
    j["attention_bias"] = p.attention_bias;
    j["sliding_window"] = p.sliding_window ? json(*p.sliding_window) : json();
    j["layer_types"] = p.layer_types;
    j["num_local_experts"] = p.num_experts;
    j["num_experts_per_tok"] = p.top_k;
    if (c.bos_token_id == c.eos_token_id) j.erase("bos_token_id");  // None, as parse() reads it
  }

  std::vector<std::string> presets() const override {
    return llama_family_presets({"gpt-oss-20b", "gpt-oss-120b"});
  }

  ModelConfig preset(const std::string& name) const override {
    const bool b20 = name == "gpt-oss-20b", b120 = name == "gpt-oss-120b";
    ModelConfig c = moe_preset(this->name(), b20 || b120 ? "tiny" : name, 4, 2, 0);
    auto gp = std::make_unique<GptOssParams>();
    static_cast<MoeParams&>(*gp) = c.params<MoeParams>();
    c.arch_params = std::move(gp);
    auto& p = c.params<GptOssParams>();
    p.rms_norm_eps = 1e-5;
    p.qkv_bias = p.o_bias = p.attention_bias = true;
    set_fixed_fields(p);
    p.sliding_window = name == "tiny" ? 4 : 128;
    p.rope.rope_type = "yarn", p.rope.beta_fast = 32.0, p.rope.beta_slow = 1.0;
    p.rope.truncate = false;
    if (b20 || b120) {
      // openai/gpt-oss-20b's and gpt-oss-120b's config.json: 20.9B and 116.8B parameters.
      c.vocab_size = 201088, c.hidden_size = 2880, p.intermediate_size = 2880;
      c.num_hidden_layers = b20 ? 24 : 36, c.num_attention_heads = 64, p.num_key_value_heads = 8;
      p.head_dim = 64, c.max_position_embeddings = 131072;
      p.num_experts = b20 ? 32 : 128, p.top_k = 4;
      p.rope.rope_theta = 150000.0, p.rope.factor = 32.0;
      p.rope.original_max_position_embeddings = 4096;
      c.bos_token_id = c.eos_token_id = 200002;
    } else {
      // YaRN over a quarter of the preset's context, so that it matters at test lengths.
      p.rope.factor = 4.0;
      p.rope.original_max_position_embeddings = c.max_position_embeddings / 4;
    }
    p.layer_types = alternating_layer_types(c.num_hidden_layers);
    p.moe_intermediate_size = p.intermediate_size;
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<MoeParams>();
    LlamaBuild b;
    b.attention_sinks = true;
    b.mlp = gpt_oss_moe;
    BuiltModel m = build_llama_family(c, w, b);
    m.mlp_width = SparseMoe::width_per_token(c.hidden_size, 2 * p.moe_intermediate_size,
                                             p.num_experts, p.top_k);
    return m;
  }
};

}  // namespace

const Architecture& gpt_oss_architecture() {
  static const GptOss arch;
  return arch;
}

}  // namespace actcap
