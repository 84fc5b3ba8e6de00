#include "executor/streams.h"

#include <ATen/Parallel.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "util/torch_compat.h"

namespace actcap {

// A virtual device's queue: its thread, the work not yet run, and two counters: work submitted and
// work done. A marker is a value of `submitted`; it completes when `done` reaches it.
struct WorkerState {
  std::mutex mu;
  std::condition_variable cv;  // signalled when work arrives, finishes, or the queue stops
  std::deque<std::function<void()>> work;
  uint64_t submitted = 0, done = 0;
  bool stop = false;
  std::exception_ptr escaped;  // the first throw that escaped a piece of work
  std::thread::id thread;
};

bool Marker::query() const {
  if (worker_) {
    std::lock_guard<std::mutex> lock(worker_->mu);
    return worker_->done >= seq_;
  }
  return !event_ || event_->query();
}

void Marker::synchronize() const {
  if (worker_) {
    std::unique_lock<std::mutex> lock(worker_->mu);
    worker_->cv.wait(lock, [&] { return worker_->done >= seq_; });
  } else if (event_) {
    synchronize_event(*event_);
  }
}

namespace {

void worker_loop(const std::shared_ptr<WorkerState>& s) {
  at::init_num_threads();  // this thread's intra-op thread count = the process's setting
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [&] { return s->stop || !s->work.empty(); });
    if (s->work.empty()) return;  // stopping, and everything ran
    std::function<void()> w = std::move(s->work.front());
    s->work.pop_front();
    // After a throw escaped (a wait that failed), what follows it would run unordered: skipped,
    // still counted as done, until synchronize() reports the throw.
    const bool skip = s->escaped != nullptr;
    lock.unlock();
    try {
      if (!skip) w();
    } catch (...) {
      std::lock_guard<std::mutex> relock(s->mu);
      if (!s->escaped) s->escaped = std::current_exception();
    }
    w = nullptr;  // what the work held (tensors) is released before it counts as done
    lock.lock();
    ++s->done;
    s->cv.notify_all();
  }
}

}  // namespace

namespace {
WorkQueue::Kind kind_of(const DeviceId& device) {
  switch (device.kind) {
    case DeviceId::Kind::kCpu:
      return WorkQueue::Kind::kInline;
    case DeviceId::Kind::kVirtualCpu:
      return WorkQueue::Kind::kWorker;
    case DeviceId::Kind::kCuda:
      break;
  }
  return WorkQueue::Kind::kAccelerator;
}
}  // namespace

WorkQueue::WorkQueue(const DeviceId& device) : WorkQueue(device, kind_of(device)) {}

WorkQueue::WorkQueue(const DeviceId& device, Kind kind) : device_(device), kind_(kind) {
  TORCH_CHECK(kind == kind_of(device) || kind == Kind::kWorker, "a work queue of another kind for ",
              device.str());
  switch (kind_) {
    case Kind::kInline:
      break;
    case Kind::kWorker:
      worker_ = std::make_shared<WorkerState>();
      thread_ = std::thread(worker_loop, worker_);
      worker_->thread = thread_.get_id();
      break;
    case Kind::kAccelerator: {
      const c10::Device d = device.c10();
      stream_ = c10::impl::getDeviceGuardImpl(d.type())->getStreamFromGlobalPool(d);
      break;
    }
  }
}

WorkQueue::~WorkQueue() {
  if (kind_ == Kind::kWorker) {
    {
      std::lock_guard<std::mutex> lock(worker_->mu);
      worker_->stop = true;
    }
    worker_->cv.notify_all();
    thread_.join();
  } else if (kind_ == Kind::kAccelerator) {
    try {
      Marker m = record();
      m.synchronize();
    } catch (...) {  // a destructor must not throw; a failed device reports on its next use
    }
  }
}

