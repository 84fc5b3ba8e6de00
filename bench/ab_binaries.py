#!/usr/bin/python3
"""Two actcap binaries, the same command, alternated: is a change inside the noise?

For refactors that must keep performance (BENCHMARKS.md, "What changed"). Each pair runs the
command once with each binary, alternating which goes first; one warm-up pair is not counted.
Reports whole-process wall time per arm (median, min, max) and the after/before ratio pair by pair
(min / median / max), and checks the two arms wrote byte-identical files when the command writes an
output folder ({out} in the command).

  /usr/bin/python3 bench/ab_binaries.py --before /tmp/actcap-old --after build/actcap --pairs 5 \\
      -- extract build/bench-models/gpt2-small --input build/bench-corpus.jsonl \\
         --capture 'transformer.h.*' --out {out} --overwrite --batch-size 8 --quiet

One binary against itself with a setting changed: `--before-env KEY=VALUE` / `--after-env` (e.g.
`--before-env ACTCAP_NO_REEXEC=1`), `--before-extra` / `--after-extra` for arguments.

`--corpus N` writes build/bench-corpus.jsonl first: N documents of 128 token ids (seed 0), the
corpus BENCHMARKS.md item 6 and 7 use. `--init ARCH:PRESET` makes build/bench-models/<name> with
`init-model` when missing (gpt2:gpt2-small -> gpt2-small, llama:gpt2-small -> llama-gpt2-small).
"""
import argparse
import filecmp
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time


def make_corpus(path, docs, tokens=128, vocab=32000, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(docs):
            f.write(json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(tokens)]}) + "\n")


def make_model(actcap, spec, models_dir):
    arch, preset = spec.split(":")
    name = preset if arch == "gpt2" else f"{arch}-{preset}"
    out = os.path.join(models_dir, name)
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        subprocess.run([actcap, "init-model", "--arch", arch, "--preset", preset, "--seed", "0",
                        "--out", out], check=True, stdout=subprocess.DEVNULL)
    return out


def run_once(binary, args, out, env=None):
    cmd = [binary] + [a.replace("{out}", out) for a in args]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return wall


def same_folder(a, b):
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    return all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--corpus", type=int, default=0, help="write build/bench-corpus.jsonl first")
    ap.add_argument("--init", action="append", default=[], help="ARCH:PRESET models to create")
    ap.add_argument("--models-dir", default="build/bench-models")
    ap.add_argument("--before-extra", default="", help="arguments only the before arm adds")
    ap.add_argument("--after-extra", default="",
                    help="arguments only the after arm adds (one binary, two settings: give the "
                         "same binary twice, e.g. --after-extra '--copy-window 0')")
    ap.add_argument("--before-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable only the before arm sets (repeatable)")
    ap.add_argument("--after-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable only the after arm sets (repeatable)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    o = ap.parse_args()
    args = o.command[1:] if o.command and o.command[0] == "--" else o.command
    if not args:
        ap.error("give the actcap command after --")
    if o.corpus:
        os.makedirs("build", exist_ok=True)
        make_corpus("build/bench-corpus.jsonl", o.corpus)
    for spec in o.init:
        make_model(o.after, spec, o.models_dir)
    envs = {}
    for arm in ("before", "after"):
        pairs = getattr(o, arm + "_env")
        if any(not p.partition("=")[0] or "=" not in p for p in pairs):
            ap.error(f"--{arm}-env takes KEY=VALUE")
        envs[arm] = dict(os.environ, **dict(p.split("=", 1) for p in pairs)) if pairs else None

    with tempfile.TemporaryDirectory() as tmp:
        outs = {"before": os.path.join(tmp, "before"), "after": os.path.join(tmp, "after")}
        walls = {"before": [], "after": []}
        for i in range(o.pairs + 1):  # pair 0 warms the page cache and is not counted
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for arm in order:
                extra = shlex.split(getattr(o, arm + "_extra"))
                w = run_once(getattr(o, arm), args + extra, outs[arm], envs[arm])
                if i > 0:
                    walls[arm].append(w)
        identical = None
        # --forward-only writes nothing: there is no folder to compare.
        if any("{out}" in a for a in args) and os.path.isdir(outs["before"]):
            identical = same_folder(outs["before"], outs["after"])

    ratios = [a / b for a, b in zip(walls["after"], walls["before"])]
    print(f"command: actcap {' '.join(args)}")
    for arm in ("before", "after"):
        if getattr(o, arm + "_extra"):
            print(f"{arm} adds: {getattr(o, arm + '_extra')}")
        if getattr(o, arm + "_env"):
            print(f"{arm} sets: {' '.join(getattr(o, arm + '_env'))}")
    print(f"pairs: {o.pairs} (after one warm-up pair), alternating which binary goes first")
    for arm in ("before", "after"):
        w = walls[arm]
        print(f"{arm:6}: median {statistics.median(w):.3f} s  (min {min(w):.3f}, max {max(w):.3f})"
              f"  {getattr(o, arm)}")
    print(f"after/before, pair by pair: min {min(ratios):.3f} / median {statistics.median(ratios):.3f}"
          f" / max {max(ratios):.3f}")
    inside = min(ratios) <= 1.0 <= max(ratios)
    print("verdict: " + ("inside the noise (pair ratios fall on both sides of 1)" if inside else
                         ("after is faster in every pair" if max(ratios) < 1 else
                          "after is slower in every pair")))
    if identical is not None:
        print("output folders: " + ("byte-identical" if identical else "DIFFER"))
        if not identical:
            sys.exit(1)


if __name__ == "__main__":
    main()
