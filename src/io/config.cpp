#include "actcap/config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actcap/error.h"
#include "io/text_file.h"

namespace actcap {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kGpt2:
      return "gpt2";
    case Arch::kLlama:
      return "llama";
    case Arch::kMistral:
      return "mistral";
    case Arch::kQwen2:
      return "qwen2";
  }
  return "?";
}

std::vector<std::string> supported_model_types() { return {"gpt2", "llama", "mistral", "qwen2"}; }

Arch parse_arch(const std::string& model_type, const std::string& origin) {
  if (model_type == "gpt2") return Arch::kGpt2;
  if (model_type == "llama") return Arch::kLlama;
  if (model_type == "mistral") return Arch::kMistral;
  if (model_type == "qwen2") return Arch::kQwen2;
  throw InputError(concat(origin, ": unsupported model_type '", model_type,
                          "'; supported: gpt2, llama, mistral, qwen2"));
}

namespace {

// Reads fields of one config object with HF's aliases and typed errors naming the field.
class Fields {
 public:
  Fields(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  const json* find(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      auto it = j_.find(n);
      if (it != j_.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  int64_t integer(std::initializer_list<const char*> names, std::optional<int64_t> dflt) const {
    const json* v = find(names);
    if (!v) {
      if (dflt) return *dflt;
      throw InputError(concat(origin_, ": missing required field '", *names.begin(), "'"));
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_float()) {  // 768.0 is accepted; the range check comes before the cast (no UB)
      const double d = v->get<double>();
      if (std::isfinite(d) && d >= -9.0e18 && d <= 9.0e18 && d == std::floor(d))
        return static_cast<int64_t>(d);
    }
    throw InputError(
        concat(origin_, ": field '", *names.begin(), "' must be an integer, got ", v->dump()));
  }

  // Sizes: positive and below 2^31, so products of a few of them (4 * n_embd, heads * head_dim,
  // vocab * hidden) cannot overflow.
  int64_t positive(std::initializer_list<const char*> names, std::optional<int64_t> dflt) const {
    int64_t v = integer(names, dflt);
    if (v <= 0 || v >= (int64_t{1} << 31))
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be between 1 and 2^31-1, got ", v));
    return v;
  }

  double number(std::initializer_list<const char*> names, double dflt) const {
    const json* v = find(names);
    if (!v) return dflt;
    if (!v->is_number())
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be a number, got ", v->dump()));
    return v->get<double>();
  }

  bool boolean(std::initializer_list<const char*> names, bool dflt) const {
    const json* v = find(names);
    if (!v) return dflt;
    if (!v->is_boolean())
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be true or false, got ", v->dump()));
    return v->get<bool>();
  }

  std::string string(std::initializer_list<const char*> names, const std::string& dflt) const {
    const json* v = find(names);
    if (!v) return dflt;
    if (!v->is_string())
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be a string, got ", v->dump()));
    return v->get<std::string>();
  }

  // Token ids may be an integer or a list (Llama 3 lists several eos ids); we keep the first.
  int64_t token_id(const char* name, int64_t dflt) const {
    const json* v = find({name});
    if (!v) return dflt;
    if (v->is_array() && !v->empty() && (*v)[0].is_number_integer()) return (*v)[0].get<int64_t>();
    if (v->is_number_integer()) return v->get<int64_t>();
    throw InputError(
        concat(origin_, ": field '", name, "' must be an integer or a list of integers"));
  }

  const std::string& origin() const { return origin_; }

 private:
  const json& j_;
  std::string origin_;
};

void check_activation(const std::string& act, const std::string& field, const std::string& origin) {
  static const char* kSupported[] = {"gelu_new", "gelu", "gelu_pytorch_tanh", "gelu_fast", "relu",
                                     "silu",     "swish"};
  for (const char* s : kSupported)
    if (act == s) return;
  throw InputError(
      concat(origin, ": unsupported ", field, " '", act,
             "'; supported: gelu_new, gelu, gelu_pytorch_tanh, gelu_fast, relu, silu, swish"));
}

Gpt2Config parse_gpt2(const Fields& f) {
  Gpt2Config c;
  c.vocab_size = f.positive({"vocab_size"}, std::nullopt);
  c.n_positions = f.positive({"n_positions", "max_position_embeddings"}, c.n_positions);
  c.n_embd = f.positive({"n_embd", "hidden_size"}, std::nullopt);
  c.n_layer = f.positive({"n_layer", "num_hidden_layers"}, std::nullopt);
  c.n_head = f.positive({"n_head", "num_attention_heads"}, std::nullopt);
  if (f.find({"n_inner"})) c.n_inner = f.positive({"n_inner"}, std::nullopt);
  c.activation_function = f.string({"activation_function"}, c.activation_function);
  check_activation(c.activation_function, "activation_function", f.origin());
  c.layer_norm_epsilon = f.number({"layer_norm_epsilon"}, c.layer_norm_epsilon);
  c.scale_attn_weights = f.boolean({"scale_attn_weights"}, c.scale_attn_weights);
  c.scale_attn_by_inverse_layer_idx = f.boolean({"scale_attn_by_inverse_layer_idx"}, false);
  c.reorder_and_upcast_attn = f.boolean({"reorder_and_upcast_attn"}, false);
  c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, true);
  c.bos_token_id = f.token_id("bos_token_id", c.bos_token_id);
  c.eos_token_id = f.token_id("eos_token_id", c.eos_token_id);
  if (c.n_embd % c.n_head != 0)
    throw InputError(
        concat(f.origin(), ": n_head=", c.n_head, " does not divide n_embd=", c.n_embd));
  return c;
}

// A rope number that must be finite and above a bound (>= when `inclusive`); the message names the
// field in the rope dict.
double rope_number(const Fields& s, const char* field, double dflt, double bound, bool inclusive,
                   const std::string& rope_type) {
  const double v = s.number({field}, dflt);
  if (!std::isfinite(v) || (inclusive ? v < bound : v <= bound))
    throw InputError(concat(s.origin(), ": rope ", rope_type, " needs '", field, "' ",
                            inclusive ? ">= " : "> ", bound, ", got ", v));
  return v;
}

double required_rope_number(const Fields& s, const char* field, double bound, bool inclusive,
                            const std::string& rope_type) {
  if (!s.find({field}))
    throw InputError(concat(s.origin(), ": rope ", rope_type, " needs '", field, "' (missing)"));
  return rope_number(s, field, 0.0, bound, inclusive, rope_type);
}

// longrope's short_factor / long_factor: one positive divisor per rotated frequency.
std::vector<double> rope_factor_list(const Fields& s, const char* field, int64_t n) {
  const json* v = s.find({field});
  if (!v) throw InputError(concat(s.origin(), ": rope longrope needs '", field, "' (missing)"));
  if (!v->is_array())
    throw InputError(concat(s.origin(), ": field '", field, "' must be a list of numbers"));
  if (static_cast<int64_t>(v->size()) != n)
    throw InputError(concat(s.origin(), ": field '", field, "' must have head_dim / 2 = ", n,
                            " entries, got ", v->size()));
  std::vector<double> out;
  out.reserve(n);
  for (const json& x : *v) {
    if (!x.is_number() || !std::isfinite(x.get<double>()) || !(x.get<double>() > 0))
      throw InputError(
          concat(s.origin(), ": field '", field, "' must hold positive numbers, got ", x.dump()));
    out.push_back(x.get<double>());
  }
  return out;
}

// RoPE as transformers resolves it (RotaryEmbeddingConfigMixin.standardize_rope_params and the
// _compute_*_parameters functions of modeling_rope_utils.py). head_dim and max_position_embeddings
// are the model's, parsed before.
RopeConfig parse_rope(const json& root, const Fields& f, int64_t head_dim,
                      int64_t max_position_embeddings) {
  RopeConfig r;
  r.rope_theta = f.number({"rope_theta"}, r.rope_theta);
  // transformers v5 folds rope_theta and rope_scaling into rope_parameters; v4 files have
  // rope_scaling (with "type" or "rope_type"). Accept both. When a file has both, a non-empty
  // rope_scaling wins, as in both versions (v4 does not know rope_parameters; v5's
  // convert_rope_params_to_dict takes `rope_scaling or rope_parameters`).
  const json* scaling = nullptr;
  const char* scaling_key = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (!it->is_object())
      throw InputError(concat(f.origin(), ": field '", key, "' must be an object"));
    if (scaling && it->empty()) continue;
    scaling = &*it;
    scaling_key = key;
  }
  const json empty = json::object();
  const Fields s(scaling ? *scaling : empty,
                 concat(f.origin(), " (", scaling_key ? scaling_key : "", ")"));
  // Llama, Mistral and Qwen2 rotate the whole head (their apply_rotary_pos_emb has no pass-through
  // part), so transformers cannot run a smaller rotary width for them.
  for (const Fields* where : {&f, &s}) {
    const double p = where->number({"partial_rotary_factor"}, 1.0);
    if (p != 1.0)
      throw InputError(concat(where->origin(), ": field 'partial_rotary_factor' is ", p,
                              "; only 1.0 is supported (llama, mistral and qwen2 rotate the whole "
                              "head)"));
  }
  r.rope_type = s.string({"rope_type", "type"}, "default");
  r.rope_theta = s.number({"rope_theta"}, r.rope_theta);
  if (!std::isfinite(r.rope_theta) || !(r.rope_theta > 0))
    throw InputError(
        concat(f.origin(), ": field 'rope_theta' must be a positive number, got ", r.rope_theta));
  const std::string& t = r.rope_type;
  if (t == "default") return r;
  if (t != "linear" && t != "dynamic" && t != "yarn" && t != "longrope" && t != "llama3")
    throw InputError(concat(f.origin(), ": unsupported rope_type '", t,
                            "'; supported: default, linear, dynamic, yarn, longrope, llama3"));
  if (t == "llama3" || t == "yarn" || t == "longrope") {
    const bool top = f.find({"original_max_position_embeddings"}) != nullptr;
    const Fields& where = top ? f : s;
    r.original_max_position_embeddings =
        where.find({"original_max_position_embeddings"})
            ? where.positive({"original_max_position_embeddings"}, std::nullopt)
            : max_position_embeddings;
  }
  if (t == "longrope") {
    if (r.original_max_position_embeddings < 2)
      throw InputError(concat(f.origin(),
                              ": rope longrope needs original_max_position_embeddings "
                              "> 1 (its log divides), got ",
                              r.original_max_position_embeddings));
    // factor only feeds the default attention factor; HF derives it from the two contexts.
    r.factor = s.find({"factor"}) ? rope_number(s, "factor", 0.0, 0.0, false, t)
                                  : static_cast<double>(max_position_embeddings) /
                                        static_cast<double>(r.original_max_position_embeddings);
    if (s.find({"attention_factor"}))
      r.attention_factor = rope_number(s, "attention_factor", 0.0, 0.0, false, t);
    r.short_factor = rope_factor_list(s, "short_factor", head_dim / 2);
    r.long_factor = rope_factor_list(s, "long_factor", head_dim / 2);
    return r;
  }
  r.factor = required_rope_number(s, "factor", 1.0, true, t);
  if (t == "dynamic" && head_dim <= 2)
    throw InputError(concat(f.origin(), ": rope dynamic needs head_dim > 2, got ", head_dim));
  if (t == "llama3") {
    r.low_freq_factor = s.number({"low_freq_factor"}, r.low_freq_factor);
    r.high_freq_factor = s.number({"high_freq_factor"}, r.high_freq_factor);
    if (!(r.high_freq_factor > r.low_freq_factor))
      throw InputError(
          concat(f.origin(), ": rope llama3 needs high_freq_factor > low_freq_factor"));
  }
  if (t == "yarn") {
    if (r.rope_theta == 1.0)
      throw InputError(concat(f.origin(), ": rope yarn needs 'rope_theta' != 1 (its log divides)"));
    if (s.find({"attention_factor"}))
      r.attention_factor = rope_number(s, "attention_factor", 0.0, 0.0, false, t);
    r.beta_fast = rope_number(s, "beta_fast", r.beta_fast, 0.0, false, t);
    r.beta_slow = rope_number(s, "beta_slow", r.beta_slow, 0.0, false, t);
    if (s.find({"mscale"})) r.mscale = rope_number(s, "mscale", 0.0, 0.0, true, t);
    if (s.find({"mscale_all_dim"}))
      r.mscale_all_dim = rope_number(s, "mscale_all_dim", 0.0, 0.0, true, t);
    r.truncate = s.boolean({"truncate"}, r.truncate);
  }
  return r;
}

LlamaConfig parse_llama(Arch arch, const json& root, const Fields& f) {
  LlamaConfig c;
  c.arch = arch;
  // HF defaults that differ per family.
  if (arch == Arch::kMistral) {
    c.intermediate_size = 14336;
    c.max_position_embeddings = 4096 * 32;
    c.sliding_window = 4096;
  } else if (arch == Arch::kQwen2) {
    c.vocab_size = 151936;
    c.intermediate_size = 22016;
    c.max_position_embeddings = 32768;
    c.sliding_window = 4096;
  }
  c.vocab_size = f.positive({"vocab_size"}, std::nullopt);
  c.hidden_size = f.positive({"hidden_size"}, std::nullopt);
  c.intermediate_size = f.positive({"intermediate_size"}, std::nullopt);
  c.num_hidden_layers = f.positive({"num_hidden_layers"}, std::nullopt);
  c.num_attention_heads = f.positive({"num_attention_heads"}, std::nullopt);
  c.num_key_value_heads = f.positive({"num_key_value_heads"}, c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw InputError(concat(f.origin(), ": num_key_value_heads=", c.num_key_value_heads,
                            " does not divide num_attention_heads=", c.num_attention_heads));
  if (f.find({"head_dim"})) {
    c.head_dim = f.positive({"head_dim"}, std::nullopt);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(concat(f.origin(), ": num_attention_heads=", c.num_attention_heads,
                              " does not divide hidden_size=", c.hidden_size));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0)
    throw InputError(concat(f.origin(), ": head_dim=", c.head_dim, " must be even for RoPE"));
  c.hidden_act = f.string({"hidden_act"}, c.hidden_act);
  check_activation(c.hidden_act, "hidden_act", f.origin());
  c.max_position_embeddings = f.positive({"max_position_embeddings"}, c.max_position_embeddings);
  c.rms_norm_eps = f.number({"rms_norm_eps"}, c.rms_norm_eps);
  c.rope = parse_rope(root, f, c.head_dim, c.max_position_embeddings);
  c.tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
  // Only Llama reads attention_bias / mlp_bias. Transformers' Mistral has no biases and Qwen2
  // always has q/k/v biases only, whatever those fields say, so the weights we expect match the
  // checkpoint (and config_to_json, which writes them for Llama only, round-trips).
  if (arch == Arch::kLlama) {
    c.attention_bias = f.boolean({"attention_bias"}, false);
    c.mlp_bias = f.boolean({"mlp_bias"}, false);
  }
  c.qkv_bias = arch == Arch::kQwen2 ? true : c.attention_bias;
  c.o_bias = arch == Arch::kQwen2 ? false : c.attention_bias;
  if (arch == Arch::kMistral) {
    const json* w = f.find({"sliding_window"});
    c.sliding_window =
        w ? std::optional<int64_t>(f.positive({"sliding_window"}, std::nullopt)) : std::nullopt;
    if (!root.count("sliding_window")) c.sliding_window = 4096;
  } else if (arch == Arch::kQwen2) {
    c.use_sliding_window = f.boolean({"use_sliding_window"}, false);
    c.sliding_window =
        f.find({"sliding_window"}) ? f.positive({"sliding_window"}, std::nullopt) : 4096;
    c.max_window_layers = f.integer({"max_window_layers"}, 28);
  } else {
    c.sliding_window = std::nullopt;
  }
  c.bos_token_id = f.token_id("bos_token_id", arch == Arch::kQwen2 ? 151643 : 1);
  c.eos_token_id = f.token_id("eos_token_id", arch == Arch::kQwen2 ? 151643 : 2);
  return c;
}

}  // namespace

std::optional<int64_t> LlamaConfig::window_for_layer(int64_t layer) const {
  if (arch == Arch::kMistral) return sliding_window;
  if (arch == Arch::kQwen2 && use_sliding_window && layer >= max_window_layers)
    return sliding_window;
  return std::nullopt;
}

int64_t ModelConfig::vocab_size() const {
  return arch == Arch::kGpt2 ? gpt2.vocab_size : llama.vocab_size;
}
int64_t ModelConfig::hidden_size() const {
  return arch == Arch::kGpt2 ? gpt2.n_embd : llama.hidden_size;
}
int64_t ModelConfig::num_layers() const {
  return arch == Arch::kGpt2 ? gpt2.n_layer : llama.num_hidden_layers;
}
int64_t ModelConfig::max_positions() const {
  if (arch == Arch::kGpt2) return gpt2.n_positions;
  if (llama.rope.rope_type != "dynamic") return llama.max_position_embeddings;
  const double n =
      std::floor(llama.rope.factor * static_cast<double>(llama.max_position_embeddings));
  return n >= 2147483647.0 ? int64_t{2147483647} : static_cast<int64_t>(n);
}
bool ModelConfig::tie_word_embeddings() const {
  return arch == Arch::kGpt2 ? gpt2.tie_word_embeddings : llama.tie_word_embeddings;
}

ModelConfig parse_config(const std::string& text, const std::string& origin) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
    throw InputError(concat(origin, ": not valid JSON (", e.what(), ")"));
  }
  if (!root.is_object()) throw InputError(concat(origin, ": expected a JSON object"));
  Fields f(root, origin);
  const json* mt = f.find({"model_type"});
  if (!mt)
    throw InputError(concat(
        origin, ": missing required field 'model_type' (supported: gpt2, llama, mistral, qwen2)"));
  if (!mt->is_string()) throw InputError(concat(origin, ": field 'model_type' must be a string"));
  ModelConfig c;
  c.model_type = mt->get<std::string>();
  c.arch = parse_arch(c.model_type, origin);
  if (c.arch == Arch::kGpt2) {
    c.gpt2 = parse_gpt2(f);
  } else {
    c.llama = parse_llama(c.arch, root, f);
  }
  return c;
}

