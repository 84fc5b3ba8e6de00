#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <tuple>

#include "actcap/config.h"
#include "actcap/error.h"
#include "models/arch/llama_family.h"
#include "models/arch/moe_family.h"

using namespace actcap;

namespace {
// The fields config_to_json writes: how tests read an architecture's own fields.
nlohmann::json fields(const ModelConfig& c) { return nlohmann::json::parse(config_to_json(c)); }

std::string error_of(const std::string& json) {
  try {
    parse_config(json, "cfg.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, Gpt2DefaultsAndAliases) {
  auto c =
      parse_config(R"({"model_type":"gpt2","vocab_size":100,"hidden_size":64,"num_hidden_layers":2,
                            "num_attention_heads":4})",
                   "cfg");
  EXPECT_EQ(c.arch, "gpt2");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_TRUE(fields(c)["n_inner"].is_null());  // 4 * n_embd
  EXPECT_EQ(c.max_position_embeddings, 1024);
  EXPECT_EQ(fields(c)["activation_function"], "gelu_new");
  EXPECT_DOUBLE_EQ(fields(c)["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(Config, LlamaDefaults) {
  auto c = parse_config(
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
                            "num_hidden_layers":2,"num_attention_heads":4})",
      "cfg");
  EXPECT_EQ(c.params<LlamaParams>().num_key_value_heads, 4);
  EXPECT_EQ(c.params<LlamaParams>().head_dim, 16);
  EXPECT_DOUBLE_EQ(c.params<LlamaParams>().rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.params<LlamaParams>().rope.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.params<LlamaParams>().qkv_bias);
  EXPECT_FALSE(c.params<LlamaParams>().window_for_layer(0).has_value());
}

TEST(Config, ExplicitHeadDimAndGqa) {
  auto c = parse_config(
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32})",
      "cfg");
  EXPECT_EQ(c.params<LlamaParams>().head_dim, 32);
  EXPECT_EQ(c.params<LlamaParams>().num_key_value_heads, 2);
}

TEST(Config, Llama3RopeScalingV4AndV5) {
  const char* v4 =
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"rope_theta":500000.0,
      "rope_scaling":{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
                      "original_max_position_embeddings":8192}})";
  const char* v5 =
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,
      "rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":32.0,"low_freq_factor":1.0,
                         "high_freq_factor":4.0,"original_max_position_embeddings":8192}})";
  for (const char* text : {v4, v5}) {
    auto c = parse_config(text, "cfg");
    EXPECT_EQ(c.params<LlamaParams>().rope.rope_type, "llama3");
    EXPECT_DOUBLE_EQ(c.params<LlamaParams>().rope.rope_theta, 500000.0);
    EXPECT_DOUBLE_EQ(c.params<LlamaParams>().rope.factor, 32.0);
    EXPECT_EQ(c.params<LlamaParams>().rope.original_max_position_embeddings, 8192);
  }
  // v4 "type" spelling
  auto c = parse_config(
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"rope_scaling":{"type":"linear","factor":2.0}})",
      "cfg");
  EXPECT_EQ(c.params<LlamaParams>().rope.rope_type, "linear");
}

namespace {

// A llama config with head_dim 16 and max_position_embeddings 64, plus `fields` at the top level.
std::string llama_with(const std::string& fields) {
  return R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"max_position_embeddings":64,)" +
         fields + "}";
}

void expect_same_rope(const RopeConfig& a, const RopeConfig& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.rope_type, b.rope_type);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.factor, b.factor);
  EXPECT_EQ(a.low_freq_factor, b.low_freq_factor);
  EXPECT_EQ(a.high_freq_factor, b.high_freq_factor);
  EXPECT_EQ(a.original_max_position_embeddings, b.original_max_position_embeddings);
  EXPECT_EQ(a.attention_factor, b.attention_factor);
  EXPECT_EQ(a.beta_fast, b.beta_fast);
  EXPECT_EQ(a.beta_slow, b.beta_slow);
  EXPECT_EQ(a.mscale, b.mscale);
  EXPECT_EQ(a.mscale_all_dim, b.mscale_all_dim);
  EXPECT_EQ(a.truncate, b.truncate);
  EXPECT_EQ(a.short_factor, b.short_factor);
  EXPECT_EQ(a.long_factor, b.long_factor);
}

const char* kShort = "[1.0,1.1,1.2,1.3,1.4,1.5,1.6,1.7]";
const char* kLong = "[2.0,2.5,3.0,3.5,4.0,4.5,5.0,5.5]";

}  // namespace

