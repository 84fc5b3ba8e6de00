// actcap command-line tool: every failure is one `actcap: error:` line and an exit code
// (0 success, 1 run or integrity failure, 2 bad input or usage).
#include <ATen/Parallel.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "common.h"

// glibc returns every freed block over the (dynamic, at most 32 MiB) mmap threshold to the kernel,
// so a forward pass that allocates its logits, attention scores and captures afresh pays a page
// fault per 4 KiB each time (a fifth of the time of a 4x256 forward, by profile). actcap is a
// one-job process: serve large blocks from the heap and keep freed memory for reuse.
// ACTCAP_MALLOC=default keeps glibc's defaults.
static void tune_allocator(int argc, char** argv) {
  (void)argc;
  (void)argv;
#if defined(__GLIBC__)
  const char* m = std::getenv("ACTCAP_MALLOC");
  if (m && std::string(m) == "default") return;
  // Only for the commands that run forwards: verify and merge of a long dataset allocate and free
  // per shard, and with freed memory kept their heap would grow with the shard count.
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "verify" || command == "merge") return;
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
#endif
}

// libgomp's idle workers spin for a while after each parallel region (OMP_WAIT_POLICY unset),
// which on a machine with as many cores as threads takes cores from OpenBLAS's own GEMM threads:
// gpt2-small went from ~200 to ~560 tokens/s at 1x128 and ~420 to ~600 at 4x256 on 2 cores with
// OMP_WAIT_POLICY=passive (generate, whose decoding steps are small: 3.6x faster, BENCHMARKS.md
// "What changed" 4). libgomp reads it once, when it is loaded (before main), so the commands
// that run forwards set it and execute themselves again, once (about 0.6 s of extra start-up here,
// so the quick commands skip it). Setting OMP_WAIT_POLICY yourself (e.g. active) keeps yours.
static void prefer_passive_openmp(int argc, char** argv) {
  if (argc < 2 || std::getenv("OMP_WAIT_POLICY") != nullptr ||
      std::getenv("ACTCAP_NO_REEXEC") != nullptr)
    return;
  const std::string command = argv[1];
  if (command != "run" && command != "extract" && command != "generate" && command != "bench" &&
      command != "compare" && command != "repro")
    return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: then run with libgomp's defaults
}

// The CLI's spelling of the library settings an error names (actcap/error.h): its flags.
std::string with_flags(const actcap::Error& e) {
  static const std::map<std::string, std::string> kFlags = {
      {"bare_ref", "--bare-ref"},
      {"batch_size", "--batch-size"},
      {"capture", "--capture"},
      {"capture_budget", "--capture-budget"},
      {"compute_dtype", "--compute-dtype"},
      {"device_map", "--device-map"},
      {"devices", "--devices"},
      {"dtype", "--dtype"},
      {"input", "--input"},
      {"stats", "--stats"},
      {"stats_only", "--stats-only"},
      {"stats_top_k", "--top-k"},
      {"forward_only", "--forward-only"},
      {"attention_heads", "--heads"},
      {"attention_keys", "--max-length"},
      {"max_length", "--max-length"},
      {"max_memory", "--max-memory"},
      {"max_new_tokens", "--max-new-tokens"},
      {"on", "--on"},
      {"out", "--out"},
      {"overwrite", "--overwrite"},
      {"positions", "--positions"},
      {"rank", "--rank"},
      {"resume", "--resume"},
      {"skip_bad_lines", "--skip-bad-lines"},
      {"stop_tokens", "--stop-token"},
      {"stride", "--stride"},
      {"temperature", "--temperature"},
      {"tolerance", "--tolerance"},
      {"top_k", "--top-k"},
      {"top_p", "--top-p"},
      {"transfer_faults", "ACTCAP_FAULT"},
      {"weights_dtype", "--weights-dtype"},
      {"world_size", "--world-size"},
  };
  std::string flags;
  for (const std::string& s : e.settings()) {
    std::string flag;
    if (s.rfind("doctor:", 0) == 0) {
      flag = "actcap doctor --devices " + s.substr(7);
    } else {
      const auto it = kFlags.find(s);
      flag = it == kFlags.end() ? s : it->second;
    }
    flags += (flags.empty() ? "" : ", ") + flag;
  }
  return actcap::cli::one_line(e.what()) + (flags.empty() ? "" : " [" + flags + "]");
}

int main(int argc, char** argv) {
  prefer_passive_openmp(argc, argv);
  tune_allocator(argc, argv);
  // A file-size limit must surface as EFBIG from write(), reported cleanly, not kill the process.
  std::signal(SIGXFSZ, SIG_IGN);
  // Use every core unless ACTCAP_THREADS says otherwise (LibTorch's default may be 1 here).
  const char* threads = std::getenv("ACTCAP_THREADS");
  const int n =
      threads ? std::atoi(threads) : static_cast<int>(std::thread::hardware_concurrency());
  if (n > 0) at::set_num_threads(n);
  actcap::set_diagnostic_sink([](const std::string& message) {
    actcap::cli::say("warning", actcap::cli::one_line(message));
  });
  CLI::App app{
      "actcap: run Hugging Face transformers split across devices and capture verified "
      "activations"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "actcap 0.1.0");
  std::vector<actcap::cli::Command> commands = {
      actcap::cli::add_init_model(app), actcap::cli::add_points(app),
      actcap::cli::add_run(app),        actcap::cli::add_plan(app),
      actcap::cli::add_doctor(app),     actcap::cli::add_verify(app),
      actcap::cli::add_repro(app),      actcap::cli::add_compare(app),
      actcap::cli::add_tokenize(app),   actcap::cli::add_bench(app),
      actcap::cli::add_extract(app),    actcap::cli::add_generate(app),
      actcap::cli::add_merge(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    actcap::cli::say("error", actcap::cli::one_line(e.what()) + " (see actcap --help)");
    return 2;
  }
  try {
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const actcap::Error& e) {
    actcap::cli::say("error", with_flags(e));
    return e.exit_code();
  } catch (const c10::Error& e) {
    actcap::cli::say("error", actcap::cli::one_line(e.what_without_backtrace()));
    return 1;
  } catch (const std::exception& e) {
    actcap::cli::say("error", actcap::cli::one_line(e.what()));
    return 1;
  }
  return 2;
}
