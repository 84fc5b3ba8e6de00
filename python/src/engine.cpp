// actcap's own engine from Python: a checkpoint loaded and split over devices as the CLI does it,
// with run (one verified capture as torch tensors), plan, compare and extract.
#include <ATen/ATen.h>

#include <mutex>
#include <nlohmann/json.hpp>

#include "actcap/capture.h"
#include "actcap/compare.h"
#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/generate.h"
#include "actcap/hash.h"
#include "actcap/model.h"
#include "actcap/ranks.h"
#include "actcap/safetensors.h"
#include "actcap/split.h"
#include "actcap/tokenizer.h"
#include "bindings.h"

namespace actcap::python {

namespace {

struct Engine {
  std::string path;
  std::unique_ptr<Model> model;
  SplitOptions split;
  std::unique_ptr<Tokenizer> tokenizer;  // null: the model has no tokenizer.json
  // One run at a time: placement and the executor's lanes belong to the model. Taken only after
  // the GIL is released (a progress callback re-takes the GIL while holding it).
  std::mutex busy;

  Batch batch(const std::vector<std::vector<int64_t>>& seqs) const {
    if (seqs.empty()) throw InputError("no sequences given", {"input_ids"});
    return Batch::from_sequences(seqs, model->config().vocab_size, model->config().max_positions());
  }
};

std::unique_ptr<Engine> load(const std::string& path, const std::string& devices,
                             const std::string& device_map, const std::string& max_memory,
                             const std::string& weights_dtype, bool verify_transfers,
                             const std::string& compute_dtype,
                             std::optional<uint64_t> copy_window) {
  auto e = std::make_unique<Engine>();
  e->path = path;
  LoadOptions load;
  load.weights_dtype = parse_weights_dtype(weights_dtype);
  load.compute_dtype = parse_compute_dtype(compute_dtype);
  if (!devices.empty()) e->split.devices = parse_device_list(devices);
  if (!max_memory.empty()) e->split.budgets = parse_max_memory(max_memory);
  if (device_map == "auto" || device_map == "balanced" || device_map == "sequential") {
    e->split.strategy = parse_strategy(device_map);
  } else {
    e->split.strategy = PlanStrategy::kExplicit;
    if (!device_map.empty() && device_map[0] == '{') {
      nlohmann::json j = nlohmann::json::parse(device_map, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) throw InputError("device_map is not valid JSON", {"device_map"});
      e->split.explicit_map = device_map_from_json(j);
    } else {
      e->split.explicit_map = load_device_map(device_map);
    }
  }
  e->split.verify_transfers = verify_transfers;
  if (copy_window) e->split.copy_window_bytes = *copy_window;
  e->model = Model::load(path, load);
  e->tokenizer = tokenizer_for(path);
  return e;
}

CaptureOptions capture_options(const std::vector<std::string>& patterns, const std::string& dtype,
                               const std::string& positions, std::optional<uint64_t> budget,
                               const std::vector<int64_t>& heads = {}, int64_t keys = 0) {
  CaptureOptions c;
  c.attention_heads = heads;
  c.attention_keys = keys;
  c.patterns = patterns;
  c.dtype = parse_capture_dtype(dtype);
  c.positions = PositionSpec::parse(positions);
  c.budget_bytes = budget;
  return c;
}

py::dict progress_dict(const ExtractProgress& p) {
  return py::dict(
      py::arg("documents_done") = p.documents_done, py::arg("documents_total") = p.documents_total,
      py::arg("tokens_done") = p.tokens_done, py::arg("bytes_written") = p.bytes_written,
      py::arg("shards_written") = p.shards_written, py::arg("seconds") = p.seconds);
}

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<Engine>(m, "Engine")
      .def(py::init(&load), py::arg("path"), py::arg("devices") = "",
           py::arg("device_map") = "auto", py::arg("max_memory") = "",
           py::arg("weights_dtype") = "keep", py::arg("verify_transfers") = true,
           py::arg("compute_dtype") = "f32", py::arg("copy_window") = py::none(),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("path", [](const Engine& e) { return e.path; })
      .def_property_readonly("fingerprint", [](const Engine& e) { return e.model->fingerprint(); })
      .def_property_readonly("config",
                             [](const Engine& e) {
                               const ModelConfig& c = e.model->config();
                               return py::dict(
                                   py::arg("arch") = c.arch, py::arg("model_type") = c.model_type,
                                   py::arg("vocab_size") = c.vocab_size,
                                   py::arg("hidden_size") = c.hidden_size,
                                   py::arg("num_hidden_layers") = c.num_hidden_layers,
                                   py::arg("num_attention_heads") = c.num_attention_heads,
                                   py::arg("max_positions") = c.max_positions());
                             })
      .def_property_readonly("has_tokenizer",
                             [](const Engine& e) { return e.tokenizer != nullptr; })
      .def("points",
           [](const Engine& e) {
             py::list out;
             for (const PointInfo& p : e.model->points())
               out.append(py::make_tuple(p.name, p.shape, safetensors_dtype_name(p.dtype)));
             return out;
           })
      .def("resolve",
           [](const Engine& e, const std::vector<std::string>& patterns, const std::string& dtype) {
             py::list out;
             for (const PointInfo& p :
                  plan_capture(*e.model, capture_options(patterns, dtype, "all", {}, {},
                                                         e.model->config().max_positions())))
               out.append(py::make_tuple(p.name, p.shape, safetensors_dtype_name(p.dtype)));
             return out;
           })
      .def("encode",
           [](const Engine& e, const std::string& text) {
             if (!e.tokenizer)
               throw InputError(concat(e.path, " has no tokenizer.json; give token ids"),
                                {"input_ids"});
             return e.tokenizer->encode(text);
           })
      .def(
          "plan",
          [](Engine& e, const std::vector<std::string>& patterns, const std::string& dtype,
             int64_t batch, int64_t seq) {
            std::string json, table;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> one_run(e.busy);
              std::vector<PointInfo> capture;
              if (!patterns.empty())
                capture =
                    plan_capture(*e.model, capture_options(patterns, dtype, "all", {}, {}, seq));
              const DevicePlan plan = plan_split(*e.model, e.split, batch, seq, capture,
                                                 Model::Logits::kSkipIfUnhooked);
              json = plan.to_json().dump();
              table = plan.table();
            }
            return py::make_tuple(json, table);
          },
          py::arg("patterns"), py::arg("dtype"), py::arg("batch"), py::arg("seq"))
      .def(
          "run",
          [](Engine& e, const std::vector<std::vector<int64_t>>& seqs,
             const std::vector<std::string>& patterns, const std::string& dtype,
             const std::string& positions,
             std::optional<std::vector<std::vector<int64_t>>> explicit_positions,
             std::optional<uint64_t> budget, bool logits, const std::vector<int64_t>& heads) {
            const Batch batch = e.batch(seqs);
            std::map<std::string, at::Tensor> out;
            std::vector<std::string> order;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> one_run(e.busy);
              const Model::Logits mode =
                  logits ? Model::Logits::kCompute : Model::Logits::kSkipIfUnhooked;
              SafeCapturer cap(*e.model, capture_options(patterns, dtype, positions, budget, heads,
                                                         batch.max_len()));
              cap.check_budget(batch);
              split_model(*e.model, e.split, batch.size(), batch.max_len(), cap.plan(), mode);
              at::Tensor y = explicit_positions ? cap.run(batch, *explicit_positions, mode)
                                                : cap.run(batch, mode);
              cap.verify();
              for (const PointInfo& p : cap.plan()) {
                out[p.name] = cap.get(p.name);  // the verified snapshot itself: no copy
                order.push_back(p.name);
              }
              out["__rows__.seq"] = at::tensor(cap.row_seq(), at::kLong);
              out["__rows__.pos"] = at::tensor(cap.row_pos(), at::kLong);
              out["__rows__.token"] = at::tensor(cap.row_token(), at::kLong);
              order.push_back("__rows__.seq");
              order.push_back("__rows__.pos");
              order.push_back("__rows__.token");
              if (logits) {
                out["logits"] = y.to(at::kCPU);
                order.push_back("logits");
              }
            }
            py::dict d;
            for (const std::string& name : order) d[py::str(name)] = out.at(name);
            return d;
          },
          py::arg("seqs"), py::arg("patterns"), py::arg("dtype"), py::arg("positions"),
          py::arg("explicit_positions"), py::arg("budget"), py::arg("logits"),
          py::arg("heads") = std::vector<int64_t>{})
      .def(
          "compare",
          [](Engine& e, const std::vector<std::vector<int64_t>>& seqs,
             const std::vector<std::string>& patterns, double tolerance) {
            const Batch batch = e.batch(seqs);
            CompareReport report;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> one_run(e.busy);
              report = compare_split(*e.model, batch, patterns, e.split, tolerance);
            }
            py::list rows;
            for (const CompareRow& r : report.rows)
              rows.append(py::dict(py::arg("point") = r.point, py::arg("equal") = r.equal,
                                   py::arg("within_tolerance") = r.within_tolerance,
                                   py::arg("max_abs_diff") = r.max_abs_diff,
                                   py::arg("max_abs_reference") = r.max_abs_reference,
                                   py::arg("rel_rms") = r.rel_rms,
                                   py::arg("reference_xxh3") = hex64(r.reference_xxh3),
                                   py::arg("split_xxh3") = hex64(r.split_xxh3)));
            return py::make_tuple(rows, report.plan.to_json().dump());
          },
          py::arg("seqs"), py::arg("patterns"), py::arg("tolerance") = 0.0)
      .def(
          "extract",
          [](Engine& e, const std::string& input, const std::string& out,
             const std::vector<std::string>& patterns, const std::string& dtype,
             const std::string& positions, int64_t batch_size, int64_t max_length, int64_t stride,
             uint64_t shard_bytes, bool resume, bool overwrite, bool skip_bad_lines,
             std::optional<uint64_t> budget, py::object on_progress,
             const std::vector<int64_t>& heads, bool stats, bool stats_only, int64_t top_k,
             bool skip_special, int rank, int world_size) {
            ExtractOptions x;
            const RankInfo ranks = detect_rank(rank, world_size);  // torchrun, srun, mpirun
            x.rank = ranks.rank;
            x.world_size = ranks.world_size;
            x.input = input;
            x.out = out;
            x.capture = capture_options(patterns, dtype, positions, budget, heads);
            x.stats = stats || stats_only;
            x.stats_only = stats_only;
            x.stats_top_k = top_k;
            x.skip_special = skip_special;
            x.batch_size = batch_size;
            x.max_length = max_length;
            x.stride = stride;
            x.shard_bytes = shard_bytes;
            x.resume = resume;
            x.overwrite = overwrite;
            x.skip_bad_lines = skip_bad_lines;
            ExtractResult r;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> one_run(e.busy);
              const int64_t len = max_length > 0 ? max_length : e.model->config().max_positions();
              x.capture.attention_keys = len;  // attention patterns: a window's keys
              split_model(*e.model, e.split, batch_size, len, plan_capture(*e.model, x.capture),
                          Model::Logits::kSkipIfUnhooked);
              r = run_extract(*e.model, e.tokenizer.get(), x, [&](const ExtractProgress& p) {
                py::gil_scoped_acquire acquire;
                if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C
                if (!on_progress.is_none()) on_progress(progress_dict(p));
              });
            }
            py::dict d = progress_dict(r.progress);
            d["skipped_lines"] = r.skipped_lines;
            d["resumed_from_line"] = r.resumed_from_line;
            d["manifest"] = r.manifest;
            if (ranks.ranked()) {
              const auto line = [](int64_t l) {
                return l == kPastTheEnd ? py::object(py::none()) : py::object(py::int_(l));
              };
              d["rank"] = ranks.rank;
              d["world_size"] = ranks.world_size;
              d["lines"] = py::make_tuple(line(r.lines_begin), line(r.lines_end));
              d["assembled"] = r.assembled;
            }
            return d;
          },
          py::arg("input"), py::arg("out"), py::arg("patterns"), py::arg("dtype"),
          py::arg("positions"), py::arg("batch_size"), py::arg("max_length"), py::arg("stride"),
          py::arg("shard_bytes"), py::arg("resume"), py::arg("overwrite"),
          py::arg("skip_bad_lines"), py::arg("budget"), py::arg("on_progress"),
          py::arg("heads") = std::vector<int64_t>{}, py::arg("stats") = false,
          py::arg("stats_only") = false, py::arg("top_k") = 8, py::arg("skip_special") = false,
          py::arg("rank") = -1, py::arg("world_size") = -1)
      .def(
          "generate",
          [](Engine& e, const std::vector<std::vector<int64_t>>& prompts,
             const std::vector<std::string>& patterns, const std::string& dtype,
             int64_t max_new_tokens, double temperature, int64_t top_k, double top_p, uint64_t seed,
             const std::vector<int64_t>& stop_tokens, bool stop_at_eos,
             std::optional<uint64_t> budget, const std::string& out, bool overwrite,
             const std::vector<int64_t>& heads) {
            GenerateOptions g;
            g.max_new_tokens = max_new_tokens;
            g.temperature = temperature;
            g.top_k = top_k;
            g.top_p = top_p;
            g.seed = seed;
            g.stop_tokens = stop_tokens;
            g.stop_at_eos = stop_at_eos;
            GenerateResult r;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> one_run(e.busy);
              SplitOptions split = e.split;
              split.kv_cache_tokens = generation_capacity(*e.model, prompts, g);
              std::unique_ptr<SafeCapturer> cap;
              std::vector<PointInfo> plan;
              if (!patterns.empty()) {
                cap = std::make_unique<SafeCapturer>(
                    *e.model,
                    capture_options(patterns, dtype, "all", budget, heads, split.kv_cache_tokens));
                plan = cap->plan();
              }
              split_model(*e.model, split, static_cast<int64_t>(prompts.size()),
                          split.kv_cache_tokens, plan);
              if (cap && !out.empty()) prepare_output_dir(out, overwrite);
              r = generate(*e.model, prompts, g, cap.get());
              if (r.capture && !out.empty()) export_generation(out, *r.capture, *e.model);
            }
            py::list seqs;
            for (const GeneratedSequence& s : r.sequences)
              seqs.append(py::dict(py::arg("tokens") = s.tokens,
                                   py::arg("prompt_length") = s.prompt_length,
                                   py::arg("finish") = s.finish));
            py::dict d;
            d["sequences"] = seqs;
            d["forwards"] = r.forwards;
            d["prompt_seconds"] = r.prompt_seconds;
            d["decode_seconds"] = r.decode_seconds;
            if (r.capture) {
              py::dict acts;
              for (const auto& [name, t] : r.capture->points) acts[py::str(name)] = t;
              acts["__rows__.seq"] = at::tensor(r.capture->row_seq, at::kLong);
              acts["__rows__.pos"] = at::tensor(r.capture->row_pos, at::kLong);
              acts["__rows__.token"] = at::tensor(r.capture->row_token, at::kLong);
              acts["__rows__.step"] = at::tensor(r.capture->row_step, at::kLong);
              d["activations"] = acts;
            }
            return d;
          },
          py::arg("prompts"), py::arg("patterns"), py::arg("dtype"), py::arg("max_new_tokens"),
          py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seed"),
          py::arg("stop_tokens"), py::arg("stop_at_eos"), py::arg("budget"), py::arg("out"),
          py::arg("overwrite"), py::arg("heads") = std::vector<int64_t>{})
      .def("device_stats",
           [](const Engine& e) {
             py::list out;
             for (const DeviceStats& s : e.model->device_stats())
               out.append(py::dict(
                   py::arg("device") = s.device.str(), py::arg("weight_bytes") = s.weight_bytes,
                   py::arg("arena_bytes") = s.arena_bytes, py::arg("peak_bytes") = s.peak_bytes,
                   py::arg("slot_reuses") = s.slot_reuses, py::arg("transfers_in") = s.transfers_in,
                   py::arg("bytes_in") = s.bytes_in, py::arg("capture_copies") = s.capture_copies,
                   py::arg("capture_bytes") = s.capture_bytes,
                   py::arg("copy_waits") = s.copy_waits));
             return out;
           })
      .def("transfer_stats", [](const Engine& e) {
        const TransferStats& s = e.model->transfer_stats();
        return py::dict(py::arg("transfers") = s.transfers, py::arg("verified") = s.verified,
                        py::arg("retried") = s.retried, py::arg("faults_injected") = s.injected,
                        py::arg("via_host") = s.via_host, py::arg("bytes") = s.bytes);
      });
}

}  // namespace actcap::python