// Each new type in the transformers v4 layout (top-level rope_theta, rope_scaling with "type") and
// the v5 layout (rope_parameters holding rope_theta) parses to the same RopeConfig.
TEST(Config, DynamicYarnLongropeV4AndV5) {
  struct Case {
    std::string type, fields;
  };
  const std::string yarn_fields =
      R"("factor":4.0,"original_max_position_embeddings":16,"beta_fast":16,"beta_slow":2,
         "mscale":0.707,"mscale_all_dim":0.5,"truncate":false,"attention_factor":1.25)";
  const Case cases[] = {
      {"dynamic", R"("factor":2.0)"},
      {"yarn", yarn_fields},
      {"longrope", std::string(R"("original_max_position_embeddings":16,"short_factor":)") +
                       kShort + R"(,"long_factor":)" + kLong},
  };
  for (const Case& k : cases) {
    auto v4 = parse_config(llama_with(R"("rope_theta":500.0,"rope_scaling":{"type":")" + k.type +
                                      "\"," + k.fields + "}"),
                           "cfg.json");
    auto v5 = parse_config(llama_with(R"("rope_parameters":{"rope_type":")" + k.type +
                                      R"(","rope_theta":500.0,)" + k.fields + "}"),
                           "cfg.json");
    EXPECT_EQ(v4.params<LlamaParams>().rope.rope_type, k.type);
    EXPECT_EQ(v4.params<LlamaParams>().rope.rope_theta, 500.0);
    expect_same_rope(v4.params<LlamaParams>().rope, v5.params<LlamaParams>().rope, k.type);
  }
  auto dynamic = parse_config(llama_with(R"("rope_scaling":{"type":"dynamic","factor":2.0})"), "c");
  EXPECT_EQ(dynamic.params<LlamaParams>().rope.factor, 2.0);
  // Dynamic NTK is there to run past max_position_embeddings: factor times it.
  EXPECT_EQ(dynamic.max_positions(), 128);

  const RopeConfig y =
      parse_config(llama_with(R"("rope_scaling":{"type":"yarn",)" + yarn_fields + "}"), "c")
          .params<LlamaParams>()
          .rope;
  EXPECT_EQ(y.factor, 4.0);
  EXPECT_EQ(y.original_max_position_embeddings, 16);
  EXPECT_EQ(y.beta_fast, 16.0);
  EXPECT_EQ(y.beta_slow, 2.0);
  EXPECT_EQ(y.mscale, 0.707);
  EXPECT_EQ(y.mscale_all_dim, 0.5);
  EXPECT_FALSE(y.truncate);
  EXPECT_EQ(y.attention_factor, 1.25);

  const auto l = parse_config(llama_with(std::string(R"("rope_scaling":{"type":"longrope",
      "original_max_position_embeddings":16,"short_factor":)") +
                                         kShort + R"(,"long_factor":)" + kLong + "}"),
                              "c");
  EXPECT_EQ(l.params<LlamaParams>().rope.short_factor.size(), 8u);
  EXPECT_EQ(l.params<LlamaParams>().rope.long_factor[7], 5.5);
  EXPECT_EQ(l.params<LlamaParams>().rope.factor,
            4.0);  // no factor: max_position_embeddings / original
  EXPECT_FALSE(l.params<LlamaParams>().rope.attention_factor.has_value());
  EXPECT_EQ(l.max_positions(), 64);  // only dynamic widens the context
}

// A file with both layouts: a non-empty rope_scaling wins, as in transformers (v4 reads only
// rope_scaling, v5 takes `rope_scaling or rope_parameters`).
TEST(Config, RopeScalingWinsOverRopeParameters) {
  const auto both = parse_config(llama_with(R"("rope_scaling":{"type":"linear","factor":2},
                    "rope_parameters":{"rope_type":"dynamic","factor":3,"rope_theta":7.0})"),
                                 "c");
  EXPECT_EQ(both.params<LlamaParams>().rope.rope_type, "linear");
  EXPECT_EQ(both.params<LlamaParams>().rope.factor, 2.0);
  EXPECT_EQ(both.params<LlamaParams>().rope.rope_theta, 10000.0);
  const auto empty_scaling = parse_config(
      llama_with(R"("rope_scaling":{},"rope_parameters":{"rope_type":"dynamic","factor":3})"), "c");
  EXPECT_EQ(empty_scaling.params<LlamaParams>().rope.rope_type, "dynamic");
  EXPECT_EQ(empty_scaling.params<LlamaParams>().rope.factor, 3.0);
}