ModelConfig load_config(const std::string& path) {
  return parse_config(read_text_file(path, kMaxConfigBytes, "config.json"), path);
}

namespace {

// rope_scaling as transformers v4 writes it (with rope_type), every resolved field explicit.
json rope_to_json(const RopeConfig& r) {
  if (r.rope_type == "default") return nullptr;
  json s = {{"rope_type", r.rope_type}, {"factor", r.factor}};
  const std::string& t = r.rope_type;
  if (t == "llama3" || t == "yarn" || t == "longrope")
    s["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (t == "llama3") {
    s["low_freq_factor"] = r.low_freq_factor;
    s["high_freq_factor"] = r.high_freq_factor;
  }
  if ((t == "yarn" || t == "longrope") && r.attention_factor)
    s["attention_factor"] = *r.attention_factor;
  if (t == "yarn") {
    s["beta_fast"] = r.beta_fast;
    s["beta_slow"] = r.beta_slow;
    if (r.mscale) s["mscale"] = *r.mscale;
    if (r.mscale_all_dim) s["mscale_all_dim"] = *r.mscale_all_dim;
    s["truncate"] = r.truncate;
  }
  if (t == "longrope") {
    s["short_factor"] = r.short_factor;
    s["long_factor"] = r.long_factor;
  }
  return s;
}

}  // namespace

