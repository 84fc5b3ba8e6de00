// GPT-2 (transformers configuration_gpt2.py, modeling_gpt2.py): learned positions, pre-LayerNorm
// blocks, one fused c_attn projection, Conv1D weights stored [in, out].
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/architecture.h"
#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/block.h"
#include "models/parts/mlp.h"
#include "models/parts/norm.h"

namespace actcap {

namespace {

// GPT-2's own fields (the sizes are ModelConfig's: n_embd, n_layer, n_head and n_positions are
// read into hidden_size, num_hidden_layers, num_attention_heads and max_position_embeddings; those
// names are GPT2Config's attribute_map aliases, which transformers sets last: where config.json
// has both names, the alias wins).
struct Gpt2Params : ArchParams {
  std::optional<int64_t> n_inner;  // None -> 4 * n_embd
  std::string activation_function = "gelu_new";
  double layer_norm_epsilon = 1e-5;
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  bool reorder_and_upcast_attn = false;

  std::unique_ptr<ArchParams> clone() const override { return std::make_unique<Gpt2Params>(*this); }
};

int64_t inner(const ModelConfig& c) {
  const auto& p = c.params<Gpt2Params>();
  return p.n_inner ? *p.n_inner : 4 * c.hidden_size;
}

// The factor GPT2Attention applies to q k^T: 1 / sqrt(head_dim) with scale_attn_weights, then
// 1 / (layer_idx + 1) with scale_attn_by_inverse_layer_idx, computed in double as HF's
// _upcast_and_reordered_attn does. actcap's attention() is always that function's computation:
// float32 (the upcast) and one baddbmm with the scale folded into alpha (the reorder), so
// reorder_and_upcast_attn needs no path of its own. HF's default eager path divides the scores
// by the two factors one after the other instead; the two agree to float32 rounding.
double attention_scale(const ModelConfig& c, int64_t layer) {
  const auto& p = c.params<Gpt2Params>();
  double scale = 1.0;
  if (p.scale_attn_weights)
    scale /= std::sqrt(static_cast<double>(c.hidden_size / c.num_attention_heads));
  if (p.scale_attn_by_inverse_layer_idx) scale /= static_cast<double>(layer + 1);
  return scale;
}

// Conv1D: weight stored [in, out], used as nn.Linear's [out, in] view.
std::unique_ptr<Linear> conv1d(WeightSource w, const std::string& name, int64_t in, int64_t out) {
  WeightSource v = w.pp(name);
  return std::make_unique<Linear>(v.path(),
                                  v.get("weight", {in, out}, Init::kMatrix, Layout::kTransposed),
                                  v.get("bias", {out}, Init::kBias));
}

// The model's LayerNorm `name` under `w` (architecture.h's, with this config's width and eps).
std::unique_ptr<Module> layer_norm(const ModelConfig& c, WeightSource w, const std::string& name) {
  return actcap::layer_norm(w, name, c.hidden_size, c.params<Gpt2Params>().layer_norm_epsilon);
}

std::unique_ptr<Module> block(const ModelConfig& c, WeightSource w, int64_t layer) {
  const int64_t H = c.hidden_size, I = inner(c);
  const std::string name = w.path();
  AttentionShape shape;
  shape.hidden = H;
  shape.heads = shape.kv_heads = c.num_attention_heads;
  shape.head_dim = H / c.num_attention_heads;
  shape.scale = attention_scale(c, layer);
  auto ln_1 = layer_norm(c, w, "ln_1");
  AttentionParts attn;
  attn.qkv = conv1d(w.pp("attn"), "c_attn", H, 3 * H);
  attn.o = conv1d(w.pp("attn"), "c_proj", H, H);
  auto attention = std::make_unique<Attention>(name + ".attn", shape, std::move(attn));
  auto ln_2 = layer_norm(c, w, "ln_2");
  auto c_fc = conv1d(w.pp("mlp"), "c_fc", H, I);
  auto act = std::make_unique<Activation>(name + ".mlp.act",
                                          c.params<Gpt2Params>().activation_function, I);
  auto mlp = std::make_unique<Mlp>(name + ".mlp", H, std::move(c_fc), std::move(act),
                                   conv1d(w.pp("mlp"), "c_proj", I, H));
  return std::make_unique<PreNormBlock>(name, H, std::move(ln_1), std::move(attention),
                                        std::move(ln_2), std::move(mlp));
}

class Gpt2 : public Architecture {
 public:
  std::string name() const override { return "gpt2"; }
  std::vector<std::string> model_types() const override { return {"gpt2"}; }
  std::vector<std::string> class_names() const override { return {"GPT2LMHeadModel"}; }

  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<Gpt2Params>();
    c.vocab_size = f.positive({"vocab_size"}, std::nullopt);
    c.max_position_embeddings =
        f.positive({f.aliased("n_positions", "max_position_embeddings")}, 1024);
    c.hidden_size = f.positive({f.aliased("n_embd", "hidden_size")}, std::nullopt);
    c.num_hidden_layers = f.positive({f.aliased("n_layer", "num_hidden_layers")}, std::nullopt);
    c.num_attention_heads = f.positive({f.aliased("n_head", "num_attention_heads")}, std::nullopt);
    if (f.has("n_inner")) p->n_inner = f.positive({"n_inner"}, std::nullopt);
    p->activation_function = f.string({"activation_function"}, p->activation_function);
    check_activation(p->activation_function, "activation_function", f.origin());
    p->layer_norm_epsilon = f.number({"layer_norm_epsilon"}, p->layer_norm_epsilon);
    p->scale_attn_weights = f.boolean({"scale_attn_weights"}, p->scale_attn_weights);
    p->scale_attn_by_inverse_layer_idx = f.boolean({"scale_attn_by_inverse_layer_idx"}, false);
    p->reorder_and_upcast_attn = f.boolean({"reorder_and_upcast_attn"}, false);
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
    c.bos_token_id = f.token_id("bos_token_id", 50256);
    c.eos_token_id = f.token_id("eos_token_id", 50256);
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": n_head=", c.num_attention_heads,
                              " does not divide n_embd=", c.hidden_size));
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<Gpt2Params>();
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.max_position_embeddings;
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_hidden_layers;
    j["n_head"] = c.num_attention_heads;
    j["n_inner"] = p.n_inner ? nlohmann::json(*p.n_inner) : nlohmann::json(nullptr);
    j["activation_function"] = p.activation_function;
    j["layer_norm_epsilon"] = p.layer_norm_epsilon;
    j["resid_pdrop"] = 0.1;
    j["embd_pdrop"] = 0.1;
    j["attn_pdrop"] = 0.1;
    j["initializer_range"] = 0.02;
    j["scale_attn_weights"] = p.scale_attn_weights;
    j["scale_attn_by_inverse_layer_idx"] = p.scale_attn_by_inverse_layer_idx;
    j["reorder_and_upcast_attn"] = p.reorder_and_upcast_attn;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
  }

  std::vector<std::string> presets() const override { return {"tiny", "small", "gpt2-small"}; }

  ModelConfig preset(const std::string& preset) const override {
    ModelConfig c;
    c.arch = c.model_type = "gpt2";
    c.arch_params = std::make_unique<Gpt2Params>();
    c.tie_word_embeddings = true;
    c.bos_token_id = c.eos_token_id = 50256;
    if (preset == "tiny") {
      c.vocab_size = 512, c.max_position_embeddings = 128, c.hidden_size = 64;
      c.num_hidden_layers = 4, c.num_attention_heads = 4;
    } else if (preset == "small") {
      c.vocab_size = 2048, c.max_position_embeddings = 512, c.hidden_size = 256;
      c.num_hidden_layers = 6, c.num_attention_heads = 8;
    } else {  // gpt2-small: HF's GPT2Config defaults are GPT-2 124M
      c.vocab_size = 50257, c.max_position_embeddings = 1024, c.hidden_size = 768;
      c.num_hidden_layers = 12, c.num_attention_heads = 12;
    }
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    w.alias_prefix("transformer.", "");  // openai-community/gpt2 stores `h.0.attn...`
    w.ignore_suffix(".attn.bias");       // the causal-mask buffers
    w.ignore_suffix(".attn.masked_bias");
    WeightSource t = w.pp("transformer");
    at::Tensor wte;
    BuiltModel m;
    m.stages.push_back({StageKind::kEmbeddings, learned_position_embeddings(c, t, wte)});
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      m.stages.push_back({StageKind::kBlock, block(c, t.pp("h").pp(i), i)});
    m.stages.push_back({StageKind::kFinalNorm, layer_norm(c, t, "ln_f")});
    m.stages.push_back(head_stage(c, w, wte));
    m.head_shares_embedding = c.tie_word_embeddings;
    m.mlp_width = inner(c);
    return m;
  }
};

}  // namespace

const Architecture& gpt2_architecture() {
  static const Gpt2 arch;
  return arch;
}

}  // namespace actcap
