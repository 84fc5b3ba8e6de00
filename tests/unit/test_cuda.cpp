// The CUDA side of the execution model (docs/execution.md), run where a GPU is: the device hash on
// the GPU against the host's, capture on cuda:0 (overlapped, delayed, blocking) against the CPU and
// against itself, rows gathered on the GPU, mixed cuda + virtual CPU maps, the reproduction on the
// GPU. Skipped without a CUDA device; under the GPU check kit (ACTCAP_REQUIRE_CUDA=1) a missing
// device is a failure instead.
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "actcap/capture.h"
#include "actcap/compare.h"
#include "actcap/error.h"
#include "actcap/hash.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/repro.h"
#include "capture/pending_copy.h"
#include "executor/device_hash.h"
#include "executor/fault_delay.h"
#include "executor/streams.h"
#include "tiny_models.h"

using namespace actcap;

namespace {

int cuda_devices() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return 0;
  return static_cast<int>(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount());
}

bool cuda_required() {
  const char* v = std::getenv("ACTCAP_REQUIRE_CUDA");
  return v && std::string(v) == "1";
}

// f32 GEMMs in IEEE float32: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (set in NVIDIA's NGC images) makes
// LibTorch start with TF32 on, which rounds inputs to 10 bits of mantissa and would put every
// comparison with the CPU outside kTolerance; LibTorch's switch is turned off here (cuBLAS's own
// NVIDIA_TF32_OVERRIDE=1 cannot be undone in-process: the kit reports it).
#define NEED_CUDA()                                                                        \
  do {                                                                                     \
    if (cuda_devices() == 0) {                                                             \
      if (cuda_required()) FAIL() << "ACTCAP_REQUIRE_CUDA=1 and no CUDA device is usable"; \
      GTEST_SKIP() << "no CUDA device";                                                    \
    }                                                                                      \
    at::globalContext().setAllowTF32CuBLAS(false);                                         \
  } while (0)

// f32 on the GPU against the CPU: the kernels sum in other orders.
constexpr double kTolerance = 1e-4;

std::unique_ptr<Model> model(int64_t layers = 6) { return test::tiny_gpt2(layers); }
Batch batch(const Model& m) { return test::padded_batch(m); }

void place_all_on_gpu(Model& m, const std::string& faults = "",
                      uint64_t window = uint64_t{256} << 20) {
  ExecutionOptions o;
  o.stage_device.assign(m.stages().size(), DeviceId::cuda(0));
  o.async_faults = parse_async_faults(faults);
  o.copy_window_bytes = window;
  m.place(o);
}

struct Captured {
  at::Tensor logits;                         // on the host
  std::map<std::string, at::Tensor> points;  // every block output, on the host
  // The same rows copied by a hook in the same forwards (clone inside the hook, on the block's
  // stream): what the capture must equal bit for bit, whatever the GPU's kernels round to.
  std::map<std::string, at::Tensor> truth;
  int64_t not_landed_at_fence = 0;
};

// The rows a capture keeps of `b`'s [batch * seq] rows: every real token, no padding.
at::Tensor real_rows(const Batch& b) {
  std::vector<int64_t> real;
  for (int64_t s = 0; s < b.size(); ++s)
    for (int64_t t = 0; t < b.lengths[s]; ++t) real.push_back(s * b.ids.size(1) + t);
  return at::tensor(real, at::kLong);
}

Captured capture(Model& m, int forwards = 1) {
  const Batch b = batch(m);
  const at::Tensor index = real_rows(b);
  std::map<std::string, std::vector<at::Tensor>> truth;
  auto hook =
      m.register_forward_hook("transformer.h.*", [&](const HookContext& c, const at::Tensor& t) {
        truth[c.point].push_back(t.flatten(0, 1).index_select(0, index.to(t.device())));
      });
  SafeCapturer cap(m, CaptureOptions{{"transformer.h.*"}});
  Captured out;
  for (int i = 0; i < forwards; ++i) out.logits = cap.run(b).to(at::kCPU);
  hook.remove();
  out.not_landed_at_fence = cap.fence();
  for (const PointInfo& p : cap.plan()) out.points[p.name] = cap.get(p.name);
  for (auto& [point, parts] : truth) out.truth[point] = at::cat(parts, 0).to(at::kCPU);
  return out;
}

// Every capture equals the rows its own forwards produced, bit for bit.
void expect_exact(const Captured& c, const std::string& label) {
  ASSERT_EQ(c.points.size(), c.truth.size()) << label;
  for (const auto& [point, rows] : c.truth) {
    const at::Tensor& got = c.points.at(point);
    EXPECT_TRUE(got.device().is_cpu()) << label << " " << point;
    EXPECT_TRUE(got.sizes() == rows.sizes() && at::equal(got, rows)) << label << " " << point;
  }
}

}  // namespace