// HF's defaults when the file leaves fields out (modeling_rope_utils.py and
// standardize_rope_params): beta_fast 32, beta_slow 1, truncate, the original context from the
// top level (Phi-3's layout, preferred), else the rope dict, else max_position_embeddings.
TEST(Config, YarnDefaultsAndWhereTheOriginalContextComesFrom) {
  const RopeConfig y =
      parse_config(llama_with(R"("rope_scaling":{"rope_type":"yarn","factor":4})"), "c")
          .params<LlamaParams>()
          .rope;
  EXPECT_EQ(y.beta_fast, 32.0);
  EXPECT_EQ(y.beta_slow, 1.0);
  EXPECT_TRUE(y.truncate);
  EXPECT_EQ(y.original_max_position_embeddings, 64);
  EXPECT_FALSE(y.attention_factor || y.mscale || y.mscale_all_dim);

  const auto top =
      parse_config(llama_with(std::string(R"("original_max_position_embeddings":16,"rope_scaling":{
          "type":"longrope","original_max_position_embeddings":32,"short_factor":)") +
                              kShort + R"(,"long_factor":)" + kLong + "}"),
                   "c");
  EXPECT_EQ(top.params<LlamaParams>().rope.original_max_position_embeddings, 16);
  EXPECT_EQ(top.params<LlamaParams>().rope.factor, 4.0);
  const auto dict = parse_config(
      llama_with(
          R"("rope_scaling":{"type":"yarn","factor":2,"original_max_position_embeddings":32})"),
      "c");
  EXPECT_EQ(dict.params<LlamaParams>().rope.original_max_position_embeddings, 32);
  EXPECT_EQ(dict.params<LlamaParams>().rope.factor, 2.0);  // an explicit factor is kept
}

// config_to_json writes every resolved rope field, so parse(config_to_json(c)) == c, and GPT-2's
// attention options survive too.
TEST(Config, RopeTypesAndGpt2OptionsRoundTrip) {
  const std::string ropes[] = {
      R"("rope_scaling":{"type":"dynamic","factor":3.5})",
      R"("rope_scaling":{"type":"yarn","factor":4})",
      R"("rope_parameters":{"rope_type":"yarn","factor":8,"rope_theta":100,"beta_fast":4,
         "beta_slow":0.5,"mscale":1,"mscale_all_dim":0,"truncate":false,"attention_factor":0.9})",
      std::string(R"("original_max_position_embeddings":16,"rope_scaling":{"type":"longrope",
         "attention_factor":1.1,"short_factor":)") +
          kShort + R"(,"long_factor":)" + kLong + "}",
      R"("rope_scaling":{"type":"llama3","factor":8})",
  };
  for (const std::string& rope : ropes) {
    const auto c = parse_config(llama_with(rope), "cfg.json");
    const std::string json = config_to_json(c);
    const auto back = parse_config(json, "back.json");
    expect_same_rope(c.params<LlamaParams>().rope, back.params<LlamaParams>().rope, json);
    EXPECT_EQ(back.max_positions(), c.max_positions());
    EXPECT_EQ(config_to_json(back), json);
  }
  const auto g = parse_config(
      R"({"model_type":"gpt2","vocab_size":100,"n_embd":64,"n_layer":2,"n_head":4,
          "scale_attn_by_inverse_layer_idx":true,"reorder_and_upcast_attn":true})",
      "cfg.json");
  EXPECT_TRUE(fields(g)["scale_attn_by_inverse_layer_idx"].get<bool>());
  EXPECT_TRUE(fields(g)["reorder_and_upcast_attn"].get<bool>());
  const auto back = parse_config(config_to_json(g), "back.json");
  EXPECT_TRUE(fields(back)["scale_attn_by_inverse_layer_idx"].get<bool>());
  EXPECT_TRUE(fields(back)["reorder_and_upcast_attn"].get<bool>());
  const auto plain = parse_config(config_to_json(parse_config(
                                      R"({"model_type":"gpt2","vocab_size":100,"n_embd":64,
                                          "n_layer":2,"n_head":4})",
                                      "c")),
                                  "c");
  EXPECT_FALSE(fields(plain)["scale_attn_by_inverse_layer_idx"].get<bool>());
  EXPECT_FALSE(fields(plain)["reorder_and_upcast_attn"].get<bool>());
}

