// actcap bench: forward throughput of MODEL for users, with optional capture and device options.
#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "common.h"

namespace actcap::cli {

namespace {
uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

// The flags of `actcap bench`.
struct BenchCommand {
  std::string model = "demo";
  int64_t batch = 1, seq = 128, iters = 10, warmup = 2, threads = 0;
  std::vector<std::string> capture;
  std::string bare_ref = "error";
  bool no_fingerprint = false, json = false;
  std::string ab;
  DeviceOptions dev;
};

// Deterministic pseudo-random tokens (content does not change the cost of a dense forward).
Batch pseudo_random_batch(const Model& model, int64_t batch, int64_t seq) {
  std::vector<std::vector<int64_t>> seqs(batch, std::vector<int64_t>(seq));
  uint64_t x = 88172645463325252ull;
  for (auto& s : seqs)
    for (auto& id : s) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      id = static_cast<int64_t>(x % static_cast<uint64_t>(model.config().vocab_size));
    }
  return Batch::from_sequences(seqs, model.config().vocab_size, model.config().max_positions());
}

// Seconds of each timed forward of the configuration and, with --ab, of the baseline and the
// configuration's cost against it forward by forward (a / b - 1).
struct BenchTimes {
  std::vector<double> secs, base, paired;
};

// Prints tokens/s from the median forward (and the --ab costs), as JSON or text.
void print_bench(const BenchCommand& o, BenchTimes t, size_t points) {
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double>& secs = t.secs;
  std::sort(secs.begin(), secs.end());
  const double median = secs[secs.size() / 2];
  const double tps = static_cast<double>(o.batch * o.seq) / median;
  if (o.json) {
    nlohmann::json out({{"tokens_per_s", tps},
                        {"median_s", median},
                        {"min_s", secs.front()},
                        {"max_s", secs.back()},
                        {"iters", o.iters},
                        {"batch", o.batch},
                        {"seq", o.seq},
                        {"threads", at::get_num_threads()},
                        {"captured_points", points},
                        {"peak_rss_bytes", peak_rss_bytes()}});
    if (!o.ab.empty())
      out.update({{"ab", o.ab},
                  {"baseline_median_s", median_of(t.base)},
                  {"ab_cost", median / median_of(t.base) - 1},
                  {"ab_paired_cost", median_of(t.paired)}});
    std::cout << out.dump() << "\n";
  } else {
    std::cout << o.batch << "x" << o.seq << ": " << static_cast<int64_t>(tps)
              << " tokens/s (median " << median * 1000 << " ms of " << o.iters << ", "
              << at::get_num_threads() << " threads"
              << (points ? concat(", capturing ", points, " points") : std::string()) << ")\n";
    if (!o.ab.empty())
      std::cout << "against --ab " << o.ab
                << " in the same process: " << (median / median_of(t.base) - 1) * 100
                << "% (median of per-forward pairs " << median_of(t.paired) * 100 << "%)\n";
  }
}

// Times forwards of MODEL (optionally capturing, split, against an --ab baseline); prints tokens/s.
int run_bench_command(const BenchCommand& o) {
  at::set_num_threads(o.threads > 0
                          ? static_cast<int>(o.threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  auto model = Model::load(o.model, load_options(o.dev));
  model->set_bare_ref_policy(parse_bare_ref_policy(o.bare_ref));
  if (o.seq > model->config().max_positions())
    throw InputError(concat("--seq ", o.seq, " exceeds the model's context of ",
                            model->config().max_positions()));
  Batch batch = pseudo_random_batch(*model, o.batch, o.seq);
  if (!o.ab.empty() && o.capture.empty()) throw InputError("--ab needs --capture");
  CaptureOptions copts;
  copts.patterns = o.capture;
  copts.fingerprint = !o.no_fingerprint;
  copts.attention_keys = o.seq;
  std::unique_ptr<SafeCapturer> cap;
  if (!o.capture.empty()) cap = std::make_unique<SafeCapturer>(*model, copts);
  split_model(*model, split_options(o.dev), o.batch, o.seq,
              cap ? cap->plan() : std::vector<PointInfo>{});
  const size_t points = cap ? cap->plan().size() : 0;
  const BareRefPolicy policy = parse_bare_ref_policy(o.bare_ref);
  // One timed forward of the configuration (A) or of the --ab baseline (B). Setting up or
  // tearing down a capturer (hook registration) happens outside the timed region.
  auto timed = [&](bool baseline) {
    std::unique_ptr<SafeCapturer> other;
    if (baseline && o.ab == "none") cap.reset();
    if (baseline && o.ab == "no-fingerprint") {
      cap.reset();
      CaptureOptions c = copts;
      c.fingerprint = false;
      other = std::make_unique<SafeCapturer>(*model, c);
    }
    if (!baseline && !cap && !o.capture.empty())
      cap = std::make_unique<SafeCapturer>(*model, copts);
    model->set_bare_ref_policy(baseline && o.ab == "bare-ref-off" ? BareRefPolicy::kOff : policy);
    SafeCapturer* c = other ? other.get() : cap.get();
    auto t0 = std::chrono::steady_clock::now();
    if (c) {
      c->run(batch);
      c->clear();
    } else {
      model->forward(batch);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  BenchTimes t;
  for (int64_t i = 0; i < o.warmup + o.iters; ++i) {
    double a = 0, b = 0;
    if (o.ab.empty()) {
      a = timed(false);
    } else if (i % 2 == 0) {  // alternate which arm goes first
      a = timed(false);
      b = timed(true);
    } else {
      b = timed(true);
      a = timed(false);
    }
    if (i < o.warmup) continue;
    t.secs.push_back(a);
    if (!o.ab.empty()) {
      t.base.push_back(b);
      t.paired.push_back(a / b - 1);
    }
  }
  print_bench(o, std::move(t), points);
  return 0;
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "bench", "Measure forward tokens/s (optionally with capture and a device split)");
  auto o = std::make_shared<BenchCommand>();
  sub->add_option("MODEL", o->model, "Checkpoint directory or 'demo'");
  sub->add_option("--batch", o->batch, "Batch size")->check(CLI::PositiveNumber);
  sub->add_option("--seq", o->seq, "Sequence length")->check(CLI::PositiveNumber);
  sub->add_option("--iters", o->iters, "Timed iterations")->check(CLI::PositiveNumber);
  sub->add_option("--warmup", o->warmup, "Untimed iterations first")->check(CLI::NonNegativeNumber);
  sub->add_option("--threads", o->threads, "Intra-op threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--capture", o->capture,
                  "Capture these hook points with SafeCapturer while timing");
  sub->add_option("--bare-ref", o->bare_ref, "Bare-reference guard: error | warn | off");
  sub->add_flag("--no-fingerprint", o->no_fingerprint,
                "Skip XXH3 of snapshots (to measure its cost)");
  sub->add_option(
         "--ab", o->ab,
         "Also time a baseline in the same process, alternating forward by forward: 'none' (no "
         "capture), 'bare-ref-off' or 'no-fingerprint' (same capture without the guard / the "
         "XXH3); "
         "prints the cost of the configuration against it")
      ->check(CLI::IsMember({"none", "bare-ref-off", "no-fingerprint"}));
  add_device_options(sub, o->dev);
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_bench_command(*o); }};
}

}  // namespace actcap::cli
