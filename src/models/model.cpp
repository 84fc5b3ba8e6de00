#include "actcap/model.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <utility>

#include "actcap/checkpoint.h"
#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/hash.h"
#include "actcap/observer.h"
#include "models/arch/architecture.h"
#include "models/fp8_weights.h"
#include "models/model_parts.h"
#include "models/weights.h"
#include "util/strings.h"

namespace actcap {

// ---- Batch ---------------------------------------------------------------------------------

int64_t Batch::max_len() const {
  int64_t m = 0;
  for (int64_t l : lengths) m = std::max(m, l);
  return m;
}

int64_t Batch::tokens() const {
  int64_t n = 0;
  for (int64_t l : lengths) n += l;
  return n;
}

Batch Batch::from_sequences(const std::vector<std::vector<int64_t>>& seqs, int64_t vocab_size,
                            int64_t max_positions) {
  if (seqs.empty()) throw InputError("no input sequences");
  Batch b;
  int64_t T = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].empty()) throw InputError(concat("sequence ", i, " is empty"));
    if (static_cast<int64_t>(seqs[i].size()) > max_positions)
      throw InputError(concat("sequence ", i, " has ", seqs[i].size(),
                              " tokens but the model's context is ", max_positions, " positions"));
    for (size_t j = 0; j < seqs[i].size(); ++j)
      if (seqs[i][j] < 0 || seqs[i][j] >= vocab_size)
        throw InputError(concat("token id ", seqs[i][j], " (sequence ", i, ", position ", j,
                                ") is outside the vocabulary [0, ", vocab_size, ")"));
    T = std::max<int64_t>(T, seqs[i].size());
    b.lengths.push_back(seqs[i].size());
  }
  b.ids = at::zeros({static_cast<int64_t>(seqs.size()), T},
                    at::kLong);  // pad id 0: never attended by real tokens
  auto acc = b.ids.accessor<int64_t, 2>();
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t j = 0; j < seqs[i].size(); ++j) acc[i][j] = seqs[i][j];
  return b;
}

// ---- hooks ---------------------------------------------------------------------------------

class HookRegistry {
 public:
  struct Site {
    Module* module;
    bool pre;
  };
  std::map<int64_t, std::vector<Site>> sites;  // by handle id: a hook's, or an observer's points
  std::map<int64_t, Observer*> observers;      // by handle id
  int64_t next_id = 0;

  void remove(int64_t id) {
    auto it = sites.find(id);
    if (it == sites.end()) return;
    for (const Site& s : it->second) {
      auto& list = s.pre ? s.module->hooks().pre : s.module->hooks().post;
      list.erase(
          std::remove_if(list.begin(), list.end(), [id](const HookEntry& e) { return e.id == id; }),
          list.end());
      s.module->drop_hooks_if_empty();
    }
    sites.erase(it);
    observers.erase(id);
  }

  // Registers `fn` on `sites` under a new handle id.
  int64_t add(std::vector<Site> add_sites, const HookFn& fn) {
    const int64_t id = next_id++;
    for (const auto& s : add_sites) {
      auto& list = s.pre ? s.module->hooks().pre : s.module->hooks().post;
      list.push_back(HookEntry{id, fn, 0});
    }
    sites.emplace(id, std::move(add_sites));
    return id;
  }
};

void HookHandle::remove() {
  if (auto reg = reg_.lock()) reg->remove(id_);
  id_ = -1;
}

bool HookHandle::active() const {
  auto reg = reg_.lock();
  return reg && reg->sites.count(id_);
}

Observer::~Observer() {
  for (HookHandle& h : attachments_) h.remove();
}

const char* stage_kind_name(StageKind kind) {
  switch (kind) {
    case StageKind::kEmbeddings:
      return "embeddings";
    case StageKind::kBlock:
      return "block";
    case StageKind::kFinalNorm:
      return "final_norm";
    case StageKind::kHead:
      return "head";
  }
  return "?";
}

// ---- Model ---------------------------------------------------------------------------------

struct Model::Impl {
  BuiltModel built;
  std::vector<Module*> modules;  // every named module, pre-order

