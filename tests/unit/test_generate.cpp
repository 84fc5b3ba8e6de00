// Generation with a KV cache (actcap/generate.h) on every architecture: the captures stitched from
// the prompt pass and the decoding steps equal one full forward over the final sequences, the
// greedy tokens are what that forward's logits pick, a split over virtual devices generates the
// same tokens and bit-identical captures, sampling is seeded, stop tokens end a sequence, the plan
// counts the cache, and bad options are InputErrors. The parity against the independent reference
// is tests/python/test_generate_parity.py.
#include <gtest/gtest.h>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/generate.h"
#include "actcap/split.h"
#include "models/arch/llama_family.h"
#include "tiny_models.h"

using namespace actcap;
using test::every_architecture;

namespace {

const std::vector<std::vector<int64_t>> kPrompts = {
    {1, 5, 9}, {8, 6, 10, 2, 7, 3, 11}, {4, 12, 13, 14, 2}};

GenerateOptions greedy(int64_t n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_at_eos = false;
  return o;
}

// max |a - b| / max(1, max |b|)
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).abs().max().item<double>() / std::max(1.0, y.abs().max().item<double>());
}

std::vector<std::vector<int64_t>> tokens_of(const GenerateResult& r) {
  std::vector<std::vector<int64_t>> out;
  for (const GeneratedSequence& s : r.sequences) out.push_back(s.tokens);
  return out;
}

class GenerateEveryArch : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(GenerateEveryArch, CachedCapturesEqualOneFullForwardAndGreedyTokensItsArgmax) {
  auto m = test::tiny_model(GetParam(), at::kFloat);
  const int64_t n = 6;
  GenerateResult r;
  {
    SafeCapturer cap(*m, CaptureOptions{{"**", "**:input"}});
    r = generate(*m, kPrompts, greedy(n), &cap);
  }
  ASSERT_TRUE(r.capture);
  EXPECT_EQ(r.forwards, 1 + n);  // the prompt pass, then each new token fed once
  const auto final_seqs = tokens_of(r);
  for (size_t b = 0; b < kPrompts.size(); ++b) {
    EXPECT_EQ(r.sequences[b].tokens.size(), kPrompts[b].size() + n);
    EXPECT_EQ(r.sequences[b].finish, "length");
  }

  // One forward over the final sequences, capturing the same points.
  SafeCapturer full(*m, CaptureOptions{{"**", "**:input"}});
  const Batch batch =
      Batch::from_sequences(final_seqs, m->config().vocab_size, m->config().max_positions());
  const at::Tensor logits = full.run(batch);
  EXPECT_EQ(r.capture->row_seq, full.row_seq());
  EXPECT_EQ(r.capture->row_pos, full.row_pos());
  ASSERT_EQ(r.capture->points.size(), full.plan().size());
  for (size_t k = 0; k < full.plan().size(); ++k) {
    const std::string& name = full.plan()[k].name;
    ASSERT_EQ(r.capture->points[k].first, name);
    const at::Tensor got = r.capture->points[k].second, want = full.get(name);
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    if (!at::isFloatingType(want.scalar_type())) {
      EXPECT_TRUE(at::equal(got, want)) << name;
      continue;
    }
    EXPECT_LE(rel_diff(got, want), 1e-5) << name;
  }
  // Rows: every token of the final sequences with its id and the forward that computed it.
  size_t row = 0;
  for (size_t b = 0; b < final_seqs.size(); ++b) {
    const int64_t prompt = static_cast<int64_t>(kPrompts[b].size());
    for (int64_t p = 0; p < static_cast<int64_t>(final_seqs[b].size()); ++p, ++row) {
      EXPECT_EQ(r.capture->row_token[row], final_seqs[b][p]);
      EXPECT_EQ(r.capture->row_step[row], p < prompt ? 0 : p - prompt + 1);
    }
    // Greedy: each new token is the argmax of the full forward's logits one position before.
    for (int64_t p = prompt; p < static_cast<int64_t>(final_seqs[b].size()); ++p)
      EXPECT_EQ(logits[b][p - 1].argmax().item<int64_t>(), final_seqs[b][p])
          << "sequence " << b << " position " << p;
  }
}

