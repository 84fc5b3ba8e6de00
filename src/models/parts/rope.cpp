// Each table is computed with the operations, order and float32 rounding of transformers'
// _compute_*_parameters, so that cos/sin match HF bit for bit on the same LibTorch: a relative
// error of 1e-7 in inv_freq is already ~1e-5 in the angle at position 100.
#include "models/parts/rope.h"

#include <algorithm>
#include <cmath>

#include "models/config_reader.h"

namespace actcap {

namespace {

// arange(0, dim, 2) / dim in float32, the exponents of every table.
at::Tensor exponents(int64_t dim) {
  return at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<float>(dim);
}

at::Tensor default_inv_freq(double base, int64_t dim) {
  return 1.0 / at::pow(base, exponents(dim));
}

at::Tensor llama3_inv_freq(const RopeConfig& r, int64_t dim) {
  at::Tensor inv_freq = default_inv_freq(r.rope_theta, dim);
  const double old_len = static_cast<double>(r.original_max_position_embeddings);
  const double low_wavelen = old_len / r.low_freq_factor;
  const double high_wavelen = old_len / r.high_freq_factor;
  auto wavelen = 2 * M_PI / inv_freq;
  auto scaled = at::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
  auto smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

// YaRN's attention scale for a context stretched by `scale`.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_attention_factor(const RopeConfig& r) {
  if (r.attention_factor) return *r.attention_factor;
  // HF tests `if mscale and mscale_all_dim`: absent or 0 falls back to the plain formula.
  if (r.mscale && *r.mscale != 0 && r.mscale_all_dim && *r.mscale_all_dim != 0)
    return yarn_mscale(r.factor, *r.mscale) / yarn_mscale(r.factor, *r.mscale_all_dim);
  return yarn_mscale(r.factor, 1.0);
}

// NTK-by-parts: dims that rotate more than beta_fast times within the original context keep their
// frequency (extrapolation), dims rotating fewer than beta_slow times are divided by factor
// (interpolation), a linear ramp in between.
at::Tensor yarn_inv_freq(const RopeConfig& r, int64_t dim) {
  const double base = r.rope_theta;
  const double original = static_cast<double>(r.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI))) /
           (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // as HF: no division by zero
  auto ramp = at::clamp((at::arange(dim / 2, at::kFloat) - low) / (high - low), 0, 1);

  auto pos_freqs = at::pow(base, exponents(dim));
  auto extrapolation = 1.0 / pos_freqs;
  auto interpolation = 1.0 / (r.factor * pos_freqs);
  auto extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

at::Tensor longrope_inv_freq(const RopeConfig& r, const std::vector<double>& factors, int64_t dim) {
  auto ext = at::tensor(factors, at::kDouble).to(at::kFloat);  // HF: torch.tensor(list, float32)
  return 1.0 / (ext * at::pow(r.rope_theta, exponents(dim)));
}

double longrope_attention_factor(const RopeConfig& r) {
  if (r.attention_factor) return *r.attention_factor;
  if (r.factor <= 1.0) return 1.0;
  return std::sqrt(1 + std::log(r.factor) /
                           std::log(static_cast<double>(r.original_max_position_embeddings)));
}

}  // namespace

Rope::Rope(const RopeConfig& config, int64_t head_dim, int64_t max_position_embeddings,
           bool rotate_in_float32, RopePairs pairs)
    : c_(config),
      dim_(head_dim),
      max_positions_(max_position_embeddings),
      rotate_in_float32_(rotate_in_float32),
      pairs_(pairs) {
  const std::string& t = c_.rope_type;
  if (t == "linear") {
    inv_freq_ = default_inv_freq(c_.rope_theta, dim_) / c_.factor;
  } else if (t == "llama3") {
    inv_freq_ = llama3_inv_freq(c_, dim_);
  } else if (t == "dynamic") {
    // The table HF builds at init (seq_len = max_position_embeddings), in double arithmetic:
    // the base is unchanged up to rounding.
    const double len = static_cast<double>(max_positions_);
    const double base =
        c_.rope_theta * std::pow((c_.factor * len / len) - (c_.factor - 1),
                                 static_cast<double>(dim_) / static_cast<double>(dim_ - 2));
    inv_freq_ = default_inv_freq(base, dim_);
  } else if (t == "yarn") {
    inv_freq_ = yarn_inv_freq(c_, dim_);
    attention_factor_ = yarn_attention_factor(c_);
  } else if (t == "longrope") {
    inv_freq_ = longrope_inv_freq(c_, c_.short_factor, dim_);
    long_inv_freq_ = longrope_inv_freq(c_, c_.long_factor, dim_);
    attention_factor_ = longrope_attention_factor(c_);
  } else {
    inv_freq_ = default_inv_freq(c_.rope_theta, dim_);
  }
}

at::Tensor Rope::dynamic_inv_freq(int64_t seq_len) const {
  // HF's seq_len here is torch.max(position_ids) + 1, a 0-dim int64 tensor, so the new base is
  // float32 tensor arithmetic (not the double arithmetic of the init table).
  auto len = at::scalar_tensor(seq_len, at::kLong);
  auto stretch = (c_.factor * len / max_positions_ - (c_.factor - 1))
                     .pow(static_cast<double>(dim_) / static_cast<double>(dim_ - 2));
  auto base = c_.rope_theta * stretch;
  return 1.0 / at::pow(base, exponents(dim_));
}

at::Tensor Rope::inv_freq(int64_t seq_len) const {
  if (c_.rope_type == "dynamic" && seq_len > max_positions_) return dynamic_inv_freq(seq_len);
  if (c_.rope_type == "longrope" && seq_len > c_.original_max_position_embeddings)
    return long_inv_freq_;
  return inv_freq_;
}

at::Tensor Rope::forward_inv_freq(ForwardState& st) const {
  return inv_freq(st.rope_len > 0 ? st.rope_len : st.seq).to(st.positions.device());
}

const std::vector<at::Tensor>& Rope::cos_sin(ForwardState& st) const {
  return st.table(this, [&] {
    at::Tensor inv = forward_inv_freq(st);
    // [T, rotary dim], or [B, 1, T, rotary dim] for per-row positions (cached decoding).
    auto freqs = st.row_positions.defined()
                     ? (st.row_positions.to(at::kFloat).unsqueeze(-1) * inv).unsqueeze(1)
                     : st.positions.to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);
    auto emb = at::cat({freqs, freqs}, -1);
    at::Tensor cos = emb.cos(), sin = emb.sin();
    if (attention_factor_ != 1.0) {  // LlamaRotaryEmbedding: cos/sin * attention_scaling
      cos.mul_(attention_factor_);
      sin.mul_(attention_factor_);
    }
    // Computed in float32, used in the compute dtype (HF: cos.to(dtype=x.dtype)), or kept.
    if (st.compute != at::kFloat && !rotate_in_float32_)
      cos = cos.to(st.compute), sin = sin.to(st.compute);
    return std::vector<at::Tensor>{cos, sin};
  });
}

