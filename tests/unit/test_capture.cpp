// The seed's test suite and one test per hazard H1-H7 (docs/safety.md). Each fails without its
// defence: a capture that kept the borrowed tensor, skipped the fingerprint or read unverified.
#include <c10/core/InferenceMode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/planner.h"
#include "actcap/repro.h"
#include "executor/transfer.h"
#include "models/arch/architecture.h"
#include "models/weights.h"
#include "tiny_models.h"

using namespace actcap;
using ::testing::HasSubstr;
using ::testing::Not;

namespace actcap {
// SafeCapturer's test seam (capture.h): no longer observing a planned point is the one way to make
// a planned point not fire in a forward.
struct SafeCapturerTestPeer {
  static void detach(SafeCapturer& cap, size_t plan_index) {
    std::vector<std::string> keep;
    for (size_t i = 0; i < cap.plan_.size(); ++i)
      if (i != plan_index) keep.push_back(cap.plan_[i].name);
    cap.handle_.remove();
    cap.handle_ = cap.model_.attach_observer(cap, keep);
  }
};
}  // namespace actcap

namespace {

std::unique_ptr<Model> model(const std::string& arch = "gpt2", int64_t layers = 8) {
  ModelConfig c = preset_config(arch, "tiny");
  c.num_hidden_layers = layers;
  return Model::from_tensors(c, random_weights(c, 21, at::kFloat), arch);
}

Batch batch(const Model& m, int variant = 0) {
  std::vector<std::vector<int64_t>> seqs = {{4, 8, 15, 16, 23, 42, 7, 1}, {3, 1, 4}};
  if (variant) seqs = {{9, 9, 8, 2, 4, 4}, {5, 6, 7, 8, 9, 10, 11}};
  return Batch::from_sequences(seqs, m.config().vocab_size, m.config().max_positions());
}

// The truth: every point's real-token rows, copied inside the hook.
std::map<std::string, at::Tensor> truth(Model& m, const Batch& b,
                                        const std::string& pattern = "**") {
  std::map<std::string, at::Tensor> out;
  std::vector<int64_t> idx;
  for (int64_t s = 0; s < b.size(); ++s)
    for (int64_t t = 0; t < b.lengths[s]; ++t) idx.push_back(s * b.ids.size(1) + t);
  auto index = at::tensor(idx, at::kLong);
  auto h = m.register_forward_hook(pattern, [&](const HookContext& c, const at::Tensor& t) {
    out[c.point] = t.flatten(0, 1).index_select(0, index).clone();
  });
  m.forward(b);
  h.remove();
  return out;
}

// Re-places the model with these test faults on its transfers ("" removes them).
void with_faults(Model& m, const std::string& spec) {
  ExecutionOptions o = m.placement();
  o.faults = spec.empty() ? std::vector<TransferFault>{} : parse_faults(spec);
  m.place(o);
}

std::string temp_dir() {
  char tmpl[] = "/tmp/actcap-capture-XXXXXX";
  return mkdtemp(tmpl);
}

}  // namespace

// ---- the seed's suite ---------------------------------------------------------------------------

TEST(SeedSuite, CopyIsolationMutatingTheSourceAfterCaptureLeavesTheCaptureUnchanged) {
  auto m = model();
  Batch b = batch(*m);
  auto expected = truth(*m, b, "transformer.h.2");
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.2"}});
  // A later in-place writer on the very tensor that was captured (registered after the capturer).
  auto writer = m->register_forward_hook(
      "transformer.h.2", [](const HookContext&, const at::Tensor& t) { t.mul_(0); });
  cap.run(b);
  writer.remove();
  EXPECT_TRUE(at::equal(cap.get("transformer.h.2"), expected.at("transformer.h.2")));
}

TEST(SeedSuite, ReuseDoesNotPollute) {
  auto m = model("gpt2", 8);
  Batch b = batch(*m);
  auto expected = truth(*m, b, "transformer.h.*");
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*"}});
  cap.run(b);
  EXPECT_GT(m->device_stats().front().slot_reuses, 0);  // the arena did overwrite earlier outputs
  for (const auto& [name, t] : expected) EXPECT_TRUE(at::equal(cap.get(name), t)) << name;
}