TEST_P(GenerateEveryArch, ThreeVirtualDevicesGenerateTheSameTokensAndBitIdenticalCaptures) {
  auto one = test::tiny_model(GetParam(), at::kFloat);
  auto split = test::tiny_model(GetParam(), at::kFloat);
  const Batch probe =
      Batch::from_sequences(kPrompts, one->config().vocab_size, one->config().max_positions());
  test::place_balanced(*split, probe, 3);
  GenerateResult a, b;
  {
    SafeCapturer cap(*one, CaptureOptions{{"**"}});
    a = generate(*one, kPrompts, greedy(5), &cap);
  }
  {
    SafeCapturer cap(*split, CaptureOptions{{"**"}});
    b = generate(*split, kPrompts, greedy(5), &cap);
  }
  EXPECT_EQ(tokens_of(a), tokens_of(b));
  ASSERT_EQ(a.capture->points.size(), b.capture->points.size());
  for (size_t k = 0; k < a.capture->points.size(); ++k)
    EXPECT_TRUE(at::equal(a.capture->points[k].second, b.capture->points[k].second))
        << a.capture->points[k].first;
  EXPECT_EQ(a.capture->row_step, b.capture->row_step);
}

TEST_P(GenerateEveryArch, WithoutACapturerTheSameTokensAndOneForwardFewer) {
  auto m = test::tiny_model(GetParam(), at::kFloat);
  GenerateResult with;
  {
    SafeCapturer cap(*m, CaptureOptions{{"**"}});
    with = generate(*m, kPrompts, greedy(4), &cap);
  }
  const GenerateResult without = generate(*m, kPrompts, greedy(4));
  EXPECT_EQ(tokens_of(with), tokens_of(without));
  EXPECT_FALSE(without.capture);
  EXPECT_EQ(without.forwards, 4);  // the last token is not fed back: nothing reads it
}

INSTANTIATE_TEST_SUITE_P(Registry, GenerateEveryArch, ::testing::ValuesIn(every_architecture()),
                         [](const auto& info) { return info.param; });

TEST(Generate, SamplingIsSeededAndTopKOneIsGreedy) {
  auto m = test::tiny_model("llama", at::kFloat);
  GenerateOptions o = greedy(12);
  o.temperature = 1.5;
  o.seed = 3;
  const auto first = tokens_of(generate(*m, kPrompts, o));
  EXPECT_EQ(first, tokens_of(generate(*m, kPrompts, o)));
  // Some seed in a handful changes the sample (a model whose sampling ignored the seed would not).
  bool differs = false;
  for (uint64_t s = 4; s < 10 && !differs; ++s) {
    o.seed = s;
    differs = tokens_of(generate(*m, kPrompts, o)) != first;
  }
  EXPECT_TRUE(differs);
  // ...and a sample differs from greedy somewhere (temperature 1.5 over a near-uniform model).
  EXPECT_NE(first, tokens_of(generate(*m, kPrompts, greedy(12))));
  o.top_k = 1;
  EXPECT_EQ(tokens_of(generate(*m, kPrompts, o)), tokens_of(generate(*m, kPrompts, greedy(12))));
  o.top_k = 0;
  o.top_p = 1e-6;  // only the most likely token survives
  EXPECT_EQ(tokens_of(generate(*m, kPrompts, o)), tokens_of(generate(*m, kPrompts, greedy(12))));
}

TEST(Generate, SamplingSplitOverDevicesPicksWhatOneDevicePicks) {
  auto one = test::tiny_model("gpt2", at::kFloat);
  auto split = test::tiny_model("gpt2", at::kFloat);
  test::place_balanced(
      *split,
      Batch::from_sequences(kPrompts, split->config().vocab_size, split->config().max_positions()),
      3);
  GenerateOptions o = greedy(8);
  o.temperature = 0.9;
  o.top_k = 20;
  o.top_p = 0.9;
  o.seed = 11;
  EXPECT_EQ(tokens_of(generate(*one, kPrompts, o)), tokens_of(generate(*split, kPrompts, o)));
}