// Malformed rope parameters: an InputError of one line naming the file and the field.
TEST(Config, MalformedRopeParametersNameTheField) {
  const std::string shorts = std::string(R"("short_factor":)") + kShort;
  const std::string longs = std::string(R"("long_factor":)") + kLong;
  const std::pair<std::string, std::string> cases[] = {
      {R"("rope_scaling":{"type":"dynamic"})", "needs 'factor' (missing)"},
      {R"("rope_scaling":{"type":"dynamic","factor":0.5})", "'factor' >= 1, got 0.5"},
      {R"("rope_scaling":{"type":"yarn","factor":"4"})", "field 'factor' must be a number"},
      {R"("rope_parameters":{"rope_type":"yarn","factor":4,"beta_fast":0})", "'beta_fast' > 0"},
      {R"("rope_scaling":{"type":"yarn","factor":4,"beta_slow":-1})", "'beta_slow' > 0"},
      {R"("rope_scaling":{"type":"yarn","factor":4,"attention_factor":0})",
       "'attention_factor' > 0"},
      {R"("rope_scaling":{"type":"yarn","factor":4,"mscale":-1})", "'mscale' >= 0"},
      {R"("rope_scaling":{"type":"yarn","factor":4,"mscale_all_dim":[1]})",
       "field 'mscale_all_dim' must be a number"},
      {R"("rope_scaling":{"type":"yarn","factor":4,"truncate":"no"})",
       "field 'truncate' must be true or false"},
      {R"("rope_scaling":{"type":"yarn","factor":4,"original_max_position_embeddings":0})",
       "field 'original_max_position_embeddings' must be between 1"},
      {R"("rope_theta":1,"rope_scaling":{"type":"yarn","factor":4})", "'rope_theta' != 1"},
      {R"("rope_scaling":{"type":"longrope",)" + shorts + "}", "needs 'long_factor' (missing)"},
      {R"("rope_scaling":{"type":"longrope",)" + longs + R"(,"short_factor":[1,2,3]})",
       "field 'short_factor' must have head_dim / 2 = 8 entries, got 3"},
      {R"("rope_scaling":{"type":"longrope",)" + shorts + R"(,"long_factor":[1,1,1,1,1,1,1,"x"]})",
       "field 'long_factor' must hold positive numbers, got \"x\""},
      {R"("rope_scaling":{"type":"longrope",)" + shorts + R"(,"long_factor":[1,1,1,1,1,1,1,0]})",
       "field 'long_factor' must hold positive numbers, got 0"},
      {R"("rope_scaling":{"type":"longrope",)" + longs + R"(,"short_factor":{"a":1}})",
       "field 'short_factor' must be a list of numbers"},
      {R"("rope_scaling":{"type":"longrope","factor":0,)" + shorts + "," + longs + "}",
       "'factor' > 0"},
      {R"("rope_scaling":{"type":"longrope","original_max_position_embeddings":1,)" + shorts + "," +
           longs + "}",
       "original_max_position_embeddings > 1"},
      {R"("partial_rotary_factor":0.5)", "field 'partial_rotary_factor' is 0.5"},
      {R"("rope_parameters":{"rope_type":"default","partial_rotary_factor":0.25})",
       "field 'partial_rotary_factor' is 0.25"},
      {R"("rope_scaling":{"type":"su","factor":2})",
       "unsupported rope_type 'su'; supported: default, linear, dynamic, yarn, longrope, llama3"},
      {R"("rope_scaling":{"rope_type":7})", "field 'rope_type' must be a string"},
      {R"("rope_theta":-10000)", "field 'rope_theta' must be a positive number"},
      {R"("rope_scaling":"yarn")", "field 'rope_scaling' must be an object"},
      {R"("head_dim":2,"rope_scaling":{"type":"dynamic","factor":2})", "needs head_dim > 2"},
  };
  for (const auto& [fields, want] : cases) {
    const std::string msg = error_of(llama_with(fields));
    EXPECT_NE(msg.find(want), std::string::npos) << fields << "\n  -> " << msg;
    EXPECT_EQ(msg.rfind("cfg.json", 0), 0u) << msg;  // names the file first
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(Config, MistralAndQwen2Windows) {
  auto m = parse_config(
      R"({"model_type":"mistral","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4})",
      "cfg");
  EXPECT_EQ(m.params<LlamaParams>().window_for_layer(1).value(), 4096);
  auto m2 = parse_config(
      R"({"model_type":"mistral","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"sliding_window":null})",
      "cfg");
  EXPECT_FALSE(m2.params<LlamaParams>().window_for_layer(1).has_value());
  auto q = parse_config(
      R"({"model_type":"qwen2","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":4,"num_attention_heads":4,"use_sliding_window":true,"sliding_window":16,
      "max_window_layers":2})",
      "cfg");
  EXPECT_TRUE(q.params<LlamaParams>().qkv_bias);
  EXPECT_FALSE(q.params<LlamaParams>().o_bias);
  EXPECT_FALSE(q.params<LlamaParams>().window_for_layer(1).has_value());
  EXPECT_EQ(q.params<LlamaParams>().window_for_layer(2).value(), 16);
}