  // The hook lists `pattern` names: the pre-hooks of the modules it matches when it ends in
  // ":input", their forward hooks otherwise.
  std::vector<HookRegistry::Site> sites(const std::string& pattern) const;
};

Model::~Model() = default;

bool ModelParts::head_shares_embedding(const Model& model) {
  return model.impl_->built.head_shares_embedding;
}

std::vector<int64_t> ModelParts::kv_elements_per_token(const Model& model) {
  std::vector<int64_t> out;
  for (const Module* s : model.stages()) out.push_back(s->kv_elements_per_token());
  return out;
}

const std::map<int64_t, Observer*>& ModelParts::observers(const Model& model) {
  return model.hooks_->observers;
}

namespace {

constexpr uint64_t kDemoSeed = 0;

ModelConfig demo_config() {
  ModelConfig c = architecture_for("gpt2", "demo").preset("tiny");
  c.vocab_size = 257;  // 256 bytes + <|endoftext|>
  c.max_position_embeddings = 512;
  c.bos_token_id = c.eos_token_id = 256;
  return c;
}

// Where GEMMs read float32 weights from, in bytes.
constexpr size_t kGemmAlignment = 64;

// MemAvailable of /proc/meminfo in bytes; 0 where unknown.
uint64_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

std::string fingerprint_tensors(const std::map<std::string, at::Tensor>& tensors) {
  std::string acc;
  for (const auto& [name, t] : tensors) acc += name + ":" + hex64(tensor_xxh3(t)) + ";";
  return hex64(xxh3(acc.data(), acc.size()));
}

}  // namespace

const char* weights_dtype_name(WeightsDtype d) { return d == WeightsDtype::kKeep ? "keep" : "f32"; }

WeightsDtype parse_weights_dtype(const std::string& name) {
  if (name == "keep") return WeightsDtype::kKeep;
  if (name == "f32") return WeightsDtype::kF32;
  throw InputError(concat("unknown weights dtype '", name, "'; supported: keep, f32"),
                   {"weights_dtype"});
}

const char* compute_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return "bf16";
    case at::kHalf:
      return "f16";
    default:
      return "f32";
  }
}

c10::ScalarType parse_compute_dtype(const std::string& name) {
  if (name == "f32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "f16") return at::kHalf;
  throw InputError(concat("unknown compute dtype '", name, "'; supported: f32, bf16, f16"),
                   {"compute_dtype"});
}

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
  if (path == "demo") {
    ModelConfig c = demo_config();
    WeightSource random = WeightSource::random(kDemoSeed);
    architecture_of(c).build(c, random);
    return from_tensors(c, random.stored(), "demo", options);
  }
  Checkpoint ckpt = Checkpoint::open(path);
  ModelConfig c = load_config(ckpt.config_path());
  // Before the tensors: hashing reads every byte, and the pages of tensors copied below are
  // released once copied.
  const std::string fingerprint = ckpt.fingerprint();
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& name : ckpt.names()) {
    // Float32 matrices go straight into GEMMs: aligned as the CPU allocator aligns (AVX-512
    // lines). The data section of a safetensors file need not be: side by side, matrices 32 bytes
    // off a 64-byte boundary ran ~5% slower than the same weights aligned.
    const TensorInfo& info = ckpt.info(name);
    const bool gemm = info.dtype == at::kFloat && info.shape.size() >= 2;
    tensors.emplace(name, ckpt.tensor(name, gemm ? kGemmAlignment : 1));
  }
  // FP8 weights checked (or refused without their quantization_config) before the build.
  check_fp8_weights(c.fp8, ckpt, tensors);
  // Widened copies are anonymous memory the kernel cannot page back to the file: refuse before
  // the machine runs out of it rather than after. (Under keep, FP8 codes and MXFP4 blocks stay
  // packed and are decoded a matrix at a time into the scratch the planner counts.)
  if (options.weights_dtype == WeightsDtype::kF32) {
    uint64_t widened = 0;
    for (const auto& [name, t] : tensors) {
      if (t.element_size() == 2 && t.is_floating_point()) widened += t.numel() * sizeof(float);
      // FP8 codes: one value per byte, decoded and widened to float32 at load.
      if (is_f8(ckpt.info(name).dtype_name)) widened += t.numel() * sizeof(float);
      // MXFP4 blocks (gpt-oss's experts): two values per byte, decoded to float32 at load.
      if (t.scalar_type() == at::kByte && ends_with(name, "_blocks"))
        widened += t.numel() * 2 * sizeof(float);
    }
    const uint64_t available = host_memory_available();
    if (available > 0 && widened > available)
      throw InputError(concat("widening the 16-bit (or FP8, MXFP4) weights of ", path,
                              " to float32 at load needs ", format_bytes(widened),
                              ", more than the ", format_bytes(available),
                              " of memory this host has available; keep them as stored (weights "
                              "dtype keep)"),
                       {"weights_dtype"});
  }
  auto model = from_tensors(c, tensors, path, options);
  model->fingerprint_ = fingerprint;
  return model;
}

