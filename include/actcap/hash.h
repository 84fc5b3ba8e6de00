// XXH3-64 fingerprints, printed as 16 lowercase hex digits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace actcap {

uint64_t xxh3(const void* data, size_t size);
std::string hex64(uint64_t h);
// Hash of a tensor's bytes in contiguous row-major order (CPU copy made if needed).
uint64_t tensor_xxh3(const at::Tensor& t);

}  // namespace actcap
