#include "models/module.h"

#include <algorithm>
#include <limits>
#include <set>

#include "actcap/diagnostics.h"
#include "actcap/error.h"

namespace actcap {

const at::Tensor& ForwardState::bias(std::optional<int64_t> window) {
  if (row_positions.defined()) {  // cached decoding: row b's query at p sees keys j <= p
    const int64_t key = window ? *window : -1;
    auto it = window_bias.find(key);
    if (it != window_bias.end()) return it->second;
    auto p = row_positions.unsqueeze(1).unsqueeze(-1);  // [B, 1, T, 1]
    auto j = at::arange(kv_len, row_positions.options()).view({1, 1, 1, kv_len});
    auto visible = j <= p;
    if (window) visible = visible.logical_and(j > p - *window);
    auto b = at::zeros(visible.sizes(), visible.options().dtype(compute))
                 .masked_fill_(visible.logical_not(), -std::numeric_limits<float>::infinity());
    return window_bias.emplace(key, b).first->second;
  }
  if (!window || *window >= seq) return causal_bias;
  auto it = window_bias.find(*window);
  if (it != window_bias.end()) return it->second;
  // Visible iff i - window < j <= i (HF sliding_window_causal: kv_idx > q_idx - window).
  auto i = at::arange(seq, at::kLong).unsqueeze(1);
  auto j = at::arange(seq, at::kLong).unsqueeze(0);
  auto visible = (j <= i).logical_and(j > i - *window);
  auto b = at::zeros({seq, seq}, compute)
               .masked_fill_(visible.logical_not(), -std::numeric_limits<float>::infinity());
  return window_bias.emplace(*window, b.to(causal_bias.device())).first->second;
}

at::Tensor ForwardState::in_compute(const at::Tensor& w) {
  if (!w.defined() || w.scalar_type() == compute) return w;
  if (w.dim() < 2 || !widen_scratch.defined() || widen_scratch.numel() < w.numel() ||
      !w.is_non_overlapping_and_dense())
    return w.to(compute);
  // Same sizes and strides as `w` over the scratch (a transposed view stays transposed), so the
  // copy is a straight conversion pass and the GEMM reads the layout it would have read.
  at::Tensor out = widen_scratch.as_strided(w.sizes(), w.strides(), 0);
  out.copy_(w);
  return out;
}

at::Tensor ForwardState::in_compute(const LinearWeight& w) {
  return w.fp8.defined() ? fp8_decode(w.fp8, compute, widen_scratch) : in_compute(w.dense);
}

Module::Module(std::string name, PointInfo in, PointInfo out)
    : name_(std::move(name)), in_(std::move(in)), out_(std::move(out)) {}

void Module::collect(std::vector<Module*>& out) {
  out.push_back(this);
  for (auto& c : children_) c->collect(out);
}

void Module::to_device(c10::Device device) {
  for (at::Tensor* t : parameters_)
    if (t->defined() && t->device() != device) *t = t->to(device);
  for (auto& c : children_) c->to_device(device);
}

uint64_t Module::parameter_bytes() const {
  uint64_t n = 0;
  for (const at::Tensor* t : parameters_)
    if (t->defined()) n += t->numel() * t->element_size();
  for (const auto& c : children_) n += c->parameter_bytes();
  return n;
}

int64_t Module::kv_elements_per_token() const {
  int64_t n = 0;
  for (const auto& c : children_) n += c->kv_elements_per_token();
  return n;
}

int64_t Module::widen_elements(at::ScalarType compute) const {
  int64_t n = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor* t = parameters_[i];
    if (!t->defined()) continue;
    if ((use_[i] == Use::kConverted && t->dim() >= 2 && t->is_floating_point() &&
         t->scalar_type() != compute) ||
        use_[i] == Use::kDecoded)
      n = std::max(n, t->numel());
  }
  for (const auto& c : children_) n = std::max(n, c->widen_elements(compute));
  return n;
}

ModuleHooks& Module::hooks() {
  if (!hooks_) hooks_ = std::make_shared<ModuleHooks>();
  return *hooks_;
}

bool Module::hooked() const { return hooks_ && (!hooks_->pre.empty() || !hooks_->post.empty()); }

void Module::drop_hooks_if_empty() {
  if (!hooked()) hooks_.reset();
}

