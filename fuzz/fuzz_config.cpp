// parse_config on arbitrary text. When it is accepted: the derived sizes are computable,
// config_to_json never throws, and its output parses again (round trip) to the same config.
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "actcap/config.h"
#include "fuzz_common.h"

namespace {

bool same_double(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

void check_same(const actcap::ModelConfig& a, const actcap::ModelConfig& b,
                const std::string& json) {
  const char* j = json.c_str();
  FUZZ_CHECK(a.arch == b.arch && a.model_type == b.model_type, "arch differs\n%s", j);
  FUZZ_CHECK(a.vocab_size() == b.vocab_size() && a.hidden_size() == b.hidden_size() &&
                 a.num_layers() == b.num_layers() && a.max_positions() == b.max_positions() &&
                 a.tie_word_embeddings() == b.tie_word_embeddings(),
             "sizes differ after the round trip\n%s", j);
  if (a.arch == actcap::Arch::kGpt2) {
    const auto &x = a.gpt2, &y = b.gpt2;
    FUZZ_CHECK(x.n_head == y.n_head && x.n_inner == y.n_inner &&
                   x.activation_function == y.activation_function &&
                   same_double(x.layer_norm_epsilon, y.layer_norm_epsilon) &&
                   x.scale_attn_weights == y.scale_attn_weights &&
                   x.scale_attn_by_inverse_layer_idx == y.scale_attn_by_inverse_layer_idx &&
                   x.reorder_and_upcast_attn == y.reorder_and_upcast_attn &&
                   x.bos_token_id == y.bos_token_id && x.eos_token_id == y.eos_token_id,
               "gpt2 fields differ after the round trip\n%s", j);
  } else {
    const auto &x = a.llama, &y = b.llama;
    FUZZ_CHECK(x.intermediate_size == y.intermediate_size &&
                   x.num_attention_heads == y.num_attention_heads &&
                   x.num_key_value_heads == y.num_key_value_heads && x.head_dim == y.head_dim &&
                   x.hidden_act == y.hidden_act && same_double(x.rms_norm_eps, y.rms_norm_eps),
               "llama fields differ after the round trip\n%s", j);
    const auto &r = x.rope, &q = y.rope;
    FUZZ_CHECK(r.rope_type == q.rope_type && same_double(r.rope_theta, q.rope_theta) &&
                   same_double(r.factor, q.factor) &&
                   same_double(r.low_freq_factor, q.low_freq_factor) &&
                   same_double(r.high_freq_factor, q.high_freq_factor) &&
                   r.original_max_position_embeddings == q.original_max_position_embeddings,
               "rope differs after the round trip\n%s", j);
    FUZZ_CHECK(r.attention_factor == q.attention_factor && same_double(r.beta_fast, q.beta_fast) &&
                   same_double(r.beta_slow, q.beta_slow) && r.mscale == q.mscale &&
                   r.mscale_all_dim == q.mscale_all_dim && r.truncate == q.truncate &&
                   r.short_factor == q.short_factor && r.long_factor == q.long_factor,
               "yarn/longrope fields differ after the round trip\n%s", j);
    FUZZ_CHECK(x.attention_bias == y.attention_bias && x.qkv_bias == y.qkv_bias &&
                   x.o_bias == y.o_bias && x.mlp_bias == y.mlp_bias &&
                   x.sliding_window == y.sliding_window &&
                   x.use_sliding_window == y.use_sliding_window &&
                   x.max_window_layers == y.max_window_layers && x.bos_token_id == y.bos_token_id &&
                   x.eos_token_id == y.eos_token_id,
               "llama flags/window/token ids differ after the round trip\n%s", j);
    for (int64_t layer : {int64_t{0}, int64_t{1}, x.num_hidden_layers - 1})
      FUZZ_CHECK(x.window_for_layer(layer) == y.window_for_layer(layer),
                 "window_for_layer(%lld) differs\n%s", static_cast<long long>(layer), j);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  actcap::ModelConfig c;
  if (!fuzz::clean([&] { c = actcap::parse_config(text, "config.json"); })) return 0;

  // The sizes the model builder derives from an accepted config.
  FUZZ_CHECK(
      c.vocab_size() > 0 && c.hidden_size() > 0 && c.num_layers() > 0 && c.max_positions() > 0,
      "accepted a non-positive size");
  if (c.arch == actcap::Arch::kGpt2) {
    FUZZ_CHECK(c.gpt2.inner() > 0 && c.gpt2.head_dim() > 0, "gpt2 inner %lld head_dim %lld",
               static_cast<long long>(c.gpt2.inner()), static_cast<long long>(c.gpt2.head_dim()));
  } else {
    FUZZ_CHECK(c.llama.head_dim > 0 && c.llama.head_dim % 2 == 0 &&
                   c.llama.num_attention_heads % c.llama.num_key_value_heads == 0,
               "llama head_dim %lld", static_cast<long long>(c.llama.head_dim));
    for (int64_t layer = 0; layer < c.llama.num_hidden_layers && layer < 4; ++layer)
      (void)c.llama.window_for_layer(layer);
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
