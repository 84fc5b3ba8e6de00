#include "actcap/repro.h"

#include <map>
#include <nlohmann/json.hpp>

#include "actcap/capture.h"
#include "actcap/config.h"
#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/planner.h"

namespace actcap {

namespace {

// GPT-2: the seed's 12-block model. Another architecture: its tiny preset, as written to
// config.json and read back, with 12 layers (every per-layer setting follows the count).
std::unique_ptr<Model> repro_model(const std::string& arch) {
  ModelConfig c = preset_config(arch, "tiny");
  if (arch == "gpt2") {
    c.vocab_size = 257;
    c.max_position_embeddings = 128;
    c.num_hidden_layers = 12;
  } else {
    c.num_hidden_layers = 12;  // written under the architecture's own field (GPT-J: n_layer)
    nlohmann::json j = nlohmann::json::parse(config_to_json(c));
    j.erase("layer_types");
    c = parse_config(j.dump(), concat("the ", arch, " repro model"));
  }
  return Model::from_tensors(c, random_weights(c, 7, at::kFloat), "repro");
}

// Every block's output: "transformer.h.*" (GPT-2, GPT-J), "model.layers.*", "gpt_neox.layers.*".
std::string block_pattern(const Model& m) {
  const std::vector<std::vector<std::string>> modules = m.stage_modules();
  for (size_t i = 0; i < modules.size(); ++i)
    if (m.stage_kind(i) == StageKind::kBlock) {
      const std::string& first = modules[i].front();
      return first.substr(0, first.rfind('.')) + ".*";
    }
  throw RunError("the repro model has no blocks");
}

std::vector<Batch> repro_batches(const Model& m) {
  std::vector<Batch> out;
  for (const char* text :
       {"activations must be what the layer computed", "and not what a later layer wrote"}) {
    std::vector<int64_t> ids;
    for (const char* p = text; *p; ++p) ids.push_back(static_cast<unsigned char>(*p));
    out.push_back(Batch::from_sequences({ids}, m.config().vocab_size, m.config().max_positions()));
  }
  return out;
}

void place_on(Model& m, const std::vector<DeviceId>& devices, const Batch& b) {
  PlanRequest req;
  req.stages = m.stage_costs(b.size(), b.max_len());
  req.devices = devices;
  req.strategy = PlanStrategy::kBalanced;
  req.hidden_bytes = b.size() * b.max_len() * m.config().hidden_size * sizeof(float);
  ExecutionOptions opts;
  opts.stage_device = plan_devices(req).stage_device;
  m.place(opts);
}

using Key = std::pair<std::string, int64_t>;  // point, step

void compare(ReproResult& r, const std::map<Key, at::Tensor>& truth,
             const std::map<Key, at::Tensor>& got) {
  r.mismatched = 0;
  r.total = static_cast<int64_t>(truth.size());
  for (const auto& [key, t] : truth) {
    auto it = got.find(key);
    if (it == got.end()) {
      ++r.mismatched;
      continue;
    }
    // SafeCapturer stores rows [tokens, hidden]; one unpadded sequence has the same bytes as [1, T,
    // hidden]. Both read on the host (a naive capture on a GPU reads the arena as it is now).
    const at::Tensor g =
        (it->second.numel() == t.numel() ? it->second.reshape(t.sizes()) : it->second).to(at::kCPU);
    if (g.sizes() != t.sizes()) {
      ++r.mismatched;
      continue;
    }
    if (!at::equal(t, g)) {
      ++r.mismatched;
      r.max_abs_err = std::max(r.max_abs_err, (t - g).abs().max().item<double>());
    }
  }
}

}  // namespace

std::vector<ReproResult> run_repro(const std::vector<int>& device_counts, const std::string& arch) {
  std::vector<std::vector<DeviceId>> maps;
  for (int n : device_counts) {
    if (n < 1 || n > 64)
      throw InputError(concat("device count ", n, " is not between 1 and 64"), {"devices"});
    std::vector<DeviceId> devices;
    for (int i = 0; i < n; ++i)
      devices.push_back(n == 1 ? DeviceId::cpu() : DeviceId::virtual_cpu(i));
    maps.push_back(std::move(devices));
  }
  return run_repro_on(maps, arch);
}

std::vector<ReproResult> run_repro_on(const std::vector<std::vector<DeviceId>>& device_maps,
                                      const std::string& arch) {
  for (const std::vector<DeviceId>& devices : device_maps) {
    if (devices.empty()) throw InputError("a repro device list is empty", {"on"});
    for (const DeviceId& d : devices) {
      try {
        require_available(d);
      } catch (const InputError& e) {
        throw InputError(e.what(), {"on"});  // the repro's device lists, not a run's --devices
      }
    }
  }
  std::vector<ReproResult> out;
  for (const std::vector<DeviceId>& devices : device_maps) {
    const int n = static_cast<int>(devices.size());
    std::string listed;
    for (const DeviceId& d : devices) listed += (listed.empty() ? "" : ",") + d.str();
    auto m = repro_model(arch);
    const std::string pattern = block_pattern(*m);
    auto batches = repro_batches(*m);
    place_on(*m, devices, batches.front());

    // The true outputs: copied inside the hook (on the block's device, in its stream's order).
    std::map<Key, at::Tensor> truth;
    {
      int64_t step = 0;
      auto h = m->register_forward_hook(pattern, [&](const HookContext& c, const at::Tensor& t) {
        truth[{c.point, step}] = t.clone();
      });
      for (const Batch& b : batches) m->forward(b), ++step;
      h.remove();
      for (auto& [key, t] : truth) t = t.to(at::kCPU);
    }

    // naive and guarded: the hook keeps the borrowed tensor, as `outputs[name] = output` does.
    for (const char* variant : {"naive", "guarded", "clone"}) {
      ReproResult r{variant, n, listed};
      const std::string v = variant;
      m->set_bare_ref_policy(v == "guarded" ? BareRefPolicy::kError : BareRefPolicy::kOff);
      std::map<Key, at::Tensor> got;
      int64_t step = 0;
      auto h = m->register_forward_hook(pattern, [&](const HookContext& c, const at::Tensor& t) {
        got[{c.point, step}] = v == "clone" ? t.clone() : t;
      });
      try {
        for (const Batch& b : batches) m->forward(b), ++step;
        compare(r, truth, got);
      } catch (const Error& e) {
        r.error = e.what();
      }
      h.remove();
      got.clear();
      out.push_back(r);
    }
    m->set_bare_ref_policy(BareRefPolicy::kError);

    ReproResult r{"safe", n, listed};
    try {
      SafeCapturer cap(*m, CaptureOptions{{pattern}});
      std::map<Key, at::Tensor> got;
      for (const Batch& b : batches) cap.run(b);
      for (const Snapshot& s : cap.snapshots()) got[{s.point, s.call}] = cap.get(s.point, s.call);
      compare(r, truth, got);
    } catch (const Error& e) {
      r.error = e.what();
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace actcap
