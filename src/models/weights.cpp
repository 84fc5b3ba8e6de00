#include "models/weights.h"

#include <cmath>
#include <set>

#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "util/strings.h"

namespace actcap {

namespace {

std::string shape_str(at::IntArrayRef s) { return concat(s); }

void add_gpt2_prefix_aliases(WeightSpec& s) {
  // openai-community/gpt2 stores `h.0.attn...` without the `transformer.` prefix.
  const std::string p = "transformer.";
  if (s.name.rfind(p, 0) == 0) s.aliases.push_back(s.name.substr(p.size()));
}

}  // namespace

WeightPlan gpt2_weight_plan(const Gpt2Config& c) {
  WeightPlan plan;
  const int64_t H = c.n_embd, I = c.inner();
  auto add = [&](std::string name, std::vector<int64_t> shape, Transform t, Init init) {
    WeightSpec s{std::move(name), std::move(shape), t, init, {}};
    add_gpt2_prefix_aliases(s);
    plan.specs.push_back(std::move(s));
  };
  add("transformer.wte.weight", {c.vocab_size, H}, Transform::kNone, Init::kMatrix);
  if (c.tie_word_embeddings) plan.specs.back().aliases.push_back("lm_head.weight");
  add("transformer.wpe.weight", {c.n_positions, H}, Transform::kNone, Init::kMatrix);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string b = concat("transformer.h.", i, ".");
    add(b + "ln_1.weight", {H}, Transform::kNone, Init::kGain);
    add(b + "ln_1.bias", {H}, Transform::kNone, Init::kBias);
    add(b + "attn.c_attn.weight", {H, 3 * H}, Transform::kTranspose, Init::kMatrix);
    add(b + "attn.c_attn.bias", {3 * H}, Transform::kNone, Init::kBias);
    add(b + "attn.c_proj.weight", {H, H}, Transform::kTranspose, Init::kMatrix);
    add(b + "attn.c_proj.bias", {H}, Transform::kNone, Init::kBias);
    add(b + "ln_2.weight", {H}, Transform::kNone, Init::kGain);
    add(b + "ln_2.bias", {H}, Transform::kNone, Init::kBias);
    add(b + "mlp.c_fc.weight", {H, I}, Transform::kTranspose, Init::kMatrix);
    add(b + "mlp.c_fc.bias", {I}, Transform::kNone, Init::kBias);
    add(b + "mlp.c_proj.weight", {I, H}, Transform::kTranspose, Init::kMatrix);
    add(b + "mlp.c_proj.bias", {H}, Transform::kNone, Init::kBias);
  }
  add("transformer.ln_f.weight", {H}, Transform::kNone, Init::kGain);
  add("transformer.ln_f.bias", {H}, Transform::kNone, Init::kBias);
  if (!c.tie_word_embeddings)
    add("lm_head.weight", {c.vocab_size, H}, Transform::kNone, Init::kMatrix);
  plan.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  return plan;
}

WeightPlan llama_weight_plan(const LlamaConfig& c) {
  WeightPlan plan;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Q = c.num_attention_heads * D, KV = c.num_key_value_heads * D;
  auto add = [&](std::string name, std::vector<int64_t> shape, Init init) {
    plan.specs.push_back(WeightSpec{std::move(name), std::move(shape), Transform::kNone, init, {}});
  };
  add("model.embed_tokens.weight", {c.vocab_size, H}, Init::kMatrix);
  if (c.tie_word_embeddings) plan.specs.back().aliases.push_back("lm_head.weight");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string b = concat("model.layers.", i, ".");
    add(b + "input_layernorm.weight", {H}, Init::kGain);
    add(b + "self_attn.q_proj.weight", {Q, H}, Init::kMatrix);
    if (c.qkv_bias) add(b + "self_attn.q_proj.bias", {Q}, Init::kBias);
    add(b + "self_attn.k_proj.weight", {KV, H}, Init::kMatrix);
    if (c.qkv_bias) add(b + "self_attn.k_proj.bias", {KV}, Init::kBias);
    add(b + "self_attn.v_proj.weight", {KV, H}, Init::kMatrix);
    if (c.qkv_bias) add(b + "self_attn.v_proj.bias", {KV}, Init::kBias);
    add(b + "self_attn.o_proj.weight", {H, Q}, Init::kMatrix);
    if (c.o_bias) add(b + "self_attn.o_proj.bias", {H}, Init::kBias);
    add(b + "post_attention_layernorm.weight", {H}, Init::kGain);
    add(b + "mlp.gate_proj.weight", {I, H}, Init::kMatrix);
    if (c.mlp_bias) add(b + "mlp.gate_proj.bias", {I}, Init::kBias);
    add(b + "mlp.up_proj.weight", {I, H}, Init::kMatrix);
    if (c.mlp_bias) add(b + "mlp.up_proj.bias", {I}, Init::kBias);
    add(b + "mlp.down_proj.weight", {H, I}, Init::kMatrix);
    if (c.mlp_bias) add(b + "mlp.down_proj.bias", {H}, Init::kBias);
  }
  add("model.norm.weight", {H}, Init::kGain);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, H}, Init::kMatrix);
  plan.ignored_suffixes = {".rotary_emb.inv_freq"};
  return plan;
}

