#!/usr/bin/python3
"""16-bit checkpoints: kept as stored (`--weights-dtype keep`) against widened at load (`f32`).

For each checkpoint dtype (bf16, f16, and an f32 checkpoint for reference) and each mode, runs
`actcap extract MODEL --forward-only` over the same corpus, alternating the arms round by round,
and reports per arm the median extract throughput (tokens/s over the extract loop, from --json),
the whole-process wall time and the peak resident set (ru_maxrss of the child: anonymous memory
plus the mapped checkpoint pages it touched). The `keep/f32` column is the per-round ratio of
throughputs (median over rounds). BENCHMARKS.md item 9 quotes it.

  /usr/bin/python3 bench/weights_dtype.py --actcap build/actcap --rounds 5

`--big` instead runs the one Llama-3.1-8B-shaped bf16 extract of issue 13 (init-model preset
llama-3.1-8b, 16 GB; written to build/bench-models/llama-3.1-8b-bf16 when missing) over three
virtual devices with the default mode, once, and reports the same figures.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ab_binaries import make_corpus  # the same seeded corpus writer


def make_model(actcap, arch, preset, dtype, models_dir):
    out = os.path.join(models_dir, f"{arch}-{preset}-{dtype}")
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        t0 = time.perf_counter()
        subprocess.run([actcap, "init-model", "--arch", arch, "--preset", preset, "--seed", "0",
                        "--dtype", dtype, "--out", out], check=True, stdout=subprocess.DEVNULL)
        print(f"init-model {arch} {preset} {dtype}: {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    return out


def run_extract(actcap, model, corpus, mode, extra):
    with tempfile.TemporaryDirectory(prefix="actcap-wd-") as out:
        cmd = [actcap, "extract", model, "--input", corpus, "--forward-only", "--json",
               "--weights-dtype", mode, "--out", out, "--overwrite", "--quiet"] + extra
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        stdout, stderr = p.stdout.read(), p.stderr.read()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            sys.exit(f"{' '.join(cmd)} failed ({code}): {stderr.strip()}")
        r = json.loads(stdout)
        return {"tps": r["tokens"] / r["seconds"], "wall": wall,
                "rss": usage.ru_maxrss * 1024, "tokens": r["tokens"]}


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actcap", default="build/actcap")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--preset", default="gpt2-small")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--big", action="store_true", help="the Llama-3.1-8B bf16 run (see above)")
    ap.add_argument("--models", default="build/bench-models")
    a = ap.parse_args()
    os.makedirs(a.models, exist_ok=True)
    corpus = os.path.join(a.models, f"wd-corpus-{a.docs}x{a.tokens}.jsonl")

    if a.big:
        make_corpus(corpus, a.docs, a.tokens, 128256)
        model = make_model(a.actcap, "llama", "llama-3.1-8b", "bf16", a.models)
        size = os.path.getsize(os.path.join(model, "model.safetensors"))
        r = run_extract(a.actcap, model, corpus, "keep",
                        ["--devices", "3", "--batch-size", str(a.batch_size)])
        print(f"llama-3.1-8b bf16 ({gib(size)} file), 3 virtual devices, keep: "
              f"{r['tokens']} tokens, {r['tps']:.2f} tokens/s, wall {r['wall']:.1f} s, "
              f"peak RSS {gib(r['rss'])}")
        return

    make_corpus(corpus, a.docs, a.tokens, 32000)
    arms = []
    for dtype in ("bf16", "f16", "f32"):
        model = make_model(a.actcap, a.arch, a.preset, dtype, a.models)
        for mode in (("keep", "f32") if dtype != "f32" else ("keep",)):
            arms.append((dtype, mode, model))
    extra = ["--batch-size", str(a.batch_size)]
    for dtype, mode, model in arms:  # warm-up: page cache, first-touch
        run_extract(a.actcap, model, corpus, mode, extra)
    results = {(d, m): [] for d, m, _ in arms}
    for i in range(a.rounds):
        order = arms if i % 2 == 0 else list(reversed(arms))
        for dtype, mode, model in order:
            results[(dtype, mode)].append(run_extract(a.actcap, model, corpus, mode, extra))

    print(f"{a.arch} {a.preset}, {a.docs} x {a.tokens} tokens, batch {a.batch_size}, "
          f"extract --forward-only, {a.rounds} alternated rounds (medians)\n")
    print("| checkpoint | --weights-dtype | tokens/s | wall s | peak RSS | keep/f32 tokens/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype, mode, _ in arms:
        rs = results[(dtype, mode)]
        ratio = ""
        if mode == "keep" and (dtype, "f32") in results:
            pairs = [k["tps"] / f["tps"] for k, f in zip(rs, results[(dtype, "f32")])]
            ratio = f"{statistics.median(pairs):.3f} ({min(pairs):.3f}-{max(pairs):.3f})"
        print(f"| {dtype} | {mode} | {statistics.median(r['tps'] for r in rs):.0f} | "
              f"{statistics.median(r['wall'] for r in rs):.2f} | "
              f"{gib(statistics.median(r['rss'] for r in rs))} | {ratio} |")


if __name__ == "__main__":
    main()
