// Device names, device lists, byte sizes and max-memory budgets: strict parsers with one clear
// message per mistake.
#include "actcap/devices.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cctype>
#include <cstdio>
#include <limits>
#include <set>

#include "actcap/error.h"
#include "util/strings.h"

namespace actcap {

namespace {

constexpr int kMaxDevices = 64;  // cpu:N and cuda:N take 0 <= N < 64; lists hold at most 64

const char* const kAcceptedDevices = "expected cpu, cpu:N or cuda:N (0 <= N < 64)";
const char* const kAcceptedUnits =
    "expected a non-negative number with an optional unit B, KB, MB, GB, TB (powers of 1000) or "
    "KiB, MiB, GiB, TiB (powers of 1024), e.g. 300MiB";

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_digit(c)) return false;
  return true;
}

std::string accepted(bool integer_is_cuda) {
  return integer_is_cuda ? concat(kAcceptedDevices, ", or an integer N meaning cuda:N")
                         : std::string(kAcceptedDevices);
}

// Index after "cpu:" / "cuda:" (or a bare integer): digits only, 0 <= N < 64.
int parse_index(const std::string& digits, const std::string& text, bool integer_is_cuda) {
  if (digits.empty())
    throw InputError(
        concat("device '", text, "' has no index after ':'; ", accepted(integer_is_cuda)));
  if (digits[0] == '-' && all_digits(digits.substr(1)))
    throw InputError(
        concat("device '", text, "' has a negative index; ", accepted(integer_is_cuda)));
  if (!all_digits(digits))
    throw InputError(concat("device '", text, "' has an invalid index '", digits, "'; ",
                            accepted(integer_is_cuda)));
  uint64_t v = 0;
  for (char c : digits) {
    v = v * 10 + static_cast<uint64_t>(c - '0');
    if (v >= static_cast<uint64_t>(kMaxDevices))
      throw InputError(
          concat("device '", text, "' has an index out of range (0 <= N < ", kMaxDevices, ")"));
  }
  return static_cast<int>(v);
}

}  // namespace

std::string DeviceId::str() const {
  switch (kind) {
    case Kind::kCpu:
      return "cpu";
    case Kind::kVirtualCpu:
      return concat("cpu:", index);
    case Kind::kCuda:
      return concat("cuda:", index);
  }
  return "cpu";
}

c10::Device DeviceId::c10() const {
  if (kind == Kind::kCuda) return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  return c10::Device(c10::kCPU);
}

void require_available(const DeviceId& device) {
  if (device.kind != DeviceId::Kind::kCuda) return;
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA))
    throw InputError(concat("device ", device.str(),
                            ": this actcap is built against a LibTorch without CUDA; build it "
                            "against a CUDA torch (docs/gpu.md) or use cpu / cpu:N"),
                     {"devices"});
  const int n = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount();
  if (device.index >= n)
    throw InputError(concat("device ", device.str(), ": this machine has ", n, " CUDA device",
                            n == 1 ? "" : "s",
                            n > 0 ? concat(" (cuda:0..cuda:", n - 1, ")") : std::string()),
                     {"devices"});
}

DeviceId parse_device(const std::string& text, bool integer_is_cuda) {
  const std::string t = trim(text);
  if (t.empty())
    throw InputError(concat("device '", text, "' is empty; ", accepted(integer_is_cuda)));
  const size_t colon = t.find(':');
  const std::string kind = t.substr(0, colon);
  if (kind == "disk" || kind == "meta" || kind == "mps")
    throw InputError(
        concat("device '", t, "': actcap does not offload to ", kind,
               "; every stage must sit on a compute device: ", accepted(integer_is_cuda)));
  if (colon == std::string::npos) {
    if (t == "cpu") return DeviceId::cpu();
    if (t == "cuda")
      throw InputError(concat("device 'cuda' needs an index (cuda:0, cuda:1, ...); ",
                              accepted(integer_is_cuda)));
    const bool integer = all_digits(t) || (t[0] == '-' && all_digits(t.substr(1)));
    if (integer) {
      if (!integer_is_cuda)
        throw InputError(concat("device '", t, "' is a bare integer; write cuda:", t,
                                " for a GPU or cpu:", t, " for a virtual CPU device; ",
                                kAcceptedDevices));
      return DeviceId::cuda(parse_index(t, t, integer_is_cuda));
    }
    throw InputError(concat("unknown device '", t, "'; ", accepted(integer_is_cuda)));
  }
  const std::string rest = t.substr(colon + 1);
  if (kind == "cpu") return DeviceId::virtual_cpu(parse_index(rest, t, integer_is_cuda));
  if (kind == "cuda") return DeviceId::cuda(parse_index(rest, t, integer_is_cuda));
  throw InputError(concat("unknown device '", t, "'; ", accepted(integer_is_cuda)));
}

