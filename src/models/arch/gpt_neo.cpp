// GPT-Neo (transformers configuration_gpt_neo.py, modeling_gpt_neo.py: EleutherAI's GPT-Neo
// 125M / 1.3B / 2.7B and the TinyStories models): learned positions added to the token embeddings
// (GPT-2's), pre-LayerNorm blocks as GPT-2's, separate q/k/v projections without biases and an
// out_proj with one, under an `attn.attention` module; NO scaling of q k^T; q and k in float32 for
// the scores; per layer either global (causal) or local attention (causal within window_size keys)
// as attention_types says; an MLP of nn.Linear c_fc / c_proj with biases; lm_head tied to wte by
// default, without a bias.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "models/arch/architecture.h"
#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/block.h"

namespace actcap {

namespace {

// GPT-Neo's own fields (num_layers, num_heads are read into num_hidden_layers and
// num_attention_heads: GPTNeoConfig's attribute_map, whose aliases transformers sets last, so they
// win where config.json has both names).
struct GptNeoParams : ArchParams {
  std::optional<int64_t> intermediate_size;  // None -> 4 * hidden_size
  int64_t window_size = 256;                 // the keys a local layer sees, its own included
  std::vector<bool> local;                   // per layer: local (true) or global attention
  std::string activation_function = "gelu_new";
  double layer_norm_epsilon = 1e-5;

  std::unique_ptr<ArchParams> clone() const override {
    return std::make_unique<GptNeoParams>(*this);
  }
};

int64_t inner(const ModelConfig& c) {
  const auto& p = c.params<GptNeoParams>();
  return p.intermediate_size ? *p.intermediate_size : 4 * c.hidden_size;
}

// attention_types, [[["global", "local"], 12]]: each item's list of types repeated its count times
// (GPTNeoConfig.expand_attention_types_params: a count of 0 adds none); true = local.
std::vector<bool> expand_attention_types(const nlohmann::json& types, const std::string& origin) {
  const std::string want =
      "; write it as [[[\"global\", \"local\"], 12]]: lists of \"global\" / \"local\" and their "
      "repeat counts";
  if (!types.is_array() || types.empty())
    throw InputError(
        concat(origin, ": attention_types must be a non-empty list, got ", types.dump(), want));
  std::vector<bool> out;
  for (const auto& item : types) {
    if (!item.is_array() || item.size() != 2 || !item[0].is_array() || item[0].empty() ||
        !item[1].is_number_integer() || item[1].get<int64_t>() < 0)
      throw InputError(concat(origin, ": attention_types item ", item.dump(),
                              " is not [[types...], count]", want));
    std::vector<bool> unit;
    for (const auto& t : item[0]) {
      if (t == "local" || t == "global") {
        unit.push_back(t == "local");
        continue;
      }
      throw InputError(concat(origin, ": attention_types names ", t.dump(),
                              "; GPT-Neo's layers are \"global\" or \"local\""));
    }
    // Bounded before it is built: a config cannot make this allocate more than a model has layers.
    constexpr size_t kMaxLayers = size_t{1} << 20;
    const auto count = static_cast<size_t>(item[1].get<int64_t>());
    if (count > (kMaxLayers - out.size()) / unit.size())
      throw InputError(concat(origin, ": attention_types expands to more than ", kMaxLayers,
                              " layers; give one type per layer"));
    for (size_t r = 0; r < count; ++r) out.insert(out.end(), unit.begin(), unit.end());
  }
  return out;
}

// The layer types as config.json writes them: "global" / "local" per layer.
nlohmann::json layer_names(const std::vector<bool>& local) {
  nlohmann::json j = nlohmann::json::array();
  for (bool l : local) j.push_back(l ? "local" : "global");
  return j;
}

// config.json's attention_layers: one "global" / "local" per layer; true = local.
std::vector<bool> layer_types(const nlohmann::json& listed, const std::string& origin) {
  if (!listed.is_array() || listed.empty())
    throw InputError(
        concat(origin, ": attention_layers must list \"global\" or \"local\" per layer, got ",
               listed.dump(), "; correct it or remove it (attention_types then decides)"));
  std::vector<bool> out;
  for (const auto& t : listed) {
    if (t != "local" && t != "global")
      throw InputError(concat(origin, ": attention_layers names ", t.dump(),
                              "; GPT-Neo's layers are \"global\" or \"local\""));
    out.push_back(t == "local");
  }
  return out;
}

// The shortest unit the per-layer types repeat (the whole list when none is shorter).
size_t period(const std::vector<bool>& local) {
  for (size_t p = 1; p < local.size(); ++p) {
    if (local.size() % p != 0) continue;
    bool ok = true;
    for (size_t i = p; ok && i < local.size(); ++i) ok = local[i] == local[i % p];
    if (ok) return p;
  }
  return local.size();
}

// GPTNeoAttention: a module holding the layer's GPTNeoSelfAttention as `attention`; its output is
// that module's output.
class GptNeoAttention : public Module {
 public:
  GptNeoAttention(const std::string& name, int64_t hidden, std::unique_ptr<Module> attention)
      : Module(name, hidden_point(name + ":input", hidden), hidden_point(name, hidden)) {
    attention_ = add(std::move(attention));
  }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override {
    return attention_->call(x, st);
  }

