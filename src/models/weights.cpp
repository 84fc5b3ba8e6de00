#include "models/weights.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <set>

#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "models/fp8_weights.h"
#include "util/strings.h"

namespace actcap {

namespace {

// splitmix64: tiny, fast, and the same on every platform.
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() {
    return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
};

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, salted by the seed
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace

// Box-Muller normals, N(base, 0.02), in the stored layout; the stream depends on the name only.
// Pair k of the stream starts from state s0 + 2k·gamma (splitmix64 is a counter), so chunks are
// generated in parallel with the same bytes whatever the thread count.
at::Tensor random_weight(uint64_t seed, const WeightSpec& spec) {
  constexpr double kStd = 0.02;
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  at::Tensor t = at::empty(spec.shape, at::kFloat);
  float* p = t.data_ptr<float>();
  const int64_t n = t.numel(), pairs = (n + 1) / 2;
  const uint64_t s0 = name_seed(seed, spec.name);
  const double base = spec.init == Init::kGain ? 1.0 : 0.0;
  at::parallel_for(0, pairs, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    SplitMix64 rng{s0 + 2 * static_cast<uint64_t>(begin) * kGamma};
    for (int64_t k = begin; k < end; ++k) {  // two normals per pair of uniforms
      const int64_t i = 2 * k;
      double r = std::sqrt(-2.0 * std::log(rng.uniform()));
      double a = 6.283185307179586 * rng.uniform();
      p[i] = static_cast<float>(base + kStd * r * std::cos(a));
      if (i + 1 < n) p[i + 1] = static_cast<float>(base + kStd * r * std::sin(a));
    }
  });
  return t;
}

namespace {

// A checkpoint tensor as the modules hold it: float32, or as stored for a 16-bit matrix under
// keep_16bit (zero-copy over the mapping either way when the stored dtype is the one held).
at::Tensor held(const at::Tensor& t, bool keep_16bit) {
  if (t.scalar_type() == at::kFloat) return t;
  const bool half = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  return keep_16bit && half && t.dim() >= 2 ? t : t.to(at::kFloat);
}

}  // namespace

struct WeightSource::State {
  const std::map<std::string, at::Tensor>* tensors = nullptr;  // load(); null for random()
  std::string origin;
  uint64_t seed = 0;
  at::ScalarType stored_dtype = at::kFloat;
  bool shapes_only = false;
  bool keep_16bit = false;
  std::optional<Fp8Weights> fp8;
  std::vector<std::pair<std::string, std::string>> prefix_aliases;
  std::vector<std::string> ignored_suffixes;
  std::vector<std::string> ignored_prefixes;
  std::vector<WeightSpec> specs;
  std::set<std::string> used;
  std::map<std::string, at::Tensor> stored;

  // The checkpoint tensor for `name`: the name itself, an alias, or a prefix alias of either.
  const std::string* find(const std::string& name, const std::vector<std::string>& aliases,
                          std::vector<std::string>& tried) const {
    std::vector<std::string> names{name};
    names.insert(names.end(), aliases.begin(), aliases.end());
    for (const std::string& n : names) {
      auto it = tensors->find(n);
      if (it != tensors->end()) return &it->first;
      if (n != name) tried.push_back(n);
      for (const auto& [prefix, alt] : prefix_aliases) {
        if (!starts_with(n, prefix)) continue;
        const std::string other = alt + n.substr(prefix.size());
        auto it2 = tensors->find(other);
        if (it2 != tensors->end()) return &it2->first;
        tried.push_back(other);
      }
    }
    return nullptr;
  }

  void check_shape(const std::string& found, const at::Tensor& t,
                   const std::vector<int64_t>& shape) const {
    if (t.sizes() != at::IntArrayRef(shape))
      throw InputError(concat(origin, ": tensor ", found, " has shape ", concat(t.sizes()),
                              " but config.json implies ", concat(at::IntArrayRef(shape))));
  }

