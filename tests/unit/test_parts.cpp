// The parts architectures compose (models/parts/) and the weight source they are built from,
// checked against the formulas transformers writes (modeling_llama.py, modeling_gemma.py,
// modeling_gemma2.py, modeling_mixtral.py), not against each other.
#include <gtest/gtest.h>

#include <cmath>

#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "models/parts/attention.h"
#include "models/parts/fp8.h"
#include "models/parts/moe.h"
#include "models/parts/mxfp4.h"
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

namespace {

// Self-attention of x through projections given as weights, no RoPE, causal.
at::Tensor attend(AttentionParts parts, int64_t heads, int64_t kv_heads, int64_t D,
                  AttentionShape::QkvLayout layout, const at::Tensor& x) {
  AttentionShape s;
  s.hidden = x.size(2), s.heads = heads, s.kv_heads = kv_heads, s.head_dim = D;
  s.scale = 1.0 / std::sqrt(static_cast<double>(D));
  s.qkv_layout = layout;
  Attention attn("attn", s, std::move(parts));
  ForwardState st;
  st.batch = x.size(0), st.seq = x.size(1);
  st.causal_bias = at::full({st.seq, st.seq}, -std::numeric_limits<float>::infinity()).triu_(1);
  return attn.call(x, st);
}

std::unique_ptr<Module> lin(const char* name, const at::Tensor& w) {
  return std::make_unique<Linear>(name, w, at::Tensor());
}

}  // namespace

// A fused projection computes what separate q, k and v projections compute, whether its rows are
// [q; k; v] with grouped-query sizes (Phi-3's qkv_proj) or [heads, 3, head_dim] (GPT-NeoX's
// query_key_value, modeling_gpt_neox.py: view(..., heads, 3 * head_size) then chunks of head_size).
TEST(Parts, FusedQkvLayoutsMatchSeparateProjections) {
  const int64_t W = 16, D = 4, T = 5;
  at::Tensor x = at::randn({2, T, W});
  for (int64_t kv : {4, 2}) {
    at::Tensor wq = at::randn({4 * D, W}), wk = at::randn({kv * D, W}), wv = at::randn({kv * D, W});
    at::Tensor wo = at::randn({W, 4 * D});
    AttentionParts sep;
    sep.q = lin("q", wq), sep.k = lin("k", wk), sep.v = lin("v", wv), sep.o = lin("o", wo);
    auto want = attend(std::move(sep), 4, kv, D, AttentionShape::QkvLayout::kStacked, x);
    AttentionParts stacked;
    stacked.qkv = lin("qkv", at::cat({wq, wk, wv}, 0)), stacked.o = lin("o", wo);
    EXPECT_TRUE(
        at::allclose(attend(std::move(stacked), 4, kv, D, AttentionShape::QkvLayout::kStacked, x),
                     want, 1e-4, 1e-5));
    if (kv != 4) continue;
    AttentionParts per_head;  // rows of head h: q_h, k_h, v_h
    per_head.qkv =
        lin("qkv", at::stack({wq.view({4, D, W}), wk.view({4, D, W}), wv.view({4, D, W})}, 1)
                       .reshape({12 * D, W}));
    per_head.o = lin("o", wo);
    EXPECT_TRUE(
        at::allclose(attend(std::move(per_head), 4, 4, D, AttentionShape::QkvLayout::kPerHead, x),
                     want, 1e-4, 1e-5));
  }
}

namespace {

// Every expert on every token, weighted by a dense routing matrix that is zero off the top k:
// the formula, with none of SparseMoe's grouping.
at::Tensor dense_moe(const at::Tensor& x, const at::Tensor& router,
                     const std::vector<ExpertWeights>& experts, int64_t k, bool normalize) {
  at::Tensor flat = x.reshape({-1, x.size(-1)});
  at::Tensor probs = at::softmax(at::linear(flat, router), -1);
  auto top = at::topk(probs, k, -1);
  at::Tensor w = std::get<0>(top);
  if (normalize) w = w / w.sum(-1, true);
  at::Tensor route = at::zeros_like(probs).scatter(1, std::get<1>(top), w);  // [N, E]
  at::Tensor out = at::zeros_like(flat);
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertWeights& m = experts[e];
    at::Tensor y = at::linear(
        at::silu(at::linear(flat, m.gate.dense)) * at::linear(flat, m.up.dense), m.down.dense);
    out = out + y * route.select(1, static_cast<int64_t>(e)).unsqueeze(1);
  }
  return out.view(x.sizes());
}

}  // namespace

