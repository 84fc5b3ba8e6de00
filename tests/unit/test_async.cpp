// The asynchronous execution model (src/executor/streams.h, docs/execution.md): work queues and
// markers; virtual devices that really run their stages and copies on their own threads; the delay
// faults that make the races deterministic, each removed fence producing wrong values and the
// fences making every capture exact; back-pressure of the copy window; the device-side hash.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/observer.h"
#include "actcap/planner.h"
#include "actcap/snapshot.h"
#include "capture/pending_copy.h"
#include "executor/device_hash.h"
#include "executor/fault_delay.h"
#include "executor/streams.h"
#include "models/arch/architecture.h"
#include "models/weights.h"
#include "tiny_models.h"

using namespace actcap;
using ::testing::HasSubstr;

#if defined(__SANITIZE_THREAD__)
#define ACTCAP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ACTCAP_TSAN 1
#endif
#endif

// The removed-fence tests race on purpose (that is what they show); ThreadSanitizer would rightly
// report them. Everything fenced runs under it.
#ifdef ACTCAP_TSAN
#define SKIP_DELIBERATE_RACE() GTEST_SKIP() << "races on purpose; not run under ThreadSanitizer"
#else
#define SKIP_DELIBERATE_RACE() (void)0
#endif

namespace {

// ---- queues and markers -------------------------------------------------------------------------

TEST(WorkQueue, VirtualDeviceRunsWorkInOrderOnItsOwnThread) {
  WorkQueue q(DeviceId::virtual_cpu(1));
  EXPECT_EQ(q.kind(), WorkQueue::Kind::kWorker);
  std::vector<int> order;
  std::thread::id ran_on;
  for (int i = 0; i < 50; ++i)
    q.submit([&, i] {
      order.push_back(i);
      ran_on = std::this_thread::get_id();
    });
  Marker m = q.record();
  m.synchronize();
  EXPECT_TRUE(m.query());
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(WorkQueue, AWaitOrdersWorkAcrossQueues) {
  WorkQueue a(DeviceId::virtual_cpu(0)), b(DeviceId::virtual_cpu(1));
  std::atomic<int> value{0};
  int seen = -1;
  a.submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    value = 7;
  });
  b.wait(a.record());
  b.submit([&] { seen = value.load(); });
  b.synchronize();
  EXPECT_EQ(seen, 7);
  // Without the wait the queues are independent: a's work can wait for b's.
  std::atomic<bool> flag{false};
  bool a_saw_b = false;
  a.submit([&] {
    for (int i = 0; i < 5000 && !flag; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    a_saw_b = flag;
  });
  b.submit([&] { flag = true; });
  a.synchronize();
  b.synchronize();
  EXPECT_TRUE(a_saw_b);
}

TEST(WorkQueue, AMarkerRecordedInsideItsOwnWorkIsComplete) {
  WorkQueue q(DeviceId::virtual_cpu(0));
  bool complete = false;
  q.submit([&] { complete = q.record().query() && q.on_worker(); });
  q.synchronize();
  EXPECT_TRUE(complete);
  EXPECT_FALSE(q.on_worker());
}

TEST(WorkQueue, AThrowThatEscapesIsRethrownBySynchronize) {
  WorkQueue q(DeviceId::virtual_cpu(0));
  q.submit([] { throw RunError("boom"); });
  EXPECT_THROW(q.synchronize(), RunError);
  EXPECT_NO_THROW(q.synchronize());  // reported once
}

TEST(WorkQueue, PlainCpuRunsWorkInline) {
  WorkQueue q(DeviceId::cpu());
  EXPECT_EQ(q.kind(), WorkQueue::Kind::kInline);
  bool ran = false;
  q.submit([&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_TRUE(q.record().query());
}

// An accelerator lane's check worker: a host thread working for a device of another kind (made
// here for cuda:0 without touching CUDA); only a worker may differ from the device's own kind.
TEST(WorkQueue, AHostWorkerForAnotherDeviceRunsOnItsOwnThreadAfterWhatItWaitsFor) {
  WorkQueue check(DeviceId::cuda(0), WorkQueue::Kind::kWorker), producer(DeviceId::virtual_cpu(1));
  EXPECT_EQ(check.kind(), WorkQueue::Kind::kWorker);
  std::atomic<int> landed{0};
  int seen = -1;
  std::thread::id ran_on;
  producer.submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    landed = 1;
  });
  const Marker m = producer.record();
  check.submit([&, m] {
    m.synchronize();
    seen = landed.load();
    ran_on = std::this_thread::get_id();
  });
  check.record().synchronize();
  EXPECT_EQ(seen, 1);
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_THROW(WorkQueue(DeviceId::cpu(), WorkQueue::Kind::kAccelerator), c10::Error);
  EXPECT_THROW(WorkQueue(DeviceId::virtual_cpu(0), WorkQueue::Kind::kInline), c10::Error);
}

// ---- the executor on virtual devices ------------------------------------------------------------

std::unique_ptr<Model> model(int64_t layers = 6) { return test::tiny_gpt2(layers); }
Batch batch(const Model& m) { return test::padded_batch(m); }

// Places the model over `n` virtual devices, balanced, with these faults (ACTCAP_FAULT syntax).
void place(Model& m, int n, const std::string& faults = "", uint64_t window = uint64_t{256} << 20) {
  const Batch b = batch(m);
  PlanRequest req;
  req.stages = m.stage_costs(b.size(), b.max_len());
  for (int i = 0; i < n; ++i) req.devices.push_back(DeviceId::virtual_cpu(i));
  req.strategy = PlanStrategy::kBalanced;
  ExecutionOptions o;
  o.stage_device = plan_devices(req).stage_device;
  o.async_faults = parse_async_faults(faults);
  o.copy_window_bytes = window;
  m.place(o);
}

// Every block output and the logits of one device, copied inside the hook: the truth.
struct Reference {
  std::map<std::string, at::Tensor> points;
  at::Tensor logits;
};
Reference reference(Model& m) {
  m.place(ExecutionOptions{});
  const Batch b = batch(m);
  std::vector<int64_t> real;  // the rows a capture keeps: every real token, no padding
  for (int64_t s = 0; s < b.size(); ++s)
    for (int64_t t = 0; t < b.lengths[s]; ++t) real.push_back(s * b.ids.size(1) + t);
  const at::Tensor index = at::tensor(real, at::kLong);
  Reference r;
  auto h =
      m.register_forward_hook("transformer.h.*", [&](const HookContext& c, const at::Tensor& t) {
        r.points[c.point] = t.flatten(0, 1).index_select(0, index);
      });
  r.logits = m.forward(b).clone();
  h.remove();
  return r;
}

// Runs a capture of every block output under `faults` over 3 virtual devices and counts the block
// outputs (and the logits) that differ from the reference.
struct Outcome {
  int wrong_points = 0;
  bool logits_equal = false;
};
Outcome captured(Model& m, const Reference& ref, const std::string& faults, int devices = 3) {
  place(m, devices, faults);
  CaptureOptions o{{"transformer.h.*"}};
  o.fingerprint = false;  // compare the raw bytes: an unfenced read is not to be caught here
  SafeCapturer cap(m, o);
  Outcome out;
  out.logits_equal = at::equal(cap.run(batch(m)), ref.logits);
  for (const Snapshot& s : cap.snapshots()) {
    const at::Tensor& want = ref.points.at(s.point);
    EXPECT_EQ(s.rows.sizes(), want.sizes()) << s.point;  // wrong values, never a wrong shape
    if (!at::equal(s.rows, want)) ++out.wrong_points;
  }
  return out;
}

TEST(AsyncExecutor, VirtualDevicesRunTheirStagesOnTheirOwnThreads) {
  auto m = model();
  place(*m, 3);
  struct Threads : Observer {
    std::map<std::string, std::set<std::thread::id>> by_device;
    std::thread::id begin_thread;
    void on_forward_begin(const ForwardBegin&) override {
      begin_thread = std::this_thread::get_id();
    }
    void on_stage_begin(const StageEvent& e) override {
      by_device[e.device.str()].insert(std::this_thread::get_id());
    }
  } threads;
  auto handle = m->attach_observer(threads, {});
  m->forward(batch(*m));
  handle.remove();
  ASSERT_EQ(threads.by_device.size(), 3u);
  std::set<std::thread::id> all;
  for (const auto& [device, ids] : threads.by_device) {
    EXPECT_EQ(ids.size(), 1u) << device;  // one compute thread per device
    EXPECT_FALSE(ids.count(threads.begin_thread)) << device << " ran on the calling thread";
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_EQ(all.size(), 3u);
}

TEST(AsyncExecutor, WithDelaysAndEveryFenceCapturesAreExact) {
  auto m = model();
  const Reference ref = reference(*m);
  for (const std::string faults :
       {"", "delay:copy:15", "delay:stage:10", "delay:copy:10;delay:stage:5"}) {
    const Outcome o = captured(*m, ref, faults);
    EXPECT_EQ(o.wrong_points, 0) << faults;
    EXPECT_TRUE(o.logits_equal) << faults;
  }
  // The copies were queued on the copy queues, not made by the hooks.
  int64_t copies = 0;
  for (const DeviceStats& s : m->device_stats()) copies += s.capture_copies;
  EXPECT_EQ(copies, m->config().num_hidden_layers);
}

TEST(AsyncExecutor, WithoutTheFenceBeforeAStageReadsItsInputTheOutputIsWrong) {
  SKIP_DELIBERATE_RACE();
  auto m = model();
  const Reference ref = reference(*m);
  // The stage after each boundary reads its transfer-in slot before the delayed copy landed.
  EXPECT_FALSE(captured(*m, ref, "delay:copy:30;nofence:transfer-in").logits_equal);
  EXPECT_TRUE(captured(*m, ref, "delay:copy:30").logits_equal);
}

TEST(AsyncExecutor, WithoutTheFenceBeforeABoundaryCopyTheOutputIsWrong) {
  SKIP_DELIBERATE_RACE();
  auto m = model();
  const Reference ref = reference(*m);
  m->set_bare_ref_policy(BareRefPolicy::kOff);  // the unfenced copy holds the producer's slot
  // The copy reads the producer's slot while the delayed block has not written it yet; the
  // transfer's own checksum cannot see it (both sides hold the same stale bytes).
  EXPECT_FALSE(captured(*m, ref, "delay:stage:30;nofence:transfer-out").logits_equal);
  EXPECT_TRUE(captured(*m, ref, "delay:stage:30").logits_equal);
}

TEST(AsyncExecutor, WithoutTheFenceBeforeAReadCapturesAreWrong) {
  SKIP_DELIBERATE_RACE();
  auto m = model();
  const Reference ref = reference(*m);
  const Outcome unfenced = captured(*m, ref, "delay:copy:30;nofence:capture-read");
  EXPECT_GT(unfenced.wrong_points, 0);
  EXPECT_TRUE(unfenced.logits_equal);  // the forward itself is fine: only the reads raced
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // let the copies land
  EXPECT_EQ(captured(*m, ref, "delay:copy:30").wrong_points, 0);
}

TEST(AsyncExecutor, ACopyOfTheBorrowedTensorInsteadOfASnapshotIsWrong) {
  SKIP_DELIBERATE_RACE();
  auto m = model();
  const Reference ref = reference(*m);
  m->set_bare_ref_policy(BareRefPolicy::kOff);  // the unsafe copy keeps the borrowed tensor
  // Block outputs live in ping-pong arena slots: on one virtual device running every block, two
  // blocks later the slot is overwritten, and the delayed copy reads that.
  const Outcome unsafe = captured(*m, ref, "delay:copy:30;nofence:capture-source", 1);
  EXPECT_GT(unsafe.wrong_points, 0);
  EXPECT_TRUE(unsafe.logits_equal);  // the forward itself is untouched
  m->set_bare_ref_policy(BareRefPolicy::kError);
  EXPECT_EQ(captured(*m, ref, "delay:copy:30", 1).wrong_points, 0);
}

TEST(AsyncExecutor, AFullCopyWindowMakesHooksWaitAndDropsNothing) {
  auto m = model();
  const Reference ref = reference(*m);
  place(*m, 3, "delay:copy:30", /*window=*/1);  // room for one copy at a time
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*"}});
  cap.run(batch(*m));
  int64_t waits = 0, copies = 0;
  for (const DeviceStats& s : m->device_stats()) {
    waits += s.copy_waits;
    copies += s.capture_copies;
  }
  EXPECT_EQ(copies, m->config().num_hidden_layers);
  EXPECT_GT(waits, 0);
  for (const auto& [point, rows] : ref.points)
    EXPECT_TRUE(at::equal(cap.get(point), rows)) << point;
}

TEST(AsyncExecutor, AMapThatReturnsToADeviceWithAFullCopyWindowDoesNotDeadlock) {
  // cpu:0 runs the first two and the last block, cpu:1 the others: cpu:0 receives a transfer
  // that waits for cpu:1, queued before cpu:0's first hooks ask for room in the copy window. Were
  // capture copies and transfers on one queue, those hooks would wait behind that transfer, which
  // waits for them.
  auto m = model();
  const Reference ref = reference(*m);
  const size_t n = m->stages().size();
  ExecutionOptions o;
  for (size_t i = 0; i < n; ++i)
    o.stage_device.push_back(DeviceId::virtual_cpu(i <= 2 || i + 3 >= n ? 0 : 1));
  o.copy_window_bytes = 1;
  o.async_faults = parse_async_faults("delay:copy:5");
  m->place(o);
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*"}});
  auto done = std::async(std::launch::async, [&] { return cap.run(batch(*m)); });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "deadlocked";
    std::abort();  // the forward's threads cannot be joined
  }
  EXPECT_TRUE(at::equal(done.get(), ref.logits));
  for (const auto& [point, rows] : ref.points)
    EXPECT_TRUE(at::equal(cap.get(point), rows)) << point;
}

TEST(AsyncExecutor, AZeroCopyWindowCopiesEachCaptureInItsHook) {
  auto m = model();
  const Reference ref = reference(*m);
  place(*m, 3, "", /*window=*/0);
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*"}});
  cap.run(batch(*m));
  EXPECT_EQ(cap.fence(), 0);  // nothing was queued: every copy was made before its hook returned
  for (const DeviceStats& s : m->device_stats()) EXPECT_EQ(s.capture_copies, 0) << s.device.str();
  for (const auto& [point, rows] : ref.points)
    EXPECT_TRUE(at::equal(cap.get(point), rows)) << point;
}

TEST(AsyncExecutor, CopiesStillInFlightAfterTheForwardAreFencedByReads) {
  auto m = model();
  const Reference ref = reference(*m);
  place(*m, 3, "delay:copy:40");
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*"}});
  cap.run(batch(*m));
  EXPECT_GT(cap.fence(), 0);  // some copies had not landed when forward() returned (40 ms each)
  EXPECT_EQ(cap.fence(), 0);
  cap.verify();
  for (const auto& [point, rows] : ref.points)
    EXPECT_TRUE(at::equal(cap.get(point), rows)) << point;
}

TEST(AsyncExecutor, AHookThatThrowsOnAWorkerFailsTheForwardNamingThePointAndTheModelRunsAgain) {
  auto m = model();
  const Reference ref = reference(*m);
  place(*m, 3);
  auto bad = m->register_forward_hook("transformer.h.4", [](const HookContext&, const at::Tensor&) {
    throw std::runtime_error("probe failed");
  });
  try {
    m->forward(batch(*m));
    FAIL() << "no throw";
  } catch (const RunError& e) {
    EXPECT_THAT(e.what(), HasSubstr("transformer.h.4"));
    EXPECT_THAT(e.what(), HasSubstr("probe failed"));
  }
  bad.remove();
  EXPECT_TRUE(at::equal(m->forward(batch(*m)), ref.logits));
}

TEST(AsyncExecutor, SplitRunsEqualOneDeviceOverRepeatedForwards) {
  auto m = model(8);
  const Reference ref = reference(*m);
  for (int n : {2, 3, 5}) {
    place(*m, n);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(m->forward(batch(*m)), ref.logits)) << n;
  }
}

