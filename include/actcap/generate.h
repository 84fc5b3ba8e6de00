// Generation with a KV cache (`actcap generate`, Engine.generate, docs/generate.md): a prompt pass
// over the right-padded batch, then one decoding step per new token, each attention module keeping
// its keys and values in a cache on its own device. A SafeCapturer attached to the model sees the
// prompt pass and every step; the generation stitches its captures into the usual rows: one per
// (sequence, position) of the final sequences, prompt and generated, with the step that computed
// it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actcap/capture.h"
#include "actcap/model.h"

namespace actcap {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  // 0: greedy (the most likely token, the lowest id among ties); > 0: sample from
  // softmax(logits / temperature) after top_k and top_p, with a generator seeded by `seed`.
  double temperature = 0;
  int64_t top_k = 0;   // keep the k most likely tokens (0: all)
  double top_p = 1.0;  // keep the most likely tokens until their probability reaches top_p
  uint64_t seed = 0;
  // A sequence stops once it generated one of these (kept as its last token); the config's
  // eos_token_id too unless `stop_at_eos` is false.
  std::vector<int64_t> stop_tokens;
  bool stop_at_eos = true;
};

struct GeneratedSequence {
  std::vector<int64_t> tokens;  // the prompt, then what was generated
  int64_t prompt_length = 0;
  std::string finish;  // "stop" (ended by a stop token) or "length" (max_new_tokens)
};

// The captures of a generation in (sequence, position) order, prompt and generated tokens alike.
struct GenerateCapture {
  std::vector<std::pair<std::string, at::Tensor>> points;  // the capturer's plan order, [rows, ...]
  std::vector<int64_t> row_seq, row_pos, row_token;
  std::vector<int64_t> row_step;  // 0: the prompt pass; k: the k-th decoding step
};

struct GenerateResult {
  std::vector<GeneratedSequence> sequences;
  int64_t forwards = 0;      // the prompt pass and the decoding steps
  uint64_t cache_bytes = 0;  // the KV cache's keys and values, every layer
  double prompt_seconds = 0, decode_seconds = 0;
  std::optional<GenerateCapture> capture;  // when a capturer was given
};

// The KV cache positions a generation of `prompts` needs per sequence: the longest prompt plus
// max_new_tokens (SplitOptions::kv_cache_tokens). Throws InputError when that passes the model's
// context, or for options out of range (max_new_tokens < 1, temperature < 0, top_k < 0, top_p
// outside (0, 1], a stop token outside the vocabulary, no prompt, an empty prompt).
int64_t generation_capacity(const Model& model, const std::vector<std::vector<int64_t>>& prompts,
                            const GenerateOptions& options);

// Generates from `prompts` (one batch) on the model as placed. Each new token of a sequence is fed
// back once, so every token of the final sequences has its activations (the last one's logits
// are not used). `capturer` (attached to `model`, optional) captures every token of the prompt pass
// and each fed token; its captures are stitched into GenerateResult::capture, verified.
GenerateResult generate(Model& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& options, SafeCapturer* capturer = nullptr);

// Prompts from a file, one per non-blank line: .txt (tokenized by `tokenizer`) or .jsonl ("text"
// or "input_ids"), as extract reads a corpus. InputError naming the line for a bad one.
class Tokenizer;
std::vector<std::vector<int64_t>> read_prompts(const std::string& path, const Tokenizer* tokenizer,
                                               int64_t vocab_size);

}  // namespace actcap
