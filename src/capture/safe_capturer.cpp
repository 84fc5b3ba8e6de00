#include <limits>
#include <set>
#include <sstream>

#include "actcap/capture.h"
#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/hash.h"
#include "actcap/numbers.h"
#include "actcap/snapshot.h"
#include "capture/device_index.h"
#include "capture/pending_copy.h"
#include "util/strings.h"

namespace actcap {

PositionSpec PositionSpec::parse(const std::string& text) {
  PositionSpec spec;
  if (text.empty() || text == "all") return spec;
  if (text == "first") {
    spec.ranges.push_back({0, 1});
    return spec;
  }
  if (text == "last") {
    spec.ranges.push_back({-1, std::nullopt});
    return spec;
  }
  auto parse_int = [&](const std::string& s) -> int64_t {
    const std::optional<int64_t> v = parse_int64(s);
    if (!v)
      throw InputError(concat("positions: '", s, "' in '", text,
                              "' is not an integer (all, first, last or ranges like 0:8,-4:)"),
                       {"positions"});
    return *v;
  };
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty())
      throw InputError(concat("positions: empty item in '", text, "'"), {"positions"});
    const size_t colon = item.find(':');
    Range r;
    if (colon == std::string::npos) {
      const int64_t p = parse_int(item);
      r.start = p;
      // -1 means "to the end"; so does INT64_MAX (no sequence is that long), without p + 1
      // overflowing.
      r.stop = (p == -1 || p == std::numeric_limits<int64_t>::max())
                   ? std::nullopt
                   : std::optional<int64_t>(p + 1);
    } else {
      if (item.find(':', colon + 1) != std::string::npos)
        throw InputError(
            concat("positions: '", item, "' has more than one ':' (steps are not supported)"),
            {"positions"});
      const std::string a = item.substr(0, colon), b = item.substr(colon + 1);
      if (!a.empty()) r.start = parse_int(a);
      if (!b.empty()) r.stop = parse_int(b);
    }
    spec.ranges.push_back(r);
  }
  return spec;
}

std::vector<int64_t> PositionSpec::select(int64_t length) const {
  std::vector<int64_t> out;
  if (ranges.empty()) {
    for (int64_t i = 0; i < length; ++i) out.push_back(i);
    return out;
  }
  std::vector<bool> keep(length, false);
  auto clamp = [&](int64_t v) {
    return v < 0 ? std::max<int64_t>(0, length + v) : std::min(v, length);
  };
  for (const Range& r : ranges) {
    const int64_t a = r.start ? clamp(*r.start) : 0, b = r.stop ? clamp(*r.stop) : length;
    for (int64_t i = a; i < b; ++i) keep[i] = true;
  }
  for (int64_t i = 0; i < length; ++i)
    if (keep[i]) out.push_back(i);
  return out;
}

std::optional<c10::ScalarType> parse_capture_dtype(const std::string& text) {
  if (text == "keep") return std::nullopt;
  if (text == "f32") return at::kFloat;
  if (text == "f16") return at::kHalf;
  if (text == "bf16") return at::kBFloat16;
  throw InputError(concat("capture dtype '", text, "' is not one of keep, f32, f16, bf16"),
                   {"dtype"});
}

bool is_attention_point(const std::string& name) {
  return ends_with(name, ":scores") || ends_with(name, ":probs");
}

std::vector<int64_t> parse_heads(const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& item : split(text, ',')) {
    const std::optional<int64_t> h = parse_int64(item);
    if (!h || *h < 0)
      throw InputError(concat("heads '", text, "': '", item, "' is not a head index (0, 1, ...)"),
                       {"attention_heads"});
    if (std::find(out.begin(), out.end(), *h) != out.end())
      throw InputError(concat("heads '", text, "' names head ", *h, " twice"), {"attention_heads"});
    out.push_back(*h);
  }
  if (out.empty()) throw InputError("no head given", {"attention_heads"});
  return out;
}

std::vector<PointInfo> plan_capture(const Model& model, const CaptureOptions& options) {
  if (options.patterns.empty()) throw InputError("no capture pattern given", {"capture"});
  std::set<std::string> chosen;
  for (const std::string& pattern : options.patterns)
    for (const PointInfo& p : model.resolve(pattern)) chosen.insert(p.name);
  std::vector<PointInfo> plan;
  for (PointInfo p : model.points())
    if (chosen.count(p.name)) {
      // Floating points take the requested dtype; token ids stay integers.
      if (options.dtype && at::isFloatingType(p.dtype)) p.dtype = *options.dtype;
      if (is_attention_point(p.name)) {  // [heads, keys]: the heads kept, the run's key length
        const int64_t heads = p.shape.at(0);
        const auto& kept = options.attention_heads;
        for (size_t i = 0; i < kept.size(); ++i)
          if (kept[i] < 0 || std::find(kept.begin(), kept.begin() + i, kept[i]) != kept.begin() + i)
            throw InputError(concat("heads: ", kept[i], " is ",
                                    kept[i] < 0 ? "not a head index" : "given twice"),
                             {"attention_heads"});
        for (int64_t h : kept)
          if (h >= heads)
            throw InputError(concat("head ", h, " does not exist: ", p.name, " has ", heads,
                                    " heads (0 to ", heads - 1, ")"),
                             {"attention_heads"});
        if (options.attention_keys <= 0)
          throw InputError(concat("capturing attention pattern ", p.name,
                                  " needs the key positions each row stores (the longest "
                                  "sequence of the run)"),
                           {"attention_keys"});
        if (!options.attention_heads.empty())
          p.shape[0] = static_cast<int64_t>(options.attention_heads.size());
        p.shape[1] = options.attention_keys;
      }
      plan.push_back(p);
    }
  return plan;
}