std::unique_ptr<Model> Model::from_tensors(const ModelConfig& config,
                                           const std::map<std::string, at::Tensor>& tensors,
                                           const std::string& origin, const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  m->origin_ = origin;
  m->fingerprint_ = fingerprint_tensors(tensors);
  const c10::ScalarType compute = options.compute_dtype;
  if (compute != at::kFloat && compute != at::kBFloat16 && compute != at::kHalf)
    throw InputError(
        concat("compute dtype ", c10::toString(compute), " is not one of f32, bf16, f16"),
        {"compute_dtype"});
  m->compute_dtype_ = compute;
  WeightSource weights =
      WeightSource::load(tensors, origin, options.weights_dtype == WeightsDtype::kKeep, config.fp8);
  m->impl_ = std::make_unique<Impl>();
  m->impl_->built = architecture_of(config).build(config, weights);
  weights.warn_unused();
  std::vector<Module*> all;
  for (auto& s : m->impl_->built.stages) {
    m->stages_.push_back(s.module.get());
    m->stage_kinds_.push_back(s.kind);
    s.module->collect(all);
  }
  for (Module* mod : all)
    if (mod->has_points()) m->impl_->modules.push_back(mod);
  m->hooks_ = std::make_shared<HookRegistry>();
  m->place(ExecutionOptions{});
  return m;
}

std::vector<PointInfo> Model::points() const {
  std::vector<PointInfo> out;
  // Modules declare float32 points; every floating activation is in the compute dtype, but for
  // the outputs a module keeps float32.
  auto computed = [&](PointInfo p) {
    if (at::isFloatingType(p.dtype)) p.dtype = compute_dtype_;
    return p;
  };
  for (Module* m : impl_->modules) {
    out.push_back(m->float32_output() ? m->output_point() : computed(m->output_point()));
    if (!m->is_tap()) out.push_back(computed(m->input_point()));
  }
  return out;
}

std::vector<std::string> Model::point_names() const {
  std::vector<std::string> out;
  for (const PointInfo& p : points()) out.push_back(p.name);
  return out;
}

std::vector<PointInfo> Model::resolve(const std::string& pattern) const {
  std::vector<PointInfo> out;
  const std::vector<PointInfo> all = points();
  for (const PointInfo& p : all)
    if (match_point(pattern, p.name)) out.push_back(p);
  if (out.empty()) {
    std::string near;
    for (const auto& n : nearest_points(pattern, point_names()))
      near += (near.empty() ? "" : ", ") + n;
    throw InputError(concat("pattern '", pattern, "' matches no hook point of ", origin_,
                            "; nearest: ", near, " (run `actcap points` for the full list)"));
  }
  return out;
}

std::vector<HookRegistry::Site> Model::Impl::sites(const std::string& pattern) const {
  const bool input = pattern.size() > 6 && ends_with(pattern, ":input");
  std::vector<HookRegistry::Site> out;
  for (Module* m : modules)
    if (match_point(pattern, input ? m->input_point().name : m->output_point().name))
      out.push_back({m, input});
  return out;
}

HookHandle Model::register_forward_hook(const std::string& pattern, HookFn fn) {
  resolve(pattern);  // loud on zero matches
  return HookHandle(hooks_, hooks_->add(impl_->sites(pattern), fn));
}