 private:
  Module* attention_;
};

std::unique_ptr<Module> block(const ModelConfig& c, WeightSource w, int64_t layer) {
  const auto& p = c.params<GptNeoParams>();
  const int64_t H = c.hidden_size, I = inner(c);
  const std::string name = w.path();
  const double eps = p.layer_norm_epsilon;
  auto ln_1 = layer_norm(w, "ln_1", H, eps);
  WeightSource a = w.pp("attn").pp("attention");
  AttentionParts parts;  // the forward's order: q_proj, k_proj, v_proj, out_proj
  parts.q = linear_layer(a, "q_proj", H, H, false);
  parts.k = linear_layer(a, "k_proj", H, H, false);
  parts.v = linear_layer(a, "v_proj", H, H, false);
  parts.o = linear_layer(a, "out_proj", H, H, true);
  AttentionShape shape;
  shape.hidden = H;
  shape.heads = shape.kv_heads = c.num_attention_heads;
  shape.head_dim = H / c.num_attention_heads;
  shape.scale = 1.0;  // _attn: torch.matmul(query, key.transpose(-1, -2)), unscaled
  if (p.local[static_cast<size_t>(layer)]) shape.window = p.window_size;
  shape.scores_in_float32 = true;  // _attn: query.to(float32), key.to(float32)
  auto attn = std::make_unique<GptNeoAttention>(
      name + ".attn", H, std::make_unique<Attention>(a.path(), shape, std::move(parts)));
  auto ln_2 = layer_norm(w, "ln_2", H, eps);
  auto mlp = biased_mlp(w.pp("mlp"), "c_fc", "act", "c_proj", p.activation_function, H, I);
  return std::make_unique<PreNormBlock>(name, H, std::move(ln_1), std::move(attn), std::move(ln_2),
                                        std::move(mlp));
}

class GptNeo : public Architecture {
 public:
  std::string name() const override { return "gpt_neo"; }
  std::vector<std::string> model_types() const override { return {"gpt_neo"}; }
  std::vector<std::string> class_names() const override { return {"GPTNeoForCausalLM"}; }

  // Every field has GPTNeoConfig's default (EleutherAI/gpt-neo-1.3B's sizes) when absent.
  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<GptNeoParams>();
    c.vocab_size = f.positive({"vocab_size"}, 50257);
    c.max_position_embeddings = f.positive({"max_position_embeddings"}, 2048);
    c.hidden_size = f.positive({"hidden_size"}, 2048);
    c.num_hidden_layers = f.positive({f.aliased("num_layers", "num_hidden_layers")}, 24);
    c.num_attention_heads = f.positive({f.aliased("num_heads", "num_attention_heads")}, 16);
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": num_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size));
    if (f.has("intermediate_size"))
      p->intermediate_size = f.positive({"intermediate_size"}, std::nullopt);
    p->activation_function = f.string({"activation_function"}, p->activation_function);
    check_activation(p->activation_function, "activation_function", f.origin());
    p->layer_norm_epsilon = f.number({"layer_norm_epsilon"}, p->layer_norm_epsilon);
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
    c.bos_token_id = f.token_id("bos_token_id", 50256);
    c.eos_token_id = f.token_id("eos_token_id", 50256);

