#include "actcap/snapshot.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <optional>

#include "actcap/error.h"
#include "actcap/hash.h"
#include "actcap/numbers.h"
#include "capture/device_index.h"
#include "capture/pending_copy.h"
#include "executor/device_hash.h"
#include "executor/fault_delay.h"
#include "util/torch_compat.h"

namespace actcap {

std::shared_ptr<DeviceIndex> new_device_index() { return std::make_shared<DeviceIndex>(); }

at::Tensor RowSelection::index_on(c10::Device device) const {
  // A moved-from selection has no cache: a plain copy (the index itself on the CPU).
  return device_index ? device_index->on(index, device) : index.to(device);
}

namespace {

std::string shape_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// `ids`, when defined, must be an integer [batch, seq] tensor: each row's token. `real` holds
// each sequence's real columns counted from `offset` columns before the tensor's first: a column
// before the tensor keeps its place in the count of positions but is no row.
RowSelection select(int64_t batch, int64_t seq, const std::vector<std::vector<int64_t>>& real,
                    const PositionSpec& positions, const at::Tensor& ids, int64_t offset = 0) {
  at::Tensor tok;
  if (ids.defined()) {
    if (ids.dim() != 2 || ids.size(0) != batch || ids.size(1) != seq ||
        at::isFloatingType(ids.scalar_type()) || at::isComplexType(ids.scalar_type()))
      throw InputError(concat("input ids must be an integer [", batch, ", ", seq,
                              "] tensor like the mask; they are ", ids.scalar_type(), " ",
                              shape_text(ids.sizes())),
                       {"input_ids"});
    tok = ids.to(at::kCPU).to(at::kLong).contiguous();
  }
  RowSelection r;
  r.batch = batch;
  r.seq = seq;
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int64_t>& cols = real[b];
    for (int64_t p : positions.select(static_cast<int64_t>(cols.size()))) {
      const int64_t col = cols[p] - offset;
      if (col < 0) continue;  // before the window: computed by an earlier forward
      idx.push_back(b * seq + col);
      r.row_seq.push_back(b);
      r.row_pos.push_back(p);
      if (tok.defined()) r.row_token.push_back(tok.data_ptr<int64_t>()[b * seq + col]);
    }
  }
  r.all = static_cast<int64_t>(idx.size()) == batch * seq;
  for (size_t i = 0; r.all && i < idx.size(); ++i) r.all = idx[i] == static_cast<int64_t>(i);
  r.index = at::tensor(idx, at::kLong);
  return r;
}

}  // namespace

