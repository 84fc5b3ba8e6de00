// actcap init-model: a deterministic random-init checkpoint in exact Hugging Face layout.
#include <iostream>

#include "actcap/init_model.h"
#include "common.h"

namespace actcap::cli {

namespace {

// The flags of `actcap init-model`.
struct InitModelCommand {
  InitModelOptions init;
  std::string tie, out;
};

// Writes the checkpoint to --out and prints what it holds.
int run_init_model_command(const InitModelCommand& o) {
  InitModelOptions init = o.init;
  if (!o.tie.empty()) init.tie_word_embeddings = o.tie == "true";
  InitModelResult r = init_model(o.out, init);
  std::cout << "wrote " << o.out << ": " << init.arch << " " << init.preset << ", "
            << r.config.num_layers() << " layers, " << r.parameters << " parameters, " << init.dtype
            << ", seed " << init.seed << (r.config.tie_word_embeddings ? ", tied" : ", untied")
            << " embeddings\n";
  return 0;
}

}  // namespace

Command add_init_model(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "init-model",
      "Write a deterministic random-init HF checkpoint (config.json + model.safetensors)");
  auto o = std::make_shared<InitModelCommand>();
  sub->add_option("--arch", o->init.arch, "Architecture")
      ->required()
      ->check(CLI::IsMember(supported_model_types()));
  sub->add_option(
      "--preset", o->init.preset,
      "Size: tiny (tests), small, gpt2-small (GPT-2 124M's shape), or the "
      "architecture's own real shapes (llama-3.1-8b, qwen3-0.6b, olmo-1b, olmo-7b, olmo-2-1b, "
      "gemma-2b, gemma-7b, "
      "gemma-2-2b, gemma-3-1b, pythia-160m, phi-3-mini, mixtral-8x7b, qwen1.5-moe-a2.7b, "
      "qwen2-57b-a14b, qwen3-30b-a3b, olmoe-1b-7b, "
      "gpt-oss-20b, gpt-oss-120b, deepseek-v2-lite, deepseek-v3)");
  sub->add_option("--seed", o->init.seed, "Random seed")->required();
  sub->add_option("--dtype", o->init.dtype, "Stored dtype")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  sub->add_option("--tie-word-embeddings", o->tie, "Override the family's default tying")
      ->check(CLI::IsMember({"true", "false"}));
  sub->add_option("--out", o->out, "Output directory")->required();
  sub->add_flag("--config-only", o->init.config_only, "Write config.json only, no weights");
  return {sub, [o] { return run_init_model_command(*o); }};
}

}  // namespace actcap::cli