    // Each layer's attention. transformers expands attention_types into attention_layers
    // (GPTNeoConfig.__post_init__), then sets config.json's own attention_layers over it (released
    // configs carry both): that list decides when present, and must agree with attention_types.
    const nlohmann::json* types = f.find({"attention_types"});
    const auto& root = f.root();
    const auto listed = root.find("attention_layers");
    const char* source = listed != root.end() ? "attention_layers" : "attention_types";
    if (listed != root.end()) {
      p->local = layer_types(*listed, f.origin());
      const std::vector<bool> expanded =
          types ? expand_attention_types(*types, f.origin()) : p->local;
      if (expanded != p->local)
        throw InputError(concat(f.origin(), ": attention_layers ", listed->dump(),
                                " disagrees with attention_types ", types->dump(),
                                " (it expands to ", layer_names(expanded).dump(),
                                "); transformers follows attention_layers: correct one of them"));
    } else {
      p->local = expand_attention_types(
          types ? *types : nlohmann::json::parse(R"([[["global", "local"], 12]])"), f.origin());
    }
    if (static_cast<int64_t>(p->local.size()) != c.num_hidden_layers)
      throw InputError(concat(f.origin(), ": ", source, " gives ", p->local.size(),
                              " layers but num_layers is ", c.num_hidden_layers,
                              types || listed != root.end()
                                  ? ""
                                  : " (attention_types is absent: its default is 24 layers)",
                              "; give one type per layer"));
    const bool any_local = std::find(p->local.begin(), p->local.end(), true) != p->local.end();
    p->window_size = f.integer({"window_size"}, p->window_size);
    if (any_local && (p->window_size < 1 || p->window_size >= (int64_t{1} << 31)))
      throw InputError(concat(f.origin(), ": window_size=", p->window_size,
                              " leaves the local layers no key; it must be between 1 and 2^31-1"));
    c.arch_params = std::move(p);
  }

  // attention_types as the shortest repeated unit of the per-layer types; when the layer count was
  // changed (the repro model's 12 layers), that unit repeats over the new count.
  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<GptNeoParams>();
    const size_t unit = period(p.local);
    std::vector<bool> local;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      local.push_back(p.local[static_cast<size_t>(i) % unit]);
    const size_t n = period(local);
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["hidden_size"] = c.hidden_size;
    j["num_layers"] = c.num_hidden_layers;
    j["num_heads"] = c.num_attention_heads;
    j["attention_types"] = nlohmann::json::array({nlohmann::json::array(
        {layer_names({local.begin(), local.begin() + static_cast<long>(n)}), local.size() / n})});
    j["attention_layers"] = layer_names(local);
    j["window_size"] = p.window_size;
    j["intermediate_size"] =
        p.intermediate_size ? nlohmann::json(*p.intermediate_size) : nlohmann::json(nullptr);
    j["activation_function"] = p.activation_function;
    j["layer_norm_epsilon"] = p.layer_norm_epsilon;
    j["resid_dropout"] = 0.0;
    j["embed_dropout"] = 0.0;
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
  }

  std::vector<std::string> presets() const override {
    return {"tiny", "small", "gpt-neo-125m", "tinystories-33m"};
  }

  ModelConfig preset(const std::string& name) const override {
    ModelConfig c;
    c.arch = c.model_type = "gpt_neo";
    auto p = std::make_unique<GptNeoParams>();
    c.vocab_size = 50257, c.max_position_embeddings = 2048;
    if (name == "tiny") {  // a window shorter than the tests' sequences
      c.vocab_size = 512, c.max_position_embeddings = 256, c.hidden_size = 64;
      c.num_hidden_layers = 4, c.num_attention_heads = 4, p->window_size = 8;
    } else if (name == "small") {
      c.vocab_size = 2048, c.max_position_embeddings = 1024, c.hidden_size = 256;
      c.num_hidden_layers = 6, c.num_attention_heads = 8, p->window_size = 64;
    } else if (name == "gpt-neo-125m") {  // EleutherAI/gpt-neo-125M's config.json
      c.hidden_size = 768, c.num_hidden_layers = 12, c.num_attention_heads = 12;
    } else {  // tinystories-33m: roneneldan/TinyStories-33M's config.json
      c.hidden_size = 768, c.num_hidden_layers = 4, c.num_attention_heads = 16;
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) p->local.push_back(i % 2 == 1);
    c.tie_word_embeddings = true;
    c.bos_token_id = c.eos_token_id = 50256;
    c.arch_params = std::move(p);
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    w.ignore_suffix(".attn.attention.bias");  // the mask buffers older checkpoints saved
    w.ignore_suffix(".attn.attention.masked_bias");
    WeightSource t = w.pp("transformer");
    at::Tensor wte;
    BuiltModel m;
    m.stages.push_back({StageKind::kEmbeddings, learned_position_embeddings(c, t, wte)});
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      m.stages.push_back({StageKind::kBlock, block(c, t.pp("h").pp(i), i)});
    m.stages.push_back(
        {StageKind::kFinalNorm,
         layer_norm(t, "ln_f", c.hidden_size, c.params<GptNeoParams>().layer_norm_epsilon)});
    m.stages.push_back(head_stage(c, w, wte));
    m.head_shares_embedding = c.tie_word_embeddings;
    m.mlp_width = inner(c);
    return m;
  }
};

}  // namespace

const Architecture& gpt_neo_architecture() {
  static const GptNeo arch;
  return arch;
}

}  // namespace actcap
