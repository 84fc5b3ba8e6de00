#include "executor/transfer.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "actcap/error.h"
#include "actcap/hash.h"
#include "actcap/numbers.h"
#include "executor/device_hash.h"

namespace actcap {

uint64_t device_fingerprint(const at::Tensor& t) {
  return t.device().is_cpu() ? tensor_xxh3(t) : device_hash_value(t);  // on the tensor's device
}

std::vector<TransferFault> parse_faults(const std::string& text) {
  std::vector<TransferFault> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    std::string item =
        text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    start = end == std::string::npos ? text.size() + 1 : end + 1;
    if (item.empty() || item.rfind("delay:", 0) == 0 || item.rfind("nofence:", 0) == 0)
      continue;  // parse_async_faults()
    const std::string prefix = "transfer:";
    const size_t arrow = item.find("->");
    const size_t kind_at = item.rfind(':');
    if (item.rfind(prefix, 0) != 0 || arrow == std::string::npos || kind_at == std::string::npos ||
        kind_at < arrow)
      throw InputError(
          concat("transfer fault '", item, "' is not transfer:SRC->DST:bitflip|zeros[-once]"),
          {"transfer_faults"});
    TransferFault f;
    f.src = parse_device(item.substr(prefix.size(), arrow - prefix.size()));
    f.dst = parse_device(item.substr(arrow + 2, kind_at - arrow - 2));
    std::string kind = item.substr(kind_at + 1);
    for (bool more = true; more;) {  // suffixes, in any order
      more = false;
      for (const auto& [suffix, flag] : {std::pair<std::string, bool*>{"-once", &f.once},
                                         std::pair<std::string, bool*>{"-direct", &f.direct_only}})
        if (kind.size() > suffix.size() &&
            kind.compare(kind.size() - suffix.size(), suffix.size(), suffix) == 0) {
          *flag = true;
          kind.resize(kind.size() - suffix.size());
          more = true;
        }
    }
    if (kind == "bitflip")
      f.kind = TransferFault::Kind::kBitflip;
    else if (kind == "zeros")
      f.kind = TransferFault::Kind::kZeros;
    else
      throw InputError(concat("transfer fault: unknown kind '", kind,
                              "' (bitflip or zeros, optionally -once and/or -direct)"),
                       {"transfer_faults"});
    out.push_back(f);
  }
  return out;
}

bool AsyncFaults::any() const {
  return delay_copy_ms > 0 || delay_stage_ms > 0 || nofence_transfer_out || nofence_transfer_in ||
         nofence_capture_read || nofence_capture_source;
}

AsyncFaults parse_async_faults(const std::string& text) {
  AsyncFaults f;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    const std::string item =
        text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    start = end == std::string::npos ? text.size() + 1 : end + 1;
    if (item.empty() || item.rfind("transfer:", 0) == 0) continue;  // parse_faults()
    if (item.rfind("delay:", 0) == 0) {
      const size_t colon = item.find(':', 6);
      const std::string what = item.substr(6, colon == std::string::npos ? colon : colon - 6);
      const int64_t ms = colon == std::string::npos
                             ? -1
                             : parse_int64(item.substr(colon + 1)).value_or(int64_t{-1});
      if ((what != "copy" && what != "stage") || ms < 0 || ms > 60000)
        throw InputError(
            concat("fault '", item, "' is not delay:copy:MS or delay:stage:MS (0 to 60000 ms)"),
            {"transfer_faults"});
      (what == "copy" ? f.delay_copy_ms : f.delay_stage_ms) = static_cast<int>(ms);
    } else if (item == "nofence:transfer-out") {
      f.nofence_transfer_out = true;
    } else if (item == "nofence:transfer-in") {
      f.nofence_transfer_in = true;
    } else if (item == "nofence:capture-read") {
      f.nofence_capture_read = true;
    } else if (item == "nofence:capture-source") {
      f.nofence_capture_source = true;
    } else {
      throw InputError(concat("fault '", item,
                              "' is none of transfer:SRC->DST:KIND, delay:copy:MS, delay:stage:MS, "
                              "nofence:transfer-out, nofence:transfer-in, nofence:capture-read, "
                              "nofence:capture-source"),
                       {"transfer_faults"});
    }
  }
  return f;
}