namespace {
// HF's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::cat({halves[1].neg(), halves[0]}, -1);
}

// GPT-J's rotate_every_two: each pair (x[2i], x[2i+1]) -> (-x[2i+1], x[2i]).
at::Tensor rotate_every_two(const at::Tensor& x) {
  const int64_t end = x.size(-1);
  auto even = x.slice(-1, 0, end, 2), odd = x.slice(-1, 1, end, 2);
  return at::stack({odd.neg(), even}, -1).flatten(-2);
}
}  // namespace

at::Tensor Rope::apply_complex(const at::Tensor& x, ForwardState& st) const {
  // Its own table (a second key for this Rope), built as DeepseekV2RotaryEmbedding builds it:
  // angles = (inv_freq [B, D/2, 1] @ positions [B, 1, T]).transpose(1, 2), then polar(1, angles)
  // times the attention factor, complex64 [B, 1, T, D/2]. The layout matters, not only the values:
  // the complex product below rounds as transformers' does only when it gets the same strides
  // (a transposed table sends both to torch's scalar kernel, whose products the compiler fuses;
  // a one-position decoding step to its vectorised one, which rounds each product).
  const at::Tensor& cis = st.table(reinterpret_cast<const char*>(this) + 1, [&] {
    at::Tensor inv = forward_inv_freq(st);
    at::Tensor pos = st.row_positions.defined() ? st.row_positions : st.positions.unsqueeze(0);
    at::Tensor freqs = at::matmul(inv.view({1, -1, 1}).expand({pos.size(0), -1, 1}),
                                  pos.to(at::kFloat).unsqueeze(1))
                           .transpose(1, 2);
    at::Tensor c = at::polar(at::ones_like(freqs), freqs) * attention_factor_;
    return std::vector<at::Tensor>{c.unsqueeze(1)};
  })[0];
  // apply_rotary_emb: view_as_complex(x.float().reshape(..., -1, 2)) * cis, back to real pairs.
  std::vector<int64_t> pairs = x.sizes().vec();
  pairs.back() /= 2;
  pairs.push_back(2);
  at::Tensor z = at::view_as_complex(x.to(at::kFloat).reshape(pairs));
  return at::view_as_real(z * cis).flatten(3).to(x.scalar_type());
}

