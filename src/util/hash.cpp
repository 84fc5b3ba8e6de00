#include "actcap/hash.h"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <cstdio>

namespace actcap {

uint64_t xxh3(const void* data, size_t size) {
  // XXH3 accepts a null pointer only together with size 0; pass a valid one regardless.
  static const char kEmpty = 0;
  return XXH3_64bits(size == 0 ? &kEmpty : data, size);
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return std::string(buf, 16);
}

uint64_t tensor_xxh3(const at::Tensor& t) {
  // Hash the logical row-major bytes so that views, strided tensors and device copies of the same
  // values all hash alike.
  at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.cpu().contiguous();
  const size_t nbytes = static_cast<size_t>(c.numel()) * c.element_size();
  if (nbytes == 0) return xxh3(nullptr, 0);
  return xxh3(c.data_ptr(), nbytes);
}

}  // namespace actcap