TEST(Generate, AStopTokenEndsItsSequenceAndTheOthersGoOn) {
  auto m = test::tiny_model("qwen2", at::kFloat);
  const GenerateResult plain = generate(*m, kPrompts, greedy(6));
  // The second token sequence 0 generates becomes a stop token.
  const int64_t stop = plain.sequences[0].tokens[kPrompts[0].size() + 1];
  GenerateOptions o = greedy(6);
  o.stop_tokens = {stop};
  GenerateResult r;
  {
    SafeCapturer cap(*m, CaptureOptions{{"model.norm"}});
    r = generate(*m, kPrompts, o, &cap);
  }
  for (size_t b = 0; b < kPrompts.size(); ++b) {
    const auto& want = plain.sequences[b].tokens;
    const auto& got = r.sequences[b].tokens;
    // Each sequence is the plain one cut right after its first stop token among the new ones.
    size_t end = want.size();
    for (size_t p = kPrompts[b].size(); p < want.size(); ++p)
      if (want[p] == stop) {
        end = p + 1;
        break;
      }
    EXPECT_EQ(got, std::vector<int64_t>(want.begin(), want.begin() + end)) << b;
    EXPECT_EQ(r.sequences[b].finish,
              end < want.size() || want[end - 1] == stop ? "stop" : "length");
  }
  EXPECT_EQ(r.sequences[0].finish, "stop");
  // Rows: exactly the tokens each sequence has.
  size_t rows = 0;
  for (const auto& s : r.sequences) rows += s.tokens.size();
  EXPECT_EQ(r.capture->row_seq.size(), rows);
  EXPECT_EQ(r.capture->points[0].second.size(0), static_cast<int64_t>(rows));
}

TEST(Generate, EosEndsASequenceUnlessIgnored) {
  auto m = test::tiny_model("llama", at::kFloat);
  const GenerateResult plain = generate(*m, kPrompts, greedy(5));
  ModelConfig c = preset_config("llama", "tiny");
  c.eos_token_id = plain.sequences[1].tokens[kPrompts[1].size()];  // its first new token
  auto eos = Model::from_tensors(c, random_weights(c, 17, at::kFloat), "llama-tiny");
  GenerateOptions o = greedy(5);
  o.stop_at_eos = true;
  const GenerateResult r = generate(*eos, kPrompts, o);
  EXPECT_EQ(r.sequences[1].tokens.size(), kPrompts[1].size() + 1);
  EXPECT_EQ(r.sequences[1].finish, "stop");
  o.stop_at_eos = false;
  EXPECT_EQ(tokens_of(generate(*eos, kPrompts, o)), tokens_of(plain));
}

TEST(Generate, ThePlanCountsTheCacheOnEachStagesDevice) {
  auto m = test::tiny_model("llama", at::kFloat);
  SplitOptions s;
  s.devices = {DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1)};
  const DevicePlan without = plan_split(*m, s, 3, 8, {});
  s.kv_cache_tokens = 13;
  const DevicePlan with = plan_split(*m, s, 3, 8, {});
  const ModelConfig& c = m->config();
  const auto& p = c.params<LlamaParams>();
  const int64_t kv_heads =
      p.num_key_value_heads > 0 ? p.num_key_value_heads : c.num_attention_heads;
  const int64_t head_dim = p.head_dim > 0 ? p.head_dim : c.hidden_size / c.num_attention_heads;
  // Keys and values, per kv head and head_dim, for 3 sequences of 13 positions, float32.
  const uint64_t per_layer = 2ull * kv_heads * head_dim * 3 * 13 * sizeof(float);
  ASSERT_EQ(with.stage_device, without.stage_device);
  uint64_t added = 0;
  for (size_t d = 0; d < with.usage.size(); ++d) {
    EXPECT_GT(with.usage[d].reserve, without.usage[d].reserve) << d;  // both devices hold layers
    added += with.usage[d].reserve - without.usage[d].reserve;
  }
  EXPECT_EQ(added, per_layer * static_cast<uint64_t>(c.num_hidden_layers));
}

TEST(Generate, BadOptionsAreInputErrors) {
  auto m = test::tiny_model("gpt2", at::kFloat);
  const int64_t context = m->config().max_positions();
  auto bad = [&](GenerateOptions o, std::vector<std::vector<int64_t>> prompts = kPrompts) {
    EXPECT_THROW(generation_capacity(*m, prompts, o), InputError);
    EXPECT_THROW(generate(*m, prompts, o), InputError);
  };
  bad(greedy(context));  // the 7-token prompt plus `context` new tokens is past the context
  bad(greedy(0));
  GenerateOptions o = greedy(2);
  o.temperature = -1;
  bad(o);
  o = greedy(2);
  o.top_p = 0;
  bad(o);
  o = greedy(2);
  o.top_k = -3;
  bad(o);
  o = greedy(2);
  o.stop_tokens = {m->config().vocab_size};
  bad(o);
  bad(greedy(2), {});
  bad(greedy(2), {{1, 2}, {}});
  EXPECT_EQ(generation_capacity(*m, kPrompts, greedy(3)), 10);
}
