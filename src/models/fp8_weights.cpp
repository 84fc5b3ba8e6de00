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

// How `fp8`'s blocks are named in its config, for errors.
std::string blocks_named(const Fp8Weights& fp8) {
  const int64_t r = fp8.block_rows, c = fp8.block_cols;
  if (fp8.method == "fp8")
    return r == 0 ? std::string("weight_block_size null (one block)")
                  : concat("weight_block_size [", r, ", ", c, "]");
  if (r == 0) return "strategy tensor";
  if (c == 0) return "strategy channel";
  return r == 1 ? concat("strategy group of ", c) : concat("block_structure [", r, ", ", c, "]");
}

bool positive_int(const json& v) {
  return v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (int64_t{1} << 31);
}

// transformers' "fp8": fmt e4m3, dynamic activations, weight_block_size (default 128 x 128).
void parse_fp8_method(const ConfigReader& f, const json& q, Fp8Weights& fp8) {
  const auto field = [&](const char* key) -> const json* {
    auto it = q.find(key);
    return it == q.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* fmt = field("fmt"); fmt && *fmt != "e4m3")
    throw InputError(concat(f.origin(), ": quantization_config \"fmt\": ", fmt->dump(),
                            " is not supported; \"fp8\" weights are e4m3"));
  if (const json* scheme = field("activation_scheme"); scheme && *scheme != "dynamic")
    throw InputError(concat(f.origin(),
                            ": quantization_config \"activation_scheme\": ", scheme->dump(),
                            " is not supported (transformers' fp8 method takes \"dynamic\" only)"));
  auto block = q.find("weight_block_size");
  if (block != q.end() && block->is_null()) {
    fp8.block_rows = fp8.block_cols = 0;
  } else if (block != q.end()) {
    if (!block->is_array() || block->size() != 2 || !positive_int((*block)[0]) ||
        !positive_int((*block)[1]))
      throw InputError(concat(f.origin(), ": quantization_config \"weight_block_size\": ",
                              block->dump(), " must be two positive integers (rows, columns)"));
    fp8.block_rows = (*block)[0].get<int64_t>();
    fp8.block_cols = (*block)[1].get<int64_t>();
  }
}

// compressed-tensors (llm-compressor's FP8 schemes): format float-quantized (or naive-quantized),
// every config group's "weights" 8-bit symmetric static floats of one strategy: tensor, channel,
// group (group_size) or block (block_structure). Activation schemes are left (activations are not
// quantized); sparsity and transforms are refused.
void parse_compressed_tensors(const ConfigReader& f, const json& q, Fp8Weights& fp8) {
  const std::string where = concat(f.origin(), ": quantization_config (compressed-tensors) ");
  const auto null_or_absent = [](const json& o, const char* key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null();
  };
  const auto text = [](const json& o, const char* key) {
    auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string format = text(q, "format");
  if (format != "float-quantized" && format != "naive-quantized")
    throw InputError(concat(
        where, "\"format\": ", q.contains("format") ? q["format"].dump() : std::string("absent"),
        " is not supported; actcap decodes 8-bit float weights "
        "(\"float-quantized\"); run a BF16 or F32 conversion of the checkpoint"));
  for (const char* key : {"sparsity_config", "transform_config"})
    if (!null_or_absent(q, key))
      throw InputError(concat(where, "has a \"", key, "\", which actcap does not decode"));
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty())
    throw InputError(concat(where, "needs \"config_groups\", an object of quantization schemes"));
  std::optional<std::pair<int64_t, int64_t>> block;
  for (const auto& [group, scheme] : groups->items()) {
    const std::string at = concat(where, "config_groups.", group);
    auto w = scheme.is_object() ? scheme.find("weights") : scheme.end();
    if (w == scheme.end() || !w->is_object())
      throw InputError(concat(at, " has no \"weights\" scheme; actcap decodes quantized weights"));
    const auto field_is = [&](const char* key, const json& want, bool absent_ok) {
      auto it = w->find(key);
      if (it == w->end() || it->is_null()) return absent_ok;
      return *it == want;
    };
    if (!field_is("num_bits", 8, false) || !field_is("type", "float", false))
      throw InputError(concat(at, ".weights: ", w->dump(),
                              " is not an 8-bit float scheme (\"num_bits\": 8, \"type\": "
                              "\"float\"), the one actcap decodes"));
    if (!field_is("symmetric", true, true) || !field_is("dynamic", false, true) ||
        !null_or_absent(*w, "actorder"))
      throw InputError(concat(at,
                              ".weights: asymmetric, dynamic or reordered weights are not "
                              "supported (\"symmetric\": true, \"dynamic\": false)"));
    const std::string strategy = text(*w, "strategy");
    std::pair<int64_t, int64_t> b;
    if (strategy == "tensor") {
      b = {0, 0};
    } else if (strategy == "channel") {
      b = {1, 0};
    } else if (strategy == "group") {
      auto g = w->find("group_size");
      if (g == w->end() || !positive_int(*g))
        throw InputError(concat(at, ".weights.group_size must be a positive integer"));
      b = {1, g->get<int64_t>()};
    } else if (strategy == "block") {
      auto s = w->find("block_structure");
      if (s == w->end() || !s->is_array() || s->size() != 2 || !positive_int((*s)[0]) ||
          !positive_int((*s)[1]))
        throw InputError(concat(at,
                                ".weights.block_structure must be two positive integers "
                                "(rows, columns)"));
      b = {(*s)[0].get<int64_t>(), (*s)[1].get<int64_t>()};
    } else {
      throw InputError(concat(at, ".weights.strategy \"", strategy,
                              "\" is not supported (tensor, channel, group, block)"));
    }
    if (block && *block != b)
      throw InputError(concat(where,
                              "has config groups of different weight strategies; actcap "
                              "decodes one scheme per checkpoint"));
    block = b;
  }
  fp8.method = "compressed-tensors";
  fp8.scale_suffix = "_scale";
  fp8.block_rows = block->first;
  fp8.block_cols = block->second;
}

}  // namespace