HookHandle Model::attach_observer(Observer& observer, const std::vector<std::string>& patterns) {
  std::vector<HookRegistry::Site> sites;
  std::set<std::pair<Module*, bool>> seen;
  for (const std::string& pattern : patterns) {
    resolve(pattern);  // loud on zero matches
    for (const HookRegistry::Site& s : impl_->sites(pattern))
      if (seen.insert({s.module, s.pre}).second) sites.push_back(s);
  }
  Observer* o = &observer;
  const int64_t id = hooks_->add(
      std::move(sites), [o](const HookContext& ctx, const at::Tensor& t) { o->on_point(ctx, t); });
  hooks_->observers.emplace(id, o);
  HookHandle handle(hooks_, id);
  auto& mine = observer.attachments_;
  mine.erase(
      std::remove_if(mine.begin(), mine.end(), [](const HookHandle& h) { return !h.active(); }),
      mine.end());
  mine.push_back(handle);
  return handle;
}

HookHandle Model::register_forward_pre_hook(const std::string& pattern, HookFn fn) {
  const bool input = pattern.size() > 6 && ends_with(pattern, ":input");
  return register_forward_hook(input ? pattern : pattern + ":input", std::move(fn));
}

size_t Model::hook_count() const {
  size_t n = 0;
  for (const auto& [id, sites] : hooks_->sites) n += sites.size();
  return n;
}

std::vector<std::vector<std::string>> Model::stage_modules() const {
  std::vector<std::vector<std::string>> out;
  for (Module* s : stages_) {
    if (s->has_points()) {
      out.push_back({s->name()});
    } else {  // structural stage: the HF modules inside it
      std::vector<Module*> inner;
      s->collect(inner);
      std::vector<std::string> names;
      for (Module* m : inner)
        if (m->has_points() && !m->is_tap()) names.push_back(m->name());
      out.push_back(names);
    }
  }
  return out;
}

std::vector<StageCost> Model::stage_costs(int64_t batch, int64_t seq, bool logits) const {
  const uint64_t BT = static_cast<uint64_t>(batch * seq), f = c10::elementSize(compute_dtype_);
  const uint64_t H = config_.hidden_size, V = config_.vocab_size;
  const uint64_t heads = config_.num_attention_heads, inner = impl_->built.mlp_width;
  const uint64_t attn = impl_->built.attention_width > 0 ? impl_->built.attention_width : 4 * H;
  auto modules = stage_modules();
  std::vector<StageCost> out;
  for (size_t i = 0; i < stages_.size(); ++i) {
    StageCost c;
    c.modules = modules[i];
    c.weight_bytes = stages_[i]->parameter_bytes();
    if (stage_kinds_[i] == StageKind::kBlock) {
      // scores + probabilities [B, heads, T, T], q/k/v and context, MLP intermediates, residuals
      c.workspace_bytes =
          f * (2 * batch * heads * seq * seq + BT * attn + 3 * BT * inner + 2 * BT * H);
    } else if (stage_kinds_[i] == StageKind::kHead) {
      c.workspace_bytes = logits ? f * BT * V : 0;
      if (impl_->built.head_shares_embedding) {
        // The head's own linear layer, the stage's last module with parameters (before it: OPT's
        // project_out), multiplies by the embedding matrix.
        std::vector<Module*> inner;
        stages_[i]->collect(inner);
        for (auto m = inner.rbegin(); m != inner.rend() && c.shared_weight_bytes == 0; ++m)
          c.shared_weight_bytes = (*m)->parameter_bytes();
        c.weight_bytes -= c.shared_weight_bytes;
        c.shared_with = modules.front().front();
      }
    } else {
      c.workspace_bytes = f * 2 * BT * H;
    }
    // A stage whose matrices are stored in another dtype than the compute dtype converts them one
    // at a time into its lane's scratch (ForwardState::in_compute), which the largest sizes.
    if (c.workspace_bytes > 0) c.workspace_bytes += f * stages_[i]->widen_elements(compute_dtype_);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace actcap
