#include "models/parts/mxfp4.h"

#include <cmath>

namespace actcap {

namespace {

// e2m1: sign, two exponent bits, one mantissa bit (transformers' FP4_VALUES, by nibble).
constexpr float kE2m1[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Both values of every byte, [256, 2]: the low nibble's, then the high nibble's.
const at::Tensor& byte_table() {
  static const at::Tensor table = [] {
    at::Tensor t = at::empty({256, 2}, at::kFloat);
    float* p = t.data_ptr<float>();
    for (int b = 0; b < 256; ++b) p[2 * b] = kE2m1[b & 0x0F], p[2 * b + 1] = kE2m1[b >> 4];
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

}  // namespace

at::Tensor mxfp4_decode(const Mxfp4Matrix& m, at::ScalarType dtype, const at::Tensor& scratch) {
  const int64_t out = m.blocks.size(0), groups = m.blocks.size(1);
  const at::Device device = m.blocks.device();
  at::Tensor table = byte_table().to(device);
  // [out * groups * 16, 2] -> [out, groups, 32]: the values in order, each block's scale applied
  // in float32 (exact: a power of two times a value of at most two significant bits).
  at::Tensor values =
      table.index_select(0, m.blocks.reshape(-1).to(at::kInt)).view({out, groups, 32});
  at::Tensor scale = scale_table()
                         .to(device)
                         .index_select(0, m.scales.reshape(-1).to(at::kInt))
                         .view({out, groups, 1});
  at::Tensor decoded = (values * scale).view({out, groups * 32});
  if (!scratch.defined() || scratch.scalar_type() != dtype || scratch.numel() < decoded.numel())
    return decoded.to(dtype);
  return scratch.narrow(0, 0, decoded.numel()).view(decoded.sizes()).copy_(decoded);
}

}  // namespace actcap
