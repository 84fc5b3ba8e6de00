// The length-dependent RoPE tables at their thresholds, and the attention factors, against the
// formulas (transformers' modeling_rope_utils.py) in double. End-to-end exactness against HF's
// semantics is the parity tests' job (tests/python/test_parity.py).
#include <gtest/gtest.h>

#include <cmath>

#include "models/parts/rope.h"

using namespace actcap;

namespace {

RopeConfig rope_of(const std::string& type, double factor) {
  RopeConfig r;
  r.rope_type = type;
  r.factor = factor;
  return r;
}

// 1 / (divisor_i * theta ** (2i / d)) in double.
std::vector<double> expected(double theta, int64_t d, const std::vector<double>& divisors) {
  std::vector<double> out;
  for (int64_t i = 0; i < d / 2; ++i)
    out.push_back(1.0 / (divisors[i] * std::pow(theta, 2.0 * static_cast<double>(i) / d)));
  return out;
}

void expect_near_rel(const at::Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  auto g = got.to(at::kDouble).contiguous();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(g.data_ptr<double>()[i] / want[i], 1.0, 1e-6) << "frequency " << i;
}

}  // namespace

TEST(Rope, DynamicKeepsTheTableWithinTheContextAndStretchesPastIt) {
  const int64_t d = 16, max_pos = 32;
  Rope plain(rope_of("default", 1.0), d, max_pos);
  Rope dynamic(rope_of("dynamic", 2.0), d, max_pos);
  EXPECT_TRUE(at::equal(dynamic.inv_freq(1), plain.inv_freq(1)));
  EXPECT_TRUE(at::equal(dynamic.inv_freq(max_pos), plain.inv_freq(max_pos)));
  for (int64_t T : {max_pos + 1, int64_t{64}}) {
    const double stretch = 2.0 * T / max_pos - 1.0;
    const double base = 10000.0 * std::pow(stretch, static_cast<double>(d) / (d - 2));
    expect_near_rel(dynamic.inv_freq(T), expected(base, d, std::vector<double>(d / 2, 1.0)));
  }
  EXPECT_EQ(dynamic.attention_factor(), 1.0);
}

TEST(Rope, LongropeTakesLongFactorsPastTheOriginalContext) {
  RopeConfig r = rope_of("longrope", 4.0);
  r.original_max_position_embeddings = 16;
  r.short_factor = {1.0, 1.1, 1.2, 1.3};
  r.long_factor = {2.0, 3.0, 5.0, 8.0};
  Rope rope(r, 8, 64);
  expect_near_rel(rope.inv_freq(16), expected(10000.0, 8, r.short_factor));
  expect_near_rel(rope.inv_freq(17), expected(10000.0, 8, r.long_factor));
  EXPECT_DOUBLE_EQ(rope.attention_factor(), std::sqrt(1 + std::log(4.0) / std::log(16.0)));
  r.attention_factor = 1.3;
  EXPECT_EQ(Rope(r, 8, 64).attention_factor(), 1.3);
  r.attention_factor.reset();
  r.factor = 1.0;  // no stretch: no attention scaling
  EXPECT_EQ(Rope(r, 8, 64).attention_factor(), 1.0);
}

TEST(Rope, YarnAttentionFactorAndScaledCosSin) {
  RopeConfig r = rope_of("yarn", 40.0);
  r.original_max_position_embeddings = 64;
  EXPECT_DOUBLE_EQ(Rope(r, 16, 256).attention_factor(), 0.1 * std::log(40.0) + 1);
  r.mscale = 0.707;
  EXPECT_DOUBLE_EQ(Rope(r, 16, 256).attention_factor(), 0.1 * std::log(40.0) + 1);  // needs both
  r.mscale_all_dim = 1.0;
  EXPECT_DOUBLE_EQ(Rope(r, 16, 256).attention_factor(),
                   (0.1 * 0.707 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1));
  r.attention_factor = 0.5;
  Rope rope(r, 16, 256);
  ForwardState st;
  st.seq = 5;
  st.positions = at::arange(5, at::kLong);
  const auto& cos_sin = rope.cos_sin(st);
  auto emb = st.positions.to(at::kFloat).unsqueeze(1) * rope.inv_freq(5).unsqueeze(0);
  emb = at::cat({emb, emb}, -1);
  EXPECT_TRUE(at::allclose(cos_sin[0], emb.cos() * 0.5));
  EXPECT_TRUE(at::allclose(cos_sin[1], emb.sin() * 0.5));
  EXPECT_EQ(&rope.cos_sin(st), &cos_sin);  // computed once per forward
}

