#include "executor/executor.h"

#include <ATen/ThreadLocalState.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "actcap/observer.h"
#include "executor/fault_delay.h"
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

// Whether this LibTorch's kernels on `device` compute in `dtype`: float32 always; bfloat16 and
// float16 when a matrix multiply in it runs (Debian's CPU LibTorch 1.13 has no float16 GEMM, its
// later versions and CUDA do). Probed once per device type and dtype.
bool computes_in(c10::Device device, at::ScalarType dtype) {
  if (dtype == at::kFloat) return true;
  static std::mutex mu;
  static std::map<std::pair<int, int>, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<int, int> key{static_cast<int>(device.type()), static_cast<int>(dtype)};
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  bool ok = true;
  try {
    c10::InferenceMode inference;
    auto a = at::ones({2, 2}, at::TensorOptions().dtype(dtype).device(device));
    at::mm(a, a);
    at::softmax(a, -1, at::kFloat);
  } catch (const c10::Error&) {
    ok = false;
  }
  return known.emplace(key, ok).first->second;
}

}  // namespace

void check_compute_dtype(at::ScalarType dtype, const std::vector<DeviceId>& devices) {
  for (const DeviceId& d : devices)
    if (!computes_in(d.c10(), dtype))
      throw InputError(concat(compute_dtype_name(dtype), " compute is not supported on ", d.str(),
                              ": this LibTorch has no ", c10::toString(dtype), " kernels for ",
                              c10::DeviceTypeName(d.c10().type(), /*lower_case=*/true),
                              "; compute in bf16 or f32 there, or place the model on an "
                              "accelerator"),
                       {"compute_dtype"});
}

void Executor::place(const ExecutionOptions& options) {
  const std::vector<Module*>& stages = model_.stages();
  std::vector<DeviceId> devs = options.stage_device;
  // The implicit placement a model gets when it is built is checked when it runs (forward).
  if (!devs.empty()) check_compute_dtype(model_.compute_dtype(), devs);
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
  lanes_.clear();  // drains and stops the previous placement's queues
  const at::ScalarType compute = model_.compute_dtype();
  for (const auto& [d, bytes] : weights) lanes_.try_emplace(d, d, bytes, options_, compute);
  for (size_t i = 0; i < stages.size(); ++i) {
    Lane& lane = lanes_.at(devs[i]);
    lane.widen_elements = std::max(lane.widen_elements, stages[i]->widen_elements(compute));
  }
  transfers_ = TransferStats{};
  host_routes_ = std::set<std::pair<DeviceId, DeviceId>>(options.host_routes.begin(),
                                                         options.host_routes.end());
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
    s.capture_copies = lane.window.copies;
    s.capture_bytes = lane.window.total_bytes;
    s.copy_waits = lane.window.waits;
    out.push_back(s);
  }
  return out;
}

ForwardState Executor::make_state(c10::Device device, int64_t batch, int64_t seq, int64_t step,
                                  const CachedStep* cached) {
  ForwardState st;
  st.batch = batch;
  st.seq = seq;
  st.step = step;
  st.bare_ref = model_.bare_ref_policy();
  st.bare_ref_warned = &bare_ref_warned_;
  st.compute = model_.compute_dtype();
  st.positions = at::arange(seq, at::TensorOptions().dtype(at::kLong).device(device));
  st.causal_bias = at::full({seq, seq}, -std::numeric_limits<float>::infinity(),
                            at::TensorOptions().dtype(st.compute).device(device))
                       .triu_(1);
  st.rope_len = seq;
  if (cached) {
    st.kv = cached->kv;
    st.kv_len = seq;
    if (cached->positions.defined()) {
      st.row_positions = cached->positions.to(device);
      st.kv_len = st.rope_len = cached->positions.max().item<int64_t>() + 1;
    }
  }
  return st;
}

void Executor::submit(WorkQueue& queue, Lane& lane, const std::shared_ptr<ForwardRun>& run,
                      std::function<void()> work) {
  // The caller's thread-local settings (grad mode, autocast, ...) go with the work to its thread.
  queue.submit(
      [run, context = &lane.context, work = std::move(work), state = at::ThreadLocalState()] {
        if (run->failed()) return;
        at::ThreadLocalStateGuard caller_settings(state);
        c10::InferenceMode inference;
        LaneScope scope(context);
        try {
          work();
        } catch (...) {
          run->fail(std::current_exception());
        }
      });
}