TEST(Parts, SparseMoeEqualsEveryExpertWeightedByTheTopKRouting) {
  const int64_t H = 12, I = 20, E = 5, B = 3, T = 7;
  at::manual_seed(3);
  at::Tensor router = at::randn({E, H}), x = at::randn({B, T, H});
  std::vector<ExpertWeights> experts;
  for (int64_t e = 0; e < E; ++e)
    experts.push_back({at::randn({I, H}) * 0.3, at::randn({I, H}) * 0.3, at::randn({H, I}) * 0.3});
  for (int64_t k : {1, 2, 5}) {
    for (bool normalize : {true, false}) {
      SparseMoeOptions o;
      o.top_k = k;
      o.normalize_top_k = normalize;
      SparseMoe moe("mlp", H, std::make_unique<Linear>("mlp.gate", router, at::Tensor()), experts,
                    "silu", o);
      EXPECT_EQ(moe.output_point().shape, (std::vector<int64_t>{H}));
      at::Tensor got = call(moe, x);
      at::Tensor want = dense_moe(x, router, experts, k, normalize);
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5))
          << "k=" << k << " normalize=" << normalize << " max diff "
          << (got - want).abs().max().item<float>();
    }
  }
}

TEST(Parts, SparseMoeRouterIsAHookPointWithOneLogitPerExpert) {
  const int64_t H = 6, E = 4;
  std::vector<ExpertWeights> experts(
      E, ExpertWeights{at::randn({8, H}), at::randn({8, H}), at::randn({H, 8})});
  at::Tensor router = at::randn({E, H});
  SparseMoe moe("m.mlp", H, std::make_unique<Linear>("m.mlp.gate", router, at::Tensor()), experts,
                "silu", SparseMoeOptions{});
  std::vector<Module*> all;
  moe.collect(all);
  ASSERT_EQ(all.size(), 2u);  // the block and its router; the experts are no points
  EXPECT_EQ(all[1]->name(), "m.mlp.gate");
  EXPECT_EQ(all[1]->output_point().shape, (std::vector<int64_t>{E}));
  SparseMoeOptions too_many;
  too_many.top_k = E + 1;
  EXPECT_THROW(SparseMoe("m.mlp", H, std::make_unique<Linear>("m.mlp.gate", router, at::Tensor()),
                         experts, "silu", too_many),
               InputError);
}

TEST(Parts, Mxfp4DecodesTwoE2m1ValuesPerByteLowNibbleFirstTimesTheBlockScale) {
  // One row of 64 inputs: two blocks of 32 values (16 bytes each).
  at::Tensor blocks = at::zeros({1, 2, 16}, at::kByte), scales = at::empty({1, 2}, at::kByte);
  blocks[0][0][0] = 0x21;   // low nibble 1 (+0.5), high nibble 2 (+1.0)
  blocks[0][0][1] = 0xF7;   // low nibble 7 (+6.0), high nibble 15 (-6.0)
  blocks[0][1][15] = 0x9B;  // low nibble 11 (-1.5), high nibble 9 (-0.5)
  scales[0][0] = 128;       // 2^1
  scales[0][1] = 0;         // 2^-127: a float32 subnormal, still exact
  at::Tensor w = mxfp4_decode({blocks, scales}, at::kFloat);
  ASSERT_EQ(w.sizes(), (at::IntArrayRef{1, 64}));
  const float* v = w.data_ptr<float>();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_EQ(v[2], 12.0f);
  EXPECT_EQ(v[3], -12.0f);
  EXPECT_EQ(v[62], std::ldexp(-1.5f, -127));
  EXPECT_EQ(v[63], std::ldexp(-0.5f, -127));
  EXPECT_EQ(at::count_nonzero(w).item<int64_t>(), 6);
  // -0.0 (nibble 8) keeps its sign; bf16 holds every value exactly.
  blocks[0][0][0] = 0x08;
  at::Tensor b = mxfp4_decode({blocks, scales}, at::kBFloat16);
  EXPECT_TRUE(std::signbit(b[0][0].item<float>()));
  EXPECT_TRUE(at::equal(b.to(at::kFloat), mxfp4_decode({blocks, scales}, at::kFloat)));
}