TEST(Cuda, DeviceHashOnTheGpuEqualsTheHostsHash) {
  NEED_CUDA();
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong, at::kByte})
    for (const int64_t n : {0, 1, 7, 1000, 4097}) {
      const at::Tensor host = (at::rand({n}, at::kDouble) * 200).to(dtype);
      const at::Tensor gpu = host.to(c10::Device(c10::kCUDA, 0));
      EXPECT_EQ(device_hash_value(gpu), device_hash_value(host)) << dtype << " " << n;
      if (n == 0) continue;
      at::Tensor damaged = host.clone();
      damaged.view({-1}).view(at::kByte).narrow(0, 0, 1).bitwise_xor_(1);  // one bit of one word
      EXPECT_NE(device_hash_value(damaged.to(gpu.device())), device_hash_value(host))
          << dtype << " " << n;
    }
}

// An accelerator lane's capture copy is checked on the host as soon as it landed, by the lane's
// check worker (the device hash recomputed over the host bytes, the fingerprint taken), not later
// by the reader: the fence finds the check done and agrees with hashing the bytes itself.
TEST(Cuda, ACaptureCopyIsCheckedOnTheHostAsSoonAsItLanded) {
  NEED_CUDA();
  const DeviceId gpu = DeviceId::cuda(0);
  WorkQueue compute(gpu), capture(gpu), check(gpu, WorkQueue::Kind::kWorker);
  CopyWindow window;
  window.limit = uint64_t{256} << 20;
  const LaneContext lane{gpu, &compute, &capture, &window, nullptr, &check};
  const at::Tensor t = at::randn({4, 33, 77}, at::kFloat).to(gpu.c10());
  SnapshotCopy copy;
  compute.wait_for_caller();  // t was made on the current stream
  compute.submit(
      [&] { copy = snapshot_copy_on_lane(lane, t, nullptr, at::kBFloat16, /*fingerprint=*/true); });
  ASSERT_NE(copy.pending, nullptr);
  copy.pending->checked.synchronize();
  EXPECT_TRUE(copy.pending->host_checked);
  const uint64_t fingerprint = finish_copy(*copy.pending, copy.rows, true, "t", 0);
  EXPECT_EQ(fingerprint, tensor_chunked_xxh3(copy.rows));
  EXPECT_EQ(copy.pending->recomputed, device_hash_value(t.to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(copy.rows, t.to(at::kBFloat16).cpu()));
  compute.synchronize();
  capture.synchronize();
}

// H5 on the GPU: the logits with every block captured equal those without, bit for bit; the
// captures (padded rows gathered on the GPU, copied asynchronously to pinned memory, checked
// against the device hash) are the CPU's within f32 rounding.
TEST(Cuda, CaptureOnTheGpuMatchesTheCpuAndDoesNotChangeTheRun) {
  NEED_CUDA();
  auto m = model();
  const Captured cpu = capture(*m);
  expect_exact(cpu, "cpu");
  place_all_on_gpu(*m);
  const at::Tensor plain = m->forward(batch(*m)).to(at::kCPU);
  const Captured gpu = capture(*m);
  expect_exact(gpu, "cuda:0");
  EXPECT_TRUE(at::equal(plain, gpu.logits));
  EXPECT_TRUE(compare_tensors("logits", cpu.logits, gpu.logits, kTolerance).within_tolerance);
  for (const auto& [point, rows] : cpu.points) {
    const CompareRow r = compare_tensors(point, rows, gpu.points.at(point), kTolerance);
    EXPECT_TRUE(r.within_tolerance)
        << point << ": max |diff| " << r.max_abs_diff << " of " << r.max_abs_reference;
  }
  int64_t copies = 0;
  for (const DeviceStats& s : m->device_stats()) copies += s.capture_copies;
  EXPECT_EQ(copies, m->config().num_hidden_layers);  // on the capture stream, not in the hooks
}

// Delayed copies, a window of one copy (back-pressure), a delayed stage, a window of 0 (each copy
// waited for in its hook), each over two forwards (the rows' index reused on the GPU): every
// capture is exactly what its forward produced.
TEST(Cuda, EveryCopyModeOnTheGpuIsExact) {
  NEED_CUDA();
  auto m = model();
  place_all_on_gpu(*m);
  const Captured base = capture(*m);
  expect_exact(base, "default");
  struct Mode {
    std::string faults;
    uint64_t window;
  };
  for (const Mode& mode : {Mode{"delay:copy:20", uint64_t{256} << 20}, Mode{"", 1},
                           Mode{"delay:stage:10", 1}, Mode{"", 0}}) {
    place_all_on_gpu(*m, mode.faults, mode.window);
    const Captured got = capture(*m, 2);
    const std::string label = mode.faults + " window " + std::to_string(mode.window);
    expect_exact(got, label);
    for (const auto& [point, rows] : base.points)
      EXPECT_EQ(got.points.at(point).size(0), 2 * rows.size(0)) << label << " " << point;
    // Other streams may pick other kernels: the same forward within rounding, not bit for bit.
    EXPECT_TRUE(compare_tensors("logits", base.logits, got.logits, kTolerance).within_tolerance)
        << label;
    if (mode.window == 0) {
      EXPECT_EQ(got.not_landed_at_fence, 0) << "blocking copies";
    }
  }
}

// The capture fences matter on the GPU too. With the copy reading the borrowed block output itself
// (nofence:capture-source) and the copy stream held back on the device (delay:copy spins a kernel
// on it), the forward overwrites the ping-pong arena slots first: without fingerprints the
// captures are wrong; with them the host's recomputation of the device hash stops the read, naming
// the point. The same map with its fences and the same delay is exact
// (EveryCopyModeOnTheGpuIsExact).
TEST(Cuda, ARemovedCaptureFenceGivesWrongCapturesAndTheDeviceHashCatchesIt) {
  NEED_CUDA();
  ASSERT_TRUE(fault_delay_on_device(c10::Device(c10::kCUDA, 0)))
      << "no spin kernel (at::cuda::sleep) found in this LibTorch: delay faults would only delay "
         "the host";
  auto m = model();
  m->set_bare_ref_policy(BareRefPolicy::kOff);  // the unsafe copy keeps the borrowed tensor
  place_all_on_gpu(*m, "delay:copy:30;nofence:capture-source");
  int wrong = 0;
  {
    const Batch b = batch(*m);
    std::map<std::string, at::Tensor> want;
    const at::Tensor index = real_rows(b);
    auto hook =
        m->register_forward_hook("transformer.h.*", [&](const HookContext& c, const at::Tensor& t) {
          want[c.point] = t.flatten(0, 1).index_select(0, index.to(t.device())).to(at::kCPU);
        });
    CaptureOptions o{{"transformer.h.*"}};
    o.fingerprint = false;  // the raw bytes: what an unfenced copy really read
    {
      // A first forward makes the allocations (pinned blocks, arena) that could otherwise make the
      // host wait for the whole device in the middle of the measured one.
      SafeCapturer warm(*m, o);
      warm.run(b);
      warm.fence();
    }
    SafeCapturer cap(*m, o);
    cap.run(b);
    hook.remove();
    cap.fence();
    for (const Snapshot& s : cap.snapshots()) {
      ASSERT_EQ(s.rows.sizes(), want.at(s.point).sizes()) << s.point;
      if (!at::equal(s.rows, want.at(s.point))) {
        ++wrong;
        std::cout << "unfenced capture differs from its forward: " << s.point << "\n";
      }
    }
  }
  EXPECT_GT(wrong, 0) << "every unfenced capture still equal: the device delay did not hold the "
                         "copy stream back";
  SafeCapturer checked(*m, CaptureOptions{{"transformer.h.*"}});
  checked.run(batch(*m));
  try {
    checked.fence();
    ADD_FAILURE() << "the device hash did not catch captures read after the forward changed them";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h."), std::string::npos) << e.what();
  }
}

// One GPU plus CPU offload, as accelerate maps a model that does not fit: host <-> device
// boundary transfers through pinned staging, verified, and the result the CPU's within rounding.
TEST(Cuda, MixedGpuAndCpuMapsMatchTheCpu) {
  NEED_CUDA();
  auto m = model();
  for (const std::vector<DeviceId>& devices :
       {std::vector<DeviceId>{DeviceId::cuda(0)},
        std::vector<DeviceId>{DeviceId::cuda(0), DeviceId::virtual_cpu(1)},
        std::vector<DeviceId>{DeviceId::virtual_cpu(1), DeviceId::cuda(0)},
        std::vector<DeviceId>{DeviceId::cuda(0), DeviceId::virtual_cpu(1),
                              DeviceId::virtual_cpu(2)}}) {
    SplitOptions split;
    split.devices = devices;
    split.strategy = PlanStrategy::kBalanced;
    const CompareReport r = compare_split(*m, batch(*m), {"**", "**:input"}, split, kTolerance);
    std::string map, worst;
    for (const DeviceId& d : devices) map += " " + d.str();
    for (const CompareRow& row : r.rows)
      if (!row.within_tolerance) worst += " " + row.point;
    EXPECT_TRUE(r.equal()) << "devices" << map << ": outside the tolerance:" << worst;
  }
}

// The seed's reproduction on the GPU: a kept reference reads reused arena memory, the guard stops
// it, clone() and SafeCapturer are exact (bit for bit: the truth is copied on the same GPU).
TEST(Cuda, ReproOnTheGpu) {
  NEED_CUDA();
  for (const auto& devices : {std::vector<DeviceId>{DeviceId::cuda(0)},
                              std::vector<DeviceId>{DeviceId::cuda(0), DeviceId::virtual_cpu(1),
                                                    DeviceId::virtual_cpu(2)}}) {
    std::map<std::string, ReproResult> by;
    for (const ReproResult& r : run_repro_on({devices})) by[r.name] = r;
    EXPECT_GT(by.at("naive").mismatched, 0) << by.at("naive").device_list;
    EXPECT_FALSE(by.at("guarded").error.empty());
    EXPECT_EQ(by.at("clone").mismatched, 0) << by.at("clone").error;
    EXPECT_EQ(by.at("safe").mismatched, 0) << by.at("safe").error;
  }
}
