#!/usr/bin/env python3
"""Mixture-of-experts forward: actcap against a lean eager PyTorch forward, and the cost of capturing
the routers. BENCHMARKS.md item 21.

    /usr/bin/python3 bench/moe_bench.py --actcap build/actcap [--reps 5] [--threads 2]
                                        [--shapes 1x128,4x128] [--models-dir DIR] [--json-out FILE]

The model is `actcap init-model --arch mixtral --preset gpt2-small --seed 1` (12 layers, 768 wide,
12 heads / 4 KV heads, 4 experts of 2048 per layer, 2 chosen per token, vocab 32000: 294.6M
parameters, 181M of them used per token, embedding and head included), f32. Each repetition runs, for every shape, three processes in
a rotated order: `actcap bench` (forward to the logits of every position), `actcap bench --capture
'model.layers.*.mlp.gate' 'model.layers.*.mlp'` (every router's logits and every sparse block's
output, through SafeCapturer), and bench/eager_forward.py (the same forward in torch.nn.functional
ops as transformers 5 runs Mixtral by default: float32 softmax router, top 2 renormalised, tokens
sorted by expert, one GEMM per expert, fused gate/up). Each process loads outside its timed loop,
runs --warmup untimed and --iters timed forwards, and reports the median; the table gives the
median over the repetitions and the per-repetition ratios (min / median / max). Both sides use the
same libtorch_cpu and OpenBLAS, with the same intra-op thread count.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EAGER = REPO / "bench" / "eager_forward.py"
CAPTURE = ["--capture", "model.layers.*.mlp.gate", "model.layers.*.mlp"]


def run_json(cmd, env):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actcap", default=str(REPO / "build" / "actcap"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="1x128,4x128")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--preset", default="gpt2-small")
    ap.add_argument("--models-dir", default=str(REPO / "build" / "bench-models"))
    ap.add_argument("--json-out")
    a = ap.parse_args()

    # A private copy of the binary: a rebuild during the run cannot mix two binaries.
    tmp = Path(tempfile.mkdtemp(prefix="moe-bench-"))
    binary = tmp / "actcap"
    shutil.copy2(a.actcap, binary)
    model = Path(a.models_dir) / f"mixtral-{a.preset}"
    if not (model / "config.json").exists():
        subprocess.run([binary, "init-model", "--arch", "mixtral", "--preset", a.preset, "--seed", "1",
                        "--out", model], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    sides = {
        "actcap": lambda B, T: [binary, "bench", model, "--batch", B, "--seq", T, "--iters", a.iters,
                                "--warmup", a.warmup, "--threads", a.threads, "--json"],
        "actcap + routers": lambda B, T: [binary, "bench", model, "--batch", B, "--seq", T, "--iters",
                                          a.iters, "--warmup", a.warmup, "--threads", a.threads,
                                          "--json", *CAPTURE],
        "eager": lambda B, T: [sys.executable, EAGER, model, "--batch", B, "--seq", T, "--iters", a.iters,
                               "--warmup", a.warmup, "--threads", a.threads, "--json"],
    }
    names = list(sides)
    results = {(s, n): [] for s in shapes for n in names}
    for rep in range(a.reps):
        for shape in shapes:
            order = names[rep % 3:] + names[:rep % 3]
            for n in order:
                r = run_json(sides[n](*shape), env)
                results[(shape, n)].append(r["tokens_per_s"])
            print(f"rep {rep + 1}/{a.reps} {shape[0]}x{shape[1]}: " + ", ".join(
                f"{n} {results[(shape, n)][-1]:.0f} tok/s" for n in names), file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)

    print(f"mixtral {a.preset}, f32, {a.threads} threads, {a.reps} repetitions "
          f"({a.warmup} + {a.iters} forwards per process)\n")
    print("| shape | actcap tok/s | eager tok/s | actcap / eager (min / median / max) "
          "| with routers tok/s | routers' cost (min / median / max) |")
    print("|---|---:|---:|---:|---:|---:|")
    out = []
    for shape in shapes:
        act, cap, eag = (results[(shape, n)] for n in names)
        speed = sorted(x / y for x, y in zip(act, eag))
        cost = sorted(x / y - 1 for x, y in zip(act, cap))
        row = dict(shape=f"{shape[0]}x{shape[1]}", actcap=statistics.median(act),
                   eager=statistics.median(eag), routers=statistics.median(cap),
                   ratio=[speed[0], statistics.median(speed), speed[-1]],
                   capture_cost=[cost[0], statistics.median(cost), cost[-1]], raw=dict(
                       actcap=act, eager=eag, routers=cap))
        out.append(row)
        print(f"| {row['shape']} | {row['actcap']:.0f} | {row['eager']:.0f} | "
              f"{speed[0]:.2f} / {statistics.median(speed):.2f} / {speed[-1]:.2f} | "
              f"{row['routers']:.0f} | {cost[0]:+.1%} / {statistics.median(cost):+.1%} / {cost[-1]:+.1%} |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
