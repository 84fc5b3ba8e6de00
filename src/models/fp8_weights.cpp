#include "models/fp8_weights.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "actcap/checkpoint.h"
#include "actcap/error.h"
#include "models/config_reader.h"
#include "util/strings.h"

namespace actcap {

namespace {

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

bool is_f8(const std::string& dtype_name) {
  return dtype_name == "F8_E4M3" || dtype_name == "F8_E5M2";
}

Fp8Matrix fp8_matrix(const Fp8Weights& fp8, const std::string& name, const at::Tensor& codes,
                     const at::Tensor& scales, const std::string& origin) {
  if (codes.dim() != 2)
    throw InputError(concat(origin, ": tensor ", name, " is F8_E4M3 of shape ",
                            concat(codes.sizes()), "; FP8 weights must be matrices [out, in]"));
  const std::string scale_name = name + "_scale_inv";
  if (!at::isFloatingType(scales.scalar_type()) || scales.element_size() < 2)
    throw InputError(concat(origin, ": tensor ", scale_name, " has dtype ", scales.scalar_type(),
                            "; block scales must be F32, BF16 or F16"));
  const int64_t rows = codes.size(0), cols = codes.size(1);
  const bool whole = fp8.block_rows == 0;
  Fp8Matrix m;
  m.block_rows = whole ? std::max<int64_t>(rows, 1) : fp8.block_rows;
  m.block_cols = whole ? std::max<int64_t>(cols, 1) : fp8.block_cols;
  const std::vector<int64_t> want{(rows + m.block_rows - 1) / m.block_rows,
                                  (cols + m.block_cols - 1) / m.block_cols};
  if (whole ? scales.numel() != 1 : scales.sizes() != at::IntArrayRef(want))
    throw InputError(
        concat(origin, ": tensor ", scale_name, " has shape ", concat(scales.sizes()), " but ",
               whole ? std::string("weight_block_size null (one block)")
                     : concat("weight_block_size [", fp8.block_rows, ", ", fp8.block_cols, "]"),
               " over ", name, "'s [", rows, ", ", cols, "] implies ",
               concat(at::IntArrayRef(whole ? std::vector<int64_t>{1, 1} : want))));
  // The codes as bytes: LibTorch 2 reads F8_E4M3 as Float8_e4m3fn, earlier ones as uint8.
  m.codes = codes.scalar_type() == at::kByte ? codes : codes.view(at::kByte);
  m.scales = scales.to(at::kFloat).reshape({whole ? 1 : want[0], whole ? 1 : want[1]});
  m.rounded = decoded_dtype(fp8);
  return m;
}

void check_fp8_weights(const std::optional<Fp8Weights>& fp8, const Checkpoint& ckpt,
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
  for (const std::string& name : f8) {
    const TensorInfo& info = ckpt.info(name);
    if (info.dtype_name != "F8_E4M3")
      throw InputError(concat(origin, ": tensor ", name, " is ", info.dtype_name,
                              "; \"fp8\" checkpoints store F8_E4M3 (e4m3fn) weights"));
    at::Tensor& t = tensors.at(name);
    auto s = tensors.find(name + "_scale_inv");
    if (s == tensors.end())
      throw InputError(concat(origin, ": tensor ", name, " is F8_E4M3 but its block scales ",
                              name + "_scale_inv", " are missing"));
    t = fp8_matrix(*fp8, name, t, s->second, origin).codes;
  }
}

}  // namespace actcap
