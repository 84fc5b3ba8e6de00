// config.json -> ModelConfig: the JSON is read here, the fields by the architecture the
// model_type names (models/arch/).
#include "actcap/config.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "actcap/error.h"
#include "io/text_file.h"
#include "models/arch/architecture.h"
#include "models/config_reader.h"
#include "models/fp8_weights.h"
#include "util/strings.h"

namespace actcap {

ModelConfig::ModelConfig(const ModelConfig& o)
    : arch(o.arch),
      model_type(o.model_type),
      vocab_size(o.vocab_size),
      hidden_size(o.hidden_size),
      num_hidden_layers(o.num_hidden_layers),
      num_attention_heads(o.num_attention_heads),
      max_position_embeddings(o.max_position_embeddings),
      tie_word_embeddings(o.tie_word_embeddings),
      bos_token_id(o.bos_token_id),
      eos_token_id(o.eos_token_id),
      fp8(o.fp8),
      arch_params(o.arch_params ? o.arch_params->clone() : nullptr) {}

ModelConfig& ModelConfig::operator=(const ModelConfig& o) {
  if (this != &o) *this = ModelConfig(o);
  return *this;
}

void ModelConfig::wrong_params() const {
  throw std::logic_error(concat("ModelConfig of architecture '", arch,
                                "': its parameters are not of the type asked for"));
}

ModelConfig parse_config(const std::string& text, const std::string& origin) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
    throw InputError(concat(origin, ": not valid JSON (", e.what(), ")"));
  }
  if (!root.is_object()) throw InputError(concat(origin, ": expected a JSON object"));
  ConfigReader f(root, origin);
  const json* mt = f.find({"model_type"});
  if (!mt)
    throw InputError(concat(origin, ": missing required field 'model_type' (supported: ",
                            join(supported_model_types(), ", "), ")"));
  if (!mt->is_string()) throw InputError(concat(origin, ": field 'model_type' must be a string"));
  ModelConfig c;
  c.model_type = mt->get<std::string>();
  const Architecture& arch = architecture_for(c.model_type, origin.c_str());
  c.arch = arch.name();
  c.fp8 = parse_quantization(f, c.arch);
  arch.parse(f, c);
  return c;
}

ModelConfig load_config(const std::string& path) {
  return parse_config(read_text_file(path, kMaxConfigBytes, "config.json"), path);
}

std::string config_to_json(const ModelConfig& c) {
  const Architecture& arch = architecture_of(c);
  json j;
  j["model_type"] = c.model_type;
  j["architectures"] = {arch.class_names().front()};
  arch.write(c, j);
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

}  // namespace actcap
