// compare_tensors / compare_split (actcap/compare.h): bit for bit, or within a tolerance for a run
// on another kind of device; run_repro_on (actcap/repro.h): the reproduction over named devices.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "actcap/compare.h"
#include "actcap/error.h"
#include "actcap/repro.h"

using namespace actcap;

TEST(Compare, EqualTensorsAreBitIdenticalWithNoDifference) {
  const at::Tensor a = at::arange(12, at::kFloat).reshape({3, 4}) - 5.0;
  const CompareRow r = compare_tensors("p", a, a.clone(), 0.0);
  EXPECT_TRUE(r.equal);
  EXPECT_TRUE(r.within_tolerance);
  EXPECT_EQ(r.max_abs_diff, 0.0);
  EXPECT_EQ(r.rel_rms, 0.0);
  EXPECT_EQ(r.max_abs_reference, 6.0);
  EXPECT_EQ(r.reference_xxh3, r.split_xxh3);
}

// A difference of 1e-6 of the largest magnitude: outside tolerance 0 (bit for bit), within 1e-5,
// outside 1e-7; the figures are the differences themselves.
TEST(Compare, ToleranceIsAFractionOfTheLargestMagnitude) {
  const at::Tensor a = at::full({100}, 2.0, at::kDouble);
  at::Tensor b = a.clone();
  b[7] = 2.0 + 2e-6;
  const CompareRow exact = compare_tensors("p", a, b, 0.0);
  EXPECT_FALSE(exact.equal);
  EXPECT_FALSE(exact.within_tolerance);
  EXPECT_NEAR(exact.max_abs_diff, 2e-6, 1e-15);
  EXPECT_NEAR(exact.rel_rms, 2e-6 / std::sqrt(400.0), 1e-15);
  EXPECT_NE(exact.reference_xxh3, exact.split_xxh3);
  EXPECT_TRUE(compare_tensors("p", a, b, 1e-5).within_tolerance);
  EXPECT_FALSE(compare_tensors("p", a, b, 1e-7).within_tolerance);
  EXPECT_FALSE(compare_tensors("p", a, b, 1e-5).equal);
}

// The same infinity on both sides (masked attention scores) is no difference; a NaN on one side
// never passes, whatever the tolerance; integer tensors and shapes compare exactly.
TEST(Compare, InfinitiesNaNsIntegersAndShapes) {
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor a = at::tensor({1.0, -inf, 3.0}, at::kFloat);
  at::Tensor b = a.clone();
  b[2] = 3.0 + 1e-6;
  const CompareRow masked = compare_tensors("scores", a, b, 1e-5);
  EXPECT_TRUE(std::isfinite(masked.max_abs_diff));
  EXPECT_EQ(masked.max_abs_reference, 3.0);
  EXPECT_TRUE(masked.within_tolerance);
  at::Tensor n = a.clone();
  n[0] = std::nan("");
  EXPECT_FALSE(compare_tensors("p", a, n, 0.5).within_tolerance);
  const at::Tensor i = at::arange(4, at::kLong);
  EXPECT_TRUE(compare_tensors("ids", i, i.clone(), 0.0).within_tolerance);
  const CompareRow ints = compare_tensors("ids", i, i + 1, 0.5);
  EXPECT_FALSE(ints.within_tolerance);
  EXPECT_EQ(ints.max_abs_diff, 1.0);
  EXPECT_FALSE(compare_tensors("p", a, a.reshape({3, 1}), 0.5).within_tolerance);
}

TEST(Compare, SplitReportCountsAndRefusesABadTolerance) {
  auto m = Model::load("demo");
  const Batch batch =
      Batch::from_sequences({{1, 2, 3, 4}}, m->config().vocab_size, m->config().max_positions());
  SplitOptions split;
  for (int i = 0; i < 3; ++i) split.devices.push_back(DeviceId::virtual_cpu(i));
  const CompareReport r = compare_split(*m, batch, {"transformer.h.*"}, split, 1e-4);
  EXPECT_EQ(r.tolerance, 1e-4);
  EXPECT_TRUE(r.equal());
  EXPECT_EQ(r.bit_identical(), static_cast<int64_t>(r.rows.size()));
  for (double bad : {-1.0, 1.5, std::nan(""), std::numeric_limits<double>::infinity()})
    EXPECT_THROW(compare_split(*m, batch, {"transformer.h.*"}, split, bad), InputError);
}

// The reproduction over named devices gives what the counts give: the naive capture corrupted, the
// clone and SafeCapturer exact, on each device list; a device this machine lacks is refused first.
TEST(Compare, ReproOnNamedDevices) {
  const std::vector<ReproResult> named = run_repro_on(
      {{DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1), DeviceId::virtual_cpu(2)}});
  const std::vector<ReproResult> counted = run_repro({3});
  ASSERT_EQ(named.size(), 4u);
  ASSERT_EQ(counted.size(), 4u);
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(named[i].name, counted[i].name);
    EXPECT_EQ(named[i].mismatched, counted[i].mismatched) << named[i].name;
    EXPECT_EQ(named[i].device_list, "cpu:0,cpu:1,cpu:2");
    EXPECT_EQ(named[i].devices, 3);
  }
  EXPECT_GT(named[0].mismatched, 0);  // naive
  EXPECT_EQ(named[3].mismatched, 0);  // safe
  EXPECT_THROW(run_repro_on({{DeviceId::cuda(63)}}), InputError);
  EXPECT_THROW(run_repro_on({{}}), InputError);
}