class SeedSuiteArch : public ::testing::TestWithParam<std::string> {};

// `actcap repro`'s hazard (hooks keeping references to engine buffers over several devices) for
// each family the registry adds, the safe capturer against the layers' true outputs.
TEST_P(SeedSuiteArch, NoCorruptionOverThreeDevicesInInferenceMode) {
  auto m = model(GetParam(), 6);
  Batch b = batch(*m);
  auto expected = truth(*m, b);  // single device
  test::place_balanced(*m, b, 3);
  SafeCapturer cap(*m, CaptureOptions{{"**", "**:input"}});
  cap.run(b);
  EXPECT_GE(m->transfer_stats().transfers, 2);
  ASSERT_FALSE(expected.empty());
  for (const auto& [name, t] : expected) EXPECT_TRUE(at::equal(cap.get(name), t)) << name;
}

INSTANTIATE_TEST_SUITE_P(Archs, SeedSuiteArch, ::testing::Values("gemma", "gemma2", "gemma3_text"));

TEST(SeedSuite, NoCorruptionOverThreeOrMoreDevicesInInferenceMode) {
  for (int n : {3, 4, 8}) {
    auto m = model("llama", 8);
    Batch b = batch(*m);
    auto expected = truth(*m, b);  // single device
    test::place_balanced(*m, b, n);
    bool inference_mode = false;
    auto probe = m->register_forward_hook("lm_head", [&](const HookContext&, const at::Tensor&) {
      inference_mode = c10::InferenceMode::is_enabled();
    });
    SafeCapturer cap(*m, CaptureOptions{{"**", "**:input"}});
    cap.run(b);
    probe.remove();
    EXPECT_TRUE(inference_mode);
    EXPECT_GE(m->transfer_stats().transfers, n - 1);
    for (const auto& [name, t] : expected)
      EXPECT_TRUE(at::equal(cap.get(name), t)) << n << " devices: " << name;
  }
}

// `actcap repro`'s reproduction on every registered architecture (its tiny preset with 12 layers)
// over 3 virtual devices: a hook that keeps the borrowed block output sees it overwritten, the
// bare-reference guard stops that run asking for clone(), and cloning in the hook or SafeCapturer
// give every block output of both steps exactly (issue 13: repro works on each family).
TEST(Repro, EveryArchitecture) {
  for (const Architecture* a : architectures()) {
    SCOPED_TRACE(a->name());
    std::map<std::string, ReproResult> by;
    for (const ReproResult& r : run_repro({3}, a->name())) by[r.name] = r;
    ASSERT_EQ(by.size(), 4u);
    EXPECT_GT(by["naive"].mismatched, 0);
    EXPECT_EQ(by["guarded"].mismatched, -1);
    EXPECT_THAT(by["guarded"].error, HasSubstr("clone()"));
    for (const char* v : {"clone", "safe"}) {
      EXPECT_EQ(by[v].mismatched, 0) << v;
      EXPECT_EQ(by[v].total, 24) << v;  // 12 blocks x 2 steps
      EXPECT_EQ(by[v].error, "") << v;
    }
  }
}

// Each captured point equals the layer's true output, taken from independent forwards (cloned
// inside a plain hook), not from the capture itself.
// Fails without the defence: checked (session 5) with a capturer that kept the borrowed tensor in
// its hook and copied it only after the forward (guard off): transformer.h.0, h.1, h.1:input and
// h.2:input then held later blocks' values and this test failed, while the old version (block i's
// capture against block i+1's captured input, which alias the same arena slot) still passed.
TEST(SeedSuite, CapturedEqualsTheLayersTrueOutput) {
  auto m = model("gpt2", 4);
  Batch b = batch(*m);
  std::map<std::string, at::Tensor> expected;
  for (const char* p : {"transformer.h.*", "transformer.h.*:input", "lm_head"}) {
    auto t = truth(*m, b, p);
    expected.insert(t.begin(), t.end());
  }
  const at::Tensor plain = m->forward(b).clone();
  ASSERT_EQ(expected.size(), 4u + 4u + 1u);
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*", "transformer.h.*:input", "lm_head"}});
  at::Tensor logits = cap.run(b);
  for (const auto& [name, t] : expected) EXPECT_TRUE(at::equal(cap.get(name), t)) << name;
  // The truth itself: lm_head's real-token rows are the logits of a plain forward.
  EXPECT_TRUE(at::equal(expected.at("lm_head"),
                        at::cat({plain[0].slice(0, 0, 8), plain[1].slice(0, 0, 3)})));
  EXPECT_TRUE(at::equal(logits, plain));
}