void WorkQueue::submit(std::function<void()> work) {
  switch (kind_) {
    case Kind::kInline:
      work();
      return;
    case Kind::kWorker: {
      {
        std::lock_guard<std::mutex> lock(worker_->mu);
        worker_->work.push_back(std::move(work));
        ++worker_->submitted;
      }
      worker_->cv.notify_all();
      return;
    }
    case Kind::kAccelerator: {
      c10::StreamGuard guard(*stream_);
      work();
      return;
    }
  }
}

bool WorkQueue::on_worker() const {
  return kind_ == Kind::kWorker && std::this_thread::get_id() == worker_->thread;
}

Marker WorkQueue::record() {
  Marker m;
  if (kind_ == Kind::kWorker && !on_worker()) {
    std::lock_guard<std::mutex> lock(worker_->mu);
    m.worker_ = worker_;
    m.seq_ = worker_->submitted;
  } else if (kind_ == Kind::kAccelerator) {
    m.event_ = std::make_shared<c10::Event>(stream_->device_type());
    m.event_->record(*stream_);
  }
  return m;
}

void WorkQueue::wait(const Marker& m) {
  switch (kind_) {
    case Kind::kInline:
      m.synchronize();
      return;
    case Kind::kWorker:
      if (on_worker())
        m.synchronize();  // called from this queue's own work: wait right here
      else if (!m.query())
        submit([m] { m.synchronize(); });
      return;
    case Kind::kAccelerator:
      if (m.event_ && m.event_->device_type() == stream_->device_type())
        m.event_->block(*stream_);  // the device waits; the host goes on
      else
        m.synchronize();  // another kind of queue: through the host
      return;
  }
}

void WorkQueue::synchronize() {
  record().synchronize();  // skipped work counts as done: this returns after a failure too
  if (kind_ == Kind::kWorker) {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(worker_->mu);
      std::swap(e, worker_->escaped);
    }
    if (e) std::rethrow_exception(e);
  }
}

void WorkQueue::wait_for_caller() {
  if (kind_ != Kind::kAccelerator) return;
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(stream_->device_type());
  c10::Event e(stream_->device_type());
  e.record(impl->getStream(stream_->device()));
  e.block(*stream_);
}

// Only memory of the queue's kind of device has an allocator that records streams (host memory
// does not, and a stream-ordered allocator such as cudaMallocAsync refuses pointers it does not
// own).
static bool recorded_by_allocator(const at::Tensor& t, const std::optional<c10::Stream>& stream) {
  return stream && t.defined() && t.has_storage() && t.device().type() == stream->device_type();
}

void WorkQueue::hand_to_caller(const at::Tensor& t) const {
  if (kind_ != Kind::kAccelerator || !recorded_by_allocator(t, stream_)) return;
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(stream_->device_type());
  impl->recordDataPtrOnStream(t.storage().data_ptr(), impl->getStream(stream_->device()));
}

void WorkQueue::record_use(const at::Tensor& t) const {
  if (kind_ != Kind::kAccelerator || !recorded_by_allocator(t, stream_)) return;
  c10::impl::getDeviceGuardImpl(stream_->device_type())
      ->recordDataPtrOnStream(t.storage().data_ptr(), *stream_);
}

void CopyWindow::reserve(uint64_t need) {
  while (!in_flight.empty() && in_flight.front().first.query()) {
    bytes -= in_flight.front().second;
    in_flight.pop_front();
  }
  while (!in_flight.empty() && bytes + need > limit) {
    ++waits;
    in_flight.front().first.synchronize();
    bytes -= in_flight.front().second;
    in_flight.pop_front();
  }
}

void CopyWindow::add(Marker landed, uint64_t need) {
  in_flight.emplace_back(std::move(landed), need);
  bytes += need;
  ++copies;
  total_bytes += need;
}

namespace {
thread_local const LaneContext* current = nullptr;
}

const LaneContext* current_lane() { return current; }
LaneScope::LaneScope(const LaneContext* lane) : previous_(current) { current = lane; }
LaneScope::~LaneScope() { current = previous_; }

}  // namespace actcap
