// OPT (transformers configuration_opt.py, modeling_opt.py: facebook/opt-125m ... 66b, opt-350m):
// learned positions looked up at position + 2 (OPTLearnedPositionalEmbedding's offset); token
// embeddings of word_embed_proj_dim projected in to hidden_size (and back out before lm_head)
// where the two differ; decoder layers whose fc1 / activation_fn / fc2 sit directly in the layer
// (no MLP module), LayerNorms before the sublayers (do_layer_norm_before) or after the residual
// additions (opt-350m); q_proj, k_proj, v_proj and out_proj with biases (enable_bias); scores
// scaled by head_dim^-0.5; a ReLU by default; lm_head tied to the embeddings by default.
#include <cmath>
#include <nlohmann/json.hpp>

#include "models/arch/architecture.h"
#include "models/config_reader.h"
#include "models/parts/attention.h"
#include "models/parts/norm.h"

namespace actcap {

namespace {

struct OptParams : ArchParams {
  int64_t ffn_dim = 3072;
  std::optional<int64_t> word_embed_proj_dim;  // None -> hidden_size
  bool do_layer_norm_before = true;
  bool remove_final_layer_norm = false;  // _remove_final_layer_norm
  bool enable_bias = true;
  bool layer_norm_elementwise_affine = true;
  std::string activation_function = "relu";
  int64_t pad_token_id = 1;

  std::unique_ptr<ArchParams> clone() const override { return std::make_unique<OptParams>(*this); }
};

constexpr double kLayerNormEps = 1e-5;  // nn.LayerNorm's default: OPTConfig has no eps field
constexpr int64_t kPositionOffset = 2;  // OPTLearnedPositionalEmbedding.offset

int64_t proj_dim(const ModelConfig& c) {
  const auto& p = c.params<OptParams>();
  return p.word_embed_proj_dim ? *p.word_embed_proj_dim : c.hidden_size;
}

std::unique_ptr<Module> norm(const ModelConfig& c, WeightSource w, const std::string& name) {
  if (c.params<OptParams>().layer_norm_elementwise_affine)
    return layer_norm(w, name, c.hidden_size, kLayerNormEps);
  return std::make_unique<LayerNorm>(w.pp(name).path(), c.hidden_size, kLayerNormEps);
}

// embed_positions: the table row of each token's position + 2. transformers calls it with the
// attention mask as its first argument (and the position ids): its `:input` is that mask, 1 for
// every token a row holds.
class OptPositions : public Module {
 public:
  OptPositions(const std::string& name, at::Tensor weight)
      : Module(name, ids_point(name + ":input"), hidden_point(name, weight.size(1))),
        weight_(std::move(weight)) {
    parameter(weight_, false);  // a lookup table: only the gathered rows are converted
  }

 protected:
  at::Tensor forward(const at::Tensor&, ForwardState& st) override {
    const at::Tensor positions = st.row_positions.defined()
                                     ? st.row_positions
                                     : st.positions.unsqueeze(0).expand({st.batch, st.seq});
    return embedding_rows(weight_, positions + kPositionOffset, st.compute);
  }

 private:
  at::Tensor weight_;
};

// project_in(embed_tokens(ids)) + embed_positions(mask), in transformers' call order; HF has no
// module for the sum.
class OptEmbeddings : public Module {
 public:
  OptEmbeddings(int64_t hidden, std::unique_ptr<Module> tokens, std::unique_ptr<Module> positions,
                std::unique_ptr<Module> project_in)
      : Module("", ids_point(""), hidden_point("", hidden)) {
    tokens_ = add(std::move(tokens));
    positions_ = add(std::move(positions));
    if (project_in) project_in_ = add(std::move(project_in));
  }

 protected:
  at::Tensor forward(const at::Tensor& ids, ForwardState& st) override {
    at::Tensor tok = tokens_->call(ids, st);
    at::Tensor pos = positions_->call(at::ones_like(ids), st);
    if (project_in_) tok = project_in_->call(tok, st);
    return tok + pos;
  }

 private:
  Module* tokens_;
  Module* positions_;
  Module* project_in_ = nullptr;
};

// OPTDecoderLayer. Pre-norm: h = x + self_attn(self_attn_layer_norm(x)), then
// h + fc2(activation_fn(fc1(final_layer_norm(h)))). Post-norm (do_layer_norm_before false):
// h = self_attn_layer_norm(x + self_attn(x)), then final_layer_norm(h +
// fc2(activation_fn(fc1(h)))). The children are registered in the order each form runs them.
class OptDecoderLayer : public Module {
 public:
  struct Parts {
    std::unique_ptr<Module> attn_norm, attn, mlp_norm, fc1, act, fc2;
  };
  OptDecoderLayer(const std::string& name, int64_t hidden, bool pre_norm, Parts p)
      : Module(name, hidden_point(name + ":input", hidden), hidden_point(name, hidden)),
        pre_norm_(pre_norm) {
    if (pre_norm_) attn_norm_ = add(std::move(p.attn_norm));
    attn_ = add(std::move(p.attn));
    if (!pre_norm_) attn_norm_ = add(std::move(p.attn_norm));
    if (pre_norm_) mlp_norm_ = add(std::move(p.mlp_norm));
    fc1_ = add(std::move(p.fc1));
    act_ = add(std::move(p.act));
    fc2_ = add(std::move(p.fc2));
    if (!pre_norm_) mlp_norm_ = add(std::move(p.mlp_norm));
  }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override {
    auto mlp = [&](const at::Tensor& h) {
      return fc2_->call(act_->call(fc1_->call(h, st), st), st);
    };
    if (pre_norm_) {
      at::Tensor h = x + attn_->call(attn_norm_->call(x, st), st);
      return st.residual_add(h, mlp(mlp_norm_->call(h, st)));
    }
    at::Tensor h = attn_norm_->call(x + attn_->call(x, st), st);
    return mlp_norm_->call(h + mlp(h), st);
  }

