// GPT-NeoX / Pythia (transformers configuration_gpt_neox.py, modeling_gpt_neox.py): LayerNorm with
// bias, one fused query_key_value projection laid out per head ([heads, 3, head_dim] rows), RoPE
// on the first int(head_dim * rotary_pct) features of each head, an exact-GELU MLP, biases
// everywhere (attention_bias for query_key_value and dense), and the parallel residual
// (use_parallel_residual, the default): out = mlp(ln2(x)) + attn(ln1(x)) + x; without it the
// sequential pre-norm block. The head is `embed_out`, untied by default; checkpoints of newer
// transformers may store it as `lm_head.weight`, accepted too (the hook point stays `embed_out`).
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/architecture.h"
#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/block.h"
#include "models/parts/norm.h"
#include "models/parts/parallel_block.h"
#include "models/parts/rope.h"

namespace actcap {

namespace {

struct NeoXParams : ArchParams {
  int64_t intermediate_size = 24576;
  std::string hidden_act = "gelu";
  double layer_norm_eps = 1e-5;
  double rotary_pct = 0.25;
  int64_t rotary_dim = 0;  // int(head_dim * rotary_pct)
  RopeConfig rope;         // rope_theta is rotary_emb_base
  bool use_parallel_residual = true;
  bool attention_bias = true;  // query_key_value and dense biases

  int64_t max_positions(int64_t max_position_embeddings) const override {
    return rope_max_positions(rope, max_position_embeddings);
  }
  std::unique_ptr<ArchParams> clone() const override { return std::make_unique<NeoXParams>(*this); }
};

int64_t head_dim(const ModelConfig& c) { return c.hidden_size / c.num_attention_heads; }

// The model's LayerNorm `name` under `w` (architecture.h's, with this config's width and eps).
std::unique_ptr<Module> layer_norm(const ModelConfig& c, WeightSource w, const std::string& name) {
  return actcap::layer_norm(w, name, c.hidden_size, c.params<NeoXParams>().layer_norm_eps);
}

std::unique_ptr<Module> layer(const ModelConfig& c, WeightSource w,
                              const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<NeoXParams>();
  const int64_t H = c.hidden_size, I = p.intermediate_size, D = head_dim(c);
  const std::string name = w.path();
  auto ln1 = layer_norm(c, w, "input_layernorm");
  WeightSource a = w.pp("attention");
  AttentionParts parts;
  parts.qkv = linear_layer(a, "query_key_value", H, 3 * H, p.attention_bias);
  parts.o = linear_layer(a, "dense", H, H, p.attention_bias);
  AttentionShape shape;
  shape.hidden = H;
  shape.heads = shape.kv_heads = c.num_attention_heads;
  shape.head_dim = D;
  shape.scale = 1.0 / std::sqrt(static_cast<double>(D));
  shape.rope = rope;
  shape.qkv_layout = AttentionShape::QkvLayout::kPerHead;
  auto attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  auto ln2 = layer_norm(c, w, "post_attention_layernorm");
  auto mlp = biased_mlp(w.pp("mlp"), "dense_h_to_4h", "act", "dense_4h_to_h", p.hidden_act, H, I);
  if (p.use_parallel_residual)
    return std::make_unique<ParallelBlock>(name, H, std::move(ln1), std::move(attn), std::move(ln2),
                                           std::move(mlp));
  return std::make_unique<PreNormBlock>(name, H, std::move(ln1), std::move(attn), std::move(ln2),
                                        std::move(mlp));
}

class GptNeoX : public Architecture {
 public:
  std::string name() const override { return "gpt_neox"; }
  std::vector<std::string> model_types() const override { return {"gpt_neox"}; }
  std::vector<std::string> class_names() const override { return {"GPTNeoXForCausalLM"}; }

  // Every field has GPTNeoXConfig's default (EleutherAI/gpt-neox-20b's sizes) when absent.
  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<NeoXParams>();
    c.vocab_size = f.positive({"vocab_size"}, 50432);
    c.hidden_size = f.positive({"hidden_size"}, 6144);
    c.num_hidden_layers = f.positive({"num_hidden_layers"}, 44);
    c.num_attention_heads = f.positive({"num_attention_heads"}, 64);
    p->intermediate_size = f.positive({"intermediate_size"}, 24576);
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size));
    p->hidden_act = f.string({"hidden_act"}, p->hidden_act);
    check_activation(p->hidden_act, "hidden_act", f.origin());
    c.max_position_embeddings = f.positive({"max_position_embeddings"}, 2048);
    p->layer_norm_eps = f.number({"layer_norm_eps"}, p->layer_norm_eps);
    p->use_parallel_residual = f.boolean({"use_parallel_residual"}, true);
    p->attention_bias = f.boolean({"attention_bias"}, true);
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
    c.bos_token_id = f.token_id("bos_token_id", 0);
    c.eos_token_id = f.token_id("eos_token_id", 2);

