// FP8 weights kept packed (transformers' fine-grained "fp8" checkpoints: DeepSeek-V3/R1, Kimi-K2,
// the Qwen3 FP8 releases; how a checkpoint names them: models/fp8_weights.h). A matrix W [rows,
// cols] is held as its F8_E4M3 (e4m3fn) codes, one byte a value, and one float32 scale per block
// of [block_rows, block_cols] (a last, partial block has a scale of its own), and decoded just
// before its GEMM: W[i, j] = value(code[i, j]) * scale[i / block_rows, j / block_cols], the
// product in float32 rounded once to the checkpoint's dtype (`rounded`), as transformers'
// Fp8Dequantize and DeepSeek's fp8_cast_bf16.py make the weights. The decoded matrix is then
// exactly the BF16 conversion's, at half its memory between uses.
#pragma once

#include <ATen/ATen.h>

namespace actcap {

struct Fp8Matrix {
  at::Tensor codes;   // uint8 [rows, cols]
  at::Tensor scales;  // float32 [ceil(rows / block_rows), ceil(cols / block_cols)]
  int64_t block_rows = 0, block_cols = 0;
  at::ScalarType rounded = at::kFloat;  // bfloat16, float16 or float32
  bool defined() const { return codes.defined(); }
};

// A linear layer's weight [out, in]: a floating tensor (`dense`), or FP8 codes decoded as it runs.
struct LinearWeight {
  LinearWeight(at::Tensor weight = {}) : dense(std::move(weight)) {}  // NOLINT: implicit
  LinearWeight(Fp8Matrix packed) : fp8(std::move(packed)) {}          // NOLINT: implicit
  at::Tensor dense;
  Fp8Matrix fp8;
  int64_t size(int64_t dim) const { return fp8.defined() ? fp8.codes.size(dim) : dense.size(dim); }
};

// The values of the 256 e4m3fn codes (sign, 4 exponent bits of bias 7, 3 mantissa bits; no
// infinities; S.1111.111 is NaN).
const float* e4m3_values();

// The matrix [rows, cols] in `dtype` (float32, bfloat16 or float16), on the codes' device,
// row-major: in `scratch` (that dtype, at least rows * cols elements: ForwardState::widen_scratch)
// when given, else fresh. On the CPU one pass over the codes; elsewhere fp8_decode_bands.
at::Tensor fp8_decode(const Fp8Matrix& m, at::ScalarType dtype, const at::Tensor& scratch = {});
// The same values from ATen operations only (a table lookup, the scales expanded, a multiply and
// the roundings), a band of rows at a time so the temporaries stay near 24 MB: what accelerators
// run, tested against the CPU pass on the CPU.
at::Tensor fp8_decode_bands(const Fp8Matrix& m, at::ScalarType dtype,
                            const at::Tensor& scratch = {});

}  // namespace actcap