// ---- hazards --------------------------------------------------------------------------------

TEST(Hazards, H1_SnapshotsShareNoStorageWithEngineBuffers) {
  auto m = model();
  Batch b = batch(*m);
  std::vector<const void*> borrowed;
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*"}});
  auto spy = m->register_forward_hook(
      "transformer.h.*",
      [&](const HookContext&, const at::Tensor& t) { borrowed.push_back(t.storage().data()); });
  cap.run(b);
  spy.remove();
  for (const Snapshot& s : cap.snapshots())
    for (const void* p : borrowed) EXPECT_NE(s.rows.storage().data(), p) << s.point;
}

// Later writers into memory the engine reuses: block k's output slot is overwritten by block k+2
// (the arena), and a hook registered after the capturer writes into every block output in place.
// The bare-reference guard and the fingerprint are off, so only the capturer's copy stands between
// those writes and the snapshots. A naive hook that kept the borrowed tensor in the same run ends
// up with wrong values at every point: the writes are real.
//
// Fails without the defence: checked (session 5) by making the capturer keep `flat` (a view of the
// borrowed tensor) instead of copying it: every point then differed from the truth.
TEST(Hazards, H2_LaterInPlaceWritersDoNotReachSnapshots) {
  auto m = model("llama", 6);
  m->set_bare_ref_policy(BareRefPolicy::kOff);
  // Unpadded, every position: the capturer's one-copy path, where keeping a view is most tempting.
  const Batch b = Batch::from_sequences({{4, 8, 15, 16, 23}, {42, 7, 1, 3, 9}},
                                        m->config().vocab_size, m->config().max_positions());
  const std::string blocks = "model.layers.*";
  const HookFn writer = [](const HookContext&, const at::Tensor& t) { t.mul_(-1).add_(3); };
  // The truth: each block's output cloned before the writer (registered after) changes it.
  std::map<std::string, at::Tensor> expected;
  auto clone = m->register_forward_hook(blocks, [&](const HookContext& c, const at::Tensor& t) {
    expected[c.point] = t.flatten(0, 1).clone();
  });
  auto w = m->register_forward_hook(blocks, writer);
  m->forward(b);
  clone.remove();
  w.remove();
  ASSERT_EQ(expected.size(), 6u);

  CaptureOptions o{{blocks}};
  o.fingerprint = false;
  SafeCapturer cap(*m, o);
  std::map<std::string, at::Tensor> naive;
  auto keep = m->register_forward_hook(
      blocks, [&](const HookContext& c, const at::Tensor& t) { naive[c.point] = t; });
  w = m->register_forward_hook(blocks, writer);
  cap.run(b);
  keep.remove();
  EXPECT_GT(m->device_stats().front().slot_reuses, 0);  // the arena handed slots out again
  for (const auto& [name, want] : expected) {
    EXPECT_FALSE(at::equal(naive.at(name).flatten(0, 1), want))
        << name << ": the kept tensor still holds the truth, so nothing wrote over it";
    EXPECT_TRUE(at::equal(cap.get(name, 0), want)) << name;
  }
  // A second, different batch through the same slots and the same writer: the first capture stays.
  cap.run(batch(*m, 1));
  w.remove();
  for (const auto& [name, want] : expected) EXPECT_TRUE(at::equal(cap.get(name, 0), want)) << name;
}

