#include "actcap/error.h"
#include "actcap/executor.h"
#include "executor/transfer.h"

namespace actcap {

bool LinkProbe::ok() const {
  for (const auto& r : results)
    if (!r.ok) return false;
  return true;
}

bool LinkProbe::host_ok() const {
  for (const auto& r : results)
    if (!r.host_ok) return false;
  return true;
}

std::vector<LinkProbe> probe_links(const std::vector<DeviceId>& devices,
                                   const std::vector<uint64_t>& sizes,
                                   std::vector<TransferFault> faults) {
  std::vector<LinkProbe> out;
  for (const DeviceId& d : devices) require_available(d);
  for (const DeviceId& a : devices)
    for (const DeviceId& b : devices) {
      if (a == b) continue;
      LinkProbe probe{a, b, {}};
      for (uint64_t bytes : sizes) {
        // A pattern whose every byte position is distinct, so zeros, stale data or shifted data all
        // show.
        const int64_t n = static_cast<int64_t>(bytes / sizeof(int32_t));
        auto pattern =
            (at::arange(n, at::kInt) * 40503 + static_cast<int64_t>(bytes % 977)).to(a.c10());
        // One copy of the pattern, directly or staged through host memory (the route a run takes
        // when the direct path corrupts data), checked by its content, not only by the
        // fingerprints: ok, or what went wrong; and whether it needed the retry.
        auto copy = [&](bool via_host, std::string& detail, bool* retried) {
          at::Tensor dst = at::empty_like(pattern, pattern.options().device(b.c10()));
          TransferStats stats;
          try {
            transfer(TransferRequest{&pattern, dst, a, b, "doctor probe", true, via_host}, faults,
                     stats);
            if (retried) *retried = stats.retried > 0;
            if (at::equal(dst.to(at::kCPU), pattern.to(at::kCPU))) return true;
            detail = "content differs";
          } catch (const RunError& e) {
            detail = e.what();
          }
          return false;
        };
        LinkResult r{bytes, true, false, ""};
        r.ok = copy(/*via_host=*/false, r.detail, &r.retried);
        r.host_ok = copy(/*via_host=*/true, r.host_detail, nullptr);
        probe.results.push_back(r);
      }
      out.push_back(std::move(probe));
    }
  return out;
}

}  // namespace actcap
