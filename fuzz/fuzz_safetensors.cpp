// parse_safetensors on arbitrary bytes, then (when it accepts them) the properties the loader
// relies on: every tensor's byte range lies inside the data section, the ranges tile it exactly,
// byte counts match shape x dtype. The same bytes are then opened through the real loading path
// (SafetensorsFile::open on a memfd, tensor() for every name) and each tensor must hold exactly
// its range's bytes.
#include <ATen/ATen.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "actcap/safetensors.h"
#include "fuzz_common.h"

namespace {

// One memfd reused for every input: the loader maps files by path.
int memfd() {
  static const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  return fd;
}

void write_memfd(const uint8_t* data, size_t size) {
  const int fd = memfd();
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  FUZZ_CHECK(::ftruncate(fd, 0) == 0, "ftruncate failed");
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    FUZZ_CHECK(w > 0, "pwrite failed");
    done += static_cast<size_t>(w);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  actcap::SafetensorsHeader h;
  if (!fuzz::clean([&] { h = actcap::parse_safetensors(data, size, "fuzz.safetensors"); }))
    return 0;

  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  FUZZ_CHECK(h.data_offset == 8 + n && h.data_offset <= size, "data_offset %llu, size %zu",
             static_cast<unsigned long long>(h.data_offset), size);
  const uint64_t data_size = size - h.data_offset;
  const uint8_t* section = data + h.data_offset;

  uint64_t pos = 0;
  unsigned sum = 0;
  for (const actcap::TensorInfo& t : h.tensors) {
    FUZZ_CHECK(t.begin == pos && t.begin <= t.end && t.end <= data_size,
               "tensor '%s' [%llu, %llu) does not continue the tiling at %llu (data %llu)",
               t.name.c_str(), static_cast<unsigned long long>(t.begin),
               static_cast<unsigned long long>(t.end), static_cast<unsigned long long>(pos),
               static_cast<unsigned long long>(data_size));
    // The name read maps to the dtype held (not back: without 8-bit float types, LibTorch before
    // 2.1 holds F8_E4M3 / F8_E5M2 codes as bytes, which are written as U8).
    FUZZ_CHECK(actcap::safetensors_dtype(t.dtype_name, "fuzz") == t.dtype, "dtype %s",
               t.dtype_name.c_str());
    // Byte count = numel x itemsize, computed without overflow here.
    uint64_t bytes = c10::elementSize(t.dtype);
    bool zero = false, overflow = false;
    for (int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0, "negative dim in '%s'", t.name.c_str());
      zero = zero || d == 0;
      overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
    }
    if (zero) bytes = 0;
    FUZZ_CHECK(!overflow || zero, "accepted an overflowing shape for '%s'", t.name.c_str());
    FUZZ_CHECK(bytes == t.end - t.begin, "'%s': %llu bytes by shape, range %llu", t.name.c_str(),
               static_cast<unsigned long long>(bytes),
               static_cast<unsigned long long>(t.end - t.begin));
    // Public API: numel() of an accepted tensor must be computable.
    const int64_t numel = t.numel();
    FUZZ_CHECK(numel >= 0, "'%s': numel %lld", t.name.c_str(), static_cast<long long>(numel));
    // Touch every byte of the range (ASan catches any read outside the input).
    for (uint64_t i = t.begin; i < t.end; ++i) sum += section[i];
    pos = t.end;
  }
  FUZZ_CHECK(pos == data_size, "tensors end at %llu, data section is %llu bytes",
             static_cast<unsigned long long>(pos), static_cast<unsigned long long>(data_size));
  for (const auto& [k, v] : h.metadata) sum += static_cast<unsigned>(k.size() + v.size());

  // The loading path: map the same bytes from a file and materialise every tensor.
  write_memfd(data, size);
  const std::string path = "/proc/self/fd/" + std::to_string(memfd());
  std::shared_ptr<actcap::SafetensorsFile> file;
  const bool opened = fuzz::clean([&] { file = actcap::SafetensorsFile::open(path); });
  FUZZ_CHECK(opened, "parse_safetensors accepted the bytes but SafetensorsFile::open did not");
  FUZZ_CHECK(file->tensors().size() == h.tensors.size(), "tensor count differs");
  for (const actcap::TensorInfo& t : h.tensors) {
    const actcap::TensorInfo* info = file->find(t.name);
    FUZZ_CHECK(info != nullptr && info->begin == t.begin && info->end == t.end,
               "find('%s') differs", t.name.c_str());
    at::Tensor x;
    // tensor() may only fail cleanly (it should not fail at all for an accepted header).
    FUZZ_CHECK(fuzz::clean([&] { x = file->tensor(t.name); }), "tensor('%s') threw InputError",
               t.name.c_str());
    FUZZ_CHECK(x.scalar_type() == t.dtype && x.sizes().vec() == t.shape && x.is_contiguous(),
               "tensor('%s') has the wrong dtype/shape", t.name.c_str());
    const uint64_t nbytes = static_cast<uint64_t>(x.numel()) * x.element_size();
    FUZZ_CHECK(nbytes == t.end - t.begin, "tensor('%s') holds %llu bytes, range %llu",
               t.name.c_str(), static_cast<unsigned long long>(nbytes),
               static_cast<unsigned long long>(t.end - t.begin));
    if (nbytes > 0)
      FUZZ_CHECK(std::memcmp(x.data_ptr(), section + t.begin, nbytes) == 0,
                 "tensor('%s') bytes differ from the file", t.name.c_str());
  }
  if (sum == 0xdeadbeef) std::fprintf(stderr, " ");  // keep the sum observable
  return 0;
}
