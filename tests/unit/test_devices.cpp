#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>

#include "actcap/devices.h"
#include "actcap/error.h"

using namespace actcap;

namespace {
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

std::string device_error(const std::string& text, bool integer_is_cuda = false) {
  return error_of([&] { parse_device(text, integer_is_cuda); });
}
std::string list_error(const std::string& text) {
  return error_of([&] { parse_device_list(text); });
}
std::string bytes_error(const std::string& text) {
  return error_of([&] { parse_bytes(text); });
}
std::string memory_error(const std::string& text) {
  return error_of([&] { parse_max_memory(text); });
}
bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}
}  // namespace

TEST(Devices, ParseAcceptedForms) {
  EXPECT_EQ(parse_device("cpu"), DeviceId::cpu());
  EXPECT_EQ(parse_device("cpu:0"), DeviceId::virtual_cpu(0));
  EXPECT_EQ(parse_device("cpu:63"), DeviceId::virtual_cpu(63));
  EXPECT_EQ(parse_device("cuda:0"), DeviceId::cuda(0));
  EXPECT_EQ(parse_device("cuda:7"), DeviceId::cuda(7));
  EXPECT_EQ(parse_device(" cpu:2 "), DeviceId::virtual_cpu(2));
  EXPECT_EQ(parse_device("3", /*integer_is_cuda=*/true), DeviceId::cuda(3));
  EXPECT_EQ(parse_device("cpu", true), DeviceId::cpu());
}

TEST(Devices, StrAndC10) {
  EXPECT_EQ(DeviceId::cpu().str(), "cpu");
  EXPECT_EQ(DeviceId::virtual_cpu(3).str(), "cpu:3");
  EXPECT_EQ(DeviceId::cuda(1).str(), "cuda:1");
  EXPECT_EQ(DeviceId::cpu().c10(), c10::Device(c10::kCPU));
  EXPECT_EQ(DeviceId::virtual_cpu(5).c10(), c10::Device(c10::kCPU));
  EXPECT_EQ(DeviceId::cuda(2).c10(), c10::Device(c10::kCUDA, 2));
  EXPECT_TRUE(DeviceId::cpu() < DeviceId::virtual_cpu(0));
  EXPECT_TRUE(DeviceId::virtual_cpu(1) < DeviceId::virtual_cpu(2));
  EXPECT_NE(DeviceId::virtual_cpu(1), DeviceId::cuda(1));
}

TEST(Devices, ParseRejections) {
  for (const char* off : {"disk", "meta", "mps", "mps:0", "disk:1"}) {
    const auto e = device_error(off);
    EXPECT_TRUE(has(e, off)) << e;
    EXPECT_TRUE(has(e, "does not offload")) << e;
  }
  EXPECT_TRUE(has(device_error(""), "empty"));
  EXPECT_TRUE(has(device_error("   "), "empty"));
  EXPECT_TRUE(has(device_error("cpu:1x"), "cpu:1x"));
  EXPECT_TRUE(has(device_error("cuda:0abc"), "cuda:0abc"));
  EXPECT_TRUE(has(device_error("cpu :1"), "cpu :1"));
  EXPECT_TRUE(has(device_error("cpu: 1"), "cpu: 1"));
  EXPECT_TRUE(has(device_error("cpu:-1"), "negative"));
  EXPECT_TRUE(has(device_error("cuda:-2"), "cuda:-2"));
  EXPECT_TRUE(has(device_error("-1", true), "negative"));
  EXPECT_TRUE(has(device_error("cpu:64"), "out of range"));
  EXPECT_TRUE(has(device_error("cuda:99999999999999999999999"), "out of range"));
  EXPECT_TRUE(has(device_error("cpu:"), "cpu:"));
  EXPECT_TRUE(has(device_error("cuda"), "cuda:0"));
  EXPECT_TRUE(has(device_error("gpu:0"), "gpu:0"));
  EXPECT_TRUE(has(device_error("CPU"), "CPU"));
  EXPECT_TRUE(has(device_error("cpu:+1"), "cpu:+1"));
  // A bare integer is only a device in accelerate's maps.
  const auto e = device_error("0");
  EXPECT_TRUE(has(e, "'0'")) << e;
  EXPECT_TRUE(has(e, "cuda:0")) << e;
  // Every message says what is accepted.
  EXPECT_TRUE(has(device_error("tpu"), "cpu:N"));
}

