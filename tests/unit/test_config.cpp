#include <gtest/gtest.h>

#include "actcap/config.h"
#include "actcap/error.h"

using namespace actcap;

namespace {
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
  EXPECT_EQ(c.arch, Arch::kGpt2);
  EXPECT_EQ(c.gpt2.n_embd, 64);
  EXPECT_EQ(c.gpt2.inner(), 256);
  EXPECT_EQ(c.gpt2.n_positions, 1024);
  EXPECT_EQ(c.gpt2.activation_function, "gelu_new");
  EXPECT_DOUBLE_EQ(c.gpt2.layer_norm_epsilon, 1e-5);
  EXPECT_TRUE(c.gpt2.tie_word_embeddings);
}

TEST(Config, LlamaDefaults) {
  auto c = parse_config(
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
                            "num_hidden_layers":2,"num_attention_heads":4})",
      "cfg");
  EXPECT_EQ(c.llama.num_key_value_heads, 4);
  EXPECT_EQ(c.llama.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.llama.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.llama.rope.rope_theta, 10000.0);
  EXPECT_FALSE(c.llama.tie_word_embeddings);
  EXPECT_FALSE(c.llama.qkv_bias);
  EXPECT_FALSE(c.llama.window_for_layer(0).has_value());
}

TEST(Config, ExplicitHeadDimAndGqa) {
  auto c = parse_config(
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32})",
      "cfg");
  EXPECT_EQ(c.llama.head_dim, 32);
  EXPECT_EQ(c.llama.num_key_value_heads, 2);
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
    EXPECT_EQ(c.llama.rope.rope_type, "llama3");
    EXPECT_DOUBLE_EQ(c.llama.rope.rope_theta, 500000.0);
    EXPECT_DOUBLE_EQ(c.llama.rope.factor, 32.0);
    EXPECT_EQ(c.llama.rope.original_max_position_embeddings, 8192);
  }
  // v4 "type" spelling
  auto c = parse_config(
      R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"rope_scaling":{"type":"linear","factor":2.0}})",
      "cfg");
  EXPECT_EQ(c.llama.rope.rope_type, "linear");
}

TEST(Config, MistralAndQwen2Windows) {
  auto m = parse_config(
      R"({"model_type":"mistral","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4})",
      "cfg");
  EXPECT_EQ(m.llama.window_for_layer(1).value(), 4096);
  auto m2 = parse_config(
      R"({"model_type":"mistral","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"sliding_window":null})",
      "cfg");
  EXPECT_FALSE(m2.llama.window_for_layer(1).has_value());
  auto q = parse_config(
      R"({"model_type":"qwen2","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":4,"num_attention_heads":4,"use_sliding_window":true,"sliding_window":16,
      "max_window_layers":2})",
      "cfg");
  EXPECT_TRUE(q.llama.qkv_bias);
  EXPECT_FALSE(q.llama.o_bias);
  EXPECT_FALSE(q.llama.window_for_layer(1).has_value());
  EXPECT_EQ(q.llama.window_for_layer(2).value(), 16);
}

// Like transformers: only Llama reads attention_bias / mlp_bias. Mistral has no biases and
// Qwen2 exactly q/k/v biases, whatever the fields say (fuzz_config finding #9: these configs did
// not round-trip through config_to_json, and actcap expected bias tensors HF never writes).
TEST(Config, BiasFieldsAreLlamaOnly) {
  const std::string dims =
      R"("vocab_size":100,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,)"
      R"("num_attention_heads":4,"attention_bias":true,"mlp_bias":true})";
  auto l = parse_config(R"({"model_type":"llama",)" + dims, "cfg");
  EXPECT_TRUE(l.llama.qkv_bias && l.llama.o_bias && l.llama.mlp_bias);
  auto m = parse_config(R"({"model_type":"mistral",)" + dims, "cfg");
  EXPECT_FALSE(m.llama.attention_bias || m.llama.qkv_bias || m.llama.o_bias || m.llama.mlp_bias);
  auto q = parse_config(R"({"model_type":"qwen2",)" + dims, "cfg");
  EXPECT_TRUE(q.llama.qkv_bias);
  EXPECT_FALSE(q.llama.attention_bias || q.llama.o_bias || q.llama.mlp_bias);
  for (const auto& c : {l, m, q}) {
    auto back = parse_config(config_to_json(c), "cfg2");
    EXPECT_EQ(back.llama.attention_bias, c.llama.attention_bias);
    EXPECT_EQ(back.llama.qkv_bias, c.llama.qkv_bias);
    EXPECT_EQ(back.llama.o_bias, c.llama.o_bias);
    EXPECT_EQ(back.llama.mlp_bias, c.llama.mlp_bias);
  }
}

TEST(Config, RoundTripThroughJson) {
  auto c = parse_config(
      R"({"model_type":"qwen2","vocab_size":100,"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2})",
      "cfg");
  auto back = parse_config(config_to_json(c), "cfg2");
  EXPECT_EQ(back.llama.num_key_value_heads, 2);
  EXPECT_EQ(back.llama.head_dim, 16);
  EXPECT_TRUE(back.llama.qkv_bias);
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
      "num_hidden_layers":2,"num_attention_heads":4,"rope_scaling":{"rope_type":"yarn","factor":2}})")
          .find("unsupported rope_type 'yarn'"),
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
