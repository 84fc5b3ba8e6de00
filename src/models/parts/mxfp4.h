// MXFP4 (the OCP microscaling format gpt-oss's checkpoints store their experts in): a matrix's
// rows in blocks of 32 values, each value a 4-bit e2m1 float (two per byte, the low nibble first)
// and each block one shared power-of-two scale, an e8m0 byte (exponent + 127). transformers names
// a quantized `W` [out, in] as `W_blocks` [..., out, in / 32, 16] and `W_scales` [..., out, in /
// 32] (integrations/mxfp4.py) and the checkpoint's quantization_config says "quant_method":
// "mxfp4".
//
// actcap keeps the packed bytes as the weight (a quarter of bf16's memory) and decodes one
// expert's matrix just before its GEMM. Every MXFP4 value is exactly representable in bfloat16
// and float32, so the decoded matrix equals transformers' (which decodes to bfloat16 at load), and
// it is laid out as transformers' is ([in, out] row-major), so the GEMM multiplies the same way.
#pragma once

#include <ATen/ATen.h>

namespace actcap {

struct Mxfp4Matrix {
  at::Tensor blocks;  // uint8 [out, in / 32, 16]
  at::Tensor scales;  // uint8 [out, in / 32]
  bool defined() const { return blocks.defined(); }
};

// The matrix [out, in] in `dtype` (float32, bfloat16 or float16), on the blocks' device, as the
// transposed view of a row-major [in, out] buffer (nn.Linear's weight over transformers' layout):
// `scratch` (that dtype, at least out * in elements: ForwardState::widen_scratch) when given, else
// fresh. Decoded a band of outputs at a time, so its own temporaries stay near 24 MB.
at::Tensor mxfp4_decode(const Mxfp4Matrix& m, at::ScalarType dtype, const at::Tensor& scratch = {});

}  // namespace actcap
