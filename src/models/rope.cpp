// Each table is computed with the operations, order and float32 rounding of transformers'
// _compute_*_parameters, so that cos/sin match HF bit for bit on the same LibTorch: a relative
// error of 1e-7 in inv_freq is already ~1e-5 in the angle at position 100.
#include "models/rope.h"

#include <algorithm>
#include <cmath>

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

Rope::Rope(const RopeConfig& config, int64_t head_dim, int64_t max_position_embeddings)
    : c_(config), dim_(head_dim), max_positions_(max_position_embeddings) {
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

void Rope::prepare(ForwardState& st) const {
  at::Tensor inv = inv_freq(st.seq).to(st.positions.device());
  auto freqs = st.positions.to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  auto emb = at::cat({freqs, freqs}, -1);  // [T, head_dim]
  st.rope_cos = emb.cos();
  st.rope_sin = emb.sin();
  if (attention_factor_ != 1.0) {  // LlamaRotaryEmbedding: cos/sin * attention_scaling
    st.rope_cos.mul_(attention_factor_);
    st.rope_sin.mul_(attention_factor_);
  }
}

}  // namespace actcap
