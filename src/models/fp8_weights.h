// FP8 checkpoints: config.json's quantization_config "quant_method": "fp8" (transformers'
// fine-grained FP8, as DeepSeek-V3/R1, Kimi-K2 and the Qwen3 FP8 releases ship) or
// "compressed-tensors" with 8-bit float weights (llm-compressor's FP8 schemes). Each linear weight
// W [rows, cols] is stored as F8_E4M3 (e4m3fn) codes beside its scales (`<W>_scale_inv`, or
// `<W>_scale` for compressed-tensors), one per block (fp8: weight_block_size [block_rows,
// block_cols]; compressed-tensors: the matrix, an output channel, a group of inputs or a block;
// [ceil(rows / block_rows), ceil(cols / block_cols)]: a last, partial block has a scale of its
// own). W[i, j] = value(code[i, j]) * scale[i / block_rows, j / block_cols] (the "inverse" scale
// multiplies too), the product in float32 rounded once to the checkpoint's dtype, as transformers'
// Fp8Dequantize, DeepSeek's fp8_cast_bf16.py and compressed-tensors' decompression make them: the
// model then runs as on that BF16 conversion, its activations
// unquantized. With weights dtype keep (the default) linear layers and experts hold the codes and
// decode each matrix just before its GEMM (models/parts/fp8.h): one byte a value; with f32 every
// weight is decoded at load and widened. Other tensors (norms, embeddings, lm_head, the routers
// and modules left unquantized) are used as stored.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "actcap/config.h"
#include "models/parts/fp8.h"

namespace actcap {

class Checkpoint;
class ConfigReader;

// config.json's quantization_config: nullopt when there is none (or it is null), or for gpt-oss's
// "mxfp4", which models/arch/gpt_oss.cpp reads; the parameters of an "fp8" or an FP8
// "compressed-tensors" one. InputError naming the field for a malformed one, for one actcap cannot
// decode (another fmt, static activation scales for "fp8"; another format, weights that are not
// symmetric static 8-bit floats, another strategy for compressed-tensors) and for any other method.
std::optional<Fp8Weights> parse_quantization(const ConfigReader& f, const std::string& arch);

// Weight `name`'s FP8 matrix from its codes (one byte each: uint8, or Float8_e4m3fn on LibTorch 2)
// and `<name>_scale_inv` (`scales`, F32, BF16 or F16), the scales widened to float32 and shaped
// [ceil(rows / block_rows), ceil(cols / block_cols)] (weight_block_size null: one block, [1, 1]).
// InputError naming the tensor and `origin`: codes that are not a matrix, scales not floating
// point or of another shape than the blocks imply.
Fp8Matrix fp8_matrix(const Fp8Weights& fp8, const std::string& name, const at::Tensor& codes,
                     const at::Tensor& scales, const std::string& origin);

// Checks every F8 tensor of `tensors` (read from `ckpt`, which gives their dtype names) before the
// build, and holds its codes as uint8 (what the weight source then decodes, at load or as the
// model runs). InputError naming the tensor and the checkpoint: an F8 tensor without an fp8
// quantization_config, an fp8 one without any F8_E4M3 tensor, an F8_E5M2 tensor, one that is not
// a matrix, scales missing, not floating point or of another shape than the blocks imply.
void check_fp8_weights(const std::optional<Fp8Weights>& fp8, const Checkpoint& ckpt,
                       std::map<std::string, at::Tensor>& tensors);

// Whether a safetensors dtype name is an 8-bit float (F8_E4M3, F8_E5M2).
bool is_f8(const std::string& dtype_name);

}  // namespace actcap
