// Phi-3 (transformers configuration_phi3.py, modeling_phi3.py): the Llama block with one fused
// qkv_proj (rows [q; k; v], grouped-query sizes) and one fused gate_up_proj (rows [gate; up],
// SiLU on the gate), no biases, RMSNorm, RoPE on the first int(head_dim * partial_rotary_factor)
// features (default or longrope: short factors, the long ones once a forward's length exceeds
// original_max_position_embeddings, cos/sin times the attention factor; the legacy rope types
// `su` and `yarn` mean longrope here, as Phi3Config maps them), and sliding_window on every layer
// when set.
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/llama_family.h"
#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/block.h"
#include "models/parts/fused_mlp.h"
#include "models/parts/norm.h"
#include "models/parts/rope.h"

namespace actcap {

namespace {

struct Phi3Params : LlamaParams {
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim = 0;  // int(head_dim * partial_rotary_factor)
  int64_t original_max_position_embeddings = 4096;
  std::unique_ptr<ArchParams> clone() const override { return std::make_unique<Phi3Params>(*this); }
};

std::unique_ptr<RMSNorm> rms_norm(const Phi3Params& p, WeightSource w, const std::string& name,
                                  int64_t width) {
  WeightSource v = w.pp(name);
  return std::make_unique<RMSNorm>(v.path(), v.get("weight", {width}, Init::kGain), p.rms_norm_eps);
}

std::unique_ptr<Module> decoder_layer(const ModelConfig& c, WeightSource w,
                                      const std::shared_ptr<const Rope>& rope) {
  const auto& p = c.params<Phi3Params>();
  const int64_t H = c.hidden_size, I = p.intermediate_size, D = p.head_dim;
  const int64_t Q = c.num_attention_heads * D, KV = p.num_key_value_heads * D;
  const std::string name = w.path();
  auto in_norm = rms_norm(p, w, "input_layernorm", H);
  WeightSource a = w.pp("self_attn");
  AttentionParts parts;
  parts.qkv = linear_layer(a, "qkv_proj", H, Q + 2 * KV, false);
  parts.o = linear_layer(a, "o_proj", Q, H, false);
  AttentionShape shape;
  shape.hidden = H;
  shape.heads = c.num_attention_heads;
  shape.kv_heads = p.num_key_value_heads;
  shape.head_dim = D;
  shape.scale = 1.0 / std::sqrt(static_cast<double>(D));
  shape.window = p.sliding_window;
  shape.rope = rope;
  auto attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  auto post_norm = rms_norm(p, w, "post_attention_layernorm", H);
  WeightSource m = w.pp("mlp");
  auto gate_up = linear_layer(m, "gate_up_proj", H, 2 * I, false);
  auto act = std::make_unique<Activation>(m.path() + ".activation_fn", p.hidden_act, I);
  auto mlp = std::make_unique<FusedGatedMlp>(m.path(), H, I, std::move(gate_up), std::move(act),
                                             linear_layer(m, "down_proj", I, H, false));
  return std::make_unique<PreNormBlock>(name, H, std::move(in_norm), std::move(attn),
                                        std::move(post_norm), std::move(mlp));
}

// The rope dict (rope_scaling, 4.x; rope_parameters, 5.x) as Phi3Config leaves it.
const char* const kRopeKeys[] = {"rope_scaling", "rope_parameters"};

class Phi3 : public Architecture {
 public:
  std::string name() const override { return "phi3"; }
  std::vector<std::string> model_types() const override { return {"phi3"}; }
  std::vector<std::string> class_names() const override { return {"Phi3ForCausalLM"}; }