// ---- faults' syntax -----------------------------------------------------------------------------

TEST(AsyncFaults, Parse) {
  const AsyncFaults f =
      parse_async_faults("transfer:cpu:0->cpu:1:bitflip;delay:copy:25;nofence:capture-read");
  EXPECT_EQ(f.delay_copy_ms, 25);
  EXPECT_EQ(f.delay_stage_ms, 0);
  EXPECT_TRUE(f.nofence_capture_read);
  EXPECT_FALSE(f.nofence_transfer_in);
  EXPECT_TRUE(f.any());
  EXPECT_FALSE(parse_async_faults("transfer:cpu:0->cpu:1:zeros").any());
  EXPECT_EQ(parse_faults("delay:stage:3;transfer:cpu:0->cpu:1:zeros;nofence:transfer-in").size(),
            1u);
  for (const char* bad : {"delay:copy", "delay:copy:x", "delay:disk:5", "delay:copy:-1",
                          "nofence:everything", "slow:copy:5"})
    EXPECT_THROW(parse_async_faults(bad), InputError) << bad;
}

// ---- the device-side hash -----------------------------------------------------------------------

TEST(DeviceHash, AnyOneByteChangeIsDetected) {
  at::Tensor t = at::randn({37}, at::kFloat);  // 148 bytes: not a whole number of words
  const uint64_t h = device_hash_value(t);
  EXPECT_EQ(device_hash_value(t.clone()), h);
  auto bytes = t.view(at::kByte);
  for (int64_t i = 0; i < bytes.numel(); ++i)
    for (int bit : {0, 7}) {
      at::Tensor d = t.clone();
      d.view(at::kByte).narrow(0, i, 1).bitwise_xor_(1 << bit);
      EXPECT_NE(device_hash_value(d), h) << "byte " << i << " bit " << bit;
    }
}