TEST(Parts, Fp8E4m3CodesAndPartialBlocks) {
  const float* v = e4m3_values();
  EXPECT_EQ(v[0x00], 0.0f);
  EXPECT_TRUE(std::signbit(v[0x80]));        // -0
  EXPECT_EQ(v[0x01], std::ldexp(1.0f, -9));  // smallest subnormal: 1/8 * 2^-6
  EXPECT_EQ(v[0x07], 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(v[0x08], std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(v[0x38], 1.0f);                  // exponent 7 (the bias), mantissa 0
  EXPECT_EQ(v[0x3C], 1.5f);
  EXPECT_EQ(v[0x7E], 448.0f);  // largest: 1.75 * 2^8
  EXPECT_EQ(v[0xFE], -448.0f);
  EXPECT_TRUE(std::isnan(v[0x7F]) && std::isnan(v[0xFF]));
  // A [3, 5] matrix in blocks of [2, 3]: scales [2, 2], the last row and columns a partial block.
  at::Tensor codes = at::full({3, 5}, 0x38, at::kByte);  // every value 1
  codes[2][4] = 0xBC;                                    // -1.5
  at::Tensor scales = at::tensor({1.0f, 2.0f, 0.25f, 8.0f}).reshape({2, 2});
  for (auto decode : {&fp8_decode, &fp8_decode_bands}) {
    at::Tensor w = decode({codes, scales, 2, 3, at::kFloat}, at::kFloat, {});
    const float want[3][5] = {{1, 1, 1, 2, 2}, {1, 1, 1, 2, 2}, {0.25f, 0.25f, 0.25f, 8, -12}};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) EXPECT_EQ(w[i][j].item<float>(), want[i][j]) << i << "," << j;
    // One block for the whole matrix (weight_block_size null).
    at::Tensor one = decode({codes, at::full({1, 1}, 3.0f), 3, 5, at::kFloat}, at::kFloat, {});
    EXPECT_EQ(one[0][0].item<float>(), 3.0f);
    EXPECT_EQ(one[2][4].item<float>(), -4.5f);
  }
}

// The products rounded once to the checkpoint's dtype, then held in the compute dtype: the same
// values as decoding to that dtype at load and converting it (at::Tensor::to), from the CPU pass
// and from the banded ATen one, into the scratch when it fits.
TEST(Parts, Fp8DecodeRoundsOnceToTheCheckpointDtype) {
  at::manual_seed(5);
  const int64_t rows = 37, cols = 300;
  at::Tensor codes = at::randint(0, 256, {rows, cols}, at::kInt).to(at::kByte);
  codes.masked_fill_(codes.bitwise_and(0x7F).eq(0x7F), 0x38);  // no NaN codes
  at::Tensor scales = at::rand({(rows + 15) / 16, (cols + 127) / 128}) * 1e-3 + 1e-4;
  const float* v = e4m3_values();
  at::Tensor values = at::from_blob(const_cast<float*>(v), {256}, at::kFloat)
                          .index_select(0, codes.to(at::kLong).reshape(-1))
                          .view({rows, cols});
  at::Tensor full_scales = scales.repeat_interleave(16, 0)
                               .narrow(0, 0, rows)
                               .repeat_interleave(128, 1)
                               .narrow(1, 0, cols);
  at::Tensor exact = values * full_scales;  // float32
  for (at::ScalarType rounded : {at::kFloat, at::kBFloat16, at::kHalf}) {
    Fp8Matrix m{codes, scales, 16, 128, rounded};
    at::Tensor loaded = exact.to(rounded);  // what decoding at load holds
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      at::Tensor want = loaded.to(dtype);
      at::Tensor scratch = at::full({rows * cols + 7}, 5.0, dtype);
      at::Tensor a = fp8_decode(m, dtype, scratch), b = fp8_decode_bands(m, dtype);
      EXPECT_EQ(a.scalar_type(), dtype);
      EXPECT_EQ(a.data_ptr(), scratch.data_ptr());  // decoded into the scratch
      EXPECT_TRUE(at::equal(a, want)) << rounded << " -> " << dtype;
      EXPECT_TRUE(at::equal(b, want)) << rounded << " -> " << dtype << " (bands)";
    }
  }
  // The rounding bites: bf16 products are not the float32 ones.
  EXPECT_FALSE(at::equal(fp8_decode({codes, scales, 16, 128, at::kBFloat16}, at::kFloat), exact));
}

TEST(Parts, AttentionSinksTakeTheirShareAndAreDropped) {
  const int64_t B = 2, H = 4, T = 5, D = 8;
  at::manual_seed(11);
  at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, 2, T, D}), v = at::randn({B, 2, T, D});
  at::Tensor sinks = at::randn({H}) * 2;
  at::Tensor bias = at::full({T, T}, -INFINITY).triu(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  at::Tensor got = attention(q, k, v, bias, scale, std::nullopt, nullptr, nullptr, sinks);
  // The formula: exp(s_j) / (sum_j exp(s_j) + exp(sink)) over the visible keys.
  at::Tensor kk = k.repeat_interleave(2, 1), vv = v.repeat_interleave(2, 1);
  at::Tensor s = at::matmul(q, kk.transpose(-1, -2)) * scale + bias;
  at::Tensor e = (s - s.amax(-1, true)).exp();
  at::Tensor sink = (sinks.view({1, H, 1, 1}) - s.amax(-1, true)).exp();
  at::Tensor p = e / (e.sum(-1, true) + sink);
  at::Tensor want = at::matmul(p, vv).transpose(1, 2).reshape({B, T, H * D});
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<float>();
  at::Tensor plain = attention(q, k, v, bias, scale);
  EXPECT_GT((plain - got).abs().max().item<float>(), 1e-2);
}