  // Every field has Phi3Config's default (Phi-3-mini's sizes) when absent.
  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<Phi3Params>();
    p->windows = LlamaParams::Windows::kEveryLayer;
    c.vocab_size = f.positive({"vocab_size"}, 32064);
    c.hidden_size = f.positive({"hidden_size"}, 3072);
    p->intermediate_size = f.positive({"intermediate_size"}, 8192);
    c.num_hidden_layers = f.positive({"num_hidden_layers"}, 32);
    c.num_attention_heads = f.positive({"num_attention_heads"}, 32);
    p->num_key_value_heads = f.positive({"num_key_value_heads"}, c.num_attention_heads);
    if (c.num_attention_heads % p->num_key_value_heads != 0)
      throw InputError(concat(f.origin(), ": num_key_value_heads=", p->num_key_value_heads,
                              " does not divide num_attention_heads=", c.num_attention_heads));
    if (f.has("head_dim")) {
      p->head_dim = f.positive({"head_dim"}, std::nullopt);
    } else {
      if (c.hidden_size % c.num_attention_heads != 0)
        throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                                " does not divide hidden_size=", c.hidden_size));
      p->head_dim = c.hidden_size / c.num_attention_heads;
    }
    p->hidden_act = f.string({"hidden_act"}, "silu");
    check_activation(p->hidden_act, "hidden_act", f.origin());
    c.max_position_embeddings = f.positive({"max_position_embeddings"}, 4096);
    p->original_max_position_embeddings = f.positive({"original_max_position_embeddings"}, 4096);
    p->rms_norm_eps = f.number({"rms_norm_eps"}, 1e-5);
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
    c.bos_token_id = f.token_id("bos_token_id", 1);
    c.eos_token_id = f.token_id("eos_token_id", 32000);
    if (f.has("sliding_window")) p->sliding_window = f.positive({"sliding_window"}, std::nullopt);