TEST(Hazards, H3_SnapshotIsCompleteAndOnTheStableDeviceWhenTheHookReturns) {
  auto m = model("gpt2", 4);
  Batch b = batch(*m);
  test::place_balanced(*m, b, 3);
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.3"}});
  bool checked = false;
  auto after =
      m->register_forward_hook("transformer.h.3", [&](const HookContext&, const at::Tensor& t) {
        // The capturer's hook ran first: its snapshot must already be final, not a pending copy.
        ASSERT_EQ(cap.snapshots().size(), 1u);
        const Snapshot& s = cap.snapshots().back();
        EXPECT_TRUE(s.rows.device().is_cpu());
        EXPECT_NO_THROW(cap.verify());
        t.fill_(7);  // and later writes to the source do not reach it
        checked = true;
      });
  cap.run(b);
  after.remove();
  EXPECT_TRUE(checked);
  EXPECT_FALSE(at::equal(cap.get("transformer.h.3"), at::full_like(cap.get("transformer.h.3"), 7)));
}

// A transfer damaged on every copy stops the capture with an error naming the link (and the stage
// that would have read the damaged state); one damaged once is repaired by the host-staged retry.
// Fails without the defence: checked (session 5) by (a) dropping the device pair from the message
// in transfer.cpp and (b) turning verification off (verify_transfers = false): both fail this test.
TEST(Hazards, H4_DamagedTransferStopsTheCaptureNamingTheLink) {
  auto m = model("qwen2", 6);
  Batch b = batch(*m);
  test::place_balanced(*m, b, 3);
  std::vector<DeviceId> placement;
  std::string into;  // the stage that reads what crosses cpu:0 -> cpu:1
  for (size_t i = 0; i < m->stages().size(); ++i) {
    placement.push_back(m->stage_device(i));
    if (i > 0 && placement[i - 1] == DeviceId::virtual_cpu(0) &&
        placement[i] == DeviceId::virtual_cpu(1))
      into = m->stage_modules()[i].front();
  }
  ASSERT_FALSE(into.empty());
  auto expected = truth(*m, b);
  std::string message;
  std::vector<std::string> settings;
  {
    SafeCapturer cap(*m, CaptureOptions{{"**"}});
    with_faults(*m, "transfer:cpu:0->cpu:1:zeros");
    try {
      cap.run(b);
    } catch (const RunError& e) {
      message = e.what();
      settings = e.settings();
    }
  }
  const int64_t fired = m->placement().faults.at(0).fired;
  EXPECT_THAT(message, HasSubstr("into " + into + " from cpu:0 to cpu:1 arrived corrupted"));
  EXPECT_THAT(message, HasSubstr("even after a retry"));
  // The link to check, for a front end to name its own way (the CLI: `actcap doctor --devices`).
  EXPECT_EQ(settings, std::vector<std::string>{"doctor:cpu:0,cpu:1"});
  EXPECT_EQ(fired, 2);  // the direct copy and the host-staged retry were both damaged
  EXPECT_EQ(m->transfer_stats().injected, 2);
  EXPECT_EQ(m->transfer_stats().retried, 0);

  // Damaged once: the retry repairs it, the capture is the truth, and the counters say so.
  with_faults(*m, "transfer:cpu:0->cpu:1:zeros-once");  // re-placed: fresh counters
  SafeCapturer cap(*m, CaptureOptions{{"**"}});
  EXPECT_NO_THROW(cap.run(b));
  EXPECT_EQ(m->transfer_stats().injected, 1);
  EXPECT_EQ(m->transfer_stats().retried, 1);
  for (const auto& [name, t] : expected) EXPECT_TRUE(at::equal(cap.get(name), t)) << name;

  // A fault on a link this placement never crosses could never fire: an input error naming it.
  EXPECT_NO_THROW(check_fault_links(parse_faults("transfer:cpu:1->cpu:2:bitflip"), placement));
  try {
    check_fault_links(parse_faults("transfer:cpu:0->cpu:1:zeros;transfer:cpu:1->cpu:0:zeros"),
                      placement);
    ADD_FAILURE() << "cpu:1->cpu:0 is not crossed";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("link cpu:1->cpu:0 is not crossed"));
    EXPECT_THAT(e.what(), HasSubstr("links crossed: cpu:0->cpu:1, cpu:1->cpu:2"));
  }
  EXPECT_THAT(
      [&] {
        try {
          check_fault_links(parse_faults("transfer:cpu:0->cpu:1:zeros"), {DeviceId::cpu()});
        } catch (const InputError& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      HasSubstr("it crosses no link (every stage is on cpu)"));
}

TEST(Hazards, H5_HeavyCaptureLeavesLogitsBitIdentical) {
  for (const char* arch : {"gpt2", "llama", "mistral", "qwen2"}) {
    auto m = model(arch, 4);
    Batch b = batch(*m);
    at::Tensor plain = m->forward(b).clone();
    SafeCapturer cap(*m, CaptureOptions{{"**", "**:input"}});
    EXPECT_TRUE(at::equal(plain, cap.run(b))) << arch;
  }
}

TEST(Hazards, H6_SilentMissesAreErrorsAndRepeatedCallsAreAllKept) {
  auto m = model();
  EXPECT_THROW(SafeCapturer(*m, CaptureOptions{{"transformer.h.99"}}), InputError);
  EXPECT_THROW(SafeCapturer(*m, CaptureOptions{{"transformer.h.*", "lm_haed"}}), InputError);
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.1"}});
  cap.run(batch(*m));
  cap.run(batch(*m, 1));
  ASSERT_EQ(cap.snapshots().size(), 2u);
  EXPECT_EQ(cap.snapshots()[0].call, 0);
  EXPECT_EQ(cap.snapshots()[1].call, 1);
  EXPECT_FALSE(
      at::equal(cap.get("transformer.h.1", 0), cap.get("transformer.h.1", 1).slice(0, 0, 11)));
  EXPECT_EQ(cap.get("transformer.h.1").size(0), 11 + 13);  // both calls, in order
  EXPECT_THROW(cap.get("transformer.h.1", 2), RunError);

  // A planned point that never fires in a forward is a RunError naming it, not a silent gap.
  // Fails without the defence: checked (session 5) by removing the never-fired check from
  // SafeCapturer::run: the run then returned normally with transformer.h.2 missing.
  SafeCapturer partial(*m, CaptureOptions{{"transformer.h.0", "transformer.h.2"}});
  ASSERT_EQ(partial.plan().at(1).name, "transformer.h.2");
  SafeCapturerTestPeer::detach(partial, 1);
  try {
    partial.run(batch(*m));
    ADD_FAILURE() << "a planned point that never fired was not reported";
  } catch (const RunError& e) {
    EXPECT_THAT(e.what(), HasSubstr("hook point 'transformer.h.2' never fired"));
    EXPECT_THAT(e.what(), Not(HasSubstr("transformer.h.0")));
  }
}

TEST(Hazards, H7_DamageAfterCaptureIsCaughtOnReadAndOnDisk) {
  auto m = model();
  Batch b = batch(*m);
  SafeCapturer cap(*m, CaptureOptions{{"transformer.h.0", "lm_head"}});
  cap.run(b);
  // In memory: a snapshot damaged after capture fails every verified read.
  const_cast<Snapshot&>(cap.snapshots()[0]).rows.view(at::kByte).view({-1})[5].bitwise_xor_(1);
  EXPECT_THROW(cap.get("transformer.h.0"), RunError);
  EXPECT_THROW(cap.verify(), RunError);
  // On disk: a flipped byte anywhere in the shard or the manifest fails verify.
  SafeCapturer fresh(*m, CaptureOptions{{"transformer.h.0", "lm_head"}});
  fresh.run(b);
  const std::string dir = temp_dir();
  export_run(dir, fresh, *m);
  ASSERT_TRUE(verify_output(dir).ok());
  for (const std::string file : {"shard-00000.safetensors", "manifest.json"}) {
    const std::string path = dir + "/" + file;
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    for (size_t at : {size_t(3), bytes.size() / 3, bytes.size() / 2, bytes.size() - 9}) {
      std::string damaged = bytes;
      damaged[at] ^= 0x04;
      std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
      EXPECT_FALSE(verify_output(dir).ok()) << file << " byte " << at;
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_TRUE(verify_output(dir).ok());
  }
  std::filesystem::remove_all(dir);
}

// ---- options ----------------------------------------------------------------------------------

TEST(CaptureOptions, PositionsDtypeAndBudget) {
  EXPECT_EQ(PositionSpec::parse("all").select(3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(PositionSpec::parse("first").select(3), (std::vector<int64_t>{0}));
  EXPECT_EQ(PositionSpec::parse("last").select(3), (std::vector<int64_t>{2}));
  EXPECT_EQ(PositionSpec::parse("0:2,-2:").select(6), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(PositionSpec::parse("0:2,-2:").select(3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(PositionSpec::parse("4").select(3), (std::vector<int64_t>{}));
  EXPECT_THROW(PositionSpec::parse("a:b"), InputError);
  EXPECT_THROW(PositionSpec::parse("0:1:2"), InputError);
  // fuzz/regressions/fuzz_small_parsers/positions_index_plus_one_overflow.txt: no p + 1 overflow.
  EXPECT_EQ(PositionSpec::parse("9223372036854775807").select(3), (std::vector<int64_t>{}));
  EXPECT_EQ(PositionSpec::parse("-9223372036854775807").select(3), (std::vector<int64_t>{}));
  EXPECT_THROW(parse_capture_dtype("f8"), InputError);

  auto m = model();
  Batch b = batch(*m);
  auto expected = truth(*m, b, "transformer.h.1");
  CaptureOptions o{{"transformer.h.1", "transformer.wte:input"}};
  o.positions = PositionSpec::parse("last");
  o.dtype = at::kBFloat16;
  SafeCapturer cap(*m, o);
  cap.run(b);
  EXPECT_EQ(cap.row_seq(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(cap.row_pos(), (std::vector<int64_t>{7, 2}));
  at::Tensor last = cap.get("transformer.h.1");
  EXPECT_EQ(last.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(
      last, at::stack({expected.at("transformer.h.1")[7], expected.at("transformer.h.1")[10]})
                .to(at::kBFloat16)));
  EXPECT_EQ(cap.get("transformer.wte:input").scalar_type(), at::kLong);  // ids stay integers
  CaptureOptions tight{{"**"}};
  tight.budget_bytes = 1024;
  SafeCapturer over(*m, tight);
  EXPECT_THROW(over.run(b), InputError);
}

// Unpadded batch with every position: SafeCapturer's one-copy path must equal the row gather,
// bit for bit, in the stored dtype too; a padded batch and a position subset take the gather path.
TEST(CaptureOptions, EveryTokenFastPathEqualsTheGather) {
  auto m = model("llama", 3);
  const Batch full = Batch::from_sequences({{4, 8, 15, 16}, {23, 42, 7, 1}}, m->config().vocab_size,
                                           m->config().max_positions());
  auto expected = truth(*m, full);
  for (auto dtype : {std::optional<c10::ScalarType>{}, std::optional<c10::ScalarType>{at::kHalf}}) {
    CaptureOptions o{{"**", "**:input"}};
    o.dtype = dtype;
    SafeCapturer cap(*m, o);
    cap.run(full);
    for (const PointInfo& p : cap.plan()) {
      if (p.name.find(":input") != std::string::npos) continue;
      at::Tensor want = expected.at(p.name);
      if (dtype && at::isFloatingType(want.scalar_type())) want = want.to(*dtype);
      ASSERT_TRUE(at::equal(cap.get(p.name), want)) << p.name;
    }
  }
  CaptureOptions last{{"model.layers.*"}};
  last.positions = PositionSpec::parse("1:3");
  SafeCapturer cap(*m, last);
  cap.run(full);
  EXPECT_TRUE(at::equal(
      cap.get("model.layers.2"),
      expected.at("model.layers.2").index_select(0, at::tensor(std::vector<int64_t>{1, 2, 5, 6}))));
}
