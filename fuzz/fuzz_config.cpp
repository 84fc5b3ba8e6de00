// parse_config on arbitrary text. When it is accepted: the derived sizes are computable,
// config_to_json never throws, and its output parses again (round trip) to the same config.
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "actcap/config.h"
#include "fuzz_common.h"
#include "models/arch/llama_family.h"

namespace {

void check_same(const actcap::ModelConfig& a, const actcap::ModelConfig& b,
                const std::string& json) {
  const char* j = json.c_str();
  FUZZ_CHECK(a.arch == b.arch && a.model_type == b.model_type, "arch differs\n%s", j);
  FUZZ_CHECK(a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
                 a.num_layers() == b.num_layers() && a.max_positions() == b.max_positions() &&
                 a.tie_word_embeddings == b.tie_word_embeddings,
             "sizes differ after the round trip\n%s", j);
  // Every field config_to_json writes (each architecture's own included) survives the trip.
  FUZZ_CHECK(actcap::config_to_json(a) == actcap::config_to_json(b),
             "fields differ after the round trip\n%s", j);
  const auto* x = dynamic_cast<const actcap::LlamaParams*>(a.arch_params.get());
  const auto* y = dynamic_cast<const actcap::LlamaParams*>(b.arch_params.get());
  FUZZ_CHECK(!x == !y, "parameter types differ after the round trip\n%s", j);
  if (x)
    for (int64_t layer : {int64_t{0}, int64_t{1}, a.num_hidden_layers - 1})
      FUZZ_CHECK(x->window_for_layer(layer) == y->window_for_layer(layer),
                 "window_for_layer(%lld) differs\n%s", static_cast<long long>(layer), j);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  actcap::ModelConfig c;
  if (!fuzz::clean([&] { c = actcap::parse_config(text, "config.json"); })) return 0;

  // The sizes the model builder derives from an accepted config.
  FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers() > 0 && c.max_positions() > 0,
             "accepted a non-positive size");
  FUZZ_CHECK(c.num_attention_heads > 0, "accepted %lld heads",
             static_cast<long long>(c.num_attention_heads));
  if (const auto* p = dynamic_cast<const actcap::LlamaParams*>(c.arch_params.get())) {
    FUZZ_CHECK(p->head_dim > 0 && p->head_dim % 2 == 0 &&
                   c.num_attention_heads % p->num_key_value_heads == 0,
               "llama head_dim %lld", static_cast<long long>(p->head_dim));
    for (int64_t layer = 0; layer < c.num_hidden_layers && layer < 4; ++layer)
      (void)p->window_for_layer(layer);
  } else {
    FUZZ_CHECK(c.hidden_size % c.num_attention_heads == 0, "gpt2 heads do not divide the width");
  }

  // Serialising an accepted config must not fail, and must parse back to the same config.
  const std::string json = actcap::config_to_json(c);
  actcap::ModelConfig again;
  std::string why;
  try {
    again = actcap::parse_config(json, "roundtrip.json");
  } catch (const actcap::Error& e) {
    why = e.what();
  }
  FUZZ_CHECK(why.empty(), "config_to_json output does not parse again: %s\ninput:\n%s\noutput:\n%s",
             why.c_str(), fuzz::escape(text, 2000).c_str(), json.c_str());
  check_same(c, again, json);
  // And the serialisation is a fixed point.
  FUZZ_CHECK(actcap::config_to_json(again) == json, "second serialisation differs\n%s",
             json.c_str());
  return 0;
}