SafeCapturer::SafeCapturer(Model& model, CaptureOptions options)
    : model_(model), options_(std::move(options)), rows_(std::make_unique<RowSelection>()) {
  plan_ = plan_capture(model_, options_);
  // Observe each planned point once (not per pattern), so overlapping patterns never capture twice.
  std::vector<std::string> points;
  for (const PointInfo& p : plan_) {
    points.push_back(p.name);
    dtype_.emplace(p.name, p.dtype);
    if (is_attention_point(p.name)) pattern_probs_.emplace(p.name, ends_with(p.name, ":probs"));
  }
  if (!options_.attention_heads.empty()) {
    heads_index_ = at::tensor(options_.attention_heads, at::kLong);
    heads_on_device_ = std::make_shared<DeviceIndex>();
  }
  handle_ = model_.attach_observer(*this, points);
}

SafeCapturer::~SafeCapturer() { handle_.remove(); }

const std::vector<int64_t>& SafeCapturer::row_seq() const { return rows_->row_seq; }
const std::vector<int64_t>& SafeCapturer::row_pos() const { return rows_->row_pos; }
const std::vector<int64_t>& SafeCapturer::row_token() const { return rows_->row_token; }

int64_t SafeCapturer::bytes_per_token() const {
  int64_t total = 0;
  for (const PointInfo& p : plan_) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    total += n * static_cast<int64_t>(c10::elementSize(p.dtype));
  }
  return total;
}

uint64_t SafeCapturer::check_budget(const Batch& batch) const {
  uint64_t rows = 0;
  for (int64_t b = 0; b < batch.size(); ++b)
    rows += options_.positions.select(batch.lengths[b]).size();
  return checked_bytes_for_rows(rows);
}

uint64_t SafeCapturer::checked_bytes_for_rows(uint64_t rows) const {
  const uint64_t need = rows * static_cast<uint64_t>(bytes_per_token());
  if (options_.budget_bytes && need > *options_.budget_bytes)
    throw InputError(concat("capturing ", plan_.size(), " points x ", rows, " tokens (",
                            bytes_per_token(), " bytes per token) needs ", format_bytes(need),
                            ", over the capture budget of ", format_bytes(*options_.budget_bytes),
                            "; capture fewer points or positions, store a smaller dtype, or raise "
                            "the budget"),
                     {"capture_budget", "positions", "dtype"});
  return need;
}

std::vector<std::vector<int64_t>> SafeCapturer::default_positions(const Batch& batch) const {
  std::vector<std::vector<int64_t>> positions;
  for (int64_t b = 0; b < batch.size(); ++b)
    positions.push_back(options_.positions.select(batch.lengths[b]));
  return positions;
}

void SafeCapturer::select_rows(const Batch& batch,
                               const std::vector<std::vector<int64_t>>& positions) {
  if (static_cast<int64_t>(positions.size()) != batch.size())
    throw InputError(
        concat("positions given for ", positions.size(), " sequences, batch has ", batch.size()));
  const int64_t T = batch.ids.size(1);
  RowSelection r;
  r.batch = batch.size();
  r.seq = T;
  std::vector<int64_t> idx;
  const at::Tensor ids = batch.ids.to(at::kCPU).to(at::kLong).contiguous();
  for (int64_t b = 0; b < batch.size(); ++b)
    for (int64_t t : positions[b]) {
      if (t < 0 || t >= batch.lengths[b])
        throw InputError(
            concat("position ", t, " is outside sequence ", b, " of length ", batch.lengths[b]));
      idx.push_back(b * T + t);
      r.row_seq.push_back(b);
      r.row_pos.push_back(t);
      r.row_token.push_back(ids.data_ptr<int64_t>()[b * T + t]);
    }
  checked_bytes_for_rows(idx.size());  // before anything runs or is kept
  r.index = at::tensor(idx, at::kLong);
  r.all = static_cast<int64_t>(idx.size()) == batch.size() * T;
  for (size_t i = 0; r.all && i < idx.size(); ++i) r.all = idx[i] == static_cast<int64_t>(i);
  *rows_ = std::move(r);
}

void SafeCapturer::set_positions(std::vector<std::vector<int64_t>> positions) {
  next_positions_ = std::move(positions);
}

