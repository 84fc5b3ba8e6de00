// actcap tokenize: encodes each line of a file with a Hugging Face tokenizer.json, one JSON array
// of ids per line.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actcap/error.h"
#include "actcap/tokenizer.h"
#include "common.h"

namespace actcap::cli {

namespace {

std::string read_input(const std::string& path) {
  if (path == "-") {
    std::ostringstream buf;
    buf << std::cin.rdbuf();
    return buf.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(concat("--input: cannot open ", path));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError(concat("--input: cannot read ", path));
  return data;
}

void append_ids(std::string& out, const std::vector<int64_t>& ids) {
  out += '[';
  char buf[24];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    const int n = std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(ids[i]));
    out.append(buf, static_cast<size_t>(n));
  }
  out += "]\n";
}

// The flags of `actcap tokenize`.
struct TokenizeCommand {
  std::string tokenizer;
  std::string input;
  bool no_special = false;
  bool jsonl = false;
  bool stats = false;
};

// Encodes each input line with the tokenizer and writes one JSON array of ids per line.
int run_tokenize_command(const TokenizeCommand& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto tokenizer = Tokenizer::from_file(o.tokenizer);
  const auto t1 = clock::now();
  const std::string data = read_input(o.input);
  const auto t2 = clock::now();
  size_t tokens = 0;
  std::string out;
  out.reserve(data.size() * 2);
  size_t start = 0;
  size_t line_no = 0;
  // Lines end at '\n' only ('\r' stays in the text); a final '\n' ends the last line.
  while (start < data.size()) {
    size_t end = data.find('\n', start);
    if (end == std::string::npos) end = data.size();
    const std::string line = data.substr(start, end - start);
    ++line_no;
    std::string text;
    if (o.jsonl) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw InputError(
            concat("--input ", o.input, ": line ", line_no, " is not JSON (", e.what(), ")"));
      }
      if (!j.is_string())
        throw InputError(concat("--input ", o.input, ": line ", line_no, " is not a JSON string"));
      text = j.get<std::string>();
    }
    const std::vector<int64_t> ids = tokenizer->encode(o.jsonl ? text : line, !o.no_special);
    tokens += ids.size();
    append_ids(out, ids);
    if (out.size() >= (1u << 20)) {
      std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
      out.clear();
    }
    start = end + 1;
  }
  std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
  std::cout.flush();
  if (!std::cout) throw RunError("tokenize: writing the output failed");
  if (o.stats) {
    const auto t3 = clock::now();
    auto secs = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
    const double enc = secs(t3 - t2);
    std::fprintf(stderr, "tokenize: load %.3f s, %zu lines, %zu tokens in %.3f s (%.0f tokens/s)\n",
                 secs(t1 - t0), line_no, tokens, enc, enc > 0 ? tokens / enc : 0.0);
  }
  return 0;
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "tokenize", "Encode text with a Hugging Face tokenizer.json: one JSON array of ids per line");
  auto o = std::make_shared<TokenizeCommand>();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer.json (BPE model)")->required();
  sub->add_option("--input", o->input, "Text file, one text per line ('-' reads stdin)")
      ->required();
  sub->add_flag("--no-special", o->no_special,
                "Do not add the post-processor's special tokens (added tokens written in the "
                "text are still recognised)");
  sub->add_flag("--jsonl", o->jsonl,
                "Each input line is a JSON string (so a text can hold newlines)");
  sub->add_flag("--stats", o->stats, "Print load and encode times to stderr");
  return {sub, [o] { return run_tokenize_command(*o); }};
}

}  // namespace actcap::cli
