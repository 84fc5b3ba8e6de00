// actcap tokenize: encodes each line of a file with a Hugging Face tokenizer.json, one JSON array
// of ids per line; with --decode, decodes one JSON array of ids per line to one JSON string.
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
  bool decode = false;
};

std::vector<int64_t> parse_ids(const std::string& line, const std::string& input, size_t line_no) {
  auto bad = [&](const std::string& why) {
    return InputError(concat("--input ", input, ": line ", line_no, " ", why));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw bad(concat("is not JSON (", e.what(), ")"));
  }
  if (!j.is_array()) throw bad("is not a JSON array of token ids");
  std::vector<int64_t> ids;
  ids.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_integer()) throw bad(concat("has ", v.dump(), ", which is not a token id"));
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

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
    if (o.jsonl && !o.decode) {
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
    if (o.decode) {
      const std::vector<int64_t> ids = parse_ids(line, o.input, line_no);
      tokens += ids.size();
      std::string decoded;
      try {
        decoded = tokenizer->decode(ids);
      } catch (const InputError& e) {
        throw InputError(concat("--input ", o.input, ": line ", line_no, ": ", e.what()));
      }
      out += nlohmann::json(decoded).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      out += '\n';
      start = end + 1;
      continue;
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
  auto* decode =
      sub->add_flag("--decode", o->decode,
                    "Decode instead: each input line is a JSON array of ids, each output "
                    "line the decoded text as a JSON string (the tokenizer's decoder)");
  decode->excludes(sub->get_option("--jsonl"));
  decode->excludes(sub->get_option("--no-special"));
  return {sub, [o] { return run_tokenize_command(*o); }};
}

}  // namespace actcap::cli