void SafeCapturer::on_forward_begin(const ForwardBegin& event) {
  std::optional<std::vector<std::vector<int64_t>>> positions = std::move(next_positions_);
  next_positions_.reset();
  if (!rows_selected_) {
    if (!positions) {
      check_budget(event.batch);
      positions = default_positions(event.batch);
    }
    select_rows(event.batch, *positions);
  }
  rows_selected_ = false;
  forward_first_ = snapshots_.size();
}

void SafeCapturer::on_point(const HookContext& ctx, const at::Tensor& shown) {
  at::Tensor t = shown;
  auto pattern = pattern_probs_.find(ctx.point);
  if (pattern != pattern_probs_.end()) {  // [B, T, heads, K]: the heads kept, keys padded
    if (heads_index_.defined())
      t = t.index_select(2, heads_on_device_->on(heads_index_, t.device()));
    const int64_t K = t.size(3), want = options_.attention_keys;
    if (K > want)
      throw InputError(concat(ctx.point, " attends over ", K, " keys; the capture stores ", want,
                              " per row: raise the key length to the longest sequence"),
                       {"attention_keys"});
    if (K < want)
      t = at::constant_pad_nd(t, {0, want - K},
                              pattern->second ? 0.0 : -std::numeric_limits<double>::infinity());
  }
  // On a virtual CPU or accelerator lane: the selected rows snapshotted on the producer's queue,
  // and their copy to the host queued on the lane's capture queue (pending_copy.h), fenced before
  // any read. Elsewhere (plain cpu, or a forward outside the executor): copied here, complete
  // before the hook returns (snapshot.h).
  const LaneContext* lane = current_lane();
  SnapshotCopy copy =
      copies_on_lane(lane, options_.stable_device)
          ? snapshot_copy_on_lane(*lane, t, rows_.get(), dtype_.at(ctx.point), options_.fingerprint)
          : snapshot_copy(t, rows_.get(), dtype_.at(ctx.point), options_.stable_device,
                          options_.fingerprint);
  // A window of 0 (--copy-window 0) on an accelerator lane: the copy is waited for inside the
  // hook, as on plain cpu (the blocking baseline the overlap is measured against).
  if (copy.pending && lane && lane->window && lane->window->limit == 0) {
    copy.xxh3 =
        finish_copy(*copy.pending, copy.rows, options_.fingerprint, ctx.point, ctx.call_index);
    copy.pending.reset();
  }
  snapshots_.push_back(Snapshot{ctx.point, ctx.call_index, ctx.step, copy.rows, copy.xxh3});
  pending_.push_back(std::move(copy.pending));
  if (pending_.back()) ++in_flight_;
}

int64_t SafeCapturer::fence() const {
  if (in_flight_ == 0) return 0;  // nothing queued since the last fence: no pass over every entry
  const int64_t not_landed = finish_copies(snapshots_, pending_, options_.fingerprint);
  in_flight_ = 0;  // not reached when a damaged copy throws: the next read checks it again
  return not_landed;
}

const std::vector<Snapshot>& SafeCapturer::snapshots() const {
  fence();
  return snapshots_;
}

void SafeCapturer::clear() {
  try {
    fence();  // waits for the copies; a damaged one must not make the capturer impossible to clear
  } catch (const std::exception&) {
  }
  snapshots_.clear();
  pending_.clear();
}

void SafeCapturer::on_forward_end(const ForwardEnd&) {
  forward_ended_ = true;
  check_all_fired(forward_first_);
}

void SafeCapturer::check_all_fired(size_t first) const {
  // Silent misses are errors: every planned point must have fired in this forward.
  std::set<std::string> fired;
  for (size_t i = first; i < snapshots_.size(); ++i) fired.insert(snapshots_[i].point);
  for (const PointInfo& p : plan_)
    if (!fired.count(p.name))
      throw RunError(concat("hook point '", p.name, "' never fired during the forward pass"));
}

at::Tensor SafeCapturer::run(const Batch& batch, Model::Logits logits) {
  check_budget(batch);
  return run(batch, default_positions(batch), logits);
}

at::Tensor SafeCapturer::run(const Batch& batch, const std::vector<std::vector<int64_t>>& positions,
                             Model::Logits logits) {
  select_rows(batch, positions);
  const size_t before = snapshots_.size();
  rows_selected_ = true;
  forward_ended_ = false;
  struct Unselect {  // a forward that never began must not leave these rows to the next one
    bool& selected;
    ~Unselect() { selected = false; }
  } unselect{rows_selected_};
  at::Tensor out = model_.forward(batch, logits);
  if (!forward_ended_) check_all_fired(before);  // not attached: nothing fired
  return out;
}

void SafeCapturer::verify() const {
  fence();
  for (const Snapshot& s : snapshots_) check_snapshot(s, options_.fingerprint);
}

at::Tensor SafeCapturer::get(const std::string& point, int64_t call) const {
  fence();
  at::Tensor rows = read_snapshots(snapshots_, point, call, options_.fingerprint);
  if (rows.defined()) return rows;
  throw RunError(call < 0 ? concat("nothing captured at hook point '", point, "'")
                          : concat("no call ", call, " captured at hook point '", point, "'"));
}

}  // namespace actcap
