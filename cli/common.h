// Shared pieces of the actcap subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "actcap/model.h"

namespace actcap::cli {

// Registers each subcommand on the app; run() is called after parsing when it was chosen.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_init_model(CLI::App& app);
Command add_points(CLI::App& app);
Command add_run(CLI::App& app);

// "1,2,3;4,5" -> {{1,2,3},{4,5}}; throws InputError naming the bad entry.
std::vector<std::vector<int64_t>> parse_token_lists(const std::string& text);
// Tokenises text for MODEL: the demo model's byte-level tokenizer (one id per UTF-8 byte).
std::vector<std::vector<int64_t>> tokenize_text(const Model& model, const std::string& text);
// Human-readable shape: [768] / [] / [3, 64].
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace actcap::cli
