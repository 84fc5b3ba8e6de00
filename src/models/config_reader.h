// Reading config.json: typed fields with HF's aliases and errors that name the field and file.
// Each architecture's parser (models/arch/) reads its fields through one of these.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "actcap/error.h"

namespace actcap {

using nlohmann::json;

// Reads fields of one config object with HF's aliases and typed errors naming the field.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  const json* find(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      auto it = j_.find(n);
      if (it != j_.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  int64_t integer(std::initializer_list<const char*> names, std::optional<int64_t> dflt) const {
    const json* v = find(names);
    if (!v) {
      if (dflt) return *dflt;
      throw InputError(concat(origin_, ": missing required field '", *names.begin(), "'"));
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_float()) {  // 768.0 is accepted; the range check comes before the cast (no UB)
      const double d = v->get<double>();
      if (std::isfinite(d) && d >= -9.0e18 && d <= 9.0e18 && d == std::floor(d))
        return static_cast<int64_t>(d);
    }
    throw InputError(
        concat(origin_, ": field '", *names.begin(), "' must be an integer, got ", v->dump()));
  }

  // Sizes: positive and below 2^31, so products of a few of them (4 * n_embd, heads * head_dim,
  // vocab * hidden) cannot overflow.
  int64_t positive(std::initializer_list<const char*> names, std::optional<int64_t> dflt) const {
    int64_t v = integer(names, dflt);
    if (v <= 0 || v >= (int64_t{1} << 31))
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be between 1 and 2^31-1, got ", v));
    return v;
  }

  double number(std::initializer_list<const char*> names, double dflt) const {
    const json* v = find(names);
    if (!v) return dflt;
    if (!v->is_number())
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be a number, got ", v->dump()));
    return v->get<double>();
  }

  bool boolean(std::initializer_list<const char*> names, bool dflt) const {
    const json* v = find(names);
    if (!v) return dflt;
    if (!v->is_boolean())
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be true or false, got ", v->dump()));
    return v->get<bool>();
  }

  std::string string(std::initializer_list<const char*> names, const std::string& dflt) const {
    const json* v = find(names);
    if (!v) return dflt;
    if (!v->is_string())
      throw InputError(
          concat(origin_, ": field '", *names.begin(), "' must be a string, got ", v->dump()));
    return v->get<std::string>();
  }

  // Token ids may be an integer or a list (Llama 3 lists several eos ids); we keep the first.
  int64_t token_id(const char* name, int64_t dflt) const {
    const json* v = find({name});
    if (!v) return dflt;
    if (v->is_array() && !v->empty() && (*v)[0].is_number_integer()) return (*v)[0].get<int64_t>();
    if (v->is_number_integer()) return v->get<int64_t>();
    throw InputError(
        concat(origin_, ": field '", name, "' must be an integer or a list of integers"));
  }

  // The name to read a field under that an attribute_map alias may also name: transformers sets
  // the alias last, so it wins where config.json has both; errors name the field otherwise.
  const char* aliased(const char* field, const char* alias) const {
    return has(alias) ? alias : field;
  }

  const std::string& origin() const { return origin_; }
  const json& root() const { return j_; }
  bool has(const char* name) const { return find({name}) != nullptr; }

 private:
  const json& j_;
  std::string origin_;
};

inline void check_activation(const std::string& act, const std::string& field,
                             const std::string& origin) {
  static const char* kSupported[] = {"gelu_new", "gelu", "gelu_pytorch_tanh", "gelu_fast", "relu",
                                     "silu",     "swish"};
  for (const char* s : kSupported)
    if (act == s) return;
  throw InputError(
      concat(origin, ": unsupported ", field, " '", act,
             "'; supported: gelu_new, gelu, gelu_pytorch_tanh, gelu_fast, relu, silu, swish"));
}

}  // namespace actcap