TEST(Devices, ListAcceptedForms) {
  const auto l = parse_device_list("cpu:0,cpu:1,cuda:0");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0], DeviceId::virtual_cpu(0));
  EXPECT_EQ(l[1], DeviceId::virtual_cpu(1));
  EXPECT_EQ(l[2], DeviceId::cuda(0));
  const auto k = parse_device_list("3");
  ASSERT_EQ(k.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(k[i], DeviceId::virtual_cpu(i));
  EXPECT_EQ(parse_device_list("64").size(), 64u);
  EXPECT_EQ(parse_device_list("cpu"), std::vector<DeviceId>{DeviceId::cpu()});
  EXPECT_EQ(parse_device_list("cpu:1, cpu:0").size(), 2u);
  EXPECT_EQ(parse_device_list("cuda:1,cpu:0")[0], DeviceId::cuda(1));  // listed order kept
}

TEST(Devices, ListRejections) {
  EXPECT_TRUE(has(list_error(""), "empty"));
  EXPECT_TRUE(has(list_error("  "), "empty"));
  EXPECT_TRUE(has(list_error("0"), "between 1 and 64"));
  EXPECT_TRUE(has(list_error("65"), "'65'"));
  EXPECT_TRUE(has(list_error("-2"), "'-2'"));
  EXPECT_TRUE(has(list_error("99999999999999999999999"), "between 1 and 64"));
  const auto dup = list_error("cpu:0,cpu:1,cpu:0");
  EXPECT_TRUE(has(dup, "cpu:0 twice")) << dup;
  EXPECT_TRUE(has(list_error("cpu:0,,cpu:1"), "empty item"));
  EXPECT_TRUE(has(list_error("cpu:0,"), "empty item"));
  EXPECT_TRUE(has(list_error(",cpu:0"), "empty item"));
  const auto mix = list_error("cpu,cpu:0");
  EXPECT_TRUE(has(mix, "mixes plain cpu")) << mix;
  EXPECT_TRUE(has(list_error("cpu:0,disk"), "does not offload"));
  EXPECT_TRUE(has(list_error("cpu:0,cpu:1x"), "cpu:1x"));
  EXPECT_TRUE(has(list_error("0,1"), "'0'"));  // integers are not devices in --devices
  EXPECT_TRUE(has(list_error("3x"), "3x"));
}

TEST(Devices, BytesAcceptedForms) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("12B"), 12u);
  EXPECT_EQ(parse_bytes("2KB"), 2000u);
  EXPECT_EQ(parse_bytes("2kb"), 2000u);
  EXPECT_EQ(parse_bytes("3MB"), 3000000u);
  EXPECT_EQ(parse_bytes("2GB"), 2000000000u);
  EXPECT_EQ(parse_bytes("1TB"), 1000000000000u);
  EXPECT_EQ(parse_bytes("512KiB"), 512u * 1024);
  EXPECT_EQ(parse_bytes("512kib"), 512u * 1024);
  EXPECT_EQ(parse_bytes("300MiB"), 300ull << 20);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_bytes("1TiB"), 1ull << 40);
  EXPECT_EQ(parse_bytes("0.5KB"), 500u);
  EXPECT_EQ(parse_bytes("1.1KiB"), 1126u);  // fractions of a byte round down
  EXPECT_EQ(parse_bytes("300 MiB"), 300ull << 20);
  EXPECT_EQ(parse_bytes(" 7 "), 7u);
  EXPECT_EQ(parse_bytes("18446744073709551615"), 18446744073709551615ull);
}

