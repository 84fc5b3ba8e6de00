// Observers (actcap/observer.h): the events the executor sends, their order and steps, SafeCapturer
// as an observer of plain forwards, and detaching from either side.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/observer.h"
#include "models/weights.h"

using namespace actcap;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

std::unique_ptr<Model> tiny(const std::string& arch = "gpt2") {
  ModelConfig c = preset_config(arch, "tiny");
  return Model::from_tensors(c, random_weights(c, 5, at::kFloat), arch);
}

Batch padded(const Model& m) {
  return Batch::from_sequences({{5, 9, 2, 7, 11, 3}, {7, 3}, {1, 2, 3, 4}}, m.config().vocab_size,
                               m.config().max_positions());
}

// Places stage i on cpu:(i * n / stages), n virtual devices in order.
void split(Model& m, int n) {
  ExecutionOptions o;
  const size_t stages = m.stages().size();
  for (size_t i = 0; i < stages; ++i)
    o.stage_device.push_back(DeviceId::virtual_cpu(static_cast<int>(i * n / stages)));
  m.place(o);
}

// Writes every event as one line.
struct Recorder : Observer {
  std::vector<std::string> events;
  void on_forward_begin(const ForwardBegin& e) override {
    events.push_back(concat("begin ", e.step, " ", e.batch_size, "x", e.seq));
  }
  void on_stage_begin(const StageEvent& e) override {
    events.push_back(
        concat("stage ", e.step, " ", e.stage, " ", stage_kind_name(e.kind), " ", e.device.str()));
  }
  void on_point(const HookContext& ctx, const at::Tensor& t) override {
    events.push_back(concat("point ", ctx.step, " ", ctx.point, " ", ctx.call_index, " ", t.size(0),
                            "x", t.size(1)));
  }
  void on_stage_end(const StageEvent& e) override {
    events.push_back(concat("stage-end ", e.step, " ", e.stage));
  }
  void on_forward_end(const ForwardEnd& e) override {
    events.push_back(concat("end ", e.step, " ", e.output.size(-1)));
  }
};

}  // namespace

TEST(Observer, SeesBeginStagesPointsAndEndInOrder) {
  auto m = tiny();
  split(*m, 2);
  Batch b = padded(*m);
  m->forward(b);  // step 0, before attaching: not observed
  Recorder rec;
  HookHandle h = m->attach_observer(rec, {"transformer.h.1", "transformer.h.1:input", "lm_head"});
  EXPECT_EQ(m->hook_count(), 3u);
  m->forward(b);
  m->forward(b, Model::Logits::kCompute);
  const size_t stages = m->stages().size();
  size_t block1 = 0;  // the stage that holds transformer.h.1
  while (m->stage_modules().at(block1).front() != "transformer.h.1") ++block1;
  std::vector<std::string> want;
  for (int step : {1, 2}) {
    want.push_back(concat("begin ", step, " 3x6"));
    for (size_t i = 0; i < stages; ++i) {
      want.push_back(concat("stage ", step, " ", i, " ", stage_kind_name(m->stage_kind(i)), " ",
                            m->stage_device(i).str()));
      if (i == block1) {
        want.push_back(concat("point ", step, " transformer.h.1:input ", step - 1, " 3x6"));
        want.push_back(concat("point ", step, " transformer.h.1 ", step - 1, " 3x6"));
      }
      if (i == stages - 1) want.push_back(concat("point ", step, " lm_head ", step - 1, " 3x6"));
      want.push_back(concat("stage-end ", step, " ", i));
    }
    want.push_back(concat("end ", step, " ", m->config().vocab_size));
  }
  EXPECT_EQ(rec.events, want);
  EXPECT_NE(m->stage_device(0), m->stage_device(stages - 1));  // the events name both devices
  h.remove();
  EXPECT_FALSE(h.active());
  EXPECT_EQ(m->hook_count(), 0u);
  rec.events.clear();
  m->forward(b);
  EXPECT_TRUE(rec.events.empty());
}

TEST(Observer, WithoutPointsSeesEventsOnlyAndKeepsTheHeadSkippable) {
  auto m = tiny();
  Batch b = padded(*m);
  Recorder rec;
  HookHandle h = m->attach_observer(rec);
  EXPECT_EQ(m->hook_count(), 0u);
  at::Tensor out = m->forward(b, Model::Logits::kSkipIfUnhooked);
  EXPECT_EQ(out.size(-1), m->config().hidden_size);  // lm_head skipped: nothing observes it
  ASSERT_FALSE(rec.events.empty());
  EXPECT_EQ(rec.events.front(), "begin 0 3x6");
  EXPECT_EQ(rec.events.back(), concat("end 0 ", m->config().hidden_size));
  EXPECT_EQ(std::count_if(rec.events.begin(), rec.events.end(),
                          [](const std::string& e) { return e.rfind("stage ", 0) == 0; }),
            static_cast<int64_t>(m->stages().size()) - 1);
  EXPECT_THROW(m->attach_observer(rec, {"transformer.h.99"}), InputError);
  h.remove();
}

TEST(Observer, ABeginThatThrowsCancelsTheForward) {
  auto m = tiny();
  struct Refuses : Observer {
    int points = 0;
    void on_forward_begin(const ForwardBegin&) override { throw InputError("not this batch"); }
    void on_point(const HookContext&, const at::Tensor&) override { ++points; }
  } refuses;
  m->attach_observer(refuses, {"**"});
  EXPECT_THROW(m->forward(padded(*m)), InputError);
  EXPECT_EQ(refuses.points, 0);
  EXPECT_EQ(m->steps(), 0);  // not counted
}

