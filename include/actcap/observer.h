// Observers: what the runtime tells about a forward while it runs (after executorch's EventTracer,
// runtime/core/event_tracer.h). Attach one with Model::attach_observer(); the executor then calls,
// for every Model::forward():
//
//   on_forward_begin   before anything runs. A throw cancels the forward: nothing runs and the
//                      step is not counted.
//   for each stage that runs, in order:
//     on_stage_begin   with the stage's index, kind and device, after the hidden state reached it
//     on_point         for every point the observer was attached with, as the modules of the stage
//                      run (the same contract as a hook: the tensor is borrowed, so copy what you
//                      keep; the bare-reference guard applies; exceptions become RunError naming
//                      the point)
//     on_stage_end
//   on_forward_end     with the output, after the last stage; a throw from it is the forward's.
//
// A forward that throws midway sends no end events. Observers are called in attach order, and an
// observer may detach itself or another while being called (a detached one is not called again).
//
// Threads (docs/execution.md): on_forward_begin and on_forward_end are called on the thread that
// called forward(); the stage events and on_point on the thread that runs the stage — for a virtual
// CPU device `cpu:N` its own worker thread, otherwise the calling thread. The calls of one forward
// never overlap and each happens after the previous one (the queues' markers order them), so an
// observer needs no lock of its own; it must not block waiting for the thread that called
// forward().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "actcap/devices.h"
#include "actcap/hooks.h"
#include "actcap/model.h"

namespace actcap {

struct ForwardBegin {
  int64_t step;        // Model::steps() before this forward: the HookContext::step of its points
  const Batch& batch;  // ids [batch_size, seq], right-padded, with each row's length
  int64_t batch_size;
  int64_t seq;
};

struct StageEvent {
  int64_t step;
  size_t stage;  // index into Model::stages()
  StageKind kind;
  const DeviceId& device;  // the device the stage runs on (Model::stage_device(stage))
};

struct ForwardEnd {
  int64_t step;
  const at::Tensor& output;  // what forward() returns (logits, or the final norm's output)
};

class Observer {
 public:
  Observer() = default;
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;
  // Detaches from every model it is still attached to, so an observer may die before its model.
  virtual ~Observer();

  virtual void on_forward_begin(const ForwardBegin& event) {}
  virtual void on_stage_begin(const StageEvent& event) {}
  virtual void on_point(const HookContext& ctx, const at::Tensor& borrowed) {}
  virtual void on_stage_end(const StageEvent& event) {}
  virtual void on_forward_end(const ForwardEnd& event) {}

 private:
  friend class Model;
  std::vector<HookHandle> attachments_;
};

// Model::attach_observer's handle: remove() detaches the observer (dropping the handle does not).
// Safe to call after the model or the observer is gone.
using ObserverHandle = HookHandle;

}  // namespace actcap