 private:
  bool pre_norm_;
  Module *attn_norm_ = nullptr, *attn_ = nullptr, *mlp_norm_ = nullptr, *fc1_ = nullptr,
         *act_ = nullptr, *fc2_ = nullptr;
};

// project_out (hidden -> word_embed_proj_dim) then lm_head, one stage: the transfer into a stage
// on another device stays hidden_size wide.
class ProjectedHead : public Module {
 public:
  ProjectedHead(int64_t hidden, int64_t vocab, std::unique_ptr<Module> project_out,
                std::unique_ptr<Module> head)
      : Module("", hidden_point("", hidden), hidden_point("", vocab)) {
    project_out_ = add(std::move(project_out));
    head_ = add(std::move(head));
  }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override {
    return head_->call(project_out_->call(x, st), st);
  }

 private:
  Module* project_out_;
  Module* head_;
};

std::unique_ptr<Module> layer(const ModelConfig& c, WeightSource w) {
  const auto& p = c.params<OptParams>();
  const int64_t H = c.hidden_size, F = p.ffn_dim;
  WeightSource a = w.pp("self_attn");
  AttentionParts parts;  // the forward's order: q_proj, k_proj, v_proj, out_proj
  parts.q = linear_layer(a, "q_proj", H, H, p.enable_bias);
  parts.k = linear_layer(a, "k_proj", H, H, p.enable_bias);
  parts.v = linear_layer(a, "v_proj", H, H, p.enable_bias);
  parts.o = linear_layer(a, "out_proj", H, H, p.enable_bias);
  AttentionShape shape;
  shape.hidden = H;
  shape.heads = shape.kv_heads = c.num_attention_heads;
  shape.head_dim = H / c.num_attention_heads;
  // HF scales q_proj's output by head_dim^-0.5 before q k^T; actcap scales the product (the same
  // bits when head_dim is a power of 4, as 64 in most OPT sizes; within float32 rounding
  // otherwise).
  shape.scale = std::pow(static_cast<double>(shape.head_dim), -0.5);
  OptDecoderLayer::Parts l;
  l.attn_norm = norm(c, w, "self_attn_layer_norm");
  l.attn = std::make_unique<Attention>(a.path(), shape, std::move(parts));
  l.mlp_norm = norm(c, w, "final_layer_norm");
  l.fc1 = linear_layer(w, "fc1", H, F, p.enable_bias);
  l.act = std::make_unique<Activation>(w.pp("activation_fn").path(), p.activation_function, F);
  l.fc2 = linear_layer(w, "fc2", F, H, p.enable_bias);
  return std::make_unique<OptDecoderLayer>(w.path(), H, p.do_layer_norm_before, std::move(l));
}

class Opt : public Architecture {
 public:
  std::string name() const override { return "opt"; }
  std::vector<std::string> model_types() const override { return {"opt"}; }
  std::vector<std::string> class_names() const override { return {"OPTForCausalLM"}; }

  // Every field has OPTConfig's default (facebook/opt-125m's sizes) when absent.
  void parse(const ConfigReader& f, ModelConfig& c) const override {
    auto p = std::make_unique<OptParams>();
    c.vocab_size = f.positive({"vocab_size"}, 50272);
    c.hidden_size = f.positive({"hidden_size"}, 768);
    c.num_hidden_layers = f.positive({"num_hidden_layers"}, 12);
    c.num_attention_heads = f.positive({"num_attention_heads"}, 12);
    c.max_position_embeddings = f.positive({"max_position_embeddings"}, 2048);
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size));
    p->ffn_dim = f.positive({"ffn_dim"}, p->ffn_dim);
    if (f.has("word_embed_proj_dim"))
      p->word_embed_proj_dim = f.positive({"word_embed_proj_dim"}, std::nullopt);
    p->do_layer_norm_before = f.boolean({"do_layer_norm_before"}, true);
    p->remove_final_layer_norm = f.boolean({"_remove_final_layer_norm"}, false);
    p->enable_bias = f.boolean({"enable_bias"}, true);
    p->layer_norm_elementwise_affine = f.boolean({"layer_norm_elementwise_affine"}, true);
    p->activation_function = f.string({"activation_function"}, p->activation_function);
    check_activation(p->activation_function, "activation_function", f.origin());
    c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
    p->pad_token_id = f.token_id("pad_token_id", 1);
    c.bos_token_id = f.token_id("bos_token_id", 2);
    c.eos_token_id = f.token_id("eos_token_id", 2);
    c.arch_params = std::move(p);
  }

