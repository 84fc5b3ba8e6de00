#include "models/fp8_weights.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <vector>

#include "actcap/checkpoint.h"
#include "actcap/error.h"
#include "models/config_reader.h"
#include "util/strings.h"

namespace actcap {

namespace {

bool is_f8(const std::string& dtype_name) {
  return dtype_name == "F8_E4M3" || dtype_name == "F8_E5M2";
}

// The dtype a config.json dtype name decodes to.
at::ScalarType decoded_dtype(const Fp8Weights& fp8) {
  if (fp8.dtype == "bfloat16") return at::kBFloat16;
  if (fp8.dtype == "float16") return at::kHalf;
  return at::kFloat;
}

}  // namespace

std::optional<Fp8Weights> parse_quantization(const ConfigReader& f, const std::string& arch) {
  const json* q = f.find({"quantization_config"});
  if (!q) return std::nullopt;
  if (!q->is_object())
    throw InputError(
        concat(f.origin(), ": quantization_config must be an object, got ", q->dump()));
  const auto field = [&](const char* key) -> const json* {
    auto it = q->find(key);
    return it == q->end() || it->is_null() ? nullptr : &*it;
  };
  const json* method = field("quant_method");
  const std::string name = method && method->is_string() ? method->get<std::string>() : "";
  if (name == "mxfp4" && arch == "gpt_oss") return std::nullopt;
  if (name != "fp8")
    throw InputError(concat(
        f.origin(), ": quantization_config \"quant_method\": ", method ? method->dump() : "absent",
        " is not supported: actcap decodes \"fp8\" (block-scaled F8_E4M3 weights) and gpt-oss's "
        "\"mxfp4\"; run a BF16 or F32 conversion of the checkpoint"));
  Fp8Weights fp8;
  if (const json* fmt = field("fmt"); fmt && *fmt != "e4m3")
    throw InputError(concat(f.origin(), ": quantization_config \"fmt\": ", fmt->dump(),
                            " is not supported; \"fp8\" weights are e4m3"));
  if (const json* scheme = field("activation_scheme"); scheme && *scheme != "dynamic")
    throw InputError(concat(f.origin(),
                            ": quantization_config \"activation_scheme\": ", scheme->dump(),
                            " is not supported (transformers' fp8 method takes \"dynamic\" only)"));
  auto block = q->find("weight_block_size");
  if (block != q->end() && block->is_null()) {
    fp8.block_rows = fp8.block_cols = 0;
  } else if (block != q->end()) {
    const auto positive = [](const json& v) {
      return v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (int64_t{1} << 31);
    };
    if (!block->is_array() || block->size() != 2 || !positive((*block)[0]) ||
        !positive((*block)[1]))
      throw InputError(concat(f.origin(), ": quantization_config \"weight_block_size\": ",
                              block->dump(), " must be two positive integers (rows, columns)"));
    fp8.block_rows = (*block)[0].get<int64_t>();
    fp8.block_cols = (*block)[1].get<int64_t>();
  }
  if (const json* dtype = f.find({"dtype", "torch_dtype"})) {
    if (!dtype->is_string() || (*dtype != "bfloat16" && *dtype != "float16" && *dtype != "float32"))
      throw InputError(concat(f.origin(), ": dtype ", dtype->dump(),
                              " is not one FP8 weights decode to (bfloat16, float16, float32)"));
    fp8.dtype = dtype->get<std::string>();
  }
  return fp8;
}

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

at::Tensor decode_block_fp8(const at::Tensor& codes, const at::Tensor& scales, int64_t block_rows,
                            int64_t block_cols) {
  const at::Tensor q = codes.contiguous();
  const at::Tensor s = scales.to(at::kFloat).contiguous();
  const int64_t rows = q.size(0), cols = q.size(1);
  at::Tensor out = at::empty({rows, cols}, at::kFloat);
  if (rows == 0 || cols == 0) return out;
  if (block_rows == 0) block_rows = rows, block_cols = cols;  // one block: one scale
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  const uint8_t* in = q.data_ptr<uint8_t>();
  const float* scale = s.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float* value = e4m3_values();
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 16) / cols),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       const float* row_scale = scale + i / block_rows * scale_cols;
                       const uint8_t* qi = in + i * cols;
                       float* oi = o + i * cols;
                       for (int64_t j0 = 0; j0 < cols; j0 += block_cols) {
                         const int64_t j1 = std::min(cols, j0 + block_cols);
                         const float f = row_scale[j0 / block_cols];
                         for (int64_t j = j0; j < j1; ++j) oi[j] = value[qi[j]] * f;
                       }
                     }
                   });
  return out;
}

