// FP8 checkpoints: config.json's quantization_config "quant_method": "fp8" (transformers'
// fine-grained FP8, as DeepSeek-V3/R1, Kimi-K2 and the Qwen3 FP8 releases ship). Each linear
// weight W [rows, cols] is stored as F8_E4M3 (e4m3fn) codes beside `<W>_scale_inv`, one scale per
// block of weight_block_size [block_rows, block_cols] ([ceil(rows / block_rows), ceil(cols /
// block_cols)]: a last, partial block has a scale of its own). Despite its name the scale
// multiplies: W[i, j] = value(code[i, j]) * scale[i / block_rows, j / block_cols]. They are decoded
// at load, the product in float32 rounded once to the checkpoint's dtype, as transformers'
// Fp8Dequantize and DeepSeek's fp8_cast_bf16.py make them: the model then runs as on that BF16
// conversion, its activations unquantized. Other tensors (norms, embeddings, lm_head, the modules
// left unquantized) are used as stored.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "actcap/config.h"

namespace actcap {

class Checkpoint;
class ConfigReader;

// config.json's quantization_config: nullopt when there is none (or it is null), or for gpt-oss's
// "mxfp4", which models/arch/gpt_oss.cpp reads; the parameters of an "fp8" one. InputError naming
// the field for a malformed one, for an "fp8" one actcap cannot decode (another fmt, static
// activation scales) and for any other method.
std::optional<Fp8Weights> parse_quantization(const ConfigReader& f, const std::string& arch);

// The values of the 256 e4m3fn codes (sign, 4 exponent bits of bias 7, 3 mantissa bits; no
// infinities; S.1111.111 is NaN).
const float* e4m3_values();

// `codes` [rows, cols] (one byte each) times `scales` [ceil(rows / block_rows), ceil(cols /
// block_cols)] (block_rows = block_cols = 0: one scale for the whole matrix), in float32.
at::Tensor decode_block_fp8(const at::Tensor& codes, const at::Tensor& scales, int64_t block_rows,
                            int64_t block_cols);

// The memory the decoded weights take: each F8 tensor of `ckpt` at its decoded dtype's size, plus
// float32's when `widened` (weights dtype f32) and that dtype is 16-bit.
uint64_t fp8_decoded_bytes(const Fp8Weights& fp8, const Checkpoint& ckpt, bool widened);

// Replaces each F8_E4M3 tensor of `tensors` (read from `ckpt`, which gives their dtype names) by
// its decoded weights, and drops its scales. InputError naming the tensor and the checkpoint: an
// F8 tensor without an fp8 quantization_config, an fp8 one without any F8_E4M3 tensor, an
// F8_E5M2 tensor, one that is not a matrix, scales missing, not floating point or of another shape
// than the blocks imply.
void decode_fp8_weights(const std::optional<Fp8Weights>& fp8, const Checkpoint& ckpt,
                        std::map<std::string, at::Tensor>& tensors);

}  // namespace actcap