at::Tensor Rope::apply(const at::Tensor& x, ForwardState& st) const {
  const std::vector<at::Tensor>* tables = &cos_sin(st);  // [T, rotary dim], over [B, heads]
  if (pairs_ == RopePairs::kInterleaved) {
    // GPT-J's tables: cos and sin of each pair's angle, repeated per feature of the pair
    // (repeat_interleave(2)); the same values as the halves' tables, laid out in pairs.
    const at::Tensor cos = (*tables)[0], sin = (*tables)[1];
    tables = &st.table(reinterpret_cast<const char*>(this) + 2, [&] {
      const int64_t half = dim_ / 2;
      return std::vector<at::Tensor>{cos.narrow(-1, 0, half).repeat_interleave(2, -1),
                                     sin.narrow(-1, 0, half).repeat_interleave(2, -1)};
    });
  }
  const auto& t = *tables;
  auto turn = pairs_ == RopePairs::kInterleaved ? rotate_every_two : rotate_half;
  auto rotate = [&](const at::Tensor& r) {
    if (r.scalar_type() == t[0].scalar_type()) return r * t[0] + turn(r) * t[1];
    // OLMo: a 16-bit r times float32 cos/sin promotes to float32; rounded once at the end.
    const at::Tensor f = r.to(at::kFloat);
    return (f * t[0] + turn(f) * t[1]).to(r.scalar_type());
  };
  if (x.size(-1) == dim_) return rotate(x);
  // Partial rotary: the first dim_ features rotate, the rest pass through (HF's
  // apply_rotary_pos_emb with rotary_ndims < head_dim).
  auto rot = x.narrow(-1, 0, dim_);
  auto pass = x.narrow(-1, dim_, x.size(-1) - dim_);
  return at::cat({rotate(rot), pass}, -1);
}

namespace {

// A rope number that must be finite and above a bound (>= when `inclusive`); the message names the
// field in the rope dict.
double rope_number(const ConfigReader& s, const char* field, double dflt, double bound,
                   bool inclusive, const std::string& rope_type) {
  const double v = s.number({field}, dflt);
  if (!std::isfinite(v) || (inclusive ? v < bound : v <= bound))
    throw InputError(concat(s.origin(), ": rope ", rope_type, " needs '", field, "' ",
                            inclusive ? ">= " : "> ", bound, ", got ", v));
  return v;
}

double required_rope_number(const ConfigReader& s, const char* field, double bound, bool inclusive,
                            const std::string& rope_type) {
  if (!s.find({field}))
    throw InputError(concat(s.origin(), ": rope ", rope_type, " needs '", field, "' (missing)"));
  return rope_number(s, field, 0.0, bound, inclusive, rope_type);
}

// longrope's short_factor / long_factor: one positive divisor per rotated frequency.
std::vector<double> rope_factor_list(const ConfigReader& s, const char* field, int64_t n) {
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

}  // namespace

// RoPE as transformers resolves it (RotaryEmbeddingConfigMixin.standardize_rope_params and the
// _compute_*_parameters functions of modeling_rope_utils.py). head_dim and max_position_embeddings
// are the model's, parsed before.
RopeConfig parse_rope(const ConfigReader& f, int64_t head_dim, int64_t max_position_embeddings,
                      double default_theta) {
  const json& root = f.root();
  RopeConfig r;
  r.rope_theta = f.number({"rope_theta"}, default_theta);
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
  const ConfigReader s(scaling ? *scaling : empty,
                       concat(f.origin(), " (", scaling_key ? scaling_key : "", ")"));
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
  // Any scaled type's: DeepSeek's attention scales its softmax by it.
  if (s.find({"mscale_all_dim"}))
    r.mscale_all_dim = rope_number(s, "mscale_all_dim", 0.0, 0.0, true, t);
  if (t == "llama3" || t == "yarn" || t == "longrope") {
    const bool top = f.find({"original_max_position_embeddings"}) != nullptr;
    const ConfigReader& where = top ? f : s;
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
    r.truncate = s.boolean({"truncate"}, r.truncate);
  }
  return r;
}

// rope_scaling as transformers v4 writes it (with rope_type), every resolved field explicit.
nlohmann::json rope_to_json(const RopeConfig& r) {
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
    s["truncate"] = r.truncate;
  }
  if (r.mscale_all_dim) s["mscale_all_dim"] = *r.mscale_all_dim;
  if (t == "longrope") {
    s["short_factor"] = r.short_factor;
    s["long_factor"] = r.long_factor;
  }
  return s;
}

}  // namespace actcap