uint64_t fp8_decoded_bytes(const Fp8Weights& fp8, const Checkpoint& ckpt, bool widened) {
  const size_t size = c10::elementSize(decoded_dtype(fp8));
  const size_t per_value = size + (widened && size == 2 ? sizeof(float) : 0);
  uint64_t bytes = 0;
  for (const std::string& name : ckpt.names())
    if (is_f8(ckpt.info(name).dtype_name))
      bytes += static_cast<uint64_t>(ckpt.info(name).numel()) * per_value;
  return bytes;
}

void decode_fp8_weights(const std::optional<Fp8Weights>& fp8, const Checkpoint& ckpt,
                        std::map<std::string, at::Tensor>& tensors) {
  std::vector<std::string> f8;
  for (const auto& [name, t] : tensors)
    if (is_f8(ckpt.info(name).dtype_name)) f8.push_back(name);
  const std::string& origin = ckpt.dir();
  if (!fp8) {
    if (f8.empty()) return;
    throw InputError(concat(origin, ": tensor ", f8.front(), " is ",
                            ckpt.info(f8.front()).dtype_name, " but ", ckpt.config_path(),
                            " has no quantization_config with \"quant_method\": \"fp8\" to say "
                            "how its block scales apply; restore it, or run a BF16 or F32 "
                            "conversion of the checkpoint"));
  }
  if (f8.empty())
    throw InputError(concat(ckpt.config_path(),
                            ": quantization_config says \"fp8\" but no tensor of ", origin,
                            " is F8_E4M3; a converted copy of an FP8 checkpoint must leave "
                            "quantization_config out"));
  const at::ScalarType dtype = decoded_dtype(*fp8);
  for (const std::string& name : f8) {
    const TensorInfo& info = ckpt.info(name);
    if (info.dtype_name != "F8_E4M3")
      throw InputError(concat(origin, ": tensor ", name, " is ", info.dtype_name,
                              "; \"fp8\" checkpoints store F8_E4M3 (e4m3fn) weights"));
    const at::Tensor& t = tensors.at(name);
    if (t.dim() != 2)
      throw InputError(concat(origin, ": tensor ", name, " is F8_E4M3 of shape ", concat(t.sizes()),
                              "; FP8 weights must be matrices [out, in]"));
    const std::string scale_name = name + "_scale_inv";
    auto s = tensors.find(scale_name);
    if (s == tensors.end())
      throw InputError(concat(origin, ": tensor ", name, " is F8_E4M3 but its block scales ",
                              scale_name, " are missing"));
    const at::Tensor& scale = s->second;
    if (!at::isFloatingType(scale.scalar_type()) || scale.element_size() < 2)
      throw InputError(concat(origin, ": tensor ", scale_name, " has dtype ", scale.scalar_type(),
                              "; block scales must be F32, BF16 or F16"));
    const int64_t rows = t.size(0), cols = t.size(1);
    const bool whole = fp8->block_rows == 0;
    const std::vector<int64_t> want =
        whole ? std::vector<int64_t>{1, 1}
              : std::vector<int64_t>{(rows + fp8->block_rows - 1) / fp8->block_rows,
                                     (cols + fp8->block_cols - 1) / fp8->block_cols};
    if (whole ? scale.numel() != 1 : scale.sizes() != at::IntArrayRef(want))
      throw InputError(concat(
          origin, ": tensor ", scale_name, " has shape ", concat(scale.sizes()), " but ",
          whole ? std::string("weight_block_size null (one block)")
                : concat("weight_block_size [", fp8->block_rows, ", ", fp8->block_cols, "]"),
          " over ", name, "'s [", rows, ", ", cols, "] implies ", concat(at::IntArrayRef(want))));
    // The codes as bytes: LibTorch 2 reads F8_E4M3 as Float8_e4m3fn, earlier ones as uint8.
    const at::Tensor codes = t.scalar_type() == at::kByte ? t : t.view(at::kByte);
    at::Tensor w = decode_block_fp8(
        codes, scale.reshape(whole ? at::IntArrayRef{1, 1} : at::IntArrayRef(want)),
        fp8->block_rows, fp8->block_cols);
    tensors[name] = dtype == at::kFloat ? w : w.to(dtype);
    tensors.erase(s);
  }
}

}  // namespace actcap