void Executor::hand_off(std::vector<at::Tensor>& outs, at::Tensor produced_slot, at::Tensor dst,
                        Lane& from, Lane& to, size_t into, const std::shared_ptr<ForwardRun>& run) {
  const std::string& name = model_.stages()[into]->name();
  const AsyncFaults& faults = options_.async_faults;
  // Test-only (AsyncFaults): without this fence the copy reads the producer's slot while the
  // producing block may still be writing it.
  const bool unfenced_out = faults.nofence_transfer_out && produced_slot.defined();
  const Marker produced = from.compute->record();
  if (!unfenced_out) to.copy->wait(produced);
  WorkQueue* copy_queue = to.copy.get();
  submit(*to.copy, to, run,
         [this, &outs, produced, produced_slot = std::move(produced_slot), unfenced_out,
          dst = std::move(dst), copy_queue, into,
          stage = name.empty() ? "stage " + std::to_string(into) : name, from = from.device,
          too = to.device] {
           fault_delay(too.c10(), options_.async_faults.delay_copy_ms);
           const at::Tensor& src = unfenced_out ? produced_slot : outs[into - 1];
           // On an accelerator the copy stream waited for the producer, but a copy or hash of the
           // source may also run on the source device's own current stream: wait for it here.
           if (!unfenced_out && !src.is_cpu()) produced.synchronize();
           if (src.sizes() != dst.sizes())
             throw RunError(concat("the hidden state handed to ", stage, " on ", too.str(),
                                   " has shape ", src.sizes(), ", not ", dst.sizes()));
           copy_queue->record_use(src);  // its memory is not reused before this copy ran
           std::lock_guard<std::mutex> lock(transfer_mu_);
           const bool via_host = host_routes_.count({from, too}) > 0;
           if (transfer(TransferRequest{&src, dst, from, too, stage, options_.verify_transfers,
                                        via_host},
                        options_.faults, transfers_)) {
             host_routes_.insert({from, too});
             warn(concat("a direct copy from ", from.str(), " to ", too.str(),
                         " arrived corrupted (the retry through host memory was intact): copies "
                         "over this link go through host memory for the rest of the run; probe "
                         "the link (doctor)"));
           }
           // Its only reader: the producer's output is released as soon as it was copied.
           if (!unfenced_out) outs[into - 1] = at::Tensor();
         });
  const Marker landed = to.copy->record();
  // Test-only: without this fence the stage reads its input slot before the copy landed (it still
  // runs after the producing stage, so stages of one forward never overlap).
  to.compute->wait(faults.nofence_transfer_in ? produced : landed);
  if (unfenced_out) to.compute->wait(produced);  // the copy raced, the stages still do not
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

at::Tensor Executor::forward(const Batch& batch, Model::Logits logits, const CachedStep* cached) {
  c10::InferenceMode guard;
  const ModelConfig& config = model_.config();
  const int64_t B = batch.ids.size(0), T = batch.ids.size(1), H = config.hidden_size;
  if (T > config.max_positions())
    throw InputError(concat("batch has ", T, " positions but ", model_.origin(),
                            " supports at most ", config.max_positions()));
  check_compute_dtype(model_.compute_dtype(), stage_device_);
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
    if (it == states.end())
      it = states.emplace(dev.str(), make_state(dev, B, T, step, cached)).first;
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

  // The stages are queued on their lanes' compute queues and run there (a virtual device's on its
  // own thread); boundary copies on the copy queues; markers order them. Each piece of work writes
  // only its own entry of `outs` (a stage's output) and reads entries its markers made final.
  auto run_state = std::make_shared<ForwardRun>();
  std::vector<at::Tensor> outs(run);
  // The stages and boundary copies queued (capture copies may stay in flight: reads fence them).
  // A wait a virtual device's queue could not complete (a device error polling an accelerator's
  // event) is rethrown here, after every queue was waited for.
  auto drain = [this] {
    std::exception_ptr first;
    for (auto& [d, lane] : lanes_)
      for (WorkQueue* q : {lane.compute.get(), lane.copy.get()}) try {
          q->synchronize();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
    if (first) std::rethrow_exception(first);
  };
  // Whatever ends this function before the drain below, the work queued so far references this
  // frame: wait for it.
  struct DrainOnExit {
    const decltype(drain)& then;
    bool armed = true;
    ~DrainOnExit() {
      if (armed) try {
          then();
        } catch (...) {  // a failed device: the error that unwinds is the one to report
        }
    }
  } drain_on_exit{drain};
  const AsyncFaults& faults = options_.async_faults;
  // First every stage's memory: arena slots handed out, budgets checked, boundaries accounted.
  // Nothing runs yet, so the views made here are all made before any hook runs: the bare-reference
  // guard (module.cpp), which compares use counts around a hook, sees no other thread change them.
  // Each view is then moved, not copied, into the one piece of work that uses it.
  struct StageWork {
    Lane* lane = nullptr;
    at::Tensor scratch, out_slot;
    at::Tensor in_slot, copy_dst, produced_slot;  // at a boundary: the transfer-in slot (twice)
  };
  std::vector<StageWork> work(run);
  for (size_t i = 0; i < run; ++i) {
    StageWork& w = work[i];
    w.lane = &lanes_.at(stage_device_[i]);
    Lane& lane = *w.lane;
    if (i > 0 && work[i - 1].lane != w.lane) {
      w.in_slot = lane.arena.slot(Arena::kTransferIn, {B, T, H});
      w.copy_dst = w.in_slot;
      if (faults.nofence_transfer_out) w.produced_slot = work[i - 1].out_slot;
      ++lane.transfers_in;
      lane.bytes_in += w.in_slot.nbytes();
    }
    // Before block_output, so the budget check counts the scratch.
    if (lane.widen_elements > 0) w.scratch = lane.arena.widen_buffer(lane.widen_elements);
    if (model_.stage_kind(i) == StageKind::kBlock) w.out_slot = block_output(lane, i, {B, T, H});
    // Test-only: with a transfer fence removed, what a racing read finds is poison, not the bytes
    // an earlier identical forward left in the slot.
    if (faults.nofence_transfer_in && w.in_slot.defined()) w.in_slot.fill_(NAN);
    if (faults.nofence_transfer_out && w.out_slot.defined()) w.out_slot.fill_(NAN);
    state_of(lane);
  }
  // On accelerators the stages and boundary copies run on the lanes' own streams: after what the
  // caller queued on the devices' current streams (its input ids, the per-forward tables made
  // above, and its kernels still reading memory the arena slots were just given from).
  for (auto& [d, lane] : lanes_) {
    lane.compute->wait_for_caller();
    lane.copy->wait_for_caller();
  }
  // Then the work, in order: a boundary copy where the lane changes, the stage.
  for (size_t i = 0; i < run; ++i) {
    StageWork& w = work[i];
    Lane& lane = *w.lane;
    if (w.copy_dst.defined())
      hand_off(outs, std::move(w.produced_slot), std::move(w.copy_dst), *work[i - 1].lane, lane, i,
               run_state);
    ForwardState& st = state_of(lane);
    submit(*lane.compute, lane, run_state,
           [&, i, scratch = std::move(w.scratch), out_slot = std::move(w.out_slot),
            in_slot = std::move(w.in_slot), device = lane.device] {
             fault_delay(device.c10(), faults.delay_stage_ms);
             const StageEvent event{step, i, model_.stage_kind(i), device};
             st.widen_scratch = scratch;
             st.stage_out = out_slot;
             observers.notify([&](Observer& o) { o.on_stage_begin(event); });
             const at::Tensor& in = i == 0              ? batch.ids.to(device.c10())
                                    : in_slot.defined() ? in_slot
                                                        : outs[i - 1];
             outs[i] = stages[i]->call(in, st);
             if (i > 0 && !in_slot.defined()) outs[i - 1] = at::Tensor();  // read, done with
             st.stage_out = at::Tensor();
             st.widen_scratch = at::Tensor();
             observers.notify([&](Observer& o) { o.on_stage_end(event); });
           });
  }
  std::exception_ptr drain_error;
  try {
    drain();
  } catch (...) {
    drain_error = std::current_exception();
  }
  drain_on_exit.armed = false;  // every queue was waited for, even if one of them failed
  // A piece of work's own error (a hook's, naming its point) first: it is the cause.
  if (std::exception_ptr error = run_state->first_error()) std::rethrow_exception(error);
  if (drain_error) std::rethrow_exception(drain_error);
  at::Tensor h = outs[run - 1];
  lanes_.at(stage_device_[run - 1]).compute->hand_to_caller(h);
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

at::Tensor ModelParts::forward_cached(Model& model, const Batch& batch, Model::Logits logits,
                                      const CachedStep& step) {
  return model.executor_->forward(batch, logits, &step);
}

const ExecutionOptions& Model::placement() const { return executor_->placement(); }
DeviceId Model::stage_device(size_t stage) const { return executor_->stage_device(stage); }
std::vector<DeviceStats> Model::device_stats() const { return executor_->device_stats(); }
const TransferStats& Model::transfer_stats() const { return executor_->transfer_stats(); }
int64_t Model::steps() const { return executor_->steps(); }

}  // namespace actcap
