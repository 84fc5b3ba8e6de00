// The host-side hashes, side by side in one process: what checking a capture or a transfer that
// left an accelerator costs on the host (the device hash recomputed over the host copy), against
// XXH3 (the fingerprint of everything on the host) and a plain copy of the same bytes.
//
//   build/actcap_hash_bench [--sizes 1,16,128] [--rounds 9] [--threads N]   (sizes in MiB;
//                                         threads: LibTorch's intra-op threads, default its own)
//
// Each round times every arm once, in turn, on the same tensor; the table gives each arm's median
// GB/s and the median of the per-round speed ratios against the capture check as it was before
// host_hash: the device hash recomputed with the device's tensor operations (arange, multiply,
// sum), then XXH3 in a second pass.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "actcap/hash.h"
#include "executor/device_hash.h"

namespace {

uint64_t ops_hash(const at::Tensor& t) {
  return static_cast<uint64_t>(actcap::device_hash(t).item<int64_t>());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<int64_t> parse_sizes(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const long long mib = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || mib <= 0) {
      std::fprintf(stderr, "hash_bench: --sizes takes MiB counts like 1,16,128; got '%s'\n",
                   item.c_str());
      std::exit(2);
    }
    out.push_back(mib);
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // As the CLI runs (cli/main.cpp): freed memory is kept, so the tensor-operations arm's
  // temporaries are not page-faulted in afresh every call.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  std::vector<int64_t> sizes{1, 16, 128};
  int rounds = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sizes" && i + 1 < argc) {
      sizes = parse_sizes(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      const int threads = std::atoi(argv[++i]);
      if (threads < 1) {
        std::fprintf(stderr, "hash_bench: --threads takes a positive count\n");
        return 2;
      }
      at::set_num_threads(threads);
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
      if (rounds < 1) {
        std::fprintf(stderr, "hash_bench: --rounds takes a positive count\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--sizes MIB,MIB,...] [--rounds N] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  std::printf("intra-op threads: %d\n", at::get_num_threads());
  std::printf("%9s  %-36s %8s  %s\n", "size", "arm", "GB/s", "speed vs the check before");
  for (const int64_t mib : sizes) {
    const at::Tensor t = at::randn({mib << 18}, at::kFloat);  // mib MiB of float32
    at::Tensor dst = at::empty_like(t);
    const double bytes = static_cast<double>(t.nbytes());
    uint64_t sink = 0;
    struct Arm {
      const char* name;
      std::function<void()> run;
      std::vector<double> s;
    };
    std::vector<Arm> arms{
        {"before: device hash as tensor ops", [&] { sink ^= ops_hash(t); }, {}},
        {"before: the capture check (+ XXH3)",
         [&] { sink ^= ops_hash(t) ^ actcap::tensor_chunked_xxh3(t); },
         {}},
        {"now: device hash as host_hash", [&] { sink ^= actcap::host_hash(t); }, {}},
        {"now: the capture check (+ XXH3)",
         [&] { sink ^= actcap::host_hash(t) ^ actcap::tensor_chunked_xxh3(t); },
         {}},
        {"XXH3 alone (tensor_chunked_xxh3)", [&] { sink ^= actcap::tensor_chunked_xxh3(t); }, {}},
        {"copy_ (reference)", [&] { dst.copy_(t); }, {}},
    };
    if (actcap::host_hash(t) != ops_hash(t)) {
      std::fprintf(stderr, "hash_bench: host_hash differs from the tensor operations\n");
      return 1;
    }
    for (int r = 0; r < rounds + 1; ++r)  // the first round warms up and is not counted
      for (Arm& a : arms) {
        const auto start = std::chrono::steady_clock::now();
        a.run();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (r > 0) a.s.push_back(s);
      }
    for (const Arm& a : arms) {
      std::vector<double> ratio;
      for (size_t r = 0; r < a.s.size(); ++r) ratio.push_back(arms[1].s[r] / a.s[r]);
      std::printf("%5lld MiB  %-36s %8.2f  %.2fx\n", static_cast<long long>(mib), a.name,
                  bytes / median(a.s) / 1e9, median(ratio));
    }
    if (sink == 42) std::printf(" ");  // keeps the hashes from being optimised away
  }
  return 0;
}
