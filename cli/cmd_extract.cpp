// actcap extract: a corpus through a (split) model into a verified, resumable activation dataset.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/extract.h"
#include "common.h"

namespace actcap::cli {

namespace {

std::string eta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

// A live bar on a terminal, a plain line every few seconds otherwise.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO)) {}
  void operator()(const ExtractProgress& p) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (since < (tty_ ? 0.2 : 5.0) && p.documents_done < p.documents_total) return;
    last_ = now;
    const double frac =
        p.documents_total ? static_cast<double>(p.documents_done) / p.documents_total : 0.0;
    const double tps = p.seconds > 0 ? p.tokens_done / p.seconds : 0.0;
    const double left = frac > 0 ? p.seconds * (1 - frac) / frac : -1;
    char line[256];
    std::snprintf(line, sizeof(line), "%lld/%lld docs  %.0f tok/s  %s written  %lld shards  ETA %s",
                  static_cast<long long>(p.documents_done),
                  static_cast<long long>(p.documents_total), tps,
                  format_bytes(p.bytes_written).c_str(), static_cast<long long>(p.shards_written),
                  eta(left).c_str());
    if (tty_) {
      const int width = 24, filled = static_cast<int>(frac * width);
      std::fprintf(stderr, "\r[%s%s] %3.0f%% %s\033[K", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), frac * 100, line);
    } else {
      std::fprintf(stderr, "actcap: %s\n", line);
    }
  }
  void done() {
    if (!quiet_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point last_{};
};

// The flags of `actcap extract`.
struct ExtractCommand {
  std::string model = "demo", input, out, shard_size = "256MiB";
  CaptureFlags cap;
  std::vector<std::string> capture;
  int64_t batch_size = 8, max_length = 0, stride = 0;
  bool resume = false, overwrite = false, skip_bad = false, quiet = false, forward_only = false,
       json = false, stats = false, stats_only = false, skip_special = false;
  int64_t top_k = 8;
  DeviceOptions dev;
};

// A corpus through a (split) model into a verified, resumable activation dataset; prints the
// summary.
int run_extract_command(const ExtractCommand& o) {
  if (!o.forward_only && o.capture.empty())
    throw InputError("--capture is required (e.g. --capture 'transformer.h.*')");
  if (!o.forward_only && o.out.empty()) throw InputError("--out is required");
  auto model = Model::load(o.model, load_options(o.dev));
  model->set_bare_ref_policy(parse_bare_ref_policy(o.cap.bare_ref));
  auto tokenizer = tokenizer_for(o.model);
  ExtractOptions x;
  x.input = o.input;
  x.out = o.out;
  // --forward-only without --capture: the head's point (GPT-NeoX names it embed_out).
  std::string head = "lm_head";
  for (const std::string& n : model->point_names())
    if (n == "embed_out") head = n;
  x.capture = capture_options(
      o.cap, o.forward_only && o.capture.empty() ? std::vector<std::string>{head} : o.capture);
  x.batch_size = o.batch_size;
  x.max_length = o.max_length;
  x.stride = o.stride;
  x.shard_bytes = parse_bytes(o.shard_size);
  if (x.shard_bytes == 0) throw InputError("--shard-size must be positive");
  x.resume = o.resume;
  x.overwrite = o.overwrite;
  x.skip_bad_lines = o.skip_bad;
  x.forward_only = o.forward_only;
  x.stats = o.stats || o.stats_only;
  x.stats_only = o.stats_only;
  x.stats_top_k = o.top_k;
  x.skip_special = o.skip_special;
  x.faults = export_faults_from_env();
  const int64_t len = x.max_length > 0 ? x.max_length : model->config().max_positions();
  x.capture.attention_keys = len;  // attention patterns: a window's keys
  std::vector<PointInfo> plan;
  if (!o.forward_only) plan = plan_capture(*model, x.capture);
  split_model(*model, split_options(o.dev), x.batch_size, len, plan,
              Model::Logits::kSkipIfUnhooked);
  ProgressPrinter printer(o.quiet);
  ExtractResult r = run_extract(*model, tokenizer.get(), x, std::ref(printer));
  printer.done();
  const auto& p = r.progress;
  const TransferStats& transfers = model->transfer_stats();
  if (o.json) {
    std::cout << nlohmann::json({{"forward_only", o.forward_only},
                                 {"documents", p.documents_done},
                                 {"tokens", p.tokens_done},
                                 {"seconds", p.seconds},
                                 {"shards", p.shards_written},
                                 {"bytes_written", p.bytes_written},
                                 {"out", o.out},
                                 {"skipped_lines", r.skipped_lines},
                                 {"resumed_at_line", r.resumed_from_line
                                                         ? nlohmann::json(r.resumed_from_line + 1)
                                                         : nlohmann::json()},
                                 {"stats", x.stats ? nlohmann::json(o.out + "/stats.safetensors")
                                                   : nlohmann::json()},
                                 {"transfers", transfer_json(transfers)}})
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << (o.forward_only ? "forward-only: " : "extracted ") << p.documents_done
            << " documents, " << p.tokens_done << " tokens in " << p.seconds << " s ("
            << static_cast<int64_t>(p.tokens_done / std::max(p.seconds, 1e-9)) << " tokens/s)";
  if (!o.forward_only)
    std::cout << "; " << p.shards_written << " shards, " << format_bytes(p.bytes_written) << " in "
              << o.out
              << (r.skipped_lines ? concat("; skipped ", r.skipped_lines, " bad lines")
                                  : std::string())
              << (r.resumed_from_line ? concat("; resumed at line ", r.resumed_from_line + 1)
                                      : std::string());
  if (x.stats) std::cout << "; statistics in " << o.out << "/stats.safetensors";
  if (transfers.transfers > 0 || transfers.injected > 0)
    std::cout << "; " << transfer_summary(transfers);
  std::cout << "\n";
  return 0;
}

}  // namespace

Command add_extract(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "extract", "Capture activations of a whole corpus into verified safetensors shards");
  auto o = std::make_shared<ExtractCommand>();
  sub->add_option("MODEL", o->model, "Checkpoint directory or 'demo'");
  sub->add_option("--input", o->input,
                  ".txt (one document per line) or .jsonl (\"text\" or \"input_ids\")")
      ->required();
  sub->add_option("--capture", o->capture, "Hook point patterns")->expected(1, -1);
  sub->add_option("--out", o->out, "Output directory");
  add_device_options(sub, o->dev);
  sub->add_option("--batch-size", o->batch_size, "Sequences per forward");
  sub->add_option("--max-length", o->max_length,
                  "Tokens per sequence (default: the model's context)");
  sub->add_option("--stride", o->stride,
                  "Cut longer documents into windows starting every N tokens");
  add_capture_options(sub, o->cap);
  sub->add_option("--shard-size", o->shard_size, "Captured bytes per shard, e.g. 256MiB");
  sub->add_flag("--resume", o->resume, "Continue an interrupted run in --out");
  sub->add_flag("--overwrite", o->overwrite, "Replace actcap output already in --out");
  sub->add_flag("--skip-bad-lines", o->skip_bad, "Skip invalid input lines instead of stopping");
  sub->add_flag("--quiet", o->quiet, "No progress output");
  sub->add_flag("--forward-only", o->forward_only,
                "Benchmark: run the same batches without capturing or writing");
  sub->add_flag("--stats", o->stats,
                "Also write per-feature statistics and top-k rows (stats.safetensors)");
  sub->add_flag("--stats-only", o->stats_only, "Statistics only: no activations stored");
  sub->add_option("--top-k", o->top_k, "Rows of largest value kept per feature by --stats")
      ->default_val(8);
  sub->add_flag("--skip-special", o->skip_special,
                "Leave special tokens (BOS, EOS, the tokenizer's special ones) out of rows and "
                "statistics");
  sub->add_flag("--json", o->json, "Machine-readable summary");
  return {sub, [o] { return run_extract_command(*o); }};
}

}  // namespace actcap::cli