TEST(Devices, BytesRejections) {
  EXPECT_TRUE(has(bytes_error(""), "empty"));
  EXPECT_TRUE(has(bytes_error("  "), "empty"));
  EXPECT_TRUE(has(bytes_error("-5MiB"), "negative"));
  EXPECT_TRUE(has(bytes_error("5XB"), "unknown unit 'XB'"));
  EXPECT_TRUE(has(bytes_error("5 M"), "unknown unit 'M'"));
  EXPECT_TRUE(has(bytes_error("MiB"), "MiB"));
  EXPECT_TRUE(has(bytes_error("1.MiB"), "1.MiB"));
  EXPECT_TRUE(has(bytes_error("1.5"), "fraction of a byte"));
  EXPECT_TRUE(has(bytes_error("18446744073709551616"), "too large"));
  EXPECT_TRUE(has(bytes_error("99999999999999999999999999999"), "too large"));
  EXPECT_TRUE(has(bytes_error("20000000TiB"), "too large"));
  EXPECT_TRUE(has(bytes_error("1e9"), "1e9"));
  EXPECT_TRUE(has(bytes_error("1,5GiB"), "1,5GiB"));
  // Messages say what is accepted.
  EXPECT_TRUE(has(bytes_error("lots"), "KiB"));
}

TEST(Devices, MaxMemory) {
  const auto m = parse_max_memory("cpu:0=300MiB,cpu:1=1GiB");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at(DeviceId::virtual_cpu(0)), 300ull << 20);
  EXPECT_EQ(m.at(DeviceId::virtual_cpu(1)), 1ull << 30);
  EXPECT_EQ(parse_max_memory("cuda:0=2GB").at(DeviceId::cuda(0)), 2000000000u);
  EXPECT_TRUE(has(memory_error(""), "empty"));
  EXPECT_TRUE(has(memory_error("cpu:0=1MiB,cpu:0=2MiB"), "cpu:0 twice"));
  EXPECT_TRUE(has(memory_error("cpu:0=1MiB,,cpu:1=1MiB"), "empty item"));
  EXPECT_TRUE(has(memory_error("cpu:0"), "cpu:0"));
  EXPECT_TRUE(has(memory_error("cpu:0=lots"), "lots"));
  EXPECT_TRUE(has(memory_error("disk=1GiB"), "does not offload"));
  EXPECT_TRUE(has(memory_error("cpu:0=-1"), "negative"));
}

TEST(Devices, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(300ull << 20), "300.00 MiB");
  EXPECT_EQ(format_bytes(3ull << 29), "1.50 GiB");
  EXPECT_EQ(format_bytes(2ull << 40), "2.00 TiB");
  EXPECT_EQ(format_bytes((1ull << 20) - 1), "1.00 MiB");  // never "1024.00 KiB"
}

// A cuda:N this machine cannot run is refused up front, by name, with what the machine has (not a
// LibTorch backend error from the first kernel). Holds with and without CUDA and GPUs.
TEST(Devices, RequireAvailableNamesTheDeviceAndWhatThisMachineHas) {
  EXPECT_NO_THROW(require_available(DeviceId::cpu()));
  EXPECT_NO_THROW(require_available(DeviceId::virtual_cpu(5)));
  const bool cuda = c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA);
  const int n = cuda ? c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() : 0;
  const std::string e = error_of([] { require_available(DeviceId::cuda(63)); });
  EXPECT_NE(e.find("device cuda:63: "), std::string::npos) << e;
  const std::string why = cuda ? "this machine has " + std::to_string(n) + " CUDA device"
                               : "built against a LibTorch without CUDA";
  EXPECT_NE(e.find(why), std::string::npos) << e;
  if (n > 0) {
    EXPECT_NO_THROW(require_available(DeviceId::cuda(n - 1)));
  }
}