// Partial rotary (GPT-NeoX, Phi): the first rotary-dim features of each head rotate as a head of
// that width would; the rest pass through unchanged.
TEST(Rope, PartialRotaryRotatesTheLeadingFeaturesOnly) {
  RopeConfig r;
  Rope partial(r, 8, 64), full(r, 8, 64);
  ForwardState st, st_full;
  st.seq = st_full.seq = 5;
  st.positions = st_full.positions = at::arange(5, at::kLong);
  at::Tensor x = at::randn({2, 3, 5, 12});
  at::Tensor y = partial.apply(x, st);
  at::Tensor lead = full.apply(x.narrow(-1, 0, 8).contiguous(), st_full);
  EXPECT_TRUE(at::equal(y.narrow(-1, 0, 8), lead));
  EXPECT_TRUE(at::equal(y.narrow(-1, 8, 4), x.narrow(-1, 8, 4)));
  EXPECT_FALSE(at::allclose(y.narrow(-1, 0, 8), x.narrow(-1, 0, 8)));
}

// GPT-J's interleaved pairs: features (2i, 2i + 1) rotate as one complex number by position x
// inv_freq[i] (rotate_every_two), the features past the rotary width pass through; against the
// formula in double. And the same bits as the halves' rotation applied to the pairs laid out as
// halves (evens first, then odds), then laid back: only the layout differs.
TEST(Rope, InterleavedPairsRotateEachPairAsAComplexNumber) {
  RopeConfig r;
  const int64_t T = 6, R = 8;
  Rope pairs(r, R, 64, false, RopePairs::kInterleaved), halves(r, R, 64);
  ForwardState st, st_h;
  st.seq = st_h.seq = T;
  st.positions = st_h.positions = at::arange(T, at::kLong);
  at::Tensor x = at::randn({2, 3, T, 12});
  at::Tensor y = pairs.apply(x, st);
  EXPECT_TRUE(at::equal(y.narrow(-1, R, 4), x.narrow(-1, R, 4)));
  auto xd = x.to(at::kDouble), yd = y.to(at::kDouble);
  for (int64_t i = 0; i < R / 2; ++i) {
    const double inv = 1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / R);
    auto angle = at::arange(T, at::kDouble).view({1, 1, T}) * inv;
    auto a = xd.select(-1, 2 * i), b = xd.select(-1, 2 * i + 1);
    EXPECT_TRUE(at::allclose(yd.select(-1, 2 * i), a * angle.cos() - b * angle.sin(), 1e-5, 1e-5));
    EXPECT_TRUE(
        at::allclose(yd.select(-1, 2 * i + 1), b * angle.cos() + a * angle.sin(), 1e-5, 1e-5));
  }
  auto lead = x.narrow(-1, 0, R);
  auto as_halves = at::cat({lead.slice(-1, 0, R, 2), lead.slice(-1, 1, R, 2)}, -1).contiguous();
  auto h = halves.apply(as_halves, st_h);
  auto back = at::stack({h.narrow(-1, 0, R / 2), h.narrow(-1, R / 2, R / 2)}, -1).flatten(-2);
  EXPECT_TRUE(at::equal(y.narrow(-1, 0, R), back));
}
