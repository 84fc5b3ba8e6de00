// actcap extract: a corpus through a (split) model into a verified, resumable activation dataset.
#include <ATen/Parallel.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>

#include "actcap/devices.h"
#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "actcap/extract.h"
#include "actcap/ranks.h"
#include "common.h"
#include "mpi_session.h"

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
  explicit ProgressPrinter(bool quiet, std::string who = "")
      : quiet_(quiet), tty_(isatty(STDERR_FILENO)), who_(std::move(who)) {}
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
      say("", who_ + line);
    }
  }
  void done() {
    if (!quiet_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool quiet_, tty_;
  std::string who_;  // "rank 1/3: " in a ranked run
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
  int rank = -1, world_size = -1;  // -1: from the launcher's environment
  DeviceOptions dev;
};

// A ranked run's failure, named by its rank, with the error's exit code and settings.
[[noreturn]] void rethrow_for_rank(const Error& e, const RankInfo& r) {
  const std::string what = concat("rank ", r.rank, " of ", r.world_size, ": ", e.what());
  if (e.exit_code() == 2) throw InputError(what, e.settings());
  throw RunError(what, e.settings());
}

// What one process of the run did: its result, the transfers it made.
struct ExtractOutcome {
  ExtractResult result;
  TransferStats transfers;
};

// This process's part of the run: the whole corpus, or this rank's share of it.
ExtractOutcome extract_share(const ExtractCommand& o, const RankInfo& ranks, bool assemble) {
  const std::string who =
      ranks.ranked() ? concat("rank ", ranks.rank, "/", ranks.world_size, ": ") : std::string();
  if (ranks.ranked())  // a rank's warnings say which rank (its errors already do)
    set_diagnostic_sink([who](const std::string& m) { say("warning", who + one_line(m)); });
  if (!o.forward_only && o.capture.empty())
    throw InputError("--capture is required (e.g. --capture 'transformer.h.*')");
  if (!o.forward_only && o.out.empty()) throw InputError("--out is required");
  DeviceOptions dev = o.dev;
  if (dev.devices.empty()) dev.devices = rank_device(ranks);  // cuda:LOCAL_RANK on a GPU node
  auto model = Model::load(o.model, load_options(dev));
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
  x.rank = ranks.rank;
  x.world_size = ranks.world_size;
  x.assemble = assemble;
  const int64_t len = x.max_length > 0 ? x.max_length : model->config().max_positions();
  x.capture.attention_keys = len;  // attention patterns: a window's keys
  std::vector<PointInfo> plan;
  if (!o.forward_only) plan = plan_capture(*model, x.capture);
  split_model(*model, split_options(dev), x.batch_size, len, plan, Model::Logits::kSkipIfUnhooked);
  ProgressPrinter printer(o.quiet, who);
  ExtractOutcome out;
  out.result = run_extract(*model, tokenizer.get(), x, std::ref(printer));
  printer.done();
  out.transfers = model->transfer_stats();
  return out;
}

// Over MPI: every rank's outcome (ok, or its error) and its manifest's checksum gathered at rank 0,
// which assembles manifest.json from the folder when all succeeded (each rank's manifest there
// must be the one that rank sealed); every rank then learns the verdict. A rank that
// failed rethrows its own error; the others fail naming it.
std::optional<MergeReport> finish_over_mpi(MpiSession& mpi, const ExtractCommand& o,
                                           const RankInfo& ranks,
                                           const std::optional<ExtractOutcome>& mine,
                                           const std::exception_ptr& failure,
                                           const std::string& failure_text) {
  const nlohmann::json status = {
      {"ok", mine.has_value()},
      {"error", failure_text},
      {"manifest_checksum",
       mine && !o.forward_only ? mine->result.rank_manifest_checksum : std::string()}};
  const std::vector<std::string> all = mpi.gather(status.dump());
  nlohmann::json verdict = {{"ok", true}, {"error", ""}};
  std::optional<MergeReport> merged;
  if (mpi.rank() == 0) {
    std::vector<std::string> checksums;
    for (size_t r = 0; r < all.size(); ++r) {
      const nlohmann::json s = nlohmann::json::parse(all[r]);
      if (!s["ok"].get<bool>() && verdict["ok"].get<bool>())
        verdict = {{"ok", false},
                   {"error", concat("rank ", r, " of ", all.size(), " failed (",
                                    s["error"].get<std::string>(),
                                    "); the dataset is not assembled: fix it and run again with "
                                    "--resume")}};
      checksums.push_back(s["manifest_checksum"].get<std::string>());
    }
    if (verdict["ok"].get<bool>() && !o.forward_only) {
      try {
        merged = merge_ranks(o.out, checksums, 0, export_faults_from_env());
      } catch (const std::exception& e) {
        verdict = {
            {"ok", false},
            {"error", concat("rank 0 could not assemble ", o.out, "/manifest.json: ", e.what())}};
      }
    }
  }
  verdict = nlohmann::json::parse(mpi.broadcast(verdict.dump()));
  if (failure) std::rethrow_exception(failure);
  if (!verdict["ok"].get<bool>()) throw RunError(verdict["error"].get<std::string>());
  if (!merged && !o.forward_only) {  // rank 0 assembled it
    merged.emplace();
    merged->assembled = true;
    merged->world_size = ranks.world_size;
  }
  return merged;
}

// The summary of this process's part (and of the assembly, where this process did it).
int print_summary(const ExtractCommand& o, const RankInfo& ranks, const ExtractOutcome& out,
                  const std::optional<MergeReport>& merged) {
  const ExtractResult& r = out.result;
  const auto& p = r.progress;
  const TransferStats& transfers = out.transfers;
  const bool stats = o.stats || o.stats_only;
  const bool assembled = r.assembled || (merged && merged->assembled);
  const auto line = [](int64_t l) {
    return l == kPastTheEnd ? nlohmann::json() : nlohmann::json(l);
  };
  if (o.json) {
    nlohmann::json j = {
        {"forward_only", o.forward_only},
        {"documents", p.documents_done},
        {"tokens", p.tokens_done},
        {"seconds", p.seconds},
        {"shards", p.shards_written},
        {"bytes_written", p.bytes_written},
        {"out", o.out},
        {"skipped_lines", r.skipped_lines},
        {"resumed_at_line",
         r.resumed_from_line ? nlohmann::json(r.resumed_from_line + 1) : nlohmann::json()},
        {"stats", stats && (!ranks.ranked() || assembled)
                      ? nlohmann::json(o.out + "/stats.safetensors")
                      : nlohmann::json()},
        {"transfers", transfer_json(transfers)}};
    if (ranks.ranked())
      j["rank"] = {{"rank", ranks.rank},
                   {"world_size", ranks.world_size},
                   {"source", ranks.source},
                   {"lines", {line(r.lines_begin), line(r.lines_end)}},
                   {"assembled", assembled}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (ranks.ranked()) std::cout << "rank " << ranks.rank << " of " << ranks.world_size << ": ";
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
  if (stats && !ranks.ranked()) std::cout << "; statistics in " << o.out << "/stats.safetensors";
  if (transfers.transfers > 0 || transfers.injected > 0)
    std::cout << "; " << transfer_summary(transfers);
  if (ranks.ranked() && !o.forward_only)
    std::cout << (assembled ? concat("; assembled ", o.out, "/manifest.json from ",
                                     ranks.world_size, " ranks")
                            : std::string("; manifest.json is assembled when every rank has "
                                          "finished (or by actcap merge)"));
  std::cout << "\n";
  return 0;
}

// A corpus through a (split) model into a verified, resumable activation dataset: the whole of it,
// or (launched as several ranks) this rank's share; prints the summary.
int run_extract_command(const ExtractCommand& o) {
  const RankInfo ranks = detect_rank(o.rank, o.world_size);
  // Ranks sharing a node share its cores, unless ACTCAP_THREADS says otherwise.
  if (ranks.ranked() && ranks.local_world_size > 1 && !std::getenv("ACTCAP_THREADS"))
    at::set_num_threads(std::max(
        1, static_cast<int>(std::thread::hardware_concurrency()) / ranks.local_world_size));
  std::unique_ptr<MpiSession> mpi;
  if (ranks.ranked() && o.rank < 0) mpi = MpiSession::start_if_launched();
  if (mpi && (mpi->rank() != ranks.rank || mpi->size() != ranks.world_size))
    throw InputError(concat("MPI says rank ", mpi->rank(), " of ", mpi->size(), ", ", ranks.source,
                            " says ", ranks.rank, " of ", ranks.world_size));
  if (!mpi) {
    try {
      const ExtractOutcome out = extract_share(o, ranks, /*assemble=*/true);
      return print_summary(o, ranks, out, std::nullopt);
    } catch (const Error& e) {
      if (!ranks.ranked()) throw;
      rethrow_for_rank(e, ranks);
    }
  }
  std::optional<ExtractOutcome> mine;
  std::exception_ptr failure;
  std::string failure_text;
  try {
    mine = extract_share(o, ranks, /*assemble=*/false);
  } catch (const Error& e) {
    failure_text = e.what();
    try {
      rethrow_for_rank(e, ranks);
    } catch (...) {
      failure = std::current_exception();
    }
  } catch (const std::exception& e) {
    failure_text = e.what();
    failure = std::make_exception_ptr(
        RunError(concat("rank ", ranks.rank, " of ", ranks.world_size, ": ", e.what())));
  }
  const std::optional<MergeReport> merged =
      finish_over_mpi(*mpi, o, ranks, mine, failure, failure_text);
  return print_summary(o, ranks, *mine, merged);
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
  sub->add_option("--rank", o->rank,
                  "This process's rank in a ranked run (default: from mpirun, srun or RANK)");
  sub->add_option("--world-size", o->world_size,
                  "Processes in a ranked run (default: from mpirun, srun or WORLD_SIZE)");
  sub->add_flag("--json", o->json, "Machine-readable summary");
  return {sub, [o] { return run_extract_command(*o); }};
}

}  // namespace actcap::cli