    // A copy of config.json as Phi3Config resolves it: the legacy `su` / `yarn` types are
    // longrope, and original_max_position_embeddings is 4096 when the file names none.
    json j = f.root();
    p->partial_rotary_factor = f.number({"partial_rotary_factor"}, 1.0);
    bool has_original = f.has("original_max_position_embeddings");
    for (const char* key : kRopeKeys) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_object()) continue;
      for (const char* t : {"type", "rope_type"}) {
        auto ty = it->find(t);
        if (ty != it->end() && ty->is_string() && (*ty == "su" || *ty == "yarn")) *ty = "longrope";
      }
      const ConfigReader s(*it, concat(f.origin(), " (", key, ")"));
      if (!it->empty() && s.has("partial_rotary_factor"))
        p->partial_rotary_factor = s.number({"partial_rotary_factor"}, 1.0);
      has_original = has_original || s.has("original_max_position_embeddings");
    }
    if (!has_original) j["original_max_position_embeddings"] = 4096;
    const double rd = std::floor(static_cast<double>(p->head_dim) * p->partial_rotary_factor);
    if (!std::isfinite(p->partial_rotary_factor) || !(p->partial_rotary_factor > 0) ||
        p->partial_rotary_factor > 1 || rd < 2 || static_cast<int64_t>(rd) % 2 != 0)
      throw InputError(concat(f.origin(), ": partial_rotary_factor=", p->partial_rotary_factor,
                              " with head_dim=", p->head_dim, " gives ", rd,
                              " rotary dims; it must give an even number of at least 2"));
    p->rotary_dim = static_cast<int64_t>(rd);
    const ConfigReader g(j, f.origin());
    p->rope = parse_rope(g, p->rotary_dim, c.max_position_embeddings);
    if (p->rope.rope_type != "default" && p->rope.rope_type != "longrope")
      throw InputError(concat(f.origin(), ": rope type '", p->rope.rope_type,
                              "' is not one Phi-3 runs; supported: default, longrope (su and yarn "
                              "are read as longrope, as Phi3Config does)"));
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<Phi3Params>();
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = p.intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = p.num_key_value_heads;
    if (p.head_dim * c.num_attention_heads != c.hidden_size) j["head_dim"] = p.head_dim;
    j["hidden_act"] = p.hidden_act;
    j["max_position_embeddings"] = c.max_position_embeddings;
    const auto& r = p.rope;
    j["original_max_position_embeddings"] = r.rope_type == "longrope"
                                                ? r.original_max_position_embeddings
                                                : p.original_max_position_embeddings;
    j["rms_norm_eps"] = p.rms_norm_eps;
    j["rope_theta"] = r.rope_theta;
    j["partial_rotary_factor"] = p.partial_rotary_factor;
    if (r.rope_type == "longrope") {
      // Phi-3's own layout: type, short_factor and long_factor; factor and attention_factor
      // only where they differ from what transformers derives.
      json s = {
          {"type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
      if (r.factor != static_cast<double>(c.max_position_embeddings) /
                          static_cast<double>(r.original_max_position_embeddings))
        s["factor"] = r.factor;
      if (r.attention_factor) s["attention_factor"] = *r.attention_factor;
      j["rope_scaling"] = s;
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["sliding_window"] = p.sliding_window ? json(*p.sliding_window) : json(nullptr);
    j["attention_dropout"] = 0.0;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["initializer_range"] = 0.02;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
    // Phi3Config's pad_token_id defaults to 32000 (the released config names it), which
    // transformers' embedding refuses as its padding_idx in a smaller vocabulary; actcap reads
    // none.
    j["pad_token_id"] = c.vocab_size > 32000 ? 32000 : c.eos_token_id;
  }

  std::vector<std::string> presets() const override {
    std::vector<std::string> out = llama_family_presets();
    out.push_back("phi-3-mini");
    return out;
  }

  ModelConfig preset(const std::string& name) const override {
    const bool real = name == "phi-3-mini";
    ModelConfig base = llama_family_preset("phi3", real ? "tiny" : name);
    auto p = std::make_unique<Phi3Params>();
    static_cast<LlamaParams&>(*p) = base.params<LlamaParams>();
    ModelConfig c;
    c.arch = c.model_type = "phi3";
    c.vocab_size = base.vocab_size, c.hidden_size = base.hidden_size;
    c.num_hidden_layers = base.num_hidden_layers, c.num_attention_heads = base.num_attention_heads;
    c.max_position_embeddings = base.max_position_embeddings;
    c.bos_token_id = 1, c.eos_token_id = 32000;
    p->windows = LlamaParams::Windows::kEveryLayer;
    p->rms_norm_eps = 1e-5;
    p->original_max_position_embeddings = c.max_position_embeddings;
    p->sliding_window = 8;  // shorter than the tests' sequences
    if (real) {             // microsoft/Phi-3-mini-4k-instruct's config.json
      c.vocab_size = 32064, c.hidden_size = 3072, p->intermediate_size = 8192;
      c.num_hidden_layers = 32, c.num_attention_heads = 32, p->num_key_value_heads = 32;
      p->head_dim = 96, c.max_position_embeddings = 4096;
      p->original_max_position_embeddings = 4096, p->sliding_window = 2047;
    }
    p->rotary_dim = p->head_dim;
    c.eos_token_id = real ? 32000 : 2;
    c.arch_params = std::move(p);
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<Phi3Params>();
    w.ignore_suffix(".rotary_emb.inv_freq");
    WeightSource model = w.pp("model");
    std::vector<std::string> tied;
    if (c.tie_word_embeddings) tied.push_back("lm_head.weight");
    at::Tensor embed = model.get("embed_tokens.weight", {c.vocab_size, c.hidden_size},
                                 Init::kMatrix, Layout::kAsStored, tied);
    BuiltModel m;
    m.stages.push_back(
        {StageKind::kEmbeddings, std::make_unique<Embedding>("model.embed_tokens", embed)});
    auto rope = std::make_shared<const Rope>(p.rope, p.rotary_dim, c.max_position_embeddings);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      m.stages.push_back({StageKind::kBlock, decoder_layer(c, model.pp("layers").pp(i), rope)});
    m.stages.push_back({StageKind::kFinalNorm, rms_norm(p, model, "norm", c.hidden_size)});
    m.stages.push_back(head_stage(c, w, embed));
    m.head_shares_embedding = c.tie_word_embeddings;
    m.mlp_width = p.intermediate_size;
    return m;
  }
};

}  // namespace

const Architecture& phi3_architecture() {
  static const Phi3 arch;
  return arch;
}

}  // namespace actcap