TEST(DeviceHash, HashesBytesWhateverTheViewAndCountsTheLength) {
  at::Tensor t = at::randn({4, 6}, at::kFloat);
  EXPECT_EQ(device_hash_value(t), device_hash_value(t.view(at::kInt)));
  EXPECT_EQ(device_hash_value(t.t()), device_hash_value(t.t().contiguous()));
  // Zero padding to whole words does not make a shorter tensor collide with a longer one.
  EXPECT_NE(device_hash_value(at::zeros({3}, at::kByte)),
            device_hash_value(at::zeros({8}, at::kByte)));
  // An unaligned view (4 bytes in) hashes as its own bytes.
  at::Tensor tail = t.view({-1}).narrow(0, 1, 23);
  EXPECT_EQ(device_hash_value(tail), device_hash_value(tail.clone()));
  // Swapping two words changes it (the multipliers depend on the position).
  at::Tensor w = at::arange(8, at::kLong);
  at::Tensor s = w.clone();
  s[0] = 1;
  s[1] = 0;
  EXPECT_NE(device_hash_value(w), device_hash_value(s));
}

// The host's one-pass hash (the check of every capture and transfer that left an accelerator) and
// the tensor operations the device runs are two implementations of one definition: they agree on
// every length (whole words and a padded tail), alignment, dtype and size, including tensors large
// enough to be split over threads.
TEST(DeviceHash, TheHostsOnePassHashEqualsTheTensorOperations) {
  auto ops = [](const at::Tensor& t) {
    return static_cast<uint64_t>(device_hash(t).item<int64_t>());
  };
  const at::Tensor bytes = at::randint(0, 256, {64 + 9}, at::kByte);
  for (int64_t offset = 0; offset < 9; ++offset)
    for (int64_t n = 0; n <= 64; ++n) {
      const at::Tensor t = bytes.narrow(0, offset, n);
      EXPECT_EQ(host_hash(t), ops(t)) << "offset " << offset << " length " << n;
    }
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong, at::kDouble}) {
    const at::Tensor t = (at::rand({3, 1001}, at::kDouble) * 500).to(dtype);
    EXPECT_EQ(host_hash(t), ops(t)) << dtype;
    EXPECT_EQ(host_hash(t.t()), ops(t.t().contiguous())) << dtype;  // not contiguous
  }
  // device_hash sums the words as rows of 2^16 (512 KiB): one row, whole rows, rows and a part.
  for (const int64_t words : {int64_t{1} << 16, int64_t{2} << 16, (int64_t{1} << 16) + 1,
                              (int64_t{3} << 16) - 1, (int64_t{5} << 16) + 77}) {
    const at::Tensor t = at::randint(-(int64_t{1} << 62), int64_t{1} << 62, {words}, at::kLong);
    EXPECT_EQ(host_hash(t), ops(t)) << words << " words";
    EXPECT_EQ(host_hash(t.view(at::kByte).narrow(0, 3, t.nbytes() - 3)),
              ops(t.view(at::kByte).narrow(0, 3, t.nbytes() - 3)))
        << words << " words, 3 bytes in";
  }
  // More than one chunk of work (1 MiB of words per task), and not a whole number of chunks.
  const at::Tensor big = at::randn({(int64_t{3} << 20) + 5}, at::kFloat);
  EXPECT_EQ(host_hash(big), ops(big));
  EXPECT_EQ(device_hash_value(big), ops(big));
  at::Tensor damaged = big.clone();
  damaged.view(at::kByte).narrow(0, 9 << 20, 1).bitwise_xor_(0x40);  // in the second chunk
  EXPECT_NE(host_hash(damaged), host_hash(big));
}

