// Devices as actcap sees them: `cpu`, virtual CPU devices `cpu:N` (own budget, arena and
// statistics on one host; for testing 3-, 4-, 8-device maps anywhere) and `cuda:N`.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace actcap {

struct DeviceId {
  enum class Kind { kCpu, kVirtualCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // virtual CPU or CUDA ordinal; 0 for plain cpu

  static DeviceId cpu() { return {}; }
  static DeviceId virtual_cpu(int i) { return {Kind::kVirtualCpu, i}; }
  static DeviceId cuda(int i) { return {Kind::kCuda, i}; }
  std::string str() const;  // "cpu", "cpu:3", "cuda:1"
  c10::Device c10() const;  // physical device (virtual CPUs are the host CPU)
  bool operator==(const DeviceId& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const DeviceId& o) const { return !(*this == o); }
  bool operator<(const DeviceId& o) const {
    return kind != o.kind ? kind < o.kind : index < o.index;
  }
};

// Strict parsers; each throws InputError naming the offending text and what is accepted.
// "cpu" | "cpu:N" | "cuda:N" | "N" (accelerate's integer = cuda:N when `integer_is_cuda`).
DeviceId parse_device(const std::string& text, bool integer_is_cuda = false);
// "cpu:0,cpu:1,cuda:0" or a count "3" (= cpu:0,cpu:1,cpu:2). No duplicates, at most 64.
std::vector<DeviceId> parse_device_list(const std::string& text);
// That `device` can run work here: a cuda:N needs a LibTorch with CUDA and at least N+1 GPUs
// (InputError naming the device and what this machine has, otherwise). CPU devices always can.
void require_available(const DeviceId& device);
// "300MiB", "1.5GiB", "2GB", "4096" (bytes), "512KiB", "1TiB": binary and decimal units.
uint64_t parse_bytes(const std::string& text);
// "cpu:0=300MiB,cpu:1=1GiB" -> budgets.
std::map<DeviceId, uint64_t> parse_max_memory(const std::string& text);
// 1536 -> "1.50 KiB"
std::string format_bytes(uint64_t bytes);

}  // namespace actcap
