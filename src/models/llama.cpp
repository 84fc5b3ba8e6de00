// Llama family (transformers modeling_llama.py, modeling_mistral.py, modeling_qwen2.py):
// RMSNorm, RoPE with rotate_half (tables in rope.cpp), grouped-query attention, SwiGLU MLP. Mistral
// and Qwen2 differ only in config: sliding windows and q/k/v biases.
#include <cmath>

#include "models/architectures.h"
#include "models/rope.h"

namespace actcap {

namespace {

at::Tensor maybe(const std::map<std::string, at::Tensor>& w, const std::string& name) {
  auto it = w.find(name);
  return it == w.end() ? at::Tensor() : it->second;
}

std::unique_ptr<Linear> linear(const std::map<std::string, at::Tensor>& w,
                               const std::string& name) {
  return std::make_unique<Linear>(name, w.at(name + ".weight"), maybe(w, name + ".bias"));
}

// HF's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the head dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::cat({halves[1].neg(), halves[0]}, -1);
}

at::Tensor apply_rope(const at::Tensor& x, const ForwardState& st) {
  return x * st.rope_cos + rotate_half(x) * st.rope_sin;  // cos/sin [T, D] broadcast over [B, H]
}

class LlamaAttention : public Module {
 public:
  LlamaAttention(const LlamaConfig& c, const std::map<std::string, at::Tensor>& w,
                 const std::string& name, int64_t layer)
      : Module(name, hidden_point(name + ":input", c.hidden_size),
               hidden_point(name, c.hidden_size)),
        n_head_(c.num_attention_heads),
        n_kv_(c.num_key_value_heads),
        head_dim_(c.head_dim),
        window_(c.window_for_layer(layer)) {
    q_ = add(linear(w, name + ".q_proj"));
    k_ = add(linear(w, name + ".k_proj"));
    v_ = add(linear(w, name + ".v_proj"));
    o_ = add(linear(w, name + ".o_proj"));
  }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override {
    const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
    auto q = q_->call(x, st).view({B, T, n_head_, D}).transpose(1, 2);
    auto k = k_->call(x, st).view({B, T, n_kv_, D}).transpose(1, 2);
    auto v = v_->call(x, st).view({B, T, n_kv_, D}).transpose(1, 2);
    q = apply_rope(q, st);
    k = apply_rope(k, st);
    auto ctx = attention(q, k, v, st.bias(window_), 1.0 / std::sqrt(static_cast<double>(D)));
    return o_->call(ctx, st);
  }

 private:
  int64_t n_head_, n_kv_, head_dim_;
  std::optional<int64_t> window_;
  Linear *q_, *k_, *v_, *o_;
};

class LlamaMlp : public Module {
 public:
  LlamaMlp(const LlamaConfig& c, const std::map<std::string, at::Tensor>& w,
           const std::string& name)
      : Module(name, hidden_point(name + ":input", c.hidden_size),
               hidden_point(name, c.hidden_size)) {
    gate_ = add(linear(w, name + ".gate_proj"));
    act_ = add(std::make_unique<Activation>(name + ".act_fn", c.hidden_act, c.intermediate_size));
    up_ = add(linear(w, name + ".up_proj"));
    down_ = add(linear(w, name + ".down_proj"));
  }

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override {
    auto a =
        act_->call(gate_->call(x, st), st);  // HF evaluates act_fn(gate_proj(x)) before up_proj(x)
    return down_->call(a * up_->call(x, st), st);
  }

 private:
  Linear *gate_, *up_, *down_;
  Activation* act_;
};

std::unique_ptr<Module> llama_layer(const LlamaConfig& c,
                                    const std::map<std::string, at::Tensor>& w,
                                    const std::string& name, int64_t layer) {
  auto norm = [&](const std::string& n) {
    return std::make_unique<RMSNorm>(n, w.at(n + ".weight"), c.rms_norm_eps);
  };
  auto in_norm = norm(name + ".input_layernorm");
  auto attn = std::make_unique<LlamaAttention>(c, w, name + ".self_attn", layer);
  auto post_norm = norm(name + ".post_attention_layernorm");
  auto mlp = std::make_unique<LlamaMlp>(c, w, name + ".mlp");
  return std::make_unique<PreNormBlock>(name, c.hidden_size, std::move(in_norm), std::move(attn),
                                        std::move(post_norm), std::move(mlp));
}

}  // namespace

BuiltModel build_llama(const LlamaConfig& c, const std::map<std::string, at::Tensor>& w) {
  BuiltModel m;
  auto embed = std::make_unique<Embedding>("model.embed_tokens", w.at("model.embed_tokens.weight"));
  at::Tensor embed_w = embed->weight();
  m.stages.push_back({StageKind::kEmbeddings, std::move(embed)});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    m.stages.push_back({StageKind::kBlock, llama_layer(c, w, concat("model.layers.", i), i)});
  m.stages.push_back(
      {StageKind::kFinalNorm,
       std::make_unique<RMSNorm>("model.norm", w.at("model.norm.weight"), c.rms_norm_eps)});
  at::Tensor head = c.tie_word_embeddings ? embed_w : w.at("lm_head.weight");
  m.stages.push_back({StageKind::kHead, std::make_unique<Linear>("lm_head", head, at::Tensor())});
  m.head_shares_embedding = c.tie_word_embeddings;
  auto rope = std::make_shared<const Rope>(c.rope, c.head_dim, c.max_position_embeddings);
  m.prepare = [rope](ForwardState& st) { rope->prepare(st); };
  return m;
}

}  // namespace actcap
