// GPT-2 (transformers modeling_gpt2.py): learned positions, pre-LayerNorm blocks, fused c_attn.
#include <cmath>

#include "models/architectures.h"

namespace actcap {

namespace {

at::Tensor get(const std::map<std::string, at::Tensor>& w, const std::string& name) {
  return w.at(name);
}

std::unique_ptr<Linear> linear(const std::map<std::string, at::Tensor>& w, const std::string& name,
                               bool bias = true) {
  return std::make_unique<Linear>(name, get(w, name + ".weight"),
                                  bias ? get(w, name + ".bias") : at::Tensor());
}

// wte(ids) + wpe(positions); HF has no module for the sum (transformer.drop is identity in eval).
class Gpt2Embeddings : public Module {
 public:
  Gpt2Embeddings(const std::map<std::string, at::Tensor>& w)
      : Module("", ids_point(""), hidden_point("", w.at("transformer.wte.weight").size(1))) {
    wte_ = add(std::make_unique<Embedding>("transformer.wte", get(w, "transformer.wte.weight")));
    wpe_ = add(std::make_unique<Embedding>("transformer.wpe", get(w, "transformer.wpe.weight")));
  }
  const at::Tensor& wte_weight() const { return wte_->weight(); }

 protected:
  at::Tensor forward(const at::Tensor& ids, ForwardState& st) override {
    auto tok = wte_->call(ids, st);
    auto pos = wpe_->call(st.positions.unsqueeze(0).expand({st.batch, st.seq}), st);
    return tok + pos;
  }

 private:
  Embedding* wte_;
  Embedding* wpe_;
};

// The factor GPT2Attention applies to q k^T: 1 / sqrt(head_dim) with scale_attn_weights, then
// 1 / (layer_idx + 1) with scale_attn_by_inverse_layer_idx, computed in double as HF's
// _upcast_and_reordered_attn does. actcap's attention() is always that function's computation:
// float32 (the upcast) and one baddbmm with the scale folded into alpha (the reorder), so
// reorder_and_upcast_attn needs no path of its own. HF's default eager path divides the scores
// by the two factors one after the other instead; the two agree to float32 rounding.
double gpt2_attention_scale(const Gpt2Config& c, int64_t layer) {
  double scale = 1.0;
  if (c.scale_attn_weights) scale /= std::sqrt(static_cast<double>(c.head_dim()));
  if (c.scale_attn_by_inverse_layer_idx) scale /= static_cast<double>(layer + 1);
  return scale;
}

class Gpt2Attention : public Module {
 public:
  Gpt2Attention(const Gpt2Config& c, const std::map<std::string, at::Tensor>& w,
                const std::string& name, int64_t layer)
      : Module(name, hidden_point(name + ":input", c.n_embd), hidden_point(name, c.n_embd)),
        n_head_(c.n_head),
        scale_(gpt2_attention_scale(c, layer)) {
    c_attn_ = add(linear(w, name + ".c_attn"));
    c_proj_ = add(linear(w, name + ".c_proj"));
  }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override {
    const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = H / n_head_;
    auto qkv = c_attn_->call(x, st).view({B, T, 3, n_head_, D}).permute({2, 0, 3, 1, 4});
    auto ctx = attention(qkv[0], qkv[1], qkv[2], st.bias(std::nullopt), scale_);
    return c_proj_->call(ctx, st);
  }

 private:
  int64_t n_head_;
  double scale_;
  Linear* c_attn_;
  Linear* c_proj_;
};

class Gpt2Mlp : public Module {
 public:
  Gpt2Mlp(const Gpt2Config& c, const std::map<std::string, at::Tensor>& w, const std::string& name)
      : Module(name, hidden_point(name + ":input", c.n_embd), hidden_point(name, c.n_embd)) {
    c_fc_ = add(linear(w, name + ".c_fc"));
    act_ = add(std::make_unique<Activation>(name + ".act", c.activation_function, c.inner()));
    c_proj_ = add(linear(w, name + ".c_proj"));
  }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override {
    return c_proj_->call(act_->call(c_fc_->call(x, st), st), st);
  }

 private:
  Linear* c_fc_;
  Activation* act_;
  Linear* c_proj_;
};

std::unique_ptr<Module> gpt2_block(const Gpt2Config& c, const std::map<std::string, at::Tensor>& w,
                                   const std::string& name, int64_t layer) {
  auto norm = [&](const std::string& n) {
    return std::make_unique<LayerNorm>(n, get(w, n + ".weight"), get(w, n + ".bias"),
                                       c.layer_norm_epsilon);
  };
  auto ln_1 = norm(name + ".ln_1");
  auto attn = std::make_unique<Gpt2Attention>(c, w, name + ".attn", layer);
  auto ln_2 = norm(name + ".ln_2");
  auto mlp = std::make_unique<Gpt2Mlp>(c, w, name + ".mlp");
  return std::make_unique<PreNormBlock>(name, c.n_embd, std::move(ln_1), std::move(attn),
                                        std::move(ln_2), std::move(mlp));
}

}  // namespace

BuiltModel build_gpt2(const Gpt2Config& c, const std::map<std::string, at::Tensor>& w) {
  BuiltModel m;
  auto emb = std::make_unique<Gpt2Embeddings>(w);
  at::Tensor wte = emb->wte_weight();
  m.stages.push_back({StageKind::kEmbeddings, std::move(emb)});
  for (int64_t i = 0; i < c.n_layer; ++i)
    m.stages.push_back({StageKind::kBlock, gpt2_block(c, w, concat("transformer.h.", i), i)});
  m.stages.push_back(
      {StageKind::kFinalNorm,
       std::make_unique<LayerNorm>("transformer.ln_f", get(w, "transformer.ln_f.weight"),
                                   get(w, "transformer.ln_f.bias"), c.layer_norm_epsilon)});
  at::Tensor head = c.tie_word_embeddings ? wte : get(w, "lm_head.weight");
  m.stages.push_back({StageKind::kHead, std::make_unique<Linear>("lm_head", head, at::Tensor())});
  m.head_shares_embedding = c.tie_word_embeddings;
  m.prepare = [](ForwardState&) {};
  return m;
}

}  // namespace actcap
