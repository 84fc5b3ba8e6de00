// Phi-1, Phi-1.5 and Phi-2 (transformers configuration_phi.py, modeling_phi.py): one LayerNorm per
// block feeding both sublayers, out = attn(ln(x)) + mlp(ln(x)) + x (GPT-J's block); q_proj,
// k_proj, v_proj and dense with biases, grouped-query heads when num_key_value_heads is less;
// RoPE (every type transformers' ROPE_INIT_FUNCTIONS has) on the first
// int(head_dim * partial_rotary_factor) features of each head, halves paired as Llama's; a
// gelu_new MLP with biases (fc1, fc2); final_layernorm; an lm_head with a bias, untied by default.
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/architecture.h"
#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/norm.h"
#include "models/parts/parallel_block.h"
#include "models/parts/rope.h"

namespace actcap {

namespace {

struct PhiParams : ArchParams {
  int64_t intermediate_size = 8192;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 64;
  std::string hidden_act = "gelu_new";
  double layer_norm_eps = 1e-5;
  double partial_rotary_factor = 0.5;
  int64_t rotary_dim = 32;  // int(head_dim * partial_rotary_factor)
  RopeConfig rope;

  int64_t max_positions(int64_t max_position_embeddings) const override {
    return rope_max_positions(rope, max_position_embeddings);
  }
  std::unique_ptr<ArchParams> clone() const override { return std::make_unique<PhiParams>(*this); }
};

// The model's LayerNorm `name` under `w` (architecture.h's, with this config's width and eps).
std::unique_ptr<Module> layer_norm(const ModelConfig& c, WeightSource w, const std::string& name) {
  return actcap::layer_norm(w, name, c.hidden_size, c.params<PhiParams>().layer_norm_eps);
}

std::unique_ptr<Module> decoder_layer(const ModelConfig& c, WeightSource w,
                                      const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<PhiParams>();
  const int64_t H = c.hidden_size, I = p.intermediate_size, D = p.head_dim;
  const int64_t Q = c.num_attention_heads * D, KV = p.num_key_value_heads * D;
  const std::string name = w.path();
  auto norm = layer_norm(c, w, "input_layernorm");
  WeightSource a = w.pp("self_attn");
  AttentionParts parts;
  parts.q = linear_layer(a, "q_proj", H, Q, true);
  parts.k = linear_layer(a, "k_proj", H, KV, true);
  parts.v = linear_layer(a, "v_proj", H, KV, true);
  parts.o = linear_layer(a, "dense", Q, H, true);
  AttentionShape shape;
  shape.hidden = H;
  shape.heads = c.num_attention_heads;
  shape.kv_heads = p.num_key_value_heads;
  shape.head_dim = D;
  shape.scale = 1.0 / std::sqrt(static_cast<double>(D));
  shape.rope = rope;
  auto attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  auto mlp = biased_mlp(w.pp("mlp"), "fc1", "activation_fn", "fc2", p.hidden_act, H, I);
  return std::make_unique<ParallelBlock>(name, H, std::move(norm), std::move(attn), nullptr,
                                         std::move(mlp));
}

class Phi : public Architecture {
 public:
  std::string name() const override { return "phi"; }
  std::vector<std::string> model_types() const override { return {"phi"}; }
  std::vector<std::string> class_names() const override { return {"PhiForCausalLM"}; }

  // Every field has PhiConfig's default (Phi-1.5's sizes) when absent.
  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<PhiParams>();
    c.vocab_size = f.positive({"vocab_size"}, 51200);
    c.hidden_size = f.positive({"hidden_size"}, 2048);
    p->intermediate_size = f.positive({"intermediate_size"}, 8192);
    c.num_hidden_layers = f.positive({"num_hidden_layers"}, 24);
    c.num_attention_heads = f.positive({"num_attention_heads"}, 32);
    p->num_key_value_heads = f.positive({"num_key_value_heads"}, c.num_attention_heads);
    if (c.num_attention_heads % p->num_key_value_heads != 0)
      throw InputError(concat(f.origin(), ": num_key_value_heads=", p->num_key_value_heads,
                              " does not divide num_attention_heads=", c.num_attention_heads));
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size));
    // PhiAttention's getattr(config, "head_dim", hidden_size // num_attention_heads).
    p->head_dim = f.positive({"head_dim"}, c.hidden_size / c.num_attention_heads);
    if (f.boolean({"qk_layernorm"}, false))
      throw InputError(concat(f.origin(),
                              ": qk_layernorm is true: LayerNorms on each query and key head are "
                              "not supported (no released Phi checkpoint has them)"));
    p->hidden_act = f.string({"hidden_act"}, p->hidden_act);
    check_activation(p->hidden_act, "hidden_act", f.origin());
    c.max_position_embeddings = f.positive({"max_position_embeddings"}, 2048);
    p->layer_norm_eps = f.number({"layer_norm_eps"}, p->layer_norm_eps);
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
    c.bos_token_id = f.token_id("bos_token_id", 1);
    c.eos_token_id = f.token_id("eos_token_id", 2);