WeightPlan weight_plan(const ModelConfig& c) {
  return c.arch == Arch::kGpt2 ? gpt2_weight_plan(c.gpt2) : llama_weight_plan(c.llama);
}

std::map<std::string, at::Tensor> load_weights(const WeightPlan& plan,
                                               const std::map<std::string, at::Tensor>& tensors,
                                               const std::string& origin) {
  std::map<std::string, at::Tensor> out;
  std::set<std::string> used;
  for (const WeightSpec& spec : plan.specs) {
    const std::string* found = nullptr;
    if (tensors.count(spec.name)) found = &spec.name;
    for (const std::string& alias : spec.aliases)
      if (!found && tensors.count(alias)) found = &alias;
    if (!found) {
      std::string also;
      for (const std::string& a : spec.aliases)
        also += (also.empty() ? " (also looked for " : ", ") + a;
      if (!also.empty()) also += ")";
      throw InputError(concat(origin, ": missing tensor ", spec.name, also));
    }
    used.insert(*found);
    const at::Tensor& t = tensors.at(*found);
    if (!at::isFloatingType(t.scalar_type()))
      throw InputError(concat(origin, ": tensor ", *found, " has dtype ", t.scalar_type(),
                              "; weights must be floating point (F32, F16, BF16, F64)"));
    if (t.sizes() != at::IntArrayRef(spec.shape))
      throw InputError(concat(origin, ": tensor ", *found, " has shape ", shape_str(t.sizes()),
                              " but config.json implies ", shape_str(spec.shape)));
    // Own a float32 copy only when needed; f32 aligned tensors stay zero-copy over the mapping.
    at::Tensor w = t.to(at::kFloat);
    // A transposed view, not a copy: linear() then multiplies by the stored [in, out] matrix
    // directly (BLAS takes either layout at the same speed), so GPT-2's Conv1D weights stay
    // zero-copy over the mapping too and are resident once, not twice.
    if (spec.transform == Transform::kTranspose) w = w.t();
    out.emplace(spec.name, std::move(w));
  }
  std::vector<std::string> unused;
  for (const auto& [name, t] : tensors) {
    if (used.count(name)) continue;
    bool ignored = false;
    for (const std::string& suf : plan.ignored_suffixes) ignored |= ends_with(name, suf);
    if (!ignored) unused.push_back(name);
  }
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 5; ++i) list += (i ? ", " : "") + unused[i];
    if (unused.size() > 5) list += concat(", ... (", unused.size(), " in all)");
    warn(concat(origin, ": ignoring tensors the model does not use: ", list));
  }
  return out;
}

namespace {

// splitmix64: tiny, fast, and the same on every platform.
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() {
    return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
};

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, salted by the seed
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace

std::map<std::string, at::Tensor> init_weights(const WeightPlan& plan, uint64_t seed,
                                               at::ScalarType dtype) {
  std::map<std::string, at::Tensor> out;
  constexpr double kStd = 0.02;
  for (const WeightSpec& spec : plan.specs) {
    at::Tensor t = at::empty(spec.shape, at::kFloat);
    float* p = t.data_ptr<float>();
    const int64_t n = t.numel();
    SplitMix64 rng{name_seed(seed, spec.name)};
    const double base = spec.init == Init::kGain ? 1.0 : 0.0;
    for (int64_t i = 0; i < n; i += 2) {  // Box-Muller: two normals per pair of uniforms
      double r = std::sqrt(-2.0 * std::log(rng.uniform()));
      double a = 6.283185307179586 * rng.uniform();
      p[i] = static_cast<float>(base + kStd * r * std::cos(a));
      if (i + 1 < n) p[i + 1] = static_cast<float>(base + kStd * r * std::sin(a));
    }
    out.emplace(spec.name, dtype == at::kFloat ? t : t.to(dtype));
  }
  return out;
}

}  // namespace actcap
