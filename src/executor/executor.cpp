#include "executor/executor.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>

#include "actcap/error.h"
#include "actcap/observer.h"
#include "executor/transfer.h"
#include "models/model_parts.h"

namespace actcap {

namespace {

// The observers attached when a forward begins; each is called only while it is still attached
// (an observer may detach itself or another while being called).
class Observers {
 public:
  explicit Observers(const Model& model)
      : live_(ModelParts::observers(model)), list_(live_.begin(), live_.end()) {}
  template <typename Event>
  void notify(const Event& event) const {
    for (const auto& [id, observer] : list_)
      if (live_.count(id)) event(*observer);
  }

 private:
  const std::map<int64_t, Observer*>& live_;
  std::vector<std::pair<int64_t, Observer*>> list_;
};

}  // namespace

void Executor::place(const ExecutionOptions& options) {
  const std::vector<Module*>& stages = model_.stages();
  std::vector<DeviceId> devs = options.stage_device;
  if (devs.empty()) devs.assign(stages.size(), DeviceId::cpu());
  if (devs.size() != stages.size())
    throw InputError(
        concat("placement has ", devs.size(), " devices for ", stages.size(), " stages"));
  std::map<DeviceId, uint64_t> weights;
  for (size_t i = 0; i < stages.size(); ++i) {
    stages[i]->to_device(devs[i].c10());
    weights[devs[i]] += stages[i]->parameter_bytes();
  }
  if (ModelParts::head_shares_embedding(model_) && devs.front() == devs.back())
    weights[devs.back()] -= stages.back()->parameter_bytes();  // lm_head shares the embedding
  for (const auto& [d, bytes] : weights) {
    auto b = options.budgets.find(d);
    if (b != options.budgets.end() && bytes > b->second)
      throw RunError(concat("weights placed on ", d.str(), " take ", format_bytes(bytes),
                            ", over its budget of ", format_bytes(b->second),
                            "; raise the memory budget of ", d.str(), " or use more devices"),
                     {"max_memory", "devices"});
  }
  options_ = options;
  stage_device_ = devs;
  lanes_.clear();
  for (const auto& [d, bytes] : weights) lanes_.try_emplace(d, d, bytes);
  for (size_t i = 0; i < stages.size(); ++i) {
    Lane& lane = lanes_.at(devs[i]);
    lane.widen_elements = std::max(lane.widen_elements, stages[i]->widen_elements());
  }
  transfers_ = TransferStats{};
}

std::vector<DeviceStats> Executor::device_stats() const {
  std::vector<DeviceStats> out;
  for (const auto& [d, lane] : lanes_) {
    DeviceStats s;
    s.device = d;
    s.weight_bytes = lane.weight_bytes;
    s.arena_bytes = lane.arena.bytes();
    s.slot_reuses = lane.arena.reuses();
    s.peak_bytes = lane.peak_bytes;
    s.transfers_in = lane.transfers_in;
    s.bytes_in = lane.bytes_in;
    out.push_back(s);
  }
  return out;
}

ForwardState Executor::make_state(c10::Device device, int64_t batch, int64_t seq, int64_t step) {
  ForwardState st;
  st.batch = batch;
  st.seq = seq;
  st.step = step;
  st.bare_ref = model_.bare_ref_policy();
  st.bare_ref_warned = &bare_ref_warned_;
  st.positions = at::arange(seq, at::TensorOptions().dtype(at::kLong).device(device));
  st.causal_bias = at::full({seq, seq}, -std::numeric_limits<float>::infinity(),
                            at::TensorOptions().dtype(at::kFloat).device(device))
                       .triu_(1);
  return st;
}

at::Tensor Executor::hand_off(const at::Tensor& h, Lane& from, Lane& to, size_t into) {
  // With streams: the copy is queued on `to`'s stream after it waits on `from`'s last event.
  at::Tensor dst = to.arena.slot(Arena::kTransferIn, h.sizes());
  const std::string& name = model_.stages()[into]->name();
  transfer(TransferRequest{&h, dst, from.device, to.device,
                           name.empty() ? "stage " + std::to_string(into) : name,
                           options_.verify_transfers},
           options_.faults, transfers_);
  ++to.transfers_in;
  to.bytes_in += h.numel() * h.element_size();
  return dst;
}

at::Tensor Executor::block_output(Lane& lane, size_t stage, at::IntArrayRef shape) {
  // Consecutive blocks on a lane alternate between its two output slots: each reads the previous
  // block's output from one while writing the other.
  at::Tensor out = lane.arena.slot(lane.block_out_slot, shape);
  lane.block_out_slot = lane.block_out_slot == Arena::kPing ? Arena::kPong : Arena::kPing;
  const uint64_t used = lane.weight_bytes + lane.arena.bytes();
  lane.peak_bytes = std::max(lane.peak_bytes, used);
  auto budget = options_.budgets.find(lane.device);
  if (budget != options_.budgets.end() && used > budget->second)
    throw RunError(
        concat(lane.device.str(), " ran out of its memory budget at ",
               model_.stages()[stage]->name(), ": weights ", format_bytes(lane.weight_bytes),
               " + activation arena ", format_bytes(lane.arena.bytes()), " > ",
               format_bytes(budget->second), "; raise its memory budget or run smaller batches"),
        {"max_memory"});
  return out;
}

at::Tensor Executor::forward(const Batch& batch, Model::Logits logits) {
  c10::InferenceMode guard;
  const ModelConfig& config = model_.config();
  const int64_t B = batch.ids.size(0), T = batch.ids.size(1), H = config.hidden_size;
  if (T > config.max_positions())
    throw InputError(concat("batch has ", T, " positions but ", model_.origin(),
                            " supports at most ", config.max_positions()));
  const int64_t step = steps_;
  const Observers observers(model_);
  observers.notify([&](Observer& o) { o.on_forward_begin(ForwardBegin{step, batch, B, T}); });
  ++steps_;  // counted once no observer refused it

  // Per-forward tables, built once per physical device (virtual devices on the host share one).
  std::map<std::string, ForwardState> states;
  for (auto& [d, lane] : lanes_) {
    lane.state = nullptr;
    lane.block_out_slot = Arena::kPing;
  }
  auto state_of = [&](Lane& lane) -> ForwardState& {
    if (lane.state) return *lane.state;
    const c10::Device dev = lane.device.c10();
    auto it = states.find(dev.str());
    if (it == states.end()) it = states.emplace(dev.str(), make_state(dev, B, T, step)).first;
    lane.state = &it->second;
    return it->second;
  };

  // Every architecture ends with its head (lm_head).
  const std::vector<Module*>& stages = model_.stages();
  size_t run = stages.size();
  // The head may wrap lm_head (Gemma 2's soft-capped logits): any hooked module in it counts.
  auto head_hooked = [&] {
    std::vector<Module*> in_head;
    stages.back()->collect(in_head);
    for (Module* m : in_head)
      if (m->hooked()) return true;
    return false;
  };
  if (logits == Model::Logits::kSkipIfUnhooked && model_.stage_kind(run - 1) == StageKind::kHead &&
      !head_hooked())
    --run;

  Lane* cur = &lanes_.at(stage_device_.front());
  at::Tensor h = batch.ids.to(cur->device.c10());
  for (size_t i = 0; i < run; ++i) {
    Lane& lane = lanes_.at(stage_device_[i]);
    if (&lane != cur) {
      h = hand_off(h, *cur, lane, i);
      cur = &lane;
    }
    ForwardState& st = state_of(lane);
    // Before block_output, so the budget check counts the scratch.
    if (lane.widen_elements > 0) st.widen_scratch = lane.arena.widen_buffer(lane.widen_elements);
    if (model_.stage_kind(i) == StageKind::kBlock) st.stage_out = block_output(lane, i, {B, T, H});
    const StageEvent event{step, i, model_.stage_kind(i), lane.device};
    observers.notify([&](Observer& o) { o.on_stage_begin(event); });
    h = stages[i]->call(h, st);
    st.stage_out = at::Tensor();
    st.widen_scratch = at::Tensor();
    observers.notify([&](Observer& o) { o.on_stage_end(event); });
  }
  observers.notify([&](Observer& o) { o.on_forward_end(ForwardEnd{step, h}); });
  return h;
}

// ---- Model's facade ------------------------------------------------------------------------

void Model::ExecutorDeleter::operator()(Executor* executor) const { delete executor; }

void Model::place(const ExecutionOptions& options) {
  if (!executor_) executor_.reset(new Executor(*this));
  executor_->place(options);
}

at::Tensor Model::forward(const Batch& batch, Logits logits) {
  return executor_->forward(batch, logits);
}

const ExecutionOptions& Model::placement() const { return executor_->placement(); }
DeviceId Model::stage_device(size_t stage) const { return executor_->stage_device(stage); }
std::vector<DeviceStats> Model::device_stats() const { return executor_->device_stats(); }
const TransferStats& Model::transfer_stats() const { return executor_->transfer_stats(); }
int64_t Model::steps() const { return executor_->steps(); }

}  // namespace actcap