// Like transformers: only Llama reads attention_bias / mlp_bias. Mistral has no biases and
// Qwen2 exactly q/k/v biases, whatever the fields say (fuzz_config finding #9: these configs did
// not round-trip through config_to_json, and actcap expected bias tensors HF never writes).
TEST(Config, BiasFieldsAreLlamaOnly) {
  const std::string dims =
      R"("vocab_size":100,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,)"
      R"("num_attention_heads":4,"attention_bias":true,"mlp_bias":true})";
  auto l = parse_config(R"({"model_type":"llama",)" + dims, "cfg");
  EXPECT_TRUE(l.params<LlamaParams>().qkv_bias && l.params<LlamaParams>().o_bias &&
              l.params<LlamaParams>().mlp_bias);
  auto m = parse_config(R"({"model_type":"mistral",)" + dims, "cfg");
  EXPECT_FALSE(m.params<LlamaParams>().attention_bias || m.params<LlamaParams>().qkv_bias ||
               m.params<LlamaParams>().o_bias || m.params<LlamaParams>().mlp_bias);
  auto q = parse_config(R"({"model_type":"qwen2",)" + dims, "cfg");
  EXPECT_TRUE(q.params<LlamaParams>().qkv_bias);
  EXPECT_FALSE(q.params<LlamaParams>().attention_bias || q.params<LlamaParams>().o_bias ||
               q.params<LlamaParams>().mlp_bias);
  for (const auto& c : {l, m, q}) {
    auto back = parse_config(config_to_json(c), "cfg2");
    EXPECT_EQ(back.params<LlamaParams>().attention_bias, c.params<LlamaParams>().attention_bias);
    EXPECT_EQ(back.params<LlamaParams>().qkv_bias, c.params<LlamaParams>().qkv_bias);
    EXPECT_EQ(back.params<LlamaParams>().o_bias, c.params<LlamaParams>().o_bias);
    EXPECT_EQ(back.params<LlamaParams>().mlp_bias, c.params<LlamaParams>().mlp_bias);
  }
}

TEST(Config, RoundTripThroughJson) {
  auto c = parse_config(
      R"({"model_type":"qwen2","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2})",
      "cfg");
  auto back = parse_config(config_to_json(c), "cfg2");
  EXPECT_EQ(back.params<LlamaParams>().num_key_value_heads, 2);
  EXPECT_EQ(back.params<LlamaParams>().head_dim, 16);
  EXPECT_TRUE(back.params<LlamaParams>().qkv_bias);
}

TEST(Config, Errors) {
  EXPECT_NE(error_of(R"({"model_type":"bert"})").find("gpt2, llama, mistral, qwen2"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"vocab_size":3})").find("model_type"), std::string::npos);
  EXPECT_NE(
      error_of(R"({"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":4})").find("'vocab_size'"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"model_type":"gpt2","vocab_size":10,"n_embd":64,"n_layer":2,"n_head":5})")
                .find("does not divide"),
            std::string::npos);
  EXPECT_NE(
      error_of(R"({"model_type":"llama","vocab_size":10,"hidden_size":64,"intermediate_size":8,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":3})")
          .find("num_key_value_heads"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"model_type":"gpt2","vocab_size":"x","n_embd":64,"n_layer":2,"n_head":4})")
                .find("must be an integer"),
            std::string::npos);
  EXPECT_NE(
      error_of(R"({"model_type":"llama","vocab_size":10,"hidden_size":64,"intermediate_size":8,
      "num_hidden_layers":2,"num_attention_heads":4,"rope_scaling":{"rope_type":"su","factor":2}})")
          .find("unsupported rope_type 'su'"),
      std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"model_type":"gpt2","vocab_size":10,"n_embd":64,"n_layer":2,"n_head":4,
      "activation_function":"tanhx"})")
                .find("unsupported activation_function"),
            std::string::npos);
}

// Found by fuzz_config (fuzz/regressions/fuzz_config): out-of-range numbers must be clean errors.
TEST(Config, HugeNumbersAreInputErrorsNotUndefinedBehaviour) {
  EXPECT_NE(
      error_of(R"({"model_type":"gpt2","vocab_size":10,"n_embd":1e300,"n_layer":2,"n_head":4})")
          .find("must be an integer"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          R"({"model_type":"gpt2","vocab_size":10,"n_embd":4611686018427387904,"n_layer":2,"n_head":4})")
          .find("between 1 and 2^31-1"),
      std::string::npos);
  EXPECT_NE(
      error_of(R"({"model_type":"gpt2","vocab_size":10,"n_embd":64,"n_inner":9223372036854775807,
      "n_layer":2,"n_head":4})")
          .find("n_inner"),
      std::string::npos);
}

