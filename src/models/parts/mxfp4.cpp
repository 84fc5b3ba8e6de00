#include "models/parts/mxfp4.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

namespace actcap {

namespace {

// e2m1: sign, two exponent bits, one mantissa bit (transformers' FP4_VALUES, by nibble).
constexpr float kE2m1[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The value of every byte's low nibble, then of its high nibble: [2, 256].
const at::Tensor& byte_table() {
  static const at::Tensor table = [] {
    at::Tensor t = at::empty({2, 256}, at::kFloat);
    float* p = t.data_ptr<float>();
    for (int b = 0; b < 256; ++b) p[b] = kE2m1[b & 0x0F], p[256 + b] = kE2m1[b >> 4];
    return t;
  }();
  return table;
}

// e8m0: 2^(byte - 127), exact (std::ldexp). 255 (NaN in the format) gives infinity, as
// transformers' torch.ldexp does.
const at::Tensor& scale_table() {
  static const at::Tensor table = [] {
    at::Tensor t = at::empty({256}, at::kFloat);
    float* p = t.data_ptr<float>();
    for (int s = 0; s < 256; ++s) p[s] = std::ldexp(1.0f, s - 127);
    return t;
  }();
  return table;
}

struct Tables {
  at::Tensor bytes, scales;
};

// Both tables on `device`: copied there once (a blocking host-to-device copy the first time only,
// not one per matrix). Never freed: a static tensor on an accelerator would outlive its runtime.
const Tables& tables_on(at::Device device) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, Tables>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(device.str());
  if (it == cache->end())
    it = cache->emplace(device.str(), Tables{byte_table().to(device), scale_table().to(device)})
             .first;
  return it->second;
}

}  // namespace

at::Tensor mxfp4_decode(const Mxfp4Matrix& m, at::ScalarType dtype, const at::Tensor& scratch) {
  const int64_t out = m.blocks.size(0), groups = m.blocks.size(1), in = groups * 32;
  const Tables& t = tables_on(m.blocks.device());
  at::Tensor buf;  // [in, out], row-major: input j = 32 g + 2 b + nibble
  if (scratch.defined() && scratch.scalar_type() == dtype && scratch.numel() >= in * out)
    buf = scratch.narrow(0, 0, in * out).view({in, out});
  else
    buf = at::empty({in, out}, m.blocks.options().dtype(dtype));
  // Bands of output columns, so that the temporaries (the bytes transposed, their int32 indices,
  // two float32 halves: about 6 bytes a value) stay near 24 MB.
  const int64_t band = std::max<int64_t>(1, (int64_t{4} << 20) / in);
  for (int64_t r = 0; r < out; r += band) {
    const int64_t n = std::min(band, out - r);
    // [n, groups, 16] bytes -> [groups, 16, n]: each byte's outputs contiguous, as in the buffer.
    // Transposed as bytes, then widened (widening the permuted view first keeps its strides and
    // makes reshape copy the int32 indices again: eight times slower, measured).
    at::Tensor idx =
        m.blocks.narrow(0, r, n).permute({1, 2, 0}).contiguous().to(at::kInt).reshape(-1);
    at::Tensor scale =
        t.scales.index_select(0, m.scales.narrow(0, r, n).t().reshape(-1).to(at::kInt))
            .view({groups, 1, n});
    // Each value times its block's scale in float32 (exact: a power of two times a value of at
    // most two significant bits), written once into the buffer's dtype: the low nibbles' inputs
    // 32 g + 2 b, the high nibbles' 32 g + 2 b + 1.
    at::Tensor v = buf.narrow(1, r, n).view({groups, 16, 2, n});
    at::Tensor lo = v.select(2, 0), hi = v.select(2, 1);
    at::mul_out(lo, t.bytes[0].index_select(0, idx).view({groups, 16, n}), scale);
    at::mul_out(hi, t.bytes[1].index_select(0, idx).view({groups, 16, n}), scale);
  }
  return buf.t();
}

}  // namespace actcap
