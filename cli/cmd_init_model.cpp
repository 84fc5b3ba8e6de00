// actcap init-model: a deterministic random-init checkpoint in exact Hugging Face layout.
#include <iostream>

#include "actcap/init_model.h"
#include "common.h"

namespace actcap::cli {

Command add_init_model(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "init-model",
      "Write a deterministic random-init HF checkpoint (config.json + model.safetensors)");
  struct Opts {
    InitModelOptions init;
    std::string tie, out;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--arch", o->init.arch, "Architecture")
      ->required()
      ->check(CLI::IsMember(supported_model_types()));
  sub->add_option("--preset", o->init.preset,
                  "Size: tiny (tests), small, gpt2-small (GPT-2 124M's shape), or the "
                  "architecture's own (qwen3-0.6b)");
  sub->add_option("--seed", o->init.seed, "Random seed")->required();
  sub->add_option("--dtype", o->init.dtype, "Stored dtype")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  sub->add_option("--tie-word-embeddings", o->tie, "Override the family's default tying")
      ->check(CLI::IsMember({"true", "false"}));
  sub->add_option("--out", o->out, "Output directory")->required();
  sub->add_flag("--config-only", o->init.config_only, "Write config.json only, no weights");
  return {sub, [o]() {
            if (!o->tie.empty()) o->init.tie_word_embeddings = o->tie == "true";
            InitModelResult r = init_model(o->out, o->init);
            std::cout << "wrote " << o->out << ": " << o->init.arch << " " << o->init.preset << ", "
                      << r.config.num_layers() << " layers, " << r.parameters << " parameters, "
                      << o->init.dtype << ", seed " << o->init.seed
                      << (r.config.tie_word_embeddings ? ", tied" : ", untied")
                      << " embeddings\n";
            return 0;
          }};
}

}  // namespace actcap::cli
