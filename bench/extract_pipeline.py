#!/usr/bin/python3
"""extract against its own --forward-only: what the capture, checks and writing cost on top of the
forward (BENCHMARKS.md item 16, issue 17 item 5).

Each pair runs `actcap extract MODEL --input CORPUS --capture PATTERN --batch-size B --quiet --json`
once with `--out` (capturing, checking and writing the shards) and once with `--forward-only` (the
same batches, nothing captured or written), alternating which goes first; one warm-up pair is not
counted. Prints tokens/s of both arms per pair (tokens / seconds as extract reports them), the
extract / forward-only ratio per pair and their medians, and the write rate: bytes_written /
seconds of the extract run (GB = 1e9 bytes).

  /usr/bin/python3 bench/extract_pipeline.py --actcap build/actcap --pairs 5

The model (init-model --arch gpt2 --preset gpt2-small --seed 0) and the corpus (DOCS lines of TOKENS ids below
the vocabulary, numpy seed 0) are made when missing. The machine is shared: quote medians and the
per-pair ratios, never one run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np


def make_model(actcap, out, arch, preset, seed):
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        subprocess.run([actcap, "init-model", "--arch", arch, "--preset", preset, "--seed", str(seed),
                        "--out", out], check=True, stdout=subprocess.DEVNULL)


def vocab_size(model):
    with open(os.path.join(model, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


def make_corpus(path, docs, tokens, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(docs, tokens))
    with open(path, "w") as f:
        for row in ids:
            f.write(json.dumps({"input_ids": [int(i) for i in row]}) + "\n")


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    j = json.loads(r.stdout)
    return {"tps": j["tokens"] / j["seconds"], "seconds": j["seconds"],
            "bytes": j["bytes_written"], "shards": j["shards"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actcap", default="build/actcap", help="the binary (default build/actcap)")
    ap.add_argument("--model", default="/tmp/perf/gpt2-small",
                    help="model folder, made with init-model when missing")
    ap.add_argument("--arch", default="gpt2", help="init-model architecture when making it")
    ap.add_argument("--preset", default="gpt2-small", help="init-model preset when making it")
    ap.add_argument("--seed", type=int, default=0, help="init-model seed when making it")
    ap.add_argument("--docs", type=int, default=96, help="corpus documents (default 96)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per document (default 128)")
    ap.add_argument("--corpus", default=None,
                    help="corpus path (default /tmp/perf/corpus-DOCSxTOKENS.jsonl, made if missing)")
    ap.add_argument("--capture", default="transformer.h.*", help="capture pattern")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", default="/tmp/perf/out", help="extract's output folder (replaced)")
    ap.add_argument("--pairs", type=int, default=5, help="counted pairs (default 5)")
    ap.add_argument("--no-warmup", action="store_true", help="count the first pair too")
    ap.add_argument("--extra", default="", help="more extract flags for both arms (one string)")
    ap.add_argument("--json", action="store_true", help="also print the raw runs as JSON")
    a = ap.parse_args()

    actcap = os.path.abspath(a.actcap)
    make_model(actcap, a.model, a.arch, a.preset, a.seed)
    corpus = a.corpus or os.path.join(os.path.dirname(os.path.abspath(a.out)),
                                      f"corpus-{a.docs}x{a.tokens}.jsonl")
    if not os.path.exists(corpus):
        os.makedirs(os.path.dirname(corpus), exist_ok=True)
        make_corpus(corpus, a.docs, a.tokens, vocab_size(a.model))
    base = [actcap, "extract", a.model, "--input", corpus, "--capture", a.capture,
            "--batch-size", str(a.batch_size), "--quiet", "--json"] + a.extra.split()
    arms = {"extract": base + ["--out", a.out, "--overwrite"], "forward-only": base + ["--forward-only"]}

    pairs = []
    for i in range(a.pairs + (0 if a.no_warmup else 1)):
        order = ["extract", "forward-only"] if i % 2 == 0 else ["forward-only", "extract"]
        got = {arm: run(arms[arm]) for arm in order}
        warm = i == 0 and not a.no_warmup
        ratio = got["extract"]["tps"] / got["forward-only"]["tps"]
        gbps = got["extract"]["bytes"] / got["extract"]["seconds"] / 1e9
        print(f"pair {i}{' (warm-up)' if warm else ''}: extract {got['extract']['tps']:.0f} tok/s, "
              f"forward-only {got['forward-only']['tps']:.0f} tok/s, ratio {ratio:.3f}, "
              f"{gbps:.3f} GB/s written", flush=True)
        if not warm:
            pairs.append({**got, "ratio": ratio, "gbps": gbps})

    ex = [p["extract"]["tps"] for p in pairs]
    fo = [p["forward-only"]["tps"] for p in pairs]
    ratios = sorted(p["ratio"] for p in pairs)
    gb = [p["gbps"] for p in pairs]
    last = pairs[-1]["extract"]
    print(f"\n{len(pairs)} pairs; {a.docs} docs x {a.tokens} tokens, capture '{a.capture}', "
          f"batch {a.batch_size}; {last['bytes'] / 1e6:.1f} MB in {last['shards']} shards per run")
    print(f"extract      median {statistics.median(ex):.0f} tok/s (min {min(ex):.0f}, max {max(ex):.0f})")
    print(f"forward-only median {statistics.median(fo):.0f} tok/s (min {min(fo):.0f}, max {max(fo):.0f})")
    print(f"ratio per pair: {' '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")
    print(f"written: median {statistics.median(gb):.3f} GB/s (bytes_written / extract seconds)")
    if a.json:
        print(json.dumps(pairs, indent=1))


if __name__ == "__main__":
    main()
