// The hashes that check data leaving an accelerator, side by side in one process.
//
//   build/actcap_hash_bench [--sizes 1,16,128] [--rounds 9] [--threads N] [--device cuda:0]
//
// Host arms (always): what checking a capture or a transfer that left an accelerator costs on the
// host. "before" is the check as it was before 2026-12-04: the device hash recomputed over the
// host copy with the device's tensor operations (a multiplier per word: arange, multiply, sum),
// then the snapshot's XXH3 fingerprint; "now" is host_hash (one pass over the bytes) then XXH3.
// A plain copy of the same bytes is the reference.
// Device arms (--device, e.g. cuda:0): device_hash() itself, queued on the device for every
// capture, against the per-word formula it replaced (the same value; several times the traffic).
//
// Each round times every arm once, in turn, on the same tensor (a device arm ends with the hash
// read back, so it is timed complete); the table gives each arm's median GB/s of hashed bytes and
// the median of the per-round speed ratios against the first arm of its group. Sizes in MiB;
// --threads sets LibTorch's intra-op threads (default: its own choice).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "actcap/hash.h"
#include "executor/device_hash.h"

namespace {

// device_hash() as it was before 2026-12-04: a multiplier per word (the value is the same).
uint64_t per_word_hash(const at::Tensor& t) {
  const at::Tensor words = t.contiguous().view({-1}).view(at::kLong);  // whole words only here
  const at::Tensor m = at::arange(words.numel(), words.options())
                           .mul_(static_cast<int64_t>(0x9E3779B97F4A7C15ull))
                           .add_(static_cast<int64_t>(0x632BE59BD9B4E019ull))
                           .bitwise_or_(1);
  return static_cast<uint64_t>(words.mul(m)
                                   .sum()
                                   .add_(static_cast<int64_t>(t.nbytes() * 0xC2B2AE3D27D4EB4Full))
                                   .item<int64_t>());
}

uint64_t ops_hash(const at::Tensor& t) {
  return static_cast<uint64_t>(actcap::device_hash(t).item<int64_t>());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int fail(const char* msg) {
  std::fprintf(stderr, "hash_bench: %s\n", msg);
  return 2;
}

bool parse_sizes(const std::string& s, std::vector<int64_t>& out) {
  out.clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const long long mib = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || mib <= 0) return false;
    out.push_back(mib);
    pos = comma + 1;
  }
  return true;
}

struct Arm {
  const char* name;
  std::function<void()> run;
  std::vector<double> s;
};

// Every arm once per round, in turn (the first round warms up and is not counted); each arm's row
// gives its median GB/s and its median speed ratio against `arms[0]`, round by round.
void run_group(std::vector<Arm>& arms, int rounds, int64_t mib, double bytes) {
  for (int r = 0; r < rounds + 1; ++r)
    for (Arm& a : arms) {
      const auto start = std::chrono::steady_clock::now();
      a.run();
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) a.s.push_back(s);
    }
  for (const Arm& a : arms) {
    std::vector<double> ratio;
    for (size_t r = 0; r < a.s.size(); ++r) ratio.push_back(arms[0].s[r] / a.s[r]);
    std::printf("%5lld MiB  %-44s %8.2f  %.2fx\n", static_cast<long long>(mib), a.name,
                bytes / median(a.s) / 1e9, median(ratio));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // As the CLI runs (cli/main.cpp): freed memory is kept, so the tensor-operation arms'
  // temporaries are not page-faulted in afresh every call.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  std::vector<int64_t> sizes{1, 16, 128};
  int rounds = 9;
  std::string device;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sizes" && i + 1 < argc) {
      if (!parse_sizes(argv[++i], sizes)) return fail("--sizes takes MiB counts like 1,16,128");
    } else if (arg == "--threads" && i + 1 < argc) {
      const int threads = std::atoi(argv[++i]);
      if (threads < 1) return fail("--threads takes a positive count");
      at::set_num_threads(threads);
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
      if (rounds < 1) return fail("--rounds takes a positive count");
    } else if (arg == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--sizes MIB,MIB,...] [--rounds N] [--threads N] [--device DEV]\n",
                   argv[0]);
      return 2;
    }
  }
  std::optional<c10::Device> dev;
  if (!device.empty()) {
    try {
      dev = c10::Device(device);
      (void)at::empty({1}, at::TensorOptions().device(*dev));
    } catch (const std::exception& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "hash_bench: --device %s cannot be used: %s\n", device.c_str(),
                   what.substr(0, what.find('\n')).c_str());
      return 2;
    }
  }
  std::printf("intra-op threads: %d\n", at::get_num_threads());
  std::printf("%9s  %-44s %8s  %s\n", "size", "arm", "GB/s", "speed vs the group's first arm");
  for (const int64_t mib : sizes) {
    const at::Tensor t = at::randn({mib << 18}, at::kFloat);  // mib MiB of float32
    at::Tensor dst = at::empty_like(t);
    const double bytes = static_cast<double>(t.nbytes());
    uint64_t sink = 0;
    if (actcap::host_hash(t) != ops_hash(t) || per_word_hash(t) != ops_hash(t))
      return fail("the hashes of one tensor differ between implementations");
    std::vector<Arm> host{
        {"host, before: tensor ops per word + XXH3",
         [&] { sink ^= per_word_hash(t) ^ actcap::tensor_chunked_xxh3(t); },
         {}},
        {"host, now: host_hash + XXH3",
         [&] { sink ^= actcap::host_hash(t) ^ actcap::tensor_chunked_xxh3(t); },
         {}},
        {"host: tensor ops per word (alone)", [&] { sink ^= per_word_hash(t); }, {}},
        {"host: host_hash (alone)", [&] { sink ^= actcap::host_hash(t); }, {}},
        {"host: XXH3 (tensor_chunked_xxh3, alone)",
         [&] { sink ^= actcap::tensor_chunked_xxh3(t); },
         {}},
        {"host: copy_ (reference)", [&] { dst.copy_(t); }, {}},
    };
    run_group(host, rounds, mib, bytes);
    if (dev) {
      const at::Tensor d = t.to(*dev);
      if (ops_hash(d) != ops_hash(t) || per_word_hash(d) != ops_hash(t))
        return fail("the device's hash differs from the host's");
      std::vector<Arm> on_device{
          {"device, before: device_hash per word", [&] { sink ^= per_word_hash(d); }, {}},
          {"device, now: device_hash by rows", [&] { sink ^= ops_hash(d); }, {}},
      };
      run_group(on_device, rounds, mib, bytes);
    }
    if (sink == 42) std::printf(" ");  // keeps the hashes from being optimised away
  }
  return 0;
}