void check_fault_links(const std::vector<TransferFault>& faults,
                       const std::vector<DeviceId>& stage_device) {
  std::vector<std::pair<DeviceId, DeviceId>> links;
  for (size_t i = 1; i < stage_device.size(); ++i) {
    const std::pair<DeviceId, DeviceId> link{stage_device[i - 1], stage_device[i]};
    if (link.first != link.second && std::find(links.begin(), links.end(), link) == links.end())
      links.push_back(link);
  }
  for (const TransferFault& f : faults) {
    if (std::find(links.begin(), links.end(), std::make_pair(f.src, f.dst)) != links.end())
      continue;
    std::string there;
    for (const auto& [a, b] : links)
      there += concat(there.empty() ? "" : ", ", a.str(), "->", b.str());
    throw InputError(
        concat("transfer fault on link ", f.src.str(), "->", f.dst.str(),
               " is not crossed by this run, so the fault could never fire; ",
               links.empty() ? concat("it crosses no link (every stage is on ",
                                      stage_device.empty() ? std::string("one device")
                                                           : stage_device.front().str(),
                                      "): split it over more devices")
                             : concat("links crossed: ", there,
                                      " (name one of them, or change the devices or device map)")),
        {"transfer_faults", "devices", "device_map"});
  }
}

namespace {

// Simulates a broken link: damages the bytes that arrived (over a host-staged copy only when the
// fault is not direct-only).
void inject(at::Tensor& dst, const DeviceId& from, const DeviceId& to, bool via_host,
            std::vector<TransferFault>& faults, TransferStats& stats) {
  for (TransferFault& f : faults) {
    if (f.src != from || f.dst != to || (f.once && f.fired > 0) || (f.direct_only && via_host))
      continue;
    ++f.fired;
    ++stats.injected;
    if (dst.numel() == 0) continue;
    if (f.kind == TransferFault::Kind::kZeros) {
      dst.zero_();
    } else {
      auto bytes = dst.view({-1}).view(at::kByte);
      const int64_t at_byte = bytes.numel() / 2;
      bytes.narrow(0, at_byte, 1).bitwise_xor_(0x10);
    }
  }
}

}  // namespace

bool transfer(const TransferRequest& req, std::vector<TransferFault>& faults,
              TransferStats& stats) {
  at::Tensor dst = req.dst;
  const at::Tensor& src = *req.src;
  // Through host memory, pinned wherever an accelerator copies to or from it (full bandwidth; host
  // to device asynchronously on the current stream, the copy queue's, the pinned block kept by the
  // allocator until the copy ran). The route of a link sent through the host, of every host <->
  // accelerator copy (a mixed map), and of the retry.
  auto staged_copy = [&] {
    if (src.is_cpu() && dst.is_cpu()) {
      dst.copy_(src);
    } else if (src.is_cpu()) {
      dst.copy_(at::empty(src.sizes(), src.options().pinned_memory(true)).copy_(src),
                /*non_blocking=*/true);
    } else {
      at::Tensor host = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(true));
      dst.copy_(host.copy_(src));  // the copy to the host waits for the device
    }
  };
  const bool mixed = src.is_cpu() != dst.is_cpu();
  if (req.via_host || mixed)
    staged_copy();
  else
    dst.copy_(src);
  if (req.via_host) ++stats.via_host;
  inject(dst, req.from, req.to, req.via_host, faults, stats);
  ++stats.transfers;
  stats.bytes += req.src->numel() * req.src->element_size();
  if (!req.verify) return false;
  ++stats.verified;
  // Both sides hashed the same way: XXH3 between host devices, the device hash (device_hash.h)
  // wherever an accelerator is involved, computed where each side lives.
  auto fingerprint = [&](const at::Tensor& t) {
    return mixed ? device_hash_value(t) : device_fingerprint(t);
  };
  const uint64_t want = fingerprint(*req.src);
  uint64_t got = fingerprint(dst);
  if (got == want) return false;
  // Retry once through host memory, bypassing the direct device-to-device path (a staged copy that
  // arrived damaged is staged once more).
  staged_copy();
  inject(dst, req.from, req.to, /*via_host=*/true, faults, stats);
  got = fingerprint(dst);
  if (got == want) {
    ++stats.retried;
    return !req.via_host;
  }
  throw RunError(
      concat("transfer of the hidden state into ", req.into, " from ", req.from.str(), " to ",
             req.to.str(), " arrived corrupted (checksum ", hex64(got), ", expected ", hex64(want),
             ") even after a retry through host memory; check the link"),
      {"doctor:" + req.from.str() + "," + req.to.str()});
}

}  // namespace actcap