std::optional<Fp8Weights> parse_quantization(const ConfigReader& f, const std::string& arch) {
  const json* q = f.find({"quantization_config"});
  if (!q) return std::nullopt;
  if (!q->is_object())
    throw InputError(
        concat(f.origin(), ": quantization_config must be an object, got ", q->dump()));
  auto method = q->find("quant_method");
  const std::string name =
      method != q->end() && method->is_string() ? method->get<std::string>() : "";
  if (name == "mxfp4" && arch == "gpt_oss") return std::nullopt;
  Fp8Weights fp8;
  if (name == "fp8")
    parse_fp8_method(f, *q, fp8);
  else if (name == "compressed-tensors")
    parse_compressed_tensors(f, *q, fp8);
  else
    throw InputError(
        concat(f.origin(), ": quantization_config \"quant_method\": ",
               method != q->end() && !method->is_null() ? method->dump() : "absent",
               " is not supported: actcap decodes \"fp8\" and \"compressed-tensors\" 8-bit float "
               "weights and gpt-oss's \"mxfp4\"; run a BF16 or F32 conversion of the checkpoint"));
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
  const std::string scale_name = name + fp8.scale_suffix;
  if (!at::isFloatingType(scales.scalar_type()) || scales.element_size() < 2)
    throw InputError(concat(origin, ": tensor ", scale_name, " has dtype ", scales.scalar_type(),
                            "; block scales must be F32, BF16 or F16"));
  const int64_t rows = codes.size(0), cols = codes.size(1);
  Fp8Matrix m;
  m.block_rows = fp8.block_rows > 0 ? fp8.block_rows : std::max<int64_t>(rows, 1);
  m.block_cols = fp8.block_cols > 0 ? fp8.block_cols : std::max<int64_t>(cols, 1);
  const std::vector<int64_t> want{(rows + m.block_rows - 1) / m.block_rows,
                                  (cols + m.block_cols - 1) / m.block_cols};
  // One scale per matrix may be stored as [], [1] or [1, 1]; per channel as [rows, 1] or [rows].
  const bool fits = scales.sizes() == at::IntArrayRef(want) ||
                    (scales.dim() <= 1 && want[1] == 1 && scales.numel() == want[0]);
  if (!fits)
    throw InputError(concat(origin, ": tensor ", scale_name, " has shape ", concat(scales.sizes()),
                            " but ", blocks_named(fp8), " over ", name, "'s [", rows, ", ", cols,
                            "] implies ", concat(at::IntArrayRef(want))));
  // The codes as bytes: LibTorch 2 reads F8_E4M3 as Float8_e4m3fn, earlier ones as uint8.
  m.codes = codes.scalar_type() == at::kByte ? codes : codes.view(at::kByte);
  m.scales = scales.to(at::kFloat).reshape({want[0], want[1]});
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
    throw InputError(
        concat(origin, ": tensor ", f8.front(), " is ", ckpt.info(f8.front()).dtype_name, " but ",
               ckpt.config_path(),
               " has no quantization_config (\"fp8\" or \"compressed-tensors\") to say "
               "how its block scales apply; restore it, or run a BF16 or F32 "
               "conversion of the checkpoint"));
  }
  if (f8.empty())
    throw InputError(concat(ckpt.config_path(), ": quantization_config says \"", fp8->method,
                            "\" but no tensor of ", origin,
                            " is F8_E4M3; a converted copy of an FP8 checkpoint must leave "
                            "quantization_config out"));
  for (const std::string& name : f8) {
    const TensorInfo& info = ckpt.info(name);
    if (info.dtype_name != "F8_E4M3")
      throw InputError(concat(origin, ": tensor ", name, " is ", info.dtype_name,
                              "; \"fp8\" checkpoints store F8_E4M3 (e4m3fn) weights"));
    at::Tensor& t = tensors.at(name);
    auto s = tensors.find(name + fp8->scale_suffix);
    if (s == tensors.end())
      throw InputError(concat(origin, ": tensor ", name, " is F8_E4M3 but its block scales ",
                              name + fp8->scale_suffix, " are missing"));
    t = fp8_matrix(*fp8, name, t, s->second, origin).codes;
  }
}

}  // namespace actcap
