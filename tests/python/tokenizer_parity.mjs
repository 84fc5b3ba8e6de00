// Reference encoder for the tokenizer parity test and bench: Hugging Face's JS implementation
// (@huggingface/tokenizers) encodes each line of the input files as `actcap tokenize` does.
//
//   node tokenizer_parity.mjs --modules DIR/node_modules --tokenizer tokenizer.json
//        [--config tokenizer_config.json] --jobs JSON
//
// JOBS is a JSON array of {"input": PATH, "output": PATH, "special": bool, "jsonl": bool}: every
// job writes one JSON array of ids per input line (lines end at '\n'; a final '\n' ends the last
// line; with jsonl each line is a JSON string). A job with "decode": true reads one JSON array of
// ids per line and writes the decoded text as one JSON string per line (no clean-up of
// tokenization spaces, special tokens kept, as `actcap tokenize --decode`). With --bench, jobs are not written out: it
// encodes the first job's input once and prints {"load_ms", "encode_ms", "tokens", "lines"}.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

function parseArgs(argv) {
  const args = { config: null, bench: false };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "--bench") args.bench = true;
    else if (a.startsWith("--")) args[a.slice(2)] = argv[++i];
    else throw new Error(`unexpected argument ${a}`);
  }
  for (const need of ["modules", "tokenizer", "jobs"])
    if (!args[need]) throw new Error(`--${need} is required`);
  return args;
}

function readLines(file, jsonl) {
  const data = fs.readFileSync(file);
  const decoder = new TextDecoder("utf-8");
  const lines = [];
  let start = 0;
  while (start < data.length) {
    let end = data.indexOf(0x0a, start);
    if (end < 0) end = data.length;
    const text = decoder.decode(data.subarray(start, end));
    lines.push(jsonl ? JSON.parse(text) : text);
    start = end + 1;
  }
  return lines;
}

const args = parseArgs(process.argv.slice(2));
const require = createRequire(path.join(path.resolve(args.modules), "noop.js"));
const { Tokenizer } = require("@huggingface/tokenizers");

const t0 = performance.now();
const tokenizerJson = JSON.parse(fs.readFileSync(args.tokenizer, "utf-8"));
const tokenizerConfig = args.config ? JSON.parse(fs.readFileSync(args.config, "utf-8")) : {};
const tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);
const loadMs = performance.now() - t0;

const jobs = JSON.parse(args.jobs);
if (args.bench) {
  const job = jobs[0];
  const lines = readLines(job.input, job.jsonl);
  const t1 = performance.now();
  let tokens = 0;
  for (const line of lines)
    tokens += tokenizer.encode(line, { add_special_tokens: job.special }).ids.length;
  const encodeMs = performance.now() - t1;
  process.stdout.write(
    JSON.stringify({ load_ms: loadMs, encode_ms: encodeMs, tokens, lines: lines.length }) + "\n");
} else {
  for (const job of jobs) {
    const out = [];
    if (job.decode) {
      for (const line of readLines(job.input, true)) {
        // decode() refuses an empty list
        const text = line.length === 0 ? ""
          : tokenizer.decode(line, { clean_up_tokenization_spaces: false });
        out.push(JSON.stringify(text));
      }
      fs.writeFileSync(job.output, out.map((l) => l + "\n").join(""));
      continue;
    }
    for (const line of readLines(job.input, job.jsonl))
      out.push(JSON.stringify(tokenizer.encode(line, { add_special_tokens: job.special }).ids));
    fs.writeFileSync(job.output, out.map((l) => l + "\n").join(""));
  }
}