    // In the rope dict (transformers 5 moves it there), else at the top level (Phi-2's
    // config.json), else 0.5 (PhiConfig's default).
    p->partial_rotary_factor = partial_rotary_fraction(f, "partial_rotary_factor", 0.5);
    const double rd = std::floor(static_cast<double>(p->head_dim) * p->partial_rotary_factor);
    if (!std::isfinite(p->partial_rotary_factor) || !(p->partial_rotary_factor > 0) ||
        p->partial_rotary_factor > 1 || rd < 2 || static_cast<int64_t>(rd) % 2 != 0)
      throw InputError(concat(f.origin(), ": partial_rotary_factor=", p->partial_rotary_factor,
                              " with head_dim=", p->head_dim, " gives ", rd,
                              " rotary dims; it must give an even number of at least 2"));
    p->rotary_dim = static_cast<int64_t>(rd);
    p->rope = parse_rope(f, p->rotary_dim, c.max_position_embeddings);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<PhiParams>();
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = p.intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = p.num_key_value_heads;
    if (p.head_dim * c.num_attention_heads != c.hidden_size) j["head_dim"] = p.head_dim;
    j["hidden_act"] = p.hidden_act;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["layer_norm_eps"] = p.layer_norm_eps;
    j["rope_theta"] = p.rope.rope_theta;
    j["rope_scaling"] = rope_to_json(p.rope);
    j["partial_rotary_factor"] = p.partial_rotary_factor;
    j["qk_layernorm"] = false;
    j["attention_dropout"] = 0.0;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["initializer_range"] = 0.02;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
  }

  std::vector<std::string> presets() const override { return {"tiny", "small", "phi-2"}; }

  ModelConfig preset(const std::string& name) const override {
    ModelConfig c;
    c.arch = c.model_type = "phi";
    auto p = std::make_unique<PhiParams>();
    if (name == "tiny") {  // head_dim 16, 8 rotary features; 2 kv heads for 4
      c.vocab_size = 512, c.hidden_size = 64, p->intermediate_size = 256;
      c.num_hidden_layers = 4, c.num_attention_heads = 4, p->num_key_value_heads = 2;
      c.max_position_embeddings = 256;
    } else if (name == "small") {
      c.vocab_size = 2048, c.hidden_size = 256, p->intermediate_size = 1024;
      c.num_hidden_layers = 6, c.num_attention_heads = 8, p->num_key_value_heads = 8;
      c.max_position_embeddings = 1024;
    } else {  // phi-2: microsoft/phi-2's sizes (partial_rotary_factor 0.4: 32 of 80 features)
      c.vocab_size = 51200, c.hidden_size = 2560, p->intermediate_size = 10240;
      c.num_hidden_layers = 32, c.num_attention_heads = 32, p->num_key_value_heads = 32;
      c.max_position_embeddings = 2048, p->partial_rotary_factor = 0.4;
    }
    p->head_dim = c.hidden_size / c.num_attention_heads;
    p->rotary_dim = static_cast<int64_t>(
        std::floor(static_cast<double>(p->head_dim) * p->partial_rotary_factor));
    c.bos_token_id = c.eos_token_id = 50256;
    c.arch_params = std::move(p);
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<PhiParams>();
    const int64_t V = c.vocab_size, H = c.hidden_size;
    w.ignore_suffix(".rotary_emb.inv_freq");
    WeightSource model = w.pp("model");
    std::vector<std::string> tied;
    if (c.tie_word_embeddings) tied.push_back("lm_head.weight");
    at::Tensor embed =
        model.get("embed_tokens.weight", {V, H}, Init::kMatrix, Layout::kAsStored, tied);
    BuiltModel m;
    m.stages.push_back(
        {StageKind::kEmbeddings, std::make_unique<Embedding>("model.embed_tokens", embed)});
    auto rope = std::make_shared<const Rope>(p.rope, p.rotary_dim, c.max_position_embeddings);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      m.stages.push_back({StageKind::kBlock, decoder_layer(c, model.pp("layers").pp(i), rope)});
    m.stages.push_back({StageKind::kFinalNorm, layer_norm(c, model, "final_layernorm")});
    // lm_head has a bias whether or not its weight is the embedding matrix.
    at::Tensor head = c.tie_word_embeddings ? embed : w.get("lm_head.weight", {V, H});
    m.stages.push_back(
        {StageKind::kHead,
         std::make_unique<Linear>("lm_head", head, w.get("lm_head.bias", {V}, Init::kBias))});
    m.head_shares_embedding = c.tie_word_embeddings;
    m.mlp_width = p.intermediate_size;
    const int64_t q = c.num_attention_heads * p.head_dim, kv = p.num_key_value_heads * p.head_dim;
    m.attention_width = 2 * q + 2 * kv;
    return m;
  }
};

}  // namespace

const Architecture& phi_architecture() {
  static const Phi arch;
  return arch;
}

}  // namespace actcap
