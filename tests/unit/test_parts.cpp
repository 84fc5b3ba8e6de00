// The parts architectures compose (models/parts/) and the weight source they are built from,
// checked against the formulas transformers writes (modeling_llama.py, modeling_gemma.py,
// modeling_gemma2.py), not against each other.
#include <gtest/gtest.h>

#include <cmath>

#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "models/parts/attention.h"
#include "models/parts/norm.h"
#include "models/weights.h"

using namespace actcap;

namespace {

at::Tensor call(Module& m, const at::Tensor& x) {
  ForwardState st;
  st.seq = x.size(1);
  return m.call(x, st);
}

// softmax(q k^T * scale + mask) v over [B, H, T, D], heads already repeated, no cap.
at::Tensor manual_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, double scale, std::optional<double> cap) {
  auto s = at::matmul(q, k.transpose(-1, -2)) * scale;
  if (cap) s = at::tanh(s / *cap) * *cap;
  auto p = at::softmax(s + mask, -1);
  auto ctx = at::matmul(p, v);  // [B, H, T, D]
  return ctx.transpose(1, 2).reshape({q.size(0), q.size(2), q.size(1) * q.size(3)});
}

}  // namespace

TEST(Parts, RmsNormUnitOffsetScalesByOnePlusTheWeight) {
  at::Tensor w = at::randn({8}) * 0.1, x = at::randn({2, 3, 8});
  RMSNormOptions o;
  o.unit_offset = true;
  RMSNorm gemma("n", w, 1e-6, o), llama("n", w + 1.0, 1e-6);
  EXPECT_TRUE(at::allclose(call(gemma, x), call(llama, x), 1e-6, 1e-6));
  auto expect = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * (w + 1.0);
  EXPECT_TRUE(at::allclose(call(gemma, x), expect, 1e-5, 1e-6));
}

TEST(Parts, PerHeadRmsNormNormalisesEachHeadAndNamesItsShape) {
  at::Tensor w = at::randn({4}), x = at::randn({2, 3, 5, 4});  // [B, T, heads, head_dim]
  RMSNormOptions o;
  o.heads = 5;
  RMSNorm norm("q_norm", w, 1e-6, o);
  EXPECT_EQ(norm.output_point().shape, (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(norm.input_point().shape, (std::vector<int64_t>{5, 4}));
  auto expect = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * w;
  EXPECT_TRUE(at::allclose(call(norm, x), expect, 1e-5, 1e-6));
}

TEST(Parts, AttentionMatchesTheFormulaWithAndWithoutSoftCapping) {
  const int64_t B = 2, H = 4, Hkv = 2, T = 6, D = 8;
  at::Tensor q = at::randn({B, H, T, D}) * 3, k = at::randn({B, Hkv, T, D}) * 3,
             v = at::randn({B, Hkv, T, D});
  at::Tensor mask = at::full({T, T}, -std::numeric_limits<float>::infinity()).triu_(1);
  // repeat_kv: kv head j serves query heads j * H/Hkv ... (j + 1) * H/Hkv - 1
  at::Tensor kk = k.repeat_interleave(H / Hkv, 1), vv = v.repeat_interleave(H / Hkv, 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  EXPECT_TRUE(at::allclose(attention(q, k, v, mask, scale),
                           manual_attention(q, kk, vv, mask, scale, std::nullopt), 1e-5, 1e-5));
  auto capped = attention(q, k, v, mask, scale, 2.0);
  EXPECT_TRUE(at::allclose(capped, manual_attention(q, kk, vv, mask, scale, 2.0), 1e-5, 1e-5));
  EXPECT_FALSE(at::allclose(capped, attention(q, k, v, mask, scale), 1e-3, 1e-3));
}

TEST(WeightSource, PrefixesAliasesShapesAndUnusedTensors) {
  std::map<std::string, at::Tensor> t = {
      {"h.0.w", at::ones({2, 3})},  // stored without the "transformer." prefix
      {"lm_head.weight", at::ones({4, 2}, at::kHalf)},
      {"extra", at::ones({1})},
      {"h.0.attn.bias", at::ones({1})},
  };
  WeightSource w = WeightSource::load(t, "ckpt");
  w.alias_prefix("transformer.", "");
  w.ignore_suffix(".attn.bias");
  WeightSource layer = w.pp("transformer").pp("h").pp(0);
  EXPECT_EQ(layer.path(), "transformer.h.0");
  at::Tensor a = layer.get("w", {2, 3}, Init::kMatrix, Layout::kTransposed);
  EXPECT_EQ(a.sizes(), (at::IntArrayRef{3, 2}));
  at::Tensor e =
      w.get("model.embed.weight", {4, 2}, Init::kMatrix, Layout::kAsStored, {"lm_head.weight"});
  EXPECT_EQ(e.scalar_type(), at::kFloat);
  ASSERT_EQ(w.specs().size(), 2u);
  EXPECT_EQ(w.specs()[0].name, "transformer.h.0.w");
  try {
    layer.get("w", {3, 2});
    FAIL() << "wrong shape accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what())
                  .find("ckpt: tensor h.0.w has shape [2, 3] but config.json "
                        "implies [3, 2]"),
              std::string::npos)
        << err.what();
  }
  try {
    layer.get("missing", {1});
    FAIL() << "missing tensor accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what())
                  .find("missing tensor transformer.h.0.missing (also looked for h.0.missing)"),
              std::string::npos)
        << err.what();
  }
  std::vector<std::string> warnings;
  set_diagnostic_sink([&](const std::string& m) { warnings.push_back(m); });
  w.warn_unused();
  set_diagnostic_sink(nullptr);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ignoring tensors the model does not use: extra"), std::string::npos);
  EXPECT_EQ(warnings[0].find("attn.bias"), std::string::npos);
}

TEST(WeightSource, RandomWeightsDependOnTheNameAndSeedOnly) {
  WeightSource a = WeightSource::random(5), b = WeightSource::random(5, at::kBFloat16);
  a.get("x.weight", {3, 4});
  a.get("x.bias", {4}, Init::kBias);
  b.get("x.bias", {4}, Init::kBias);  // asked in another order and stored as bf16
  b.get("x.weight", {3, 4});
  EXPECT_TRUE(at::equal(a.stored().at("x.weight").to(at::kBFloat16), b.stored().at("x.weight")));
  EXPECT_EQ(b.stored().at("x.weight").scalar_type(), at::kBFloat16);
  WeightSource g = WeightSource::random(5);
  at::Tensor gain = g.get("n.weight", {1000}, Init::kGain);
  EXPECT_NEAR(gain.mean().item<double>(), 1.0, 0.01);
  WeightSource s = WeightSource::shapes();
  s.get("big", {1 << 16, 1 << 10});  // 256 MiB, never touched
  EXPECT_TRUE(s.stored().empty());
}
