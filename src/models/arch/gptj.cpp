// GPT-J (transformers configuration_gptj.py, modeling_gptj.py): one LayerNorm per block feeding
// both sublayers, out = attn(ln_1(x)) + mlp(ln_1(x)) + x; separate q/k/v projections and out_proj
// without biases; RoPE on the first rotary_dim features of each head with GPT-J's interleaved pairs
// (rotate_every_two) and base 10000 (no rope scaling); q and k in float32 for the scores; a
// gelu_new MLP with biases (fc_in, fc_out); no position embeddings; an lm_head with a bias, untied
// by default.
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

// GPT-J's own fields (n_embd, n_layer, n_head and n_positions are read into hidden_size,
// num_hidden_layers, num_attention_heads and max_position_embeddings: GPTJConfig's attribute_map
// aliases, which win where config.json has both names, as in transformers).
struct GptjParams : ArchParams {
  std::optional<int64_t> n_inner;  // None -> 4 * n_embd
  int64_t rotary_dim = 64;         // the rotated features of each head
  std::string activation_function = "gelu_new";
  double layer_norm_epsilon = 1e-5;

  std::unique_ptr<ArchParams> clone() const override { return std::make_unique<GptjParams>(*this); }
};

int64_t inner(const ModelConfig& c) {
  const auto& p = c.params<GptjParams>();
  return p.n_inner ? *p.n_inner : 4 * c.hidden_size;
}

// The model's LayerNorm `name` under `w` (architecture.h's, with this config's width and eps).
std::unique_ptr<Module> layer_norm(const ModelConfig& c, WeightSource w, const std::string& name) {
  return actcap::layer_norm(w, name, c.hidden_size, c.params<GptjParams>().layer_norm_epsilon);
}

std::unique_ptr<Module> block(const ModelConfig& c, WeightSource w,
                              const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<GptjParams>();
  const int64_t H = c.hidden_size, I = inner(c), D = H / c.num_attention_heads;
  const std::string name = w.path();
  auto ln_1 = layer_norm(c, w, "ln_1");
  WeightSource a = w.pp("attn");
  AttentionParts parts;  // the forward's order: q_proj, k_proj, v_proj, out_proj
  parts.q = linear_layer(a, "q_proj", H, H, false);
  parts.k = linear_layer(a, "k_proj", H, H, false);
  parts.v = linear_layer(a, "v_proj", H, H, false);
  parts.o = linear_layer(a, "out_proj", H, H, false);
  AttentionShape shape;
  shape.hidden = H;
  shape.heads = shape.kv_heads = c.num_attention_heads;
  shape.head_dim = D;
  // HF divides the scores by sqrt(head_dim); actcap multiplies by its inverse (the same bits when
  // head_dim is a power of 4: 64, 256 and every released GPT-J size).
  shape.scale = 1.0 / std::sqrt(static_cast<double>(D));
  shape.rope = rope;
  shape.scores_in_float32 = true;  // _attn: query.to(float32), key.to(float32)
  auto attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  auto mlp = biased_mlp(w.pp("mlp"), "fc_in", "act", "fc_out", p.activation_function, H, I);
  return std::make_unique<ParallelBlock>(name, H, std::move(ln_1), std::move(attn), nullptr,
                                         std::move(mlp));
}

class Gptj : public Architecture {
 public:
  std::string name() const override { return "gptj"; }
  std::vector<std::string> model_types() const override { return {"gptj"}; }
  std::vector<std::string> class_names() const override { return {"GPTJForCausalLM"}; }