  // Checkpoint tensor `found` as an FP8 weight (its codes, with its scales beside it under an FP8
  // quantization_config), the scales then used; nullopt for any other tensor.
  std::optional<Fp8Matrix> fp8_weight(const std::string& found) {
    const at::Tensor& t = tensors->at(found);
    const bool byte = t.scalar_type() == at::kByte || at::isFloatingType(t.scalar_type());
    if (!fp8 || !byte || t.element_size() != 1) return std::nullopt;
    auto s = tensors->find(found + fp8->scale_suffix);
    if (s == tensors->end()) return std::nullopt;
    Fp8Matrix m = fp8_matrix(*fp8, found, t, s->second, origin);
    used.insert(s->first);
    return m;
  }
};

WeightSource::WeightSource(std::shared_ptr<State> state, std::string prefix)
    : state_(std::move(state)), prefix_(std::move(prefix)) {}

WeightSource WeightSource::load(const std::map<std::string, at::Tensor>& tensors,
                                std::string origin, bool keep_16bit,
                                std::optional<Fp8Weights> fp8) {
  auto s = std::make_shared<State>();
  s->tensors = &tensors;
  s->origin = std::move(origin);
  s->keep_16bit = keep_16bit;
  // compressed-tensors' activation and KV-cache scales: activations are not quantized.
  if (fp8 && fp8->method == "compressed-tensors")
    s->ignored_suffixes = {".input_scale", ".output_scale", ".k_scale", ".v_scale"};
  s->fp8 = std::move(fp8);
  return WeightSource(std::move(s), "");
}

WeightSource WeightSource::random(uint64_t seed, at::ScalarType stored) {
  auto s = std::make_shared<State>();
  s->seed = seed;
  s->stored_dtype = stored;
  return WeightSource(std::move(s), "");
}

WeightSource WeightSource::shapes() {
  auto s = std::make_shared<State>();
  s->shapes_only = true;
  return WeightSource(std::move(s), "");
}

WeightSource WeightSource::pp(const std::string& part) const {
  return WeightSource(state_, prefix_ + part + ".");
}

WeightSource WeightSource::pp(int64_t index) const { return pp(std::to_string(index)); }

void WeightSource::alias_prefix(const std::string& prefix, const std::string& alternative) {
  state_->prefix_aliases.emplace_back(prefix, alternative);
}

void WeightSource::ignore_suffix(const std::string& suffix) {
  state_->ignored_suffixes.push_back(suffix);
}

void WeightSource::ignore_prefix(const std::string& prefix) {
  state_->ignored_prefixes.push_back(prefix);
}

bool WeightSource::has(const std::string& relative) const {
  const State& s = *state_;
  if (!s.tensors) return false;
  std::vector<std::string> tried;
  return s.find(prefix_ + relative, {}, tried) != nullptr;
}

at::Tensor WeightSource::get(const std::string& relative, const std::vector<int64_t>& shape,
                             Init init, Layout layout, const std::vector<std::string>& aliases) {
  State& s = *state_;
  WeightSpec spec{prefix_ + relative, shape, init};
  s.specs.push_back(spec);
  at::Tensor w;
  if (s.shapes_only) {
    w = at::empty(shape, at::kFloat);  // large ones are mapped, not touched
  } else if (!s.tensors) {
    w = random_weight(s.seed, spec);
    s.stored.emplace(spec.name, s.stored_dtype == at::kFloat ? w : w.to(s.stored_dtype));
  } else {
    std::vector<std::string> tried;
    const std::string* found = s.find(spec.name, aliases, tried);
    if (!found) {
      std::string also;
      for (const std::string& a : tried) also += (also.empty() ? " (also looked for " : ", ") + a;
      if (!also.empty()) also += ")";
      throw InputError(concat(s.origin, ": missing tensor ", spec.name, also));
    }
    s.used.insert(*found);
    at::Tensor t = s.tensors->at(*found);
    // Decoded in one pass to the dtype a weight stored in the checkpoint's dtype is held in (that
    // dtype under keep_16bit, float32 otherwise), each value rounded through the checkpoint's.
    if (std::optional<Fp8Matrix> packed = s.fp8_weight(*found))
      t = fp8_decode(*packed, s.keep_16bit ? packed->rounded : at::kFloat);
    // 8-bit floats hold values only their block scales make weights of (models/fp8_weights.h):
    // without them, or without an fp8 quantization_config, refused rather than run as garbage.
    const bool float8 =
        at::isFloatingType(t.scalar_type()) && c10::elementSize(t.scalar_type()) == 1;
    if (!at::isFloatingType(t.scalar_type()) || float8)
      throw InputError(concat(s.origin, ": tensor ", *found, " has dtype ", t.scalar_type(),
                              float8 ? "; 8-bit float weights are decoded only with their block "
                                       "scales under an FP8 quantization_config (\"fp8\", "
                                       "\"compressed-tensors\")"
                                     : "; weights must be floating point (F32, F16, BF16, F64)"));
    s.check_shape(*found, t, shape);
    w = held(t, s.keep_16bit);
  }
  // A transposed view, not a copy: linear() then multiplies by the stored [in, out] matrix
  // directly (BLAS takes either layout at the same speed), so GPT-2's Conv1D weights stay
  // zero-copy over the mapping too and are resident once, not twice.
  return layout == Layout::kTransposed ? w.t() : w;
}

LinearWeight WeightSource::get_linear(const std::string& relative,
                                      const std::vector<int64_t>& shape) {
  State& s = *state_;
  if (s.tensors && s.keep_16bit && s.fp8) {
    std::vector<std::string> tried;
    const std::string* found = s.find(prefix_ + relative, {}, tried);
    if (found) {
      const at::Tensor& t = s.tensors->at(*found);
      if (std::optional<Fp8Matrix> packed = s.fp8_weight(*found)) {
        s.check_shape(*found, t, shape);
        s.specs.push_back({prefix_ + relative, shape, Init::kMatrix});
        s.used.insert(*found);
        return std::move(*packed);
      }
    }
  }
  return get(relative, shape);
}

at::Tensor WeightSource::get_packed(const std::string& relative, const std::vector<int64_t>& shape,
                                    at::ScalarType dtype) {
  State& s = *state_;
  const std::string name = prefix_ + relative;
  if (!s.tensors) throw std::logic_error(concat("get_packed(", name, ") without a checkpoint"));
  std::vector<std::string> tried;
  const std::string* found = s.find(name, {}, tried);
  if (!found) throw InputError(concat(s.origin, ": missing tensor ", name));
  const at::Tensor& t = s.tensors->at(*found);
  if (t.scalar_type() != dtype)
    throw InputError(concat(s.origin, ": tensor ", *found, " has dtype ", t.scalar_type(),
                            "; a packed weight must be ", dtype));
  s.check_shape(*found, t, shape);
  s.specs.push_back({name, shape, Init::kMatrix});
  s.used.insert(*found);
  return t;
}

bool WeightSource::keeps_stored() const { return state_->keep_16bit; }

void WeightSource::warn_unused() const {
  const State& s = *state_;
  if (!s.tensors) return;
  std::vector<std::string> unused;
  for (const auto& [name, t] : *s.tensors) {
    if (s.used.count(name)) continue;
    bool ignored = false;
    for (const std::string& suf : s.ignored_suffixes) ignored |= ends_with(name, suf);
    for (const std::string& pre : s.ignored_prefixes) ignored |= starts_with(name, pre);
    if (!ignored) unused.push_back(name);
  }
  if (unused.empty()) return;
  std::string list;
  for (size_t i = 0; i < unused.size() && i < 5; ++i) list += (i ? ", " : "") + unused[i];
  if (unused.size() > 5) list += concat(", ... (", unused.size(), " in all)");
  warn(concat(s.origin, ": ignoring tensors the model does not use: ", list));
}

const std::vector<WeightSpec>& WeightSource::specs() const { return state_->specs; }
const std::map<std::string, at::Tensor>& WeightSource::stored() const { return state_->stored; }

}  // namespace actcap