// fuzz/regressions/fuzz_config/json_number_overflow_escapes.json: a number beyond double range is
// nlohmann's out_of_range, not parse_error; it must still be an InputError naming the file.
TEST(Config, NumberBeyondDoubleRangeIsInputError) {
  const std::string msg = error_of(R"({"model_type":"gpt2","attn_pdrop":1e400})");
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

// Gemma 3: Gemma3TextConfig's defaults, local/global layers and their RoPE in both layouts, the
// multimodal config's text_config, and the round trip of each.
namespace {
const char* kGemma3 = R"({"model_type":"gemma3_text","vocab_size":100,"hidden_size":64,
  "intermediate_size":128,"num_hidden_layers":7,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":16,"rope_theta":5000.0,"rope_local_base_freq":50.0,"sliding_window":8,
  "rope_scaling":{"rope_type":"linear","factor":8.0}})";

std::vector<bool> local_layers(const ModelConfig& c) {
  std::vector<bool> out;
  auto f = fields(c);
  const auto& p = c.params<LlamaParams>();
  if (!p.layer_types.empty()) {
    for (const auto& t : p.layer_types) out.push_back(t == "sliding_attention");
  } else {
    const int64_t pattern = f.value("sliding_window_pattern", 6);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) out.push_back((i + 1) % pattern != 0);
  }
  return out;
}
}  // namespace

TEST(Config, Gemma3DefaultsAndRopeOfEachLayerType) {
  auto d = parse_config(R"({"model_type":"gemma3_text"})", "cfg");
  EXPECT_EQ(d.arch, "gemma3_text");
  EXPECT_EQ(std::make_tuple(d.vocab_size, d.hidden_size, d.num_hidden_layers, d.num_attention_heads,
                            d.max_position_embeddings, d.tie_word_embeddings),
            std::make_tuple(262208, 2304, 26, 8, 131072, true));
  EXPECT_EQ(d.params<LlamaParams>().head_dim, 256);
  EXPECT_EQ(d.params<LlamaParams>().num_key_value_heads, 4);
  auto df = fields(d);
  EXPECT_DOUBLE_EQ(df["rope_theta"].get<double>(), 1e6);
  EXPECT_DOUBLE_EQ(df["rope_local_base_freq"].get<double>(), 1e4);
  EXPECT_TRUE(df["final_logit_softcapping"].is_null());
  EXPECT_TRUE(df["attn_logit_softcapping"].is_null());
  EXPECT_EQ(df["sliding_window"], 4096);
  EXPECT_EQ(df["sliding_window_pattern"], 6);

  auto c = parse_config(kGemma3, "cfg");
  EXPECT_EQ(local_layers(c), (std::vector<bool>{true, true, true, true, true, false, true}));
  const auto& p = c.params<LlamaParams>();
  EXPECT_EQ(p.rope.rope_type, "linear");  // the global layers'
  EXPECT_DOUBLE_EQ(p.rope.rope_theta, 5000.0);
  auto f = fields(c);
  EXPECT_DOUBLE_EQ(f["rope_local_base_freq"].get<double>(), 50.0);
  EXPECT_EQ(f["rope_scaling"]["rope_type"], "linear");
  // transformers 5's layout of the same model parses to the same config.
  auto v5 = parse_config(
      R"({"model_type":"gemma3_text","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":7,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
      "sliding_window":8,"rope_parameters":{
        "full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":5000.0},
        "sliding_attention":{"rope_type":"default","rope_theta":50.0}},
      "layer_types":["sliding_attention","sliding_attention","sliding_attention","sliding_attention",
                     "sliding_attention","full_attention","sliding_attention"]})",
      "cfg");
  EXPECT_EQ(local_layers(v5), local_layers(c));
  auto g = fields(v5);
  for (const char* k : {"rope_theta", "rope_scaling", "rope_local_base_freq"})
    EXPECT_EQ(g[k], f[k]) << k;
  // transformers 5.12's save of a model whose layers are all of one type: a default rope_type and
  // a rope_theta beside the entries, which its Gemma 3 does not read.
  auto mixed = parse_config(
      R"({"model_type":"gemma3_text","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":4,"num_attention_heads":4,"head_dim":16,"sliding_window":8,
      "rope_parameters":{"rope_type":"default","rope_theta":null,
        "full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":5000.0},
        "sliding_attention":{"rope_type":"default","rope_theta":50.0}}})",
      "cfg");
  EXPECT_EQ(mixed.params<LlamaParams>().rope.rope_type, "linear");
  EXPECT_DOUBLE_EQ(mixed.params<LlamaParams>().rope.rope_theta, 5000.0);
  EXPECT_DOUBLE_EQ(fields(mixed)["rope_local_base_freq"].get<double>(), 50.0);
}