// Every selection carries the cache that copies its index to an accelerator once per stream
// (SafeCapturer's per-batch selection once lacked it: on a GPU every hook then copied the index
// from pageable memory, stalling the host on the stream).
TEST(RowSelectionIndex, EverySelectionCachesItsDeviceCopies) {
  EXPECT_NE(RowSelection().device_index, nullptr);
  EXPECT_NE(RowSelection::dense(2, 3, PositionSpec{}).device_index, nullptr);
  const RowSelection masked = RowSelection::from_mask(
      at::tensor({1, 1, 0, 1, 1, 1}, at::kLong).view({2, 3}), PositionSpec{});
  ASSERT_NE(masked.device_index, nullptr);
  EXPECT_TRUE(at::equal(masked.index_on(c10::kCPU), masked.index));  // on the CPU: the index itself
}

// A decoding step with a KV cache: the mask covers the cached tokens and the new ones, the tensor
// only the new ones (its last columns). Positions count from each sequence's start; only tokens
// inside the window are rows.
TEST(RowSelectionWindow, ADecodingStepsNewTokensWithTheirPositions) {
  // sequence 0 left-padded by two, sequence 1 whole; one new column each
  const at::Tensor mask = at::tensor({0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, at::kLong).view({2, 5});
  const at::Tensor ids = at::tensor({7, 9}, at::kLong).view({2, 1});
  const RowSelection step = RowSelection::from_mask(mask, PositionSpec{}, ids, 1);
  EXPECT_EQ(std::make_pair(step.batch, step.seq), std::make_pair(int64_t{2}, int64_t{1}));
  EXPECT_EQ(step.row_seq, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(step.row_pos, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(step.row_token, (std::vector<int64_t>{7, 9}));
  EXPECT_TRUE(at::equal(step.index, at::tensor({0, 1}, at::kLong)));
  // 'last' is the new token; 'first' lies before the window: no rows
  EXPECT_EQ(RowSelection::from_mask(mask, PositionSpec::parse("last"), {}, 1).row_pos,
            (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(RowSelection::from_mask(mask, PositionSpec::parse("first"), {}, 1).rows(), 0);
  // the whole mask as its window is the plain selection
  EXPECT_TRUE(at::equal(RowSelection::from_mask(mask, PositionSpec{}, {}, 5).index,
                        RowSelection::from_mask(mask, PositionSpec{}).index));
  EXPECT_THROW(RowSelection::from_mask(mask, PositionSpec{}, {}, 6), InputError);
  EXPECT_THROW(RowSelection::from_mask(mask, PositionSpec{}, at::zeros({2, 5}, at::kLong), 1),
               InputError);  // ids are the window's
}

// The delay faults: a host queue sleeps; an accelerator's stream is held back by a spin kernel,
// which a LibTorch without CUDA does not have (the host then sleeps: the delay moves nothing on a
// device, which test_cuda.cpp refuses to run without).
TEST(FaultDelay, TheHostSleepsAndTheDeviceSpinsWhereItCan) {
  EXPECT_TRUE(fault_delay_on_device(c10::kCPU));
  const auto start = std::chrono::steady_clock::now();
  fault_delay(c10::kCPU, 30);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    EXPECT_FALSE(fault_delay_on_device(c10::Device(c10::kCUDA, 0)));
  }
}

// A throw that escapes a virtual device's work (a wait on another device's marker that failed)
// stops the work queued after it, which would otherwise run unordered, until synchronize() reports
// it; a capture copy skipped that way is an error when read, not rows that were never written.
TEST(WorkQueueFailure, AThrowThatEscapesSkipsLaterWorkUntilReported) {
  WorkQueue q(DeviceId::virtual_cpu(1));
  std::atomic<int> ran{0};
  q.submit([] { throw std::runtime_error("the wait failed"); });
  q.submit([&] { ++ran; });
  EXPECT_THROW(q.synchronize(), std::runtime_error);
  EXPECT_EQ(ran.load(), 0);
  q.submit([&] { ++ran; });  // reported: the queue runs work again
  q.synchronize();
  EXPECT_EQ(ran.load(), 1);
}

TEST(WorkQueueFailure, ACaptureCopySkippedAfterAFailureIsAnErrorWhenRead) {
  WorkQueue compute(DeviceId::virtual_cpu(1)), capture(DeviceId::virtual_cpu(1));
  CopyWindow window;
  window.limit = uint64_t{1} << 20;
  const LaneContext lane{DeviceId::virtual_cpu(1), &compute, &capture, &window, nullptr};
  capture.submit([] { throw std::runtime_error("the wait failed"); });
  const at::Tensor t = at::arange(24, at::kFloat).view({2, 3, 4});
  SnapshotCopy copy = snapshot_copy_on_lane(lane, t, nullptr, at::kFloat, /*fingerprint=*/true);
  ASSERT_NE(copy.pending, nullptr);
  try {
    wait(*copy.pending);
    ADD_FAILURE() << "a copy that never ran was read as landed";
  } catch (const RunError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("never ran"));
  }
  EXPECT_THROW(capture.synchronize(), std::runtime_error);
}

}  // namespace
