// actcap generate: generation with a KV cache from the given prompts, capturing hook points on the
// prompt pass and every decoding step, stitched into one row per (sequence, position).
#include <iomanip>
#include <iostream>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/generate.h"
#include "actcap/split.h"
#include "common.h"

namespace actcap::cli {

namespace {

// The flags of `actcap generate`.
struct GenerateCommand {
  std::string model = "demo", tokens, text, input, out;
  std::vector<std::string> capture;
  std::vector<int64_t> stop_tokens;
  bool overwrite = false, json = false, ignore_eos = false;
  GenerateOptions gen;
  DeviceOptions dev;
  CaptureFlags cap;
};

std::vector<std::vector<int64_t>> prompts_of(const GenerateCommand& o, const Model& model) {
  if (!o.input.empty()) {
    auto tokenizer = tokenizer_for(o.model);
    return read_prompts(o.input, tokenizer.get(), model.config().vocab_size);
  }
  return o.tokens.empty() ? tokenize_text(model, o.text) : parse_token_lists(o.tokens);
}

nlohmann::json result_json(const GenerateResult& r, const Tokenizer* tokenizer) {
  nlohmann::json seqs = nlohmann::json::array();
  for (const GeneratedSequence& s : r.sequences) {
    nlohmann::json j = {{"tokens", s.tokens},
                        {"prompt_length", s.prompt_length},
                        {"generated", static_cast<int64_t>(s.tokens.size()) - s.prompt_length},
                        {"finish", s.finish}};
    if (tokenizer)
      j["text"] = tokenizer->decode(
          std::vector<int64_t>(s.tokens.begin() + s.prompt_length, s.tokens.end()));
    seqs.push_back(j);
  }
  return {{"sequences", seqs},
          {"forwards", r.forwards},
          {"prompt_seconds", r.prompt_seconds},
          {"decode_seconds", r.decode_seconds}};
}

int run_generate_command(GenerateCommand o) {
  const int given = !o.tokens.empty() + !o.text.empty() + !o.input.empty();
  if (given != 1) throw InputError("give the prompts with one of --tokens, --text or --input");
  if (!o.capture.empty() && o.out.empty())
    throw InputError("--capture needs --out (the folder the captures are written to)");
  if (o.cap.positions != "all")
    throw InputError(
        "generate captures every token (prompt and generated); --positions must be all",
        {"positions"});
  auto model = Model::load(o.model, load_options(o.dev));
  model->set_bare_ref_policy(parse_bare_ref_policy(o.cap.bare_ref));
  const auto prompts = prompts_of(o, *model);
  o.gen.stop_tokens = o.stop_tokens;
  o.gen.stop_at_eos = !o.ignore_eos;
  SplitOptions split = split_options(o.dev);
  split.kv_cache_tokens = generation_capacity(*model, prompts, o.gen);
  std::unique_ptr<SafeCapturer> capturer;
  std::vector<PointInfo> plan;
  if (!o.capture.empty()) {
    CaptureOptions copts = capture_options(o.cap, o.capture);
    copts.attention_keys = split.kv_cache_tokens;  // patterns: every position the cache holds
    capturer = std::make_unique<SafeCapturer>(*model, copts);
    plan = capturer->plan();
  }
  const DevicePlan placed =
      split_model(*model, split, static_cast<int64_t>(prompts.size()), split.kv_cache_tokens, plan);
  if (capturer) prepare_output_dir(o.out, o.overwrite);
  const GenerateResult r = generate(*model, prompts, o.gen, capturer.get());
  std::vector<ExportedTensor> exported;
  if (r.capture) exported = export_generation(o.out, *r.capture, *model, export_faults_from_env());
  auto tokenizer = tokenizer_for(o.model);
  if (o.json) {
    nlohmann::json j = result_json(r, tokenizer.get());
    j["kv_cache_bytes"] = r.cache_bytes;
    j["devices"] = placed.to_json()["devices"];
    if (r.capture) {
      j["out"] = o.out;
      j["rows"] = r.capture->row_seq.size();
      j["tensors"] = exported.size();
    }
    j["transfers"] = transfer_json(model->transfer_stats());
    // Decoded text of random or cut-off tokens need not be valid UTF-8: replaced, not thrown.
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const GeneratedSequence& s = r.sequences[i];
    std::cout << "sequence " << i << " (" << s.finish << ", " << s.prompt_length << " prompt + "
              << s.tokens.size() - s.prompt_length << " new):";
    for (size_t t = s.prompt_length; t < s.tokens.size(); ++t) std::cout << " " << s.tokens[t];
    std::cout << "\n";
    if (tokenizer)
      std::cout << "  "
                << tokenizer->decode(
                       std::vector<int64_t>(s.tokens.begin() + s.prompt_length, s.tokens.end()))
                << "\n";
  }
  std::cout << r.forwards << " forwards (prompt " << std::fixed << std::setprecision(3)
            << r.prompt_seconds << " s, decoding " << r.decode_seconds << " s)\n";
  if (r.capture)
    std::cout << "wrote " << exported.size() << " tensors (" << r.capture->row_seq.size()
              << " rows) to " << o.out << "/shard-00000.safetensors and manifest.json\n";
  return 0;
}

}  // namespace

Command add_generate(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "generate", "Generate with a KV cache, capturing hook points of every token into DIR");
  auto o = std::make_shared<GenerateCommand>();
  sub->add_option("MODEL", o->model, "Checkpoint directory or 'demo'");
  sub->add_option("--tokens", o->tokens, "Prompt token ids: \"1,2,3;4,5\" (';' between prompts)");
  sub->add_option("--text", o->text, "Prompt text (the checkpoint's tokenizer.json)");
  sub->add_option("--input", o->input,
                  "Prompts, one per line: .txt (tokenized) or .jsonl (\"text\" or \"input_ids\")");
  sub->add_option("--max-new-tokens", o->gen.max_new_tokens, "Tokens to generate per prompt")
      ->default_val(16);
  sub->add_option("--temperature", o->gen.temperature, "0: greedy (default); > 0: sample");
  sub->add_option("--top-k", o->gen.top_k, "Sample among the k most likely tokens (0: all)");
  sub->add_option("--top-p", o->gen.top_p, "Sample among the most likely tokens up to this mass");
  sub->add_option("--seed", o->gen.seed, "The sampler's seed");
  sub->add_option("--stop-token", o->stop_tokens,
                  "Token ids that end a sequence (besides the config's eos_token_id)")
      ->expected(1, -1);
  sub->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the config's eos_token_id");
  sub->add_option("--capture", o->capture,
                  "Hook point patterns (* one segment, ** any depth, NAME:input)")
      ->expected(1, -1);
  sub->add_option("--out", o->out, "Output directory for the captures");
  sub->add_flag("--overwrite", o->overwrite, "Replace actcap output already in --out");
  add_device_options(sub, o->dev);
  add_capture_options(sub, o->cap);
  sub->add_flag("--json", o->json, "Machine-readable summary");
  return {sub, [o] { return run_generate_command(*o); }};
}

}  // namespace actcap::cli