TEST(Config, Gemma3RoundTripsInBothLayouts) {
  auto c = parse_config(kGemma3, "cfg");
  EXPECT_EQ(config_to_json(parse_config(config_to_json(c), "again")), config_to_json(c));
  // Local layers with their own scaling exist only in transformers 5's layout: written back so.
  auto v5 = parse_config(
      R"({"model_type":"gemma3_text","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":3,"num_attention_heads":4,"head_dim":16,"rope_parameters":{
        "sliding_attention":{"rope_type":"yarn","factor":2.0,"rope_theta":50.0}}})",
      "cfg");
  auto f = fields(v5);
  EXPECT_FALSE(f.contains("rope_local_base_freq"));
  EXPECT_EQ(f["rope_parameters"]["sliding_attention"]["rope_type"], "yarn");
  EXPECT_DOUBLE_EQ(f["rope_parameters"]["full_attention"]["rope_theta"].get<double>(), 1e6);
  EXPECT_EQ(config_to_json(parse_config(config_to_json(v5), "again")), config_to_json(v5));
}

TEST(Config, Gemma3ConditionalGenerationReadsTextConfig) {
  auto c = parse_config(
      R"({"model_type":"gemma3","architectures":["Gemma3ForConditionalGeneration"],
      "eos_token_id":[1,106],"vision_config":{"hidden_size":1152},
      "text_config":{"model_type":"gemma3_text","hidden_size":2560,"intermediate_size":10240,
        "num_hidden_layers":34,"rope_scaling":{"factor":8.0,"rope_type":"linear"},
        "sliding_window":1024}})",
      "cfg");
  EXPECT_EQ(c.arch, "gemma3_text");
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_EQ(std::make_tuple(c.vocab_size, c.hidden_size, c.num_attention_heads, c.eos_token_id,
                            c.tie_word_embeddings),
            std::make_tuple(262208, 2560, 8, 1, true));
  auto f = fields(c);
  EXPECT_EQ(f["architectures"][0], "Gemma3ForConditionalGeneration");
  EXPECT_EQ(f["text_config"]["model_type"], "gemma3_text");
  EXPECT_EQ(f["text_config"]["rope_scaling"]["rope_type"], "linear");
  EXPECT_FALSE(f.contains("hidden_size"));
  auto back = parse_config(config_to_json(c), "again");
  EXPECT_EQ(back.model_type, "gemma3");
  EXPECT_EQ(config_to_json(back), config_to_json(c));
  // No text_config at all: every text default.
  EXPECT_EQ(parse_config(R"({"model_type":"gemma3"})", "cfg").hidden_size, 2304);
}

TEST(Config, Gemma3ErrorsNameTheField) {
  const std::string head =
      R"({"model_type":"gemma3_text","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":4,"num_attention_heads":4,"head_dim":16,)";
  EXPECT_NE(error_of(head + R"("sliding_window_pattern":0})").find("sliding_window_pattern"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("sliding_window":null})").find("sliding_window is null"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("rope_parameters":{"rope_type":"linear","factor":2.0}})")
                .find("keyed by layer type"),
            std::string::npos);
  // Beside the layer types' entries only a default rope_type is what transformers writes.
  EXPECT_NE(error_of(head + R"("rope_parameters":{"rope_type":"linear","factor":2.0,
      "full_attention":{"rope_type":"default"}}})")
                .find("keyed by layer type"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("rope_scaling":{"type":"linear","factor":2.0}})").find("'type'"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("rope_local_base_freq":"x"})").find("rope_local_base_freq"),
            std::string::npos);
  EXPECT_NE(
      error_of(head + R"("rope_parameters":{"full_attention":{"rope_type":"su","factor":2.0}}})")
          .find("unsupported rope_type 'su'"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"model_type":"gemma3","text_config":[1]})").find("'text_config'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type":"gemma3","text_config":{"model_type":"llama"}})")
                .find("gemma3_text"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("use_bidirectional_attention":true})").find("bidirectional"),
            std::string::npos);
}