  void write(const ModelConfig& c, nlohmann::json& j) const override {
    const auto& p = c.params<OptParams>();
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["ffn_dim"] = p.ffn_dim;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["word_embed_proj_dim"] = proj_dim(c);
    j["do_layer_norm_before"] = p.do_layer_norm_before;
    j["_remove_final_layer_norm"] = p.remove_final_layer_norm;
    j["enable_bias"] = p.enable_bias;
    j["layer_norm_elementwise_affine"] = p.layer_norm_elementwise_affine;
    j["activation_function"] = p.activation_function;
    j["dropout"] = 0.0;
    j["attention_dropout"] = 0.0;
    j["layerdrop"] = 0.0;
    j["init_std"] = 0.02;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["pad_token_id"] = p.pad_token_id;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
  }

  std::vector<std::string> presets() const override {
    return {"tiny", "small", "opt-125m", "opt-350m"};
  }

  ModelConfig preset(const std::string& name) const override {
    ModelConfig c;
    c.arch = c.model_type = "opt";
    auto p = std::make_unique<OptParams>();
    c.vocab_size = 50272, c.max_position_embeddings = 2048;
    if (name == "tiny") {  // embeddings narrower than the layers: project_in / project_out run
      c.vocab_size = 512, c.max_position_embeddings = 256, c.hidden_size = 64;
      c.num_hidden_layers = 4, c.num_attention_heads = 4, p->ffn_dim = 160;
      p->word_embed_proj_dim = 48;
    } else if (name == "small") {
      c.vocab_size = 2048, c.max_position_embeddings = 1024, c.hidden_size = 256;
      c.num_hidden_layers = 6, c.num_attention_heads = 8, p->ffn_dim = 1024;
    } else if (name == "opt-125m") {  // facebook/opt-125m's config.json
      c.hidden_size = 768, c.num_hidden_layers = 12, c.num_attention_heads = 12;
      p->ffn_dim = 3072;
    } else {  // opt-350m: facebook/opt-350m's (post-norm layers, 512-wide embeddings)
      c.hidden_size = 1024, c.num_hidden_layers = 24, c.num_attention_heads = 16;
      p->ffn_dim = 4096, p->word_embed_proj_dim = 512, p->do_layer_norm_before = false;
    }
    c.tie_word_embeddings = true;
    c.bos_token_id = c.eos_token_id = 2;
    c.arch_params = std::move(p);
    return c;
  }

  BuiltModel build(const ModelConfig& c, WeightSource& w) const override {
    const auto& p = c.params<OptParams>();
    const int64_t V = c.vocab_size, H = c.hidden_size, P = proj_dim(c);
    w.alias_prefix("model.", "");  // the Hub's files were saved from OPTModel: `decoder.layers...`
    WeightSource d = w.pp("model").pp("decoder");
    std::vector<std::string> tied;
    if (c.tie_word_embeddings) tied.push_back("lm_head.weight");
    at::Tensor wte = d.get("embed_tokens.weight", {V, P}, Init::kMatrix, Layout::kAsStored, tied);
    auto positions = std::make_unique<OptPositions>(
        d.pp("embed_positions").path(),
        d.get("embed_positions.weight", {c.max_position_embeddings + kPositionOffset, H}));
    BuiltModel m;
    m.stages.push_back(
        {StageKind::kEmbeddings,
         std::make_unique<OptEmbeddings>(
             H, std::make_unique<Embedding>(d.pp("embed_tokens").path(), wte), std::move(positions),
             P != H ? linear_layer(d, "project_in", P, H, false) : nullptr)});
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      m.stages.push_back({StageKind::kBlock, layer(c, d.pp("layers").pp(i))});
    if (p.do_layer_norm_before && !p.remove_final_layer_norm)
      m.stages.push_back({StageKind::kFinalNorm, norm(c, d, "final_layer_norm")});
    at::Tensor head = c.tie_word_embeddings ? wte : w.get("lm_head.weight", {V, P});
    auto lm_head = std::make_unique<Linear>("lm_head", head, at::Tensor());
    if (P != H)
      m.stages.push_back({StageKind::kHead, std::make_unique<ProjectedHead>(
                                                H, V, linear_layer(d, "project_out", H, P, false),
                                                std::move(lm_head))});
    else
      m.stages.push_back({StageKind::kHead, std::move(lm_head)});
    m.head_shares_embedding = c.tie_word_embeddings;
    m.mlp_width = p.ffn_dim;
    return m;
  }
};

}  // namespace

const Architecture& opt_architecture() {
  static const Opt arch;
  return arch;
}

}  // namespace actcap