TEST(Observer, DetachingFromEitherSideIsSafe) {
  Batch b = padded(*tiny());
  {  // the observer dies first: it detaches itself
    auto m = tiny();
    {
      Recorder rec;
      m->attach_observer(rec, {"**"});
      m->forward(b);
      EXPECT_GT(m->hook_count(), 0u);
    }
    EXPECT_EQ(m->hook_count(), 0u);
    m->forward(b);
  }
  {  // the model dies first: the handle and the observer outlive it harmlessly
    Recorder rec;
    HookHandle h;
    {
      auto m = tiny();
      h = m->attach_observer(rec, {"transformer.h.0"});
      EXPECT_TRUE(h.active());
    }
    EXPECT_FALSE(h.active());
    h.remove();
  }
  {  // an observer detaching itself (and another) mid-forward is not called again
    auto m = tiny();
    Recorder later;
    struct Leaves : Observer {
      HookHandle self, other;
      int points = 0;
      void on_point(const HookContext&, const at::Tensor&) override {
        ++points;
        self.remove();
        other.remove();
      }
    } leaves;
    leaves.self = m->attach_observer(leaves, {"**"});
    leaves.other = m->attach_observer(later, {"**"});
    m->forward(b);
    EXPECT_EQ(leaves.points, 1);
    ASSERT_EQ(later.events.size(), 2u);  // detached in the first stage, before its first point
    EXPECT_EQ(later.events[0].rfind("begin ", 0), 0u);
    EXPECT_EQ(later.events[1].rfind("stage ", 0), 0u);
    EXPECT_EQ(m->hook_count(), 0u);
  }
  {  // a SafeCapturer destroyed before its model, and one outliving it
    auto m = tiny();
    { SafeCapturer cap(*m, CaptureOptions{{"transformer.h.*"}}); }
    EXPECT_EQ(m->hook_count(), 0u);
    auto other = tiny();
    auto cap = std::make_unique<SafeCapturer>(*other, CaptureOptions{{"transformer.h.0"}});
    other->forward(b);
    other.reset();
    EXPECT_EQ(cap->snapshots().size(), 1u);
    cap.reset();
  }
}

TEST(Observer, AnAttachedCapturerCapturesPlainForwardsAsRunDoes) {
  for (const std::string arch : {"gpt2", "llama"}) {
    auto m = tiny(arch);
    split(*m, 3);
    Batch b = padded(*m);
    CaptureOptions o;
    o.patterns = {"**", "**:input"};
    o.positions = PositionSpec::parse("0,-2:");
    SafeCapturer via_run(*m, o);
    via_run.run(b);
    std::vector<Snapshot> ran = via_run.snapshots();
    const std::vector<int64_t> seq = via_run.row_seq(), pos = via_run.row_pos();
    via_run.clear();
    m->forward(b);  // the same capturer, attached: a plain forward captures as run() did
    const std::vector<Snapshot>& plain = via_run.snapshots();
    ASSERT_EQ(plain.size(), ran.size());
    ASSERT_EQ(plain.size(), via_run.plan().size());  // each point once
    for (size_t i = 0; i < ran.size(); ++i) {
      EXPECT_EQ(plain[i].point, ran[i].point);
      EXPECT_EQ(plain[i].call, ran[i].call + 1);
      EXPECT_EQ(plain[i].step, ran[i].step + 1);
      EXPECT_TRUE(at::equal(plain[i].rows, ran[i].rows)) << arch << " " << ran[i].point;
      EXPECT_EQ(plain[i].xxh3, ran[i].xxh3);
    }
    EXPECT_EQ(via_run.row_seq(), seq);
    EXPECT_EQ(via_run.row_pos(), pos);

    // Positions set for one forward, as run(batch, positions) takes them.
    const std::vector<std::vector<int64_t>> chosen = {{5}, {0, 1}, {2}};
    via_run.clear();
    via_run.run(b, chosen);
    ran = via_run.snapshots();
    via_run.clear();
    via_run.set_positions(chosen);
    m->forward(b);
    ASSERT_EQ(via_run.snapshots().size(), ran.size());
    for (size_t i = 0; i < ran.size(); ++i)
      EXPECT_TRUE(at::equal(via_run.snapshots()[i].rows, ran[i].rows));
    EXPECT_THAT(via_run.row_pos(), ElementsAre(5, 0, 1, 2));
    via_run.clear();
    m->forward(b);  // only for one forward: back to the options' positions
    EXPECT_EQ(via_run.row_pos(), pos);

    // Bad positions and the budget are checked when the forward begins, before anything runs.
    via_run.set_positions({{9}, {0}, {0}});
    EXPECT_THROW(m->forward(b), InputError);
  }
}

TEST(Observer, CapturerBudgetAppliesToPlainForwards) {
  auto m = tiny();
  CaptureOptions o;
  o.patterns = {"transformer.h.0"};
  o.budget_bytes = 64;
  SafeCapturer cap(*m, o);
  const int64_t steps = m->steps();
  try {
    m->forward(padded(*m));
    ADD_FAILURE() << "over budget";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("over the capture budget"));
  }
  EXPECT_EQ(m->steps(), steps);
  EXPECT_TRUE(cap.snapshots().empty());
}