std::string config_to_json(const ModelConfig& c) {
  json j;
  j["model_type"] = c.model_type;
  if (c.arch == Arch::kGpt2) {
    const Gpt2Config& g = c.gpt2;
    j["architectures"] = {"GPT2LMHeadModel"};
    j["vocab_size"] = g.vocab_size;
    j["n_positions"] = g.n_positions;
    j["n_embd"] = g.n_embd;
    j["n_layer"] = g.n_layer;
    j["n_head"] = g.n_head;
    j["n_inner"] = g.n_inner ? json(*g.n_inner) : json(nullptr);
    j["activation_function"] = g.activation_function;
    j["layer_norm_epsilon"] = g.layer_norm_epsilon;
    j["resid_pdrop"] = 0.1;
    j["embd_pdrop"] = 0.1;
    j["attn_pdrop"] = 0.1;
    j["initializer_range"] = 0.02;
    j["scale_attn_weights"] = g.scale_attn_weights;
    j["scale_attn_by_inverse_layer_idx"] = g.scale_attn_by_inverse_layer_idx;
    j["reorder_and_upcast_attn"] = g.reorder_and_upcast_attn;
    j["tie_word_embeddings"] = g.tie_word_embeddings;
    j["bos_token_id"] = g.bos_token_id;
    j["eos_token_id"] = g.eos_token_id;
  } else {
    const LlamaConfig& l = c.llama;
    static const char* kArch[] = {"", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};
    j["architectures"] = {kArch[static_cast<int>(c.arch)]};
    j["vocab_size"] = l.vocab_size;
    j["hidden_size"] = l.hidden_size;
    j["intermediate_size"] = l.intermediate_size;
    j["num_hidden_layers"] = l.num_hidden_layers;
    j["num_attention_heads"] = l.num_attention_heads;
    j["num_key_value_heads"] = l.num_key_value_heads;
    j["head_dim"] = l.head_dim;
    j["hidden_act"] = l.hidden_act;
    j["max_position_embeddings"] = l.max_position_embeddings;
    j["rms_norm_eps"] = l.rms_norm_eps;
    j["rope_theta"] = l.rope.rope_theta;
    j["rope_scaling"] = rope_to_json(l.rope);
    j["tie_word_embeddings"] = l.tie_word_embeddings;
    j["initializer_range"] = 0.02;
    j["bos_token_id"] = l.bos_token_id;
    j["eos_token_id"] = l.eos_token_id;
    if (c.arch == Arch::kLlama) {
      j["attention_bias"] = l.attention_bias;
      j["mlp_bias"] = l.mlp_bias;
    } else if (c.arch == Arch::kMistral) {
      j["sliding_window"] = l.sliding_window ? json(*l.sliding_window) : json(nullptr);
    } else {
      j["use_sliding_window"] = l.use_sliding_window;
      j["sliding_window"] = l.sliding_window ? json(*l.sliding_window) : json(nullptr);
      j["max_window_layers"] = l.max_window_layers;
    }
  }
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

}  // namespace actcap
