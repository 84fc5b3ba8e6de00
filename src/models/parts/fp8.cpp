#include "models/parts/fp8.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

namespace actcap {

const float* e4m3_values() {
  static const std::array<float, 256> kValues = [] {
    std::array<float, 256> v{};
    for (int code = 0; code < 256; ++code) {
      const int exponent = (code >> 3) & 15, mantissa = code & 7;
      float x;
      if (exponent == 15 && mantissa == 7)
        x = std::nanf("");
      else if (exponent == 0)
        x = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: mantissa/8 * 2^-6
      else
        x = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // (1 + m/8) * 2^(e-7)
      v[code] = (code & 128) ? -x : x;
    }
    return v;
  }();
  return kValues.data();
}

namespace {

// The output buffer [rows, cols] in `dtype`: the front of `scratch` when it fits, else fresh.
at::Tensor output(const Fp8Matrix& m, at::ScalarType dtype, const at::Tensor& scratch) {
  const int64_t rows = m.codes.size(0), cols = m.codes.size(1);
  if (scratch.defined() && scratch.scalar_type() == dtype && scratch.numel() >= rows * cols &&
      scratch.device() == m.codes.device())
    return scratch.narrow(0, 0, rows * cols).view({rows, cols});
  return at::empty({rows, cols}, m.codes.options().dtype(dtype));
}

// The product rounded to R (the checkpoint's dtype), then held as Out (the buffer's).
template <typename R, typename Out>
void decode_cpu(const Fp8Matrix& m, Out* o) {
  const at::Tensor codes = m.codes.contiguous(), scales = m.scales.contiguous();
  const int64_t rows = codes.size(0), cols = codes.size(1);
  const int64_t br = m.block_rows, bc = m.block_cols, scale_cols = scales.size(1);
  const uint8_t* in = codes.data_ptr<uint8_t>();
  const float* scale = scales.data_ptr<float>();
  const float* value = e4m3_values();
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 16) / cols),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       const float* row_scale = scale + i / br * scale_cols;
                       const uint8_t* qi = in + i * cols;
                       Out* oi = o + i * cols;
                       for (int64_t j0 = 0; j0 < cols; j0 += bc) {
                         const int64_t j1 = std::min(cols, j0 + bc);
                         const float f = row_scale[j0 / bc];
                         for (int64_t j = j0; j < j1; ++j)
                           oi[j] = static_cast<Out>(static_cast<float>(R(value[qi[j]] * f)));
                       }
                     }
                   });
}

template <typename R>
void decode_cpu_into(const Fp8Matrix& m, at::Tensor& out) {
  switch (out.scalar_type()) {
    case at::kBFloat16:
      return decode_cpu<R>(m, out.data_ptr<at::BFloat16>());
    case at::kHalf:
      return decode_cpu<R>(m, out.data_ptr<at::Half>());
    default:
      return decode_cpu<R>(m, out.data_ptr<float>());
  }
}

// The code table on `device`: copied there once, never freed (a static tensor on an accelerator
// would outlive its runtime).
const at::Tensor& table_on(at::Device device) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, at::Tensor>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(device.str());
  if (it == cache->end()) {
    at::Tensor t = at::from_blob(const_cast<float*>(e4m3_values()), {256}, at::kFloat);
    it = cache->emplace(device.str(), t.to(device, /*non_blocking=*/false, /*copy=*/true)).first;
  }
  return it->second;
}

}  // namespace

at::Tensor fp8_decode(const Fp8Matrix& m, at::ScalarType dtype, const at::Tensor& scratch) {
  if (!m.codes.device().is_cpu()) return fp8_decode_bands(m, dtype, scratch);
  at::Tensor out = output(m, dtype, scratch);
  if (out.numel() == 0) return out;
  switch (m.rounded) {
    case at::kBFloat16:
      decode_cpu_into<at::BFloat16>(m, out);
      break;
    case at::kHalf:
      decode_cpu_into<at::Half>(m, out);
      break;
    default:
      decode_cpu_into<float>(m, out);
  }
  return out;
}

at::Tensor fp8_decode_bands(const Fp8Matrix& m, at::ScalarType dtype, const at::Tensor& scratch) {
  const int64_t rows = m.codes.size(0), cols = m.codes.size(1);
  at::Tensor out = output(m, dtype, scratch);
  if (out.numel() == 0) return out;
  const at::Tensor& table = table_on(m.codes.device());
  // Each column's scale column, once: [cols] indices into a scale row.
  const at::Tensor col_block =
      at::arange(cols, m.codes.options().dtype(at::kLong)).div(m.block_cols, "floor");
  // About 20 bytes of temporaries a value (int32 indices, values, scales, product, rounding).
  const int64_t band = std::max<int64_t>(1, (int64_t{1} << 20) / cols);
  for (int64_t r = 0; r < rows; r += band) {
    const int64_t n = std::min(band, rows - r);
    at::Tensor idx = m.codes.narrow(0, r, n).to(at::kInt).reshape(-1);
    at::Tensor v = table.index_select(0, idx).view({n, cols});
    const at::Tensor row_block =
        at::arange(r, r + n, col_block.options()).div(m.block_rows, "floor");
    at::Tensor s = m.scales.index_select(0, row_block).index_select(1, col_block);  // [n, cols]
    v.mul_(s);  // float32, as the CPU pass multiplies
    if (m.rounded != at::kFloat) v = v.to(m.rounded);
    out.narrow(0, r, n).copy_(v);
  }
  return out;
}

}  // namespace actcap