std::vector<DeviceId> parse_device_list(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty())
    throw InputError(concat("device list '", text, "' is empty; expected comma-separated devices (",
                            kAcceptedDevices, ") or a count K (1..64) meaning cpu:0..cpu:K-1"));
  if (all_digits(t) || (t[0] == '-' && all_digits(t.substr(1)))) {
    uint64_t k = 0;
    bool too_big = t[0] == '-';
    for (char c : t) {
      if (too_big || c == '-') break;
      k = k * 10 + static_cast<uint64_t>(c - '0');
      if (k > static_cast<uint64_t>(kMaxDevices)) too_big = true;
    }
    if (too_big || k == 0)
      throw InputError(concat("device count '", t, "' must be between 1 and ", kMaxDevices,
                              " (a count K means cpu:0..cpu:K-1)"));
    std::vector<DeviceId> out;
    for (int i = 0; i < static_cast<int>(k); ++i) out.push_back(DeviceId::virtual_cpu(i));
    return out;
  }
  std::vector<DeviceId> out;
  std::set<DeviceId> seen;
  const auto items = split(t, ',');
  if (items.size() > static_cast<size_t>(kMaxDevices))
    throw InputError(
        concat("device list '", t, "' names ", items.size(), " devices; at most ", kMaxDevices));
  for (size_t i = 0; i < items.size(); ++i) {
    if (trim(items[i]).empty())
      throw InputError(concat("device list '", t, "' has an empty item at position ", i + 1,
                              "; expected comma-separated devices (", kAcceptedDevices, ")"));
    const DeviceId d = parse_device(items[i], /*integer_is_cuda=*/false);
    if (!seen.insert(d).second)
      throw InputError(concat("device list '", t, "' names ", d.str(), " twice"));
    out.push_back(d);
  }
  bool plain = false, virt = false;
  for (const auto& d : out) {
    plain = plain || d.kind == DeviceId::Kind::kCpu;
    virt = virt || d.kind == DeviceId::Kind::kVirtualCpu;
  }
  if (plain && virt)
    throw InputError(concat("device list '", t,
                            "' mixes plain cpu with virtual CPU devices cpu:N (ambiguous); use "
                            "either cpu or cpu:0, cpu:1, ..."));
  return out;
}

uint64_t parse_bytes(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty()) throw InputError(concat("size '", text, "' is empty; ", kAcceptedUnits));
  if (t[0] == '-') throw InputError(concat("size '", t, "' is negative; ", kAcceptedUnits));
  size_t i = 0;
  unsigned __int128 whole = 0;
  const unsigned __int128 u64max = std::numeric_limits<uint64_t>::max();
  bool overflow = false;
  while (i < t.size() && is_digit(t[i])) {
    whole = whole * 10 + static_cast<unsigned>(t[i] - '0');
    if (whole > u64max) {
      overflow = true;
      whole = u64max + 1;  // keep it bounded; the value is too large anyway
    }
    ++i;
  }
  if (i == 0)
    throw InputError(concat("size '", t, "' does not start with a number; ", kAcceptedUnits));
  unsigned __int128 frac = 0, frac_scale = 1;
  bool has_point = false;
  if (i < t.size() && t[i] == '.') {
    has_point = true;
    ++i;
    const size_t start = i;
    while (i < t.size() && is_digit(t[i])) {
      if (i - start < 18) {  // finer than 1e-18 of a unit cannot change a byte count
        frac = frac * 10 + static_cast<unsigned>(t[i] - '0');
        frac_scale *= 10;
      }
      ++i;
    }
    if (i == start)
      throw InputError(
          concat("size '", t, "' has no digits after the decimal point; ", kAcceptedUnits));
  }
  while (i < t.size() && t[i] == ' ') ++i;
  std::string unit = t.substr(i);
  std::string lower;
  for (char c : unit) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t mult = 0;
  if (lower.empty() || lower == "b")
    mult = 1;
  else if (lower == "kb")
    mult = 1000ULL;
  else if (lower == "mb")
    mult = 1000ULL * 1000;
  else if (lower == "gb")
    mult = 1000ULL * 1000 * 1000;
  else if (lower == "tb")
    mult = 1000ULL * 1000 * 1000 * 1000;
  else if (lower == "kib")
    mult = 1ULL << 10;
  else if (lower == "mib")
    mult = 1ULL << 20;
  else if (lower == "gib")
    mult = 1ULL << 30;
  else if (lower == "tib")
    mult = 1ULL << 40;
  else
    throw InputError(concat("size '", t, "' has an unknown unit '", unit, "'; ", kAcceptedUnits));
  if (mult == 1 && has_point && frac != 0)
    throw InputError(concat("size '", t, "' is a fraction of a byte; ", kAcceptedUnits));
  const unsigned __int128 value = overflow ? u64max + 1 : whole * mult + (frac * mult) / frac_scale;
  if (value > u64max)
    throw InputError(concat("size '", t, "' is too large (more than 2^64-1 bytes)"));
  return static_cast<uint64_t>(value);
}

std::map<DeviceId, uint64_t> parse_max_memory(const std::string& text) {
  const std::string t = trim(text);
  const char* const form = "expected comma-separated DEVICE=SIZE, e.g. cpu:0=300MiB,cpu:1=1GiB";
  if (t.empty()) throw InputError(concat("max-memory '", text, "' is empty; ", form));
  std::map<DeviceId, uint64_t> out;
  const auto items = split(t, ',');
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string item = trim(items[i]);
    if (item.empty())
      throw InputError(
          concat("max-memory '", t, "' has an empty item at position ", i + 1, "; ", form));
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw InputError(concat("max-memory item '", item, "' has no '='; ", form));
    const DeviceId d = parse_device(item.substr(0, eq), /*integer_is_cuda=*/false);
    const uint64_t bytes = parse_bytes(item.substr(eq + 1));
    if (!out.emplace(d, bytes).second)
      throw InputError(concat("max-memory '", t, "' gives ", d.str(), " twice"));
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return concat(bytes, " B");
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  // 1023.995 and up would print as "1024.00"; move to the next unit instead.
  while (u < 4 && v >= 1023.995) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace actcap