RowSelection RowSelection::from_mask(const at::Tensor& attention_mask,
                                     const PositionSpec& positions, const at::Tensor& ids,
                                     int64_t window) {
  if (attention_mask.dim() != 2)
    throw InputError(
        concat("attention_mask must be [batch, seq]; it is ", shape_text(attention_mask.sizes())),
        {"attention_mask"});
  const at::Tensor m = attention_mask.ne(0).to(at::kCPU).contiguous();
  const int64_t B = m.size(0), T = m.size(1);
  if (window < 0 || window > T)
    throw InputError(concat("a window of ", window, " columns does not fit an attention mask of ",
                            shape_text(attention_mask.sizes())),
                     {"attention_mask"});
  const bool* p = m.data_ptr<bool>();
  std::vector<std::vector<int64_t>> real(B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      if (p[b * T + t]) real[b].push_back(t);
  const int64_t w = window == 0 ? T : window;  // 0: the whole mask
  return select(B, w, real, positions, ids, T - w);
}

RowSelection RowSelection::dense(int64_t batch, int64_t seq, const PositionSpec& positions,
                                 const at::Tensor& ids) {
  std::vector<int64_t> cols(seq);
  for (int64_t t = 0; t < seq; ++t) cols[t] = t;
  return select(batch, seq, std::vector<std::vector<int64_t>>(batch, cols), positions, ids);
}

void wait(PendingCopy& pending) {
  if (!pending.fenced) return;  // test-only: nofence:capture-read
  if (pending.event) synchronize_event(*pending.event);
  pending.landed.synchronize();
  pending.checked.synchronize();
  pending.event.reset();
  pending.source.reset();
  if (pending.error) std::rethrow_exception(pending.error);
  if (!pending.ran)
    throw RunError(
        "a capture copy never ran: its device's capture queue stopped after an earlier error "
        "(see the first error of the run)");
}

uint64_t finish_copy(PendingCopy& pending, const at::Tensor& rows, bool fingerprint,
                     const std::string& point, int64_t call) {
  wait(pending);
  if (pending.host_hash.defined()) {
    const uint64_t device = static_cast<uint64_t>(pending.host_hash.item<int64_t>());
    const uint64_t host = pending.host_checked ? pending.recomputed : device_hash_value(rows);
    if (device != host)
      throw RunError(concat("captured tensor '", point, "' (call ", call,
                            ") was damaged between the device and host memory: device hash ",
                            hex64(device), ", host copy ", hex64(host), "; check the device"));
  }
  if (!fingerprint) return 0;
  return pending.hashed && pending.fenced ? pending.xxh3 : tensor_chunked_xxh3(rows);
}

int64_t finish_copies(std::vector<Snapshot>& snapshots,
                      std::vector<std::shared_ptr<PendingCopy>>& pending, bool fingerprint) {
  int64_t not_landed = 0;
  for (size_t i = 0; i < pending.size(); ++i)
    if (pending[i]) {
      not_landed += in_flight(*pending[i]);
      Snapshot& s = snapshots[i];
      s.xxh3 = finish_copy(*pending[i], s.rows, fingerprint, s.point, s.call);
      pending[i].reset();
    }
  return not_landed;
}

bool copies_on_lane(const LaneContext* lane, c10::Device stable) {
  return lane && stable.is_cpu() && lane->capture && lane->window && lane->window->limit > 0 &&
         lane->capture->kind() != WorkQueue::Kind::kInline;
}

bool in_flight(const PendingCopy& pending) {
  return !pending.landed.query() || (pending.event && !pending.event->query());
}

// nofence:capture-source: the rows `gather` selects of `t` (all of them when undefined), in
// `dtype`, contiguous.
static at::Tensor rows_in(const at::Tensor& t, const at::Tensor& gather, c10::ScalarType dtype) {
  return (gather.defined() ? t.index_select(0, gather) : t).to(dtype).contiguous();
}

SnapshotCopy snapshot_copy_on_lane(const LaneContext& lane, const at::Tensor& borrowed,
                                   const RowSelection* rows, c10::ScalarType dtype,
                                   bool fingerprint) {
  c10::InferenceMode ordinary_tensors(/*enabled=*/false);
  at::NoGradGuard outside_the_graph;
  const at::Tensor src = rows ? borrowed.flatten(0, 1) : borrowed;
  const bool all = !rows || rows->all;
  const bool accelerator = lane.capture->kind() == WorkQueue::Kind::kAccelerator;
  // 1. The snapshot, on the producer's queue (this hook runs in the stage's work): fresh device
  // memory that nothing else writes, so the copy below may run whenever the capture queue gets to
  // it. Test-only nofence:capture-source keeps the borrowed tensor instead: the copy then reads
  // memory the forward goes on writing.
  const bool unsafe_source = lane.faults && lane.faults->nofence_capture_source;
  at::Tensor snap = unsafe_source
                        ? src
                        : (all ? src.to(dtype, /*non_blocking=*/false, /*copy=*/true)
                               : src.index_select(0, rows->index_on(src.device())).to(dtype))
                              .contiguous();
  at::Tensor gather_later;  // nofence:capture-source: the copy selects the rows itself, later
  if (unsafe_source && !all) gather_later = rows->index_on(src.device());
  at::IntArrayRef out_sizes = snap.sizes();
  std::vector<int64_t> sizes(out_sizes.begin(), out_sizes.end());
  if (gather_later.defined()) sizes[0] = gather_later.numel();
  int64_t numel = 1;
  for (int64_t d : sizes) numel *= d;
  const uint64_t need = static_cast<uint64_t>(numel) * c10::elementSize(dtype);
  // 2. Room in the copy window (back-pressure: waits for the oldest copies, never drops).
  lane.window->reserve(need);
  SnapshotCopy out;
  out.rows =
      at::empty(sizes, snap.options().dtype(dtype).device(c10::kCPU).pinned_memory(accelerator));
  auto pending = std::make_shared<PendingCopy>();
  pending->fenced = !(lane.faults && lane.faults->nofence_capture_read);
  // Test-only: an unfenced read finds poison, not bytes an earlier identical forward left there.
  if (!pending->fenced) out.rows.view({-1}).view(at::kByte).fill_(0xFF);
  // Queued on the producer's stream. Under nofence:capture-source, of the rows the copy should
  // find (the copy itself reads them later): a hash that then differs shows the bytes changed.
  if (accelerator && fingerprint)
    pending->device_hash = device_hash(unsafe_source ? rows_in(snap, gather_later, dtype) : snap);
  // 3. The copy to the host on the capture queue, after the snapshot (on a virtual lane the hook's
  // own thread already ordered it; on an accelerator the copy stream waits for an event).
  lane.capture->wait(lane.compute->record());
  const int delay_ms = lane.faults ? lane.faults->delay_copy_ms : 0;
  WorkQueue* queue = lane.capture;
  pending->ran = false;
  lane.capture->submit([pending, snap_in = snap, gather_later, dtype, host = out.rows, queue,
                        accelerator, delay_ms, fingerprint] {
    pending->ran = true;
    try {
      fault_delay(snap_in.device(), delay_ms);  // the copy stream itself, on an accelerator
      at::Tensor snap = snap_in;
      if (gather_later.defined() || snap.scalar_type() != dtype || !snap.is_contiguous())
        snap = rows_in(snap, gather_later, dtype);  // only under nofence:capture-source
      if (accelerator) {
        at::Tensor host_rows = host;  // the handle is const in the closure; the bytes are not
        host_rows.copy_(snap, /*non_blocking=*/true);
        if (pending->device_hash.defined()) {
          pending->host_hash = at::empty({}, host.options().dtype(at::kLong).pinned_memory(true));
          pending->host_hash.copy_(pending->device_hash, /*non_blocking=*/true);
          queue->record_use(pending->device_hash);
        }
        queue->record_use(snap);
        if (gather_later.defined()) queue->record_use(gather_later);  // read on this stream too
        pending->source = snap;
      } else {
        pending->xxh3 =
            copy_chunked(snap.data_ptr(), host.data_ptr(),
                         static_cast<size_t>(snap.numel()) * snap.element_size(), fingerprint);
        pending->hashed = fingerprint;
      }
    } catch (...) {
      pending->error = std::current_exception();
    }
  });
  pending->landed = lane.capture->record();
  lane.window->add(pending->landed, need);
  // 4. On an accelerator, the host's check of the copy as soon as it landed, on the lane's check
  // worker while the device runs on: the device hash recomputed over the host bytes and the
  // fingerprint taken (finish_copy compares and uses them; on a virtual lane the copy itself
  // fingerprinted). Whatever goes wrong here is left to finish_copy, which then hashes itself.
  if (accelerator && lane.check && pending->device_hash.defined() && pending->fenced) {
    lane.check->submit([pending, host = out.rows] {
      try {
        pending->landed.synchronize();
        if (!pending->ran || pending->error) return;
        pending->recomputed = host_hash(host);
        pending->xxh3 = tensor_chunked_xxh3(host);
        pending->host_checked = pending->hashed = true;
      } catch (...) {
      }
    });
    pending->checked = lane.check->record();
  }
  out.pending = std::move(pending);
  return out;
}

SnapshotCopy snapshot_copy(const at::Tensor& borrowed, const RowSelection* rows,
                           c10::ScalarType dtype, c10::Device stable, bool fingerprint) {
  // A snapshot is an ordinary tensor outside any graph, even when the forward runs under
  // inference_mode (an inference tensor could not be written to, nor used to train a probe) or
  // records autograd.
  c10::InferenceMode ordinary_tensors(/*enabled=*/false);
  at::NoGradGuard outside_the_graph;
  const at::Tensor src = rows ? borrowed.flatten(0, 1) : borrowed;
  const bool all = !rows || rows->all;
  SnapshotCopy out;
  // CPU to CPU, every row, no conversion: our own parallel copy, fingerprinting each chunk while it
  // is in cache.
  if (all && src.scalar_type() == dtype && src.is_contiguous() && src.device().is_cpu() &&
      stable.is_cpu()) {
    out.rows = at::empty(src.sizes(), src.options());
    out.xxh3 = copy_chunked(src.data_ptr(), out.rows.data_ptr(),
                            static_cast<size_t>(src.numel()) * src.element_size(), fingerprint);
    return out;
  }
  // On the producing device and its current stream, into fresh memory: a converting copy (2-4x
  // faster than index_select's gather on CPU) or the gather of the selected rows.
  at::Tensor copy = all ? src.to(dtype, /*non_blocking=*/false, /*copy=*/true)
                        : src.index_select(0, rows->index_on(src.device()));
  if (copy.scalar_type() != dtype) copy = copy.to(dtype);
  if (!copy.device().is_cpu() && stable.is_cpu()) {
    // Accelerator -> host: an asynchronous copy into pinned memory on the producer's stream, and
    // an event after it. Nothing reads the host rows before wait() has synchronized on it.
    out.rows = at::empty(copy.sizes(), copy.options().device(c10::kCPU).pinned_memory(true));
    out.rows.copy_(copy, /*non_blocking=*/true);
    auto pending = std::make_shared<PendingCopy>();
    // The device-side hash of the rows, copied back with them: the host copy is checked against it.
    if (fingerprint) {
      pending->device_hash = device_hash(copy);
      pending->host_hash = at::empty({}, out.rows.options().dtype(at::kLong).pinned_memory(true));
      pending->host_hash.copy_(pending->device_hash, /*non_blocking=*/true);
    }
    const c10::impl::DeviceGuardImplInterface* impl =
        c10::impl::getDeviceGuardImpl(copy.device().type());
    pending->event.emplace(copy.device().type());
    pending->event->record(impl->getStream(copy.device()));
    pending->source = copy;
    out.pending = std::move(pending);
    return out;
  }
  out.rows = copy.to(stable, /*non_blocking=*/false, /*copy=*/false);
  if (fingerprint) out.xxh3 = tensor_chunked_xxh3(out.rows);
  return out;
}

SnapshotStore::SnapshotStore(SnapshotStoreOptions options) : options_(std::move(options)) {}

SnapshotStore::~SnapshotStore() {
  // The copies in flight still write into memory this store owns; a copy that failed (a device
  // error) is not reported from a destructor, which must not throw.
  for (auto& p : pending_) try {
      if (p) wait(*p);
    } catch (...) {
    }
}

int64_t SnapshotStore::capture(const std::string& point, const at::Tensor& borrowed,
                               std::shared_ptr<const RowSelection> rows, int64_t step) {
  if (!borrowed.defined()) throw InputError(concat("hook point '", point, "' produced no tensor"));
  if (rows &&
      (borrowed.dim() < 2 || borrowed.size(0) != rows->batch || borrowed.size(1) != rows->seq))
    throw InputError(
        concat("hook point '", point, "' produced a tensor of shape ", shape_text(borrowed.sizes()),
               ", not [batch, seq, ...] = [", rows->batch, ", ", rows->seq,
               ", ...] as the attention mask or positions say: rows can only be taken "
               "from such tensors; capture this point whole (no attention mask, no positions) or "
               "choose another point"),
        {"points", "positions", "attention_mask"});
  const c10::ScalarType dtype = options_.dtype && at::isFloatingType(borrowed.scalar_type())
                                    ? *options_.dtype
                                    : borrowed.scalar_type();
  int64_t elements = borrowed.numel();
  if (rows)
    elements = borrowed.size(0) * borrowed.size(1) == 0
                   ? 0
                   : elements / (borrowed.size(0) * borrowed.size(1)) * rows->rows();
  const uint64_t need = static_cast<uint64_t>(elements) * c10::elementSize(dtype);
  if (options_.budget_bytes && bytes_ + need > *options_.budget_bytes)
    throw RunError(concat("capturing hook point '", point, "' (", format_bytes(need),
                          ") takes the snapshots kept to ", format_bytes(bytes_ + need),
                          ", over the capture budget of ", format_bytes(*options_.budget_bytes),
                          "; capture fewer points or positions, store a smaller dtype, save and "
                          "clear between batches, or raise the budget"),
                   {"budget", "positions", "dtype"});
  SnapshotCopy copy =
      snapshot_copy(borrowed, rows.get(), dtype, options_.stable_device, options_.fingerprint);
  const int64_t call = calls_[point]++;
  snapshots_.push_back(Snapshot{point, call, step, copy.rows, copy.xxh3});
  selections_.push_back(std::move(rows));
  pending_.push_back(std::move(copy.pending));
  bytes_ += need;
  return call;
}

int64_t SnapshotStore::fence() { return finish_copies(snapshots_, pending_, options_.fingerprint); }

int64_t SnapshotStore::in_flight() const {
  int64_t n = 0;
  for (const auto& p : pending_) n += p != nullptr;
  return n;
}

void check_snapshot(const Snapshot& s, bool fingerprinted) {
  if (!fingerprinted) return;
  const uint64_t now = tensor_chunked_xxh3(s.rows);
  if (now != s.xxh3)
    throw RunError(concat("captured tensor '", s.point, "' (call ", s.call,
                          ") changed after capture: checksum ", hex64(s.xxh3), " at capture, ",
                          hex64(now), " now"));
}

at::Tensor read_snapshots(const std::vector<Snapshot>& snapshots, const std::string& point,
                          int64_t call, bool fingerprinted) {
  std::vector<at::Tensor> parts;
  for (const Snapshot& s : snapshots)
    if (s.point == point && (call < 0 || s.call == call)) {
      check_snapshot(s, fingerprinted);
      parts.push_back(s.rows);
    }
  if (parts.size() <= 1) return parts.empty() ? at::Tensor() : parts[0];
  for (const at::Tensor& t : parts)
    if (t.dim() != parts[0].dim() || t.dim() == 0 ||
        t.sizes().slice(1) != parts[0].sizes().slice(1))
      throw RunError(concat("the calls of hook point '", point, "' do not stack: shapes ",
                            shape_text(parts[0].sizes()), " and ", shape_text(t.sizes()),
                            "; read one call at a time (get(point, call)), or capture rows in "
                            "every forward (an attention mask or positions)"));
  return at::cat(parts, 0);
}

at::Tensor SnapshotStore::get(const std::string& point, int64_t call) {
  fence();
  at::Tensor rows = read_snapshots(snapshots_, point, call, options_.fingerprint);
  if (rows.defined()) return rows;
  if (!calls_.count(point)) throw RunError(concat("nothing captured at hook point '", point, "'"));
  throw RunError(concat("no call ", call, " of hook point '", point, "' is kept (",
                        calls_.at(point), " calls so far; clear() drops the kept ones)"));
}

void SnapshotStore::verify() {
  fence();
  for (const Snapshot& s : snapshots_) check_snapshot(s, options_.fingerprint);
}

const std::vector<Snapshot>& SnapshotStore::snapshots() {
  fence();
  return snapshots_;
}

const std::shared_ptr<const RowSelection>& SnapshotStore::selection(size_t snapshot) const {
  return selections_.at(snapshot);
}

std::vector<std::string> SnapshotStore::points() const {
  std::vector<std::string> out;
  for (const Snapshot& s : snapshots_)
    if (std::find(out.begin(), out.end(), s.point) == out.end()) out.push_back(s.point);
  return out;
}

int64_t SnapshotStore::calls(const std::string& point) const {
  auto it = calls_.find(point);
  return it == calls_.end() ? 0 : it->second;
}

void SnapshotStore::clear() {
  try {
    fence();  // waits for the copies; a damaged one must not make the store impossible to clear
  } catch (const std::exception&) {
  }
  snapshots_.clear();
  selections_.clear();
  pending_.clear();
  bytes_ = 0;
}

}  // namespace actcap