    // partial_rotary_factor in the rope dict (5.x), else rotary_pct (4.x), else 0.25.
    p->rotary_pct = partial_rotary_fraction(f, "rotary_pct", 0.25);
    const int64_t D = c.hidden_size / c.num_attention_heads;
    const double rd = std::floor(static_cast<double>(D) * p->rotary_pct);
    if (!std::isfinite(p->rotary_pct) || !(p->rotary_pct > 0) || p->rotary_pct > 1 || rd < 2 ||
        static_cast<int64_t>(rd) % 2 != 0)
      throw InputError(concat(f.origin(), ": rotary_pct=", p->rotary_pct, " with head_dim=", D,
                              " gives ", rd,
                              " rotary dims; it must give an even number of at least 2"));
    p->rotary_dim = static_cast<int64_t>(rd);
    // The base is rotary_emb_base (4.x; GPTNeoXConfig maps it to rope_theta), or rope_theta
    // in the rope dict (5.x), which wins.
    json j = f.root();
    if (j.contains("rotary_emb_base") && !j["rotary_emb_base"].is_null())
      j["rope_theta"] = j["rotary_emb_base"];
    const ConfigReader g(j, f.origin());
    p->rope = parse_rope(g, p->rotary_dim, c.max_position_embeddings);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<NeoXParams>();
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["intermediate_size"] = p.intermediate_size;
    j["hidden_act"] = p.hidden_act;
    j["rotary_pct"] = p.rotary_pct;
    j["rotary_emb_base"] = p.rope.rope_theta;
    j["rope_scaling"] = rope_to_json(p.rope);
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["layer_norm_eps"] = p.layer_norm_eps;
    j["use_parallel_residual"] = p.use_parallel_residual;
    j["attention_bias"] = p.attention_bias;
    j["initializer_range"] = 0.02;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
  }

  std::vector<std::string> presets() const override { return {"tiny", "small", "pythia-160m"}; }

  ModelConfig preset(const std::string& name) const override {
    ModelConfig c;
    c.arch = c.model_type = "gpt_neox";
    auto p = std::make_unique<NeoXParams>();
    if (name == "tiny") {  // head_dim 16: 4 rotary dims, 12 passed through
      c.vocab_size = 512, c.hidden_size = 64, p->intermediate_size = 256, c.num_hidden_layers = 4;
      c.num_attention_heads = 4, c.max_position_embeddings = 256;
    } else if (name == "small") {
      c.vocab_size = 2048, c.hidden_size = 256, p->intermediate_size = 1024;
      c.num_hidden_layers = 6, c.num_attention_heads = 8, c.max_position_embeddings = 1024;
    } else {  // pythia-160m: EleutherAI/pythia-160m's config.json
      c.vocab_size = 50304, c.hidden_size = 768, p->intermediate_size = 3072;
      c.num_hidden_layers = 12, c.num_attention_heads = 12, c.max_position_embeddings = 2048;
    }
    p->rotary_dim = static_cast<int64_t>(
        std::floor(static_cast<double>(c.hidden_size / c.num_attention_heads) * p->rotary_pct));
    c.bos_token_id = 0;
    c.eos_token_id = name == "pythia-160m" ? 0 : 2;
    c.arch_params = std::move(p);
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<NeoXParams>();
    const int64_t V = c.vocab_size, H = c.hidden_size;
    w.ignore_suffix(".attention.bias");  // the causal-mask buffers older checkpoints saved
    w.ignore_suffix(".attention.masked_bias");
    w.ignore_suffix(".rotary_emb.inv_freq");
    WeightSource t = w.pp("gpt_neox");
    std::vector<std::string> tied;
    if (c.tie_word_embeddings) tied = {"embed_out.weight", "lm_head.weight"};
    at::Tensor embed = t.get("embed_in.weight", {V, H}, Init::kMatrix, Layout::kAsStored, tied);
    BuiltModel m;
    m.stages.push_back(
        {StageKind::kEmbeddings, std::make_unique<Embedding>("gpt_neox.embed_in", embed)});
    auto rope = std::make_shared<const Rope>(p.rope, p.rotary_dim, c.max_position_embeddings);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      m.stages.push_back({StageKind::kBlock, layer(c, t.pp("layers").pp(i), rope)});
    m.stages.push_back({StageKind::kFinalNorm, layer_norm(c, t, "final_layer_norm")});
    at::Tensor head = c.tie_word_embeddings ? embed
                                            : w.get("embed_out.weight", {V, H}, Init::kMatrix,
                                                    Layout::kAsStored, {"lm_head.weight"});
    m.stages.push_back(
        {StageKind::kHead, std::make_unique<Linear>("embed_out", head, at::Tensor())});
    m.head_shares_embedding = c.tie_word_embeddings;
    m.mlp_width = p.intermediate_size;
    return m;
  }
};

}  // namespace

const Architecture& gpt_neox_architecture() {
  static const GptNeoX arch;
  return arch;
}

}  // namespace actcap