// Mixtral and Qwen3-MoE read transformers 5's defaults (configuration_mixtral.py,
// configuration_qwen3_moe.py), not the Llama family's.
TEST(Config, MixtureOfExpertsDefaults) {
  const std::string base = R"("vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":4,"num_attention_heads":8)";
  auto m = parse_config(R"({"model_type":"mixtral",)" + base + "}", "cfg");
  const auto& mp = m.params<MoeParams>();
  EXPECT_EQ(mp.num_experts, 8);
  EXPECT_EQ(mp.top_k, 2);
  EXPECT_EQ(mp.moe_intermediate_size, 128);
  EXPECT_TRUE(mp.norm_topk_prob);
  EXPECT_DOUBLE_EQ(mp.rope.rope_theta, 1e6);  // MixtralConfig.default_theta
  EXPECT_DOUBLE_EQ(mp.rms_norm_eps, 1e-5);
  EXPECT_EQ(mp.head_dim, 8);
  EXPECT_FALSE(mp.window_for_layer(3).has_value());  // no window unless sliding_window is set
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(mp.sparse(i));
  EXPECT_EQ(m.max_position_embeddings, 4096 * 32);

  auto q = parse_config(R"({"model_type":"qwen3_moe",)" + base + "}", "cfg");
  const auto& qp = q.params<MoeParams>();
  EXPECT_EQ(qp.num_experts, 128);
  EXPECT_EQ(qp.top_k, 8);
  EXPECT_EQ(qp.moe_intermediate_size, 768);
  EXPECT_FALSE(qp.norm_topk_prob);
  EXPECT_EQ(qp.head_dim, 8);  // hidden_size / num_attention_heads, not Qwen3's 128
  EXPECT_EQ(qp.num_key_value_heads, 4);
  EXPECT_TRUE(qp.qk_norm);
  EXPECT_DOUBLE_EQ(qp.rope.rope_theta, 10000.0);
  EXPECT_FALSE(qp.window_for_layer(3).has_value());

  // A window on every layer only with use_sliding_window (absent: 4096); dense layers by
  // mlp_only_layers and decoder_sparse_step; transformers 5 writes num_local_experts.
  auto w = parse_config(R"({"model_type":"qwen3_moe",)" + base +
                            R"(,"use_sliding_window":true,"decoder_sparse_step":2,
      "mlp_only_layers":[3],"num_local_experts":6,"num_experts_per_tok":2})",
                        "cfg");
  const auto& wp = w.params<MoeParams>();
  EXPECT_EQ(wp.window_for_layer(0).value(), 4096);
  EXPECT_EQ(wp.window_for_layer(3).value(), 4096);
  EXPECT_EQ(wp.num_experts, 6);
  EXPECT_FALSE(wp.sparse(0));
  EXPECT_TRUE(wp.sparse(1));
  EXPECT_FALSE(wp.sparse(2));
  EXPECT_FALSE(wp.sparse(3));  // (3 + 1) % 2 == 0, but listed in mlp_only_layers
  auto back = parse_config(config_to_json(w), "cfg2");
  EXPECT_EQ(config_to_json(back), config_to_json(w));

  auto e = parse_config(R"({"model_type":"mixtral",)" + base + R"(,"num_experts":3})", "cfg");
  EXPECT_EQ(e.params<MoeParams>().num_experts, 3);  // transformers' attribute_map alias
}

TEST(Config, MixtureOfExpertsErrorsNameTheField) {
  const std::string base = R"("vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":4,"num_attention_heads":8)";
  EXPECT_NE(error_of(R"({"model_type":"mixtral",)" + base +
                     R"(,"num_local_experts":4,"num_experts_per_tok":5})")
                .find("num_experts_per_tok=5 exceeds num_local_experts=4"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type":"qwen3_moe",)" + base + R"(,"mlp_only_layers":["1"]})")
                .find("field 'mlp_only_layers' holds \"1\""),
            std::string::npos);
  // An entry that is no layer names nothing, as in transformers (a model cut to fewer layers).
  auto cut =
      parse_config(R"({"model_type":"qwen3_moe",)" + base + R"(,"mlp_only_layers":[7, 1]})", "cfg");
  EXPECT_TRUE(cut.params<MoeParams>().sparse(0));
  EXPECT_FALSE(cut.params<MoeParams>().sparse(1));
  EXPECT_EQ(config_to_json(parse_config(config_to_json(cut), "cfg2")), config_to_json(cut));
  // Mixtral's num_key_value_heads defaults to 8 (MixtralConfig), not num_attention_heads.
  EXPECT_EQ(parse_config(R"({"model_type":"mixtral",)" + base + "}", "cfg")
                .params<MoeParams>()
                .num_key_value_heads,
            8);
  EXPECT_NE(error_of(R"({"model_type":"qwen3_moe",)" + base + R"(,"decoder_sparse_step":0})")
                .find("'decoder_sparse_step'"),
            std::string::npos);
  // An absent num_key_value_heads is the config class's default (null: num_attention_heads).
  const std::string four_heads = R"({"vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":4,"num_attention_heads":4,)";
  EXPECT_NE(error_of(four_heads + R"("model_type":"mixtral"})")
                .find("num_key_value_heads is absent, so 8 (MixtralConfig's default), which does "
                      "not divide num_attention_heads=4"),
            std::string::npos);
  EXPECT_EQ(parse_config(four_heads + R"("model_type":"mixtral","num_key_value_heads":null})", "c")
                .params<MoeParams>()
                .num_key_value_heads,
            4);
  EXPECT_NE(error_of(four_heads + R"("model_type":"qwen3"})").find("(Qwen3Config's default)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type":"mixtral",)" + base + R"(,"num_local_experts":0})")
                .find("num_local_experts is 0"),
            std::string::npos);
}
