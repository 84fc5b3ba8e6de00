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
        at::Tensor dst = at::empty_like(pattern, pattern.options().device(b.c10()));
        TransferStats stats;
        LinkResult r{bytes, true, false, ""};
        try {
          transfer(TransferRequest{&pattern, dst, a, b, "doctor probe", true}, faults, stats);
          r.retried = stats.retried > 0;
          // Independent check of the content, not only of the fingerprints.
          if (!at::equal(dst.to(at::kCPU), pattern.to(at::kCPU))) {
            r.ok = false;
            r.detail = "content differs";
          }
        } catch (const RunError& e) {
          r.ok = false;
          r.detail = e.what();
        }
        // The same pattern staged through host memory: the route a run takes when the direct
        // path corrupts data.
        try {
          at::Tensor via = at::empty_like(dst);
          TransferStats host_stats;
          transfer(TransferRequest{&pattern, via, a, b, "doctor probe", true, /*via_host=*/true},
                   faults, host_stats);
          if (!at::equal(via.to(at::kCPU), pattern.to(at::kCPU))) {
            r.host_ok = false;
            r.host_detail = "content differs";
          }
        } catch (const RunError& e) {
          r.host_ok = false;
          r.host_detail = e.what();
        }
        probe.results.push_back(r);
      }
      out.push_back(std::move(probe));
    }
  return out;
}

}  // namespace actcap