namespace {

[[noreturn]] void bare_ref_error(const std::string& point) {
  throw RunError(
      concat("hook on point '", point,
             "' kept a reference to the borrowed tensor (the tensor itself, a view or a detach()); "
             "actcap reuses that memory for later layers, so the kept value would silently change. "
             "Copy inside the hook with t.clone() (or use SafeCapturer), or set the bare-reference "
             "policy to warn or off"),
      {"bare_ref"});
}

void run_hooks(std::vector<HookEntry>& entries, const std::string& point, bool is_input,
               const at::Tensor& t, const ForwardState& st) {
  // Iterate over a snapshot: a hook may remove itself or others while running.
  std::vector<std::pair<int64_t, HookFn>> snapshot;
  snapshot.reserve(entries.size());
  for (const auto& e : entries) snapshot.emplace_back(e.id, e.fn);
  for (auto& [id, fn] : snapshot) {
    auto live = std::find_if(entries.begin(), entries.end(),
                             [id = id](const HookEntry& e) { return e.id == id; });
    if (live == entries.end()) continue;
    HookContext ctx{point, is_input, t.device(), live->calls++, st.step};
    // Bare-reference guard: a hook that keeps the tensor or a view raises these use counts.
    const size_t impl_uses = t.use_count();
    const size_t storage_uses = t.has_storage() ? t.storage().use_count() : 0;
    try {
      fn(ctx, t);
    } catch (const Error&) {
      throw;                           // already names what failed
    } catch (const c10::Error& err) {  // a LibTorch error: its what() carries a C++ backtrace
      throw RunError(concat("hook on point '", point, "' threw: ", err.what_without_backtrace()));
    } catch (const std::exception& err) {
      throw RunError(concat("hook on point '", point, "' threw: ", err.what()));
    } catch (...) {
      throw RunError(
          concat("hook on point '", point, "' threw an exception that is not a std::exception"));
    }
    if (st.bare_ref != BareRefPolicy::kOff &&
        (t.use_count() > impl_uses ||
         (t.has_storage() && t.storage().use_count() > storage_uses))) {
      if (st.bare_ref == BareRefPolicy::kError) bare_ref_error(point);
      if (!st.bare_ref_warned || st.bare_ref_warned->insert(point).second)
        warn(concat("hook on point '", point,
                    "' kept a reference to the borrowed tensor; its value will change when the "
                    "memory is reused: copy inside the hook with t.clone()"));
    }
  }
}

}  // namespace

at::Tensor Module::call_hooked(const at::Tensor& x, ForwardState& st) {
  std::shared_ptr<ModuleHooks> hooks = hooks_;  // stays alive even if a hook removes the last one
  if (!hooks->pre.empty()) run_hooks(hooks->pre, in_.name, true, x, st);
  at::Tensor y = forward(x, st);
  if (!hooks->post.empty()) run_hooks(hooks->post, out_.name, false, y, st);
  return y;
}

PointInfo hidden_point(const std::string& name, int64_t width) {
  return {name, {width}, at::kFloat};
}
PointInfo ids_point(const std::string& name) { return {name, {}, at::kLong}; }

Linear::Linear(const std::string& name, LinearWeight weight, at::Tensor bias)
    : Module(name, hidden_point(name + ":input", weight.size(1)),
             hidden_point(name, weight.size(0))),
      weight_(std::move(weight)),
      bias_(std::move(bias)) {
  parameter(weight_);
  parameter(bias_);
}

at::Tensor Linear::forward(const at::Tensor& x, ForwardState& st) {
  // The weight through the scratch first: converting the bias allocates and would not disturb it.
  at::Tensor w = st.in_compute(weight_);
  return at::linear(x, w, st.in_compute(bias_));
}

Embedding::Embedding(const std::string& name, at::Tensor weight)
    : Module(name, ids_point(name + ":input"), hidden_point(name, weight.size(1))),
      weight_(std::move(weight)) {
  parameter(weight_, /*widened=*/false);
}

at::Tensor embedding_rows(const at::Tensor& weight, const at::Tensor& ids, at::ScalarType dtype) {
  at::Tensor rows = at::embedding(weight, ids);
  return rows.scalar_type() == dtype ? rows : rows.to(dtype);
}

at::Tensor Embedding::forward(const at::Tensor& ids, ForwardState& st) {
  return embedding_rows(weight_, ids, st.compute);
}

Activation::Activation(const std::string& name, const std::string& kind, int64_t width)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)) {
  if (kind == "gelu_new" || kind == "gelu_pytorch_tanh" || kind == "gelu_fast") {
    kind_ = Kind::kGeluTanh;
  } else if (kind == "gelu") {
    kind_ = Kind::kGelu;
  } else if (kind == "relu") {
    kind_ = Kind::kRelu;
  } else if (kind == "silu" || kind == "swish") {
    kind_ = Kind::kSilu;
  } else {
    throw InputError(concat("unsupported activation '", kind, "' for ", name));
  }
}

at::Tensor Activation::forward(const at::Tensor& x, ForwardState&) { return apply(x); }

at::Tensor Activation::apply(const at::Tensor& x) const {
  switch (kind_) {
    case Kind::kGeluTanh:
      return at::gelu(x, "tanh");
    case Kind::kGelu:
      return at::gelu(x);
    case Kind::kRelu:
      return at::relu(x);
    case Kind::kSilu:
      return at::silu(x);
  }
  return x;
}

}  // namespace actcap
