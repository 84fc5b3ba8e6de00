// 16-bit compute (LoadOptions::compute_dtype, --compute-dtype): the forward runs in bfloat16 on
// every architecture, splits over devices bit-identically, stays within bfloat16's rounding of the
// float32 forward, sizes its arena and scratch in the compute dtype, and refuses float16 where the
// kernels lack it. The parity against the independent float32 reference is
// tests/python/test_compute_dtype.py.
#include <gtest/gtest.h>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/planner.h"
#include "models/module.h"
#include "tiny_models.h"
#include "util/strings.h"

using namespace actcap;
using test::every_architecture;

namespace {

std::unique_ptr<Model> tiny(const std::string& arch, at::ScalarType stored,
                            at::ScalarType compute) {
  LoadOptions o;
  o.compute_dtype = compute;
  return test::tiny_model(arch, stored, o);
}

Batch batch_of(const Model& m) {
  return Batch::from_sequences({{1, 5, 9, 2, 7, 3, 11, 4}, {8, 6, 10}}, m.config().vocab_size,
                               m.config().max_positions());
}

// ||a - b|| / ||b|| over the real tokens (row 1 has 3 of 8 positions).
double rms_rel(const at::Tensor& a, const at::Tensor& b) {
  auto real = [](const at::Tensor& t) {
    return at::cat({t[0], t[1].slice(0, 0, 3)}).to(at::kDouble);
  };
  const at::Tensor x = real(a), y = real(b);
  return (x - y).norm().item<double>() / y.norm().item<double>();
}

bool cpu_has_half_gemm() {
  try {
    auto a = at::ones({2, 2}, at::kHalf);
    at::mm(a, a);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

class ComputeDtypeEveryArch : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(ComputeDtypeEveryArch, Bf16RunsInBf16AndStaysWithinItsRoundingOfF32) {
  auto f32 = tiny(GetParam(), at::kBFloat16, at::kFloat);
  auto bf16 = tiny(GetParam(), at::kBFloat16, at::kBFloat16);
  const Batch b = batch_of(*bf16);
  const at::Tensor want = f32->forward(b), got = bf16->forward(b);
  EXPECT_EQ(want.scalar_type(), at::kFloat);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  const double err = rms_rel(got, want);
  // bfloat16 keeps 8 significant bits (2^-9 relative rounding per operation); through the tiny
  // presets' layers of random weights the logits stay within 5e-2 (measured up to ~3e-2), and
  // differ at all: the forward really ran in 16 bits.
  EXPECT_LT(err, 5e-2);
  EXPECT_GT(err, 1e-4);
  // Every floating point is declared, captured and stored in the compute dtype under "keep",
  // except DeepSeek's routers, float32 as in transformers.
  auto float32_router = [&](const std::string& name) {
    return starts_with(GetParam(), "deepseek") && ends_with(name, ".mlp.gate");
  };
  for (const PointInfo& p : bf16->points())
    EXPECT_TRUE(p.dtype == (float32_router(p.name) ? at::kFloat : at::kBFloat16) ||
                p.dtype == at::kLong)
        << p.name;
  SafeCapturer cap(*bf16, CaptureOptions{{"**"}});
  cap.run(b);
  int64_t routers = 0;
  for (const PointInfo& p : cap.plan()) {
    if (!at::isFloatingType(p.dtype)) continue;
    const at::ScalarType want = float32_router(p.name) ? at::kFloat : at::kBFloat16;
    routers += want == at::kFloat;
    EXPECT_EQ(p.dtype, want) << p.name;
    EXPECT_EQ(cap.get(p.name).scalar_type(), want) << p.name;
  }
  if (starts_with(GetParam(), "deepseek")) {
    EXPECT_EQ(routers, 3);  // the tiny preset's sparse layers
  }
}

TEST_P(ComputeDtypeEveryArch, Bf16SplitOverThreeDevicesEqualsOneDevice) {
  // Float32-stored weights: every matrix is converted into the lanes' scratch as it runs.
  auto m = tiny(GetParam(), at::kFloat, at::kBFloat16);
  const Batch b = batch_of(*m);
  const at::Tensor one = m->forward(b).clone();
  test::place_balanced(*m, b, 3);
  const at::Tensor three = m->forward(b);
  EXPECT_EQ(three.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(one, three));
}

INSTANTIATE_TEST_SUITE_P(Archs, ComputeDtypeEveryArch, ::testing::ValuesIn(every_architecture()));

TEST(ComputeDtype, ConvertsMatricesIntoTheScratchAndVectorsFresh) {
  ForwardState st;
  st.compute = at::kBFloat16;
  st.widen_scratch = at::empty({64}, at::kBFloat16);
  const at::Tensor m = at::randn({8, 4}).t();  // a transposed float32 view (GPT-2's Conv1D)
  const at::Tensor w = st.in_compute(m);
  EXPECT_EQ(w.data_ptr(), st.widen_scratch.data_ptr());
  EXPECT_EQ(w.strides(), m.strides());
  EXPECT_TRUE(at::equal(w, m.to(at::kBFloat16)));
  const at::Tensor v = at::randn({4});
  const at::Tensor vb = st.in_compute(v);
  EXPECT_NE(vb.data_ptr(), st.widen_scratch.data_ptr());  // a bias must not evict the matrix
  EXPECT_TRUE(at::equal(vb, v.to(at::kBFloat16)));
  const at::Tensor same = at::randn({2, 2}).to(at::kBFloat16);
  EXPECT_EQ(st.in_compute(same).data_ptr(), same.data_ptr());
  EXPECT_FALSE(st.in_compute(at::Tensor()).defined());
}

TEST(ComputeDtype, PlannerSizesWorkspaceAndScratchInTheComputeDtype) {
  auto f32 = tiny("llama", at::kFloat, at::kFloat);
  auto bf16 = tiny("llama", at::kFloat, at::kBFloat16);
  auto kept = tiny("llama", at::kBFloat16, at::kBFloat16);
  const auto a = f32->stage_costs(2, 8), b = bf16->stage_costs(2, 8), k = kept->stage_costs(2, 8);
  for (size_t i = 0; i < a.size(); ++i) {
    if (f32->stage_kind(i) != StageKind::kBlock) continue;
    // float32 weights under bf16 compute: half the activations plus a bf16 copy of the largest
    // matrix; bf16 weights: no scratch at all.
    EXPECT_GT(b[i].workspace_bytes, a[i].workspace_bytes / 2);
    EXPECT_EQ(k[i].workspace_bytes * 2, a[i].workspace_bytes);
    EXPECT_LT(k[i].workspace_bytes, b[i].workspace_bytes);
  }
  // The arena really is bf16: a forward reserves half the float32 arena.
  const Batch batch = batch_of(*f32);
  f32->forward(batch);
  kept->forward(batch);
  EXPECT_EQ(kept->device_stats().at(0).arena_bytes * 2, f32->device_stats().at(0).arena_bytes);
}

TEST(ComputeDtype, F16IsRefusedWhereTheKernelsLackIt) {
  auto m = tiny("gpt2", at::kFloat, at::kHalf);
  const Batch b = batch_of(*m);
  if (cpu_has_half_gemm()) {  // a LibTorch with float16 CPU kernels (2.x): it runs
    EXPECT_EQ(m->forward(b).scalar_type(), at::kHalf);
    return;
  }
  for (int devices : {0, 3}) {
    try {
      if (devices > 0) test::place_balanced(*m, b, devices);
      m->forward(b);
      FAIL() << "f16 compute ran on the CPU";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("f16 compute is not supported on cpu"),
                std::string::npos)
          << e.what();
      ASSERT_EQ(e.settings().size(), 1u);
      EXPECT_EQ(e.settings()[0], "compute_dtype");
    }
  }
}

TEST(ComputeDtype, NamesParseAndBadOnesSayTheChoices) {
  EXPECT_EQ(parse_compute_dtype("f32"), at::kFloat);
  EXPECT_EQ(parse_compute_dtype("bf16"), at::kBFloat16);
  EXPECT_EQ(parse_compute_dtype("f16"), at::kHalf);
  EXPECT_STREQ(compute_dtype_name(at::kBFloat16), "bf16");
  try {
    parse_compute_dtype("fp8");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("f32, bf16, f16"), std::string::npos) << e.what();
  }
  ModelConfig c = preset_config("gpt2", "tiny");
  LoadOptions o;
  o.compute_dtype = at::kDouble;
  EXPECT_THROW(Model::from_tensors(c, random_weights(c, 1, at::kFloat), "x", o), InputError);
}
