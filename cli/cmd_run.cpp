// actcap run: one forward over the given sequences, capturing the chosen hook points.
#include <iomanip>
#include <iostream>

#include "actcap/capture.h"
#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "common.h"

namespace actcap::cli {

namespace {

// run --json: the summary the text output prints, with the inter-device transfer counters.
nlohmann::json summary_json(const std::string& out, const std::vector<ExportedTensor>& exported,
                            const SafeCapturer& capturer, uint64_t need,
                            const TransferStats& transfers) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& e : exported)
    tensors.push_back(
        {{"name", e.name}, {"shape", e.shape}, {"dtype", e.dtype}, {"xxh3", e.checksum}});
  return {{"out", out},
          {"tensors", tensors},
          {"rows", capturer.row_seq().size()},
          {"points", capturer.plan().size()},
          {"bytes_per_token", capturer.bytes_per_token()},
          {"capture_bytes", need},
          {"transfers", transfer_json(transfers)}};
}

// The flags of `actcap run`.
struct RunCommand {
  std::string model = "demo", tokens, text, out;
  std::vector<std::string> capture;
  bool overwrite = false, json = false;
  DeviceOptions dev;
  CaptureFlags cap;
};

// One forward over the given sequences, capturing the chosen points into --out; prints the summary.
int run_run_command(const RunCommand& o) {
  if (o.tokens.empty() && o.text.empty())
    throw InputError("give the input with --tokens or --text");
  auto model = Model::load(o.model, load_options(o.dev));
  auto seqs = o.tokens.empty() ? tokenize_text(*model, o.text) : parse_token_lists(o.tokens);
  Batch batch =
      Batch::from_sequences(seqs, model->config().vocab_size, model->config().max_positions());
  model->set_bare_ref_policy(parse_bare_ref_policy(o.cap.bare_ref));
  CaptureOptions copts = capture_options(o.cap, o.capture);
  copts.attention_keys = batch.max_len();  // attention patterns: every key of the batch
  SafeCapturer capturer(*model, copts);
  const uint64_t need = capturer.check_budget(batch);
  split_model(*model, split_options(o.dev), batch.size(), batch.max_len(), capturer.plan(),
              Model::Logits::kSkipIfUnhooked);
  prepare_output_dir(o.out, o.overwrite);
  capturer.run(batch, Model::Logits::kSkipIfUnhooked);
  auto exported = export_run(o.out, capturer, *model, export_faults_from_env());
  const TransferStats& moved = model->transfer_stats();
  if (o.json) {
    std::cout << summary_json(o.out, exported, capturer, need, moved).dump(2) << "\n";
    return 0;
  }
  size_t width = 5;
  for (const auto& e : exported) width = std::max(width, e.name.size());
  std::cout << std::left << std::setw(width + 2) << "point" << std::setw(14) << "shape"
            << std::setw(7) << "dtype"
            << "xxh3\n";
  for (const auto& e : exported)
    std::cout << std::left << std::setw(width + 2) << e.name << std::setw(14)
              << shape_string(e.shape) << std::setw(7) << e.dtype << e.checksum << "\n";
  std::cout << "wrote " << exported.size() << " tensors (" << capturer.row_seq().size()
            << " rows) to " << o.out << "/shard-00000.safetensors and manifest.json ("
            << capturer.plan().size() << " points, " << capturer.bytes_per_token()
            << " bytes per token, " << format_bytes(need) << ")\n";
  if (moved.transfers > 0 || moved.injected > 0) std::cout << transfer_summary(moved) << "\n";
  return 0;
}

}  // namespace

Command add_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Run one forward and capture hook points into DIR");
  auto o = std::make_shared<RunCommand>();
  sub->add_option("MODEL", o->model, "Checkpoint directory or 'demo'");
  auto* tok = sub->add_option("--tokens", o->tokens,
                              "Token ids: \"1,2,3;4,5\" (sequences separated by ';')");
  auto* txt = sub->add_option("--text", o->text, "Text (demo: byte-level tokenizer)");
  tok->excludes(txt);
  sub->add_option("--capture", o->capture,
                  "Hook point patterns (* one segment, ** any depth, NAME:input)")
      ->required()
      ->expected(1, -1);
  sub->add_option("--out", o->out, "Output directory")->required();
  sub->add_flag("--overwrite", o->overwrite, "Replace actcap output already in --out");
  add_device_options(sub, o->dev);
  add_capture_options(sub, o->cap);
  sub->add_flag("--json", o->json, "Machine-readable summary");
  return {sub, [o] { return run_run_command(*o); }};
}

}  // namespace actcap::cli