  // Every field has GPTJConfig's default (EleutherAI/gpt-j-6B's sizes) when absent.
  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<GptjParams>();
    c.vocab_size = f.positive({"vocab_size"}, 50400);
    c.max_position_embeddings =
        f.positive({f.aliased("n_positions", "max_position_embeddings")}, 2048);
    c.hidden_size = f.positive({f.aliased("n_embd", "hidden_size")}, 4096);
    c.num_hidden_layers = f.positive({f.aliased("n_layer", "num_hidden_layers")}, 28);
    c.num_attention_heads = f.positive({f.aliased("n_head", "num_attention_heads")}, 16);
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": n_head=", c.num_attention_heads,
                              " does not divide n_embd=", c.hidden_size));
    const int64_t D = c.hidden_size / c.num_attention_heads;
    if (f.has("n_inner")) p->n_inner = f.positive({"n_inner"}, std::nullopt);
    p->activation_function = f.string({"activation_function"}, p->activation_function);
    check_activation(p->activation_function, "activation_function", f.origin());
    p->layer_norm_epsilon = f.number({"layer_norm_epsilon"}, p->layer_norm_epsilon);
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
    c.bos_token_id = f.token_id("bos_token_id", 50256);
    c.eos_token_id = f.token_id("eos_token_id", 50256);

    // rotary_dim null: transformers rotates n_embd features, which fits a head only when there is
    // one head (its tables are n_embd wide, the head head_dim).
    const auto& root = f.root();
    const auto it = root.find("rotary_dim");
    if (it != root.end() && it->is_null()) {
      if (c.num_attention_heads != 1)
        throw InputError(
            concat(f.origin(), ": rotary_dim is null with n_head=", c.num_attention_heads,
                   ": transformers' GPT-J then rotates n_embd features of each head of ", D,
                   "; give rotary_dim (an even number up to ", D, ")"));
      p->rotary_dim = D;
    } else {
      p->rotary_dim = f.integer({"rotary_dim"}, 64);
    }
    if (p->rotary_dim < 2 || p->rotary_dim % 2 != 0 || p->rotary_dim > D)
      throw InputError(concat(f.origin(), ": rotary_dim=", p->rotary_dim, " with head_dim=", D,
                              " (n_embd / n_head): it must be even, at least 2 and at most ", D));
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<GptjParams>();
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.max_position_embeddings;
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_hidden_layers;
    j["n_head"] = c.num_attention_heads;
    j["rotary_dim"] = p.rotary_dim;
    j["n_inner"] = p.n_inner ? nlohmann::json(*p.n_inner) : nlohmann::json(nullptr);
    j["activation_function"] = p.activation_function;
    j["layer_norm_epsilon"] = p.layer_norm_epsilon;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["initializer_range"] = 0.02;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
  }

  std::vector<std::string> presets() const override { return {"tiny", "small", "gpt-j-6b"}; }

  ModelConfig preset(const std::string& name) const override {
    ModelConfig c;
    c.arch = c.model_type = "gptj";
    auto p = std::make_unique<GptjParams>();
    if (name == "tiny") {  // head_dim 16: 8 rotary features, 8 passed through
      c.vocab_size = 512, c.max_position_embeddings = 256, c.hidden_size = 64;
      c.num_hidden_layers = 4, c.num_attention_heads = 4, p->rotary_dim = 8;
    } else if (name == "small") {  // head_dim 64: GPT-J 6B's rotary_dim and head_dim ratio
      c.vocab_size = 2048, c.max_position_embeddings = 1024, c.hidden_size = 256;
      c.num_hidden_layers = 6, c.num_attention_heads = 4, p->rotary_dim = 16;
    } else {  // gpt-j-6b: EleutherAI/gpt-j-6B's config.json (GPTJConfig's defaults)
      c.vocab_size = 50400, c.max_position_embeddings = 2048, c.hidden_size = 4096;
      c.num_hidden_layers = 28, c.num_attention_heads = 16, p->rotary_dim = 64;
    }
    c.bos_token_id = c.eos_token_id = 50256;
    c.arch_params = std::move(p);
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<GptjParams>();
    const int64_t V = c.vocab_size, H = c.hidden_size;
    w.ignore_suffix(".attn.bias");  // the causal-mask buffers older checkpoints saved
    w.ignore_suffix(".attn.masked_bias");
    WeightSource t = w.pp("transformer");
    std::vector<std::string> tied;
    if (c.tie_word_embeddings) tied.push_back("lm_head.weight");
    at::Tensor wte = t.get("wte.weight", {V, H}, Init::kMatrix, Layout::kAsStored, tied);
    BuiltModel m;
    m.stages.push_back(
        {StageKind::kEmbeddings, std::make_unique<Embedding>("transformer.wte", wte)});
    auto rope = std::make_shared<const Rope>(RopeConfig{}, p.rotary_dim, c.max_position_embeddings,
                                             false, RopePairs::kInterleaved);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      m.stages.push_back({StageKind::kBlock, block(c, t.pp("h").pp(i), rope)});
    m.stages.push_back({StageKind::kFinalNorm, layer_norm(c, t, "ln_f")});
    // lm_head has a bias whether or not its weight is the embedding matrix.
    at::Tensor head = c.tie_word_embeddings ? wte : w.get("lm_head.weight", {V, H});
    m.stages.push_back(
        {StageKind::kHead,
         std::make_unique<Linear>("lm_head", head, w.get("lm_head.bias", {V}, Init::kBias))});
    m.head_shares_embedding = c.tie_word_embeddings;
    m.mlp_width = inner(c);
    return m;
  }
};

}  // namespace

const Architecture& gptj_architecture() {
  static const Gptj arch;
  return arch;
}

}  // namespace actcap
