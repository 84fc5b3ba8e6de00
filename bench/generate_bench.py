#!/usr/bin/python3
"""Decoding with the KV cache (`Engine.generate`) against the same greedy decoding without one (one
full forward of the growing sequence per new token, `Engine.run(..., logits=True)`, argmax), in one
process, the arms alternated repetition by repetition (BENCHMARKS.md item 15).

  /usr/bin/python3 bench/generate_bench.py                      # gpt2-small, 1 x 32 prompt, 64 new, 5 reps
  /usr/bin/python3 bench/generate_bench.py --batch 8 --reps 3   # the batched run (about 6 min here)
  /usr/bin/python3 bench/generate_bench.py --model demo --new 8 --reps 2 --json /tmp/g.json   # smoke

Arms, for each batch size B (B prompts of --prompt random token ids, seed 0, --new tokens each,
EOS ignored so every arm makes exactly --new tokens):

  cached          Engine.generate(prompts, max_new_tokens=N, stop_at_eos=False): a prompt pass, then
                  N - 1 decoding steps (the last token is not fed back without a capture).
  cached+capture  the same, capturing every block output (--capture, default the architecture's
                  'transformer.h.*' / 'model.layers.*'): N decoding steps (the last token is fed back
                  so that it has activations), rows stitched and verified after the steps.
  no cache        N calls of Engine.run(seqs, <final norm>, positions='last', logits=True), each a
                  full forward of the whole sequence so far (P, P+1, ..., P+N-1 tokens), argmax of the
                  last position's logits (torch.argmax: the first maximum, as generate's greedy
                  choice). Each call is timed whole (it also places the model and captures one row).

Reported per arm (median over --reps, min-max): ms per new token = compute time / N (cached:
prompt_seconds + decode_seconds, which exclude placement and Python; no cache: the N run() calls);
ms per decoding step (cached: decode_seconds / decoding forwards; no cache: the mean of calls 2..N,
the forwards that a decoding step replaces); wall seconds of the arm (whole generate() call, or the
whole loop). Ratios are medians of the per-repetition ratios, with their min-max. The three arms must
produce the same tokens (checked every repetition; the smallest gap between the best and second-best
logit met by the no-cache arm says how close a tie came). Also reported: generate()'s time outside
its own timers (wall - prompt_seconds - decode_seconds: placement, planning, Python) and one run() of
a one-token sequence (placement and a one-token forward: what a decoding step costs without the
cache's keys), medians over --reps.

Threads: --threads (default 2) for torch's intra-op pool, which the engine shares, and
ACTCAP_THREADS=N in the environment. Like the CLI, the script re-executes itself once with
OMP_WAIT_POLICY=passive unless it is set (--no-reexec skips that) and keeps freed memory
(actcap.keep_freed_memory(); --glibc-defaults skips that). Needs the Python package (make build).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ensure_model(actcap_bin, models_dir, arch, preset):
    """build/bench-models/<name> (gpt2-small, llama-gpt2-small, ...) as it is, or made with
    init-model --seed 0 when missing (as bench/ab_binaries.py makes it; bench/run_bench.py uses seed
    1 at the same path). Timing does not depend on the weights' values."""
    name = preset if arch == "gpt2" else f"{arch}-{preset}"
    out = os.path.join(models_dir, name)
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        log(f"making {out}: actcap init-model --arch {arch} --preset {preset} --seed 0")
        subprocess.run([actcap_bin, "init-model", "--arch", arch, "--preset", preset, "--seed", "0",
                        "--out", out], check=True, stdout=subprocess.DEVNULL)
    return out


def med(xs):
    return statistics.median(xs)


def spread(xs, scale=1.0, spec=".1f"):
    return f"{scale * med(xs):{spec}} ({scale * min(xs):{spec}}-{scale * max(xs):{spec}})"


def blocks_pattern(engine):
    return "transformer.h.*" if engine.config["arch"] == "gpt2" else "model.layers.*"


def final_norm(engine):
    """The last hook point before the LM head: one cheap row for run() to capture."""
    names = [p.name for p in engine.points() if not p.name.endswith(":input")]
    head = [n for n in names if n.endswith("lm_head")]
    return names[names.index(head[0]) - 1] if head and names.index(head[0]) > 0 else names[-1]


def arm_cached(engine, prompts, new, capture=None):
    t0 = time.perf_counter()
    g = engine.generate(prompts, capture, max_new_tokens=new, stop_at_eos=False)
    wall = time.perf_counter() - t0
    steps = g.forwards - 1
    if capture is not None:
        rows = sum(len(s.tokens) for s in g.sequences)
        for name, t in g.activations.items():
            assert t.shape[0] == rows, f"{name}: {t.shape[0]} rows, expected {rows}"
    return {"tokens": [s.tokens for s in g.sequences],
            "per_token": (g.prompt_seconds + g.decode_seconds) / new,
            "per_step": g.decode_seconds / steps if steps else float("nan"),
            "prompt": g.prompt_seconds, "decode": g.decode_seconds, "steps": steps, "wall": wall}


def arm_no_cache(engine, prompts, new, point):
    import torch
    seqs = [list(p) for p in prompts]
    calls, gap = [], float("inf")
    t_all = time.perf_counter()
    for _ in range(new):
        t0 = time.perf_counter()
        r = engine.run(seqs, point, positions="last", logits=True)
        calls.append(time.perf_counter() - t0)
        last = r["logits"][:, -1]  # every sequence has the same length
        top2 = torch.topk(last.float(), 2, dim=-1).values
        gap = min(gap, float((top2[:, 0] - top2[:, 1]).min()))
        for s, t in zip(seqs, last.argmax(-1).tolist()):
            s.append(t)
    wall = time.perf_counter() - t_all
    return {"tokens": seqs, "per_token": sum(calls) / new,
            "per_step": sum(calls[1:]) / (new - 1) if new > 1 else float("nan"),
            "first_call": calls[0], "last_call": calls[-1], "wall": wall, "min_top2_gap": gap,
            "calls": calls}


def check_same(results, batch):
    ref = results["no cache"]["tokens"]
    for arm in ("cached", "cached+capture"):
        got = results[arm]["tokens"]
        if got != ref:
            for b, (x, y) in enumerate(zip(got, ref)):
                if x != y:
                    i = next(i for i, (u, v) in enumerate(zip(x, y)) if u != v)
                    raise SystemExit(f"batch {batch}: {arm} and no cache differ at sequence {b}, "
                                     f"position {i}: {x[i]} vs {y[i]} (smallest top-2 logit gap "
                                     f"{results['no cache']['min_top2_gap']:.3g})")


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = next(int(l.split()[1]) for l in f if l.startswith("MemTotal")) / 2**20
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem, "kernel": platform.release()}


def report(res):
    a, m = res["args"], res["machine"]
    out = [f"Run: {res['date']} — `{res['command']}` — {res['seconds']:.0f} s in one process. "
           f"Model {res['model']} ({res['arch']}, {res['layers']} layers, vocab {res['vocab']}); "
           f"prompt {a['prompt']} tokens, {a['new']} new tokens, greedy, {a['reps']} repetitions, "
           f"{res['threads']} threads, OMP_WAIT_POLICY={res['omp_wait_policy']}, "
           f"{'freed memory kept' if res['keep_freed_memory'] else 'glibc malloc defaults'}.",
           f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']:.0f} GiB, Linux {m['kernel']}; "
           f"torch {res['torch']}. Load average at start "
           f"{', '.join(f'{x:.1f}' for x in res['loadavg_start'])}, at end "
           f"{', '.join(f'{x:.1f}' for x in res['loadavg_end'])}.",
           f"Same tokens in every arm and repetition (smallest top-2 logit gap of the no-cache arm: "
           f"{res['min_top2_gap']:.3g}). Captured: `{res['capture']}` ({res['capture_points']} points); "
           f"no-cache run() captures `{res['run_point']}` (last position). generate()'s time "
           f"outside its timers (placement, Python): {1e3 * res['generate_overhead_s']:.1f} ms per "
           f"call; run() of a one-token sequence: {1e3 * res['one_token_run_s']:.1f} ms.", "",
           "| B | arm | ms per new token | ms per decoding step | prompt pass ms | wall s (arm) |",
           "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for B, r in res["batches"].items():
        for arm in ("cached", "cached+capture", "no cache"):
            t = r["times"][arm]
            prompt = spread(t["prompt"], 1e3) if "prompt" in t else spread(t["first_call"], 1e3) + " (first call)"
            out.append(f"| {B} | {arm} | {spread(t['per_token'], 1e3)} | {spread(t['per_step'], 1e3)} | "
                       f"{prompt} | {spread(t['wall'], 1, '.2f')} |")
    out += ["", "Ratios (median of the per-repetition ratios, min-max):", "",
            "| B | no cache / cached, per new token | no cache / cached, per decoding step | "
            "capture / no capture, per decoding step | capture / no capture, wall |",
            "| ---: | ---: | ---: | ---: | ---: |"]
    for B, r in res["batches"].items():
        q = r["ratios"]
        out.append(f"| {B} | {spread(q['nocache_per_token'], 1, '.2f')}x | "
                   f"{spread(q['nocache_per_step'], 1, '.2f')}x | {spread(q['capture_per_step'], 1, '.3f')} | "
                   f"{spread(q['capture_wall'], 1, '.3f')} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None,
                    help="checkpoint folder or 'demo' (default: build/bench-models/<--preset>, made with init-model)")
    ap.add_argument("--arch", default="gpt2", help="init-model architecture of the default model (gpt2)")
    ap.add_argument("--preset", default="gpt2-small", help="init-model preset of the default model (gpt2-small)")
    ap.add_argument("--models-dir", default=os.path.join(REPO, "build", "bench-models"))
    ap.add_argument("--actcap", default=os.path.join(REPO, "build", "actcap"), help="for init-model")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens P (default 32)")
    ap.add_argument("--new", type=int, default=64, help="new tokens N (default 64)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes (default 1; e.g. 1 8)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every arm (default 5)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--capture", default=None, help="the capture arm's pattern (default: every block output)")
    ap.add_argument("--devices", default=None, help="actcap.load(devices=...) (default one device)")
    ap.add_argument("--json", default=None, help="write every timing to this file")
    ap.add_argument("--no-reexec", action="store_true", help="do not re-execute with OMP_WAIT_POLICY=passive")
    ap.add_argument("--glibc-defaults", action="store_true", help="do not call actcap.keep_freed_memory()")
    a = ap.parse_args()
    if a.new < 2 or a.prompt < 1 or a.reps < 1 or min(a.batch) < 1:
        ap.error("--new must be at least 2, --prompt, --reps and --batch at least 1")

    if not a.no_reexec and "OMP_WAIT_POLICY" not in os.environ:
        env = dict(os.environ, OMP_WAIT_POLICY="passive", ACTCAP_THREADS=str(a.threads))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)  # libgomp reads it when loaded
    os.environ["ACTCAP_THREADS"] = str(a.threads)

    import torch
    sys.path.insert(0, os.path.join(REPO, "build", "python"))
    import actcap

    torch.set_num_threads(a.threads)
    kept = False if a.glibc_defaults else actcap.keep_freed_memory()
    model = a.model or ensure_model(a.actcap, a.models_dir, a.arch, a.preset)
    start = time.perf_counter()
    loadavg_start = os.getloadavg()
    engine = actcap.load(model, devices=a.devices)
    cfg = engine.config
    capture = a.capture or blocks_pattern(engine)
    point = final_norm(engine)
    n_points = len(engine.resolve(capture))
    gen = torch.Generator().manual_seed(0)
    prompts = {B: torch.randint(0, cfg["vocab_size"], (B, a.prompt), generator=gen).tolist() for B in a.batch}

    # Warm-up, untimed: every arm once, short.
    for B in a.batch:
        arm_cached(engine, prompts[B], 4)
        arm_cached(engine, prompts[B], 4, capture)
        arm_no_cache(engine, prompts[B], 2, point)

    arms = ["cached", "no cache", "cached+capture"]
    raw = {B: {arm: [] for arm in arms} for B in a.batch}
    one_token = []
    gap = float("inf")
    overhead = []
    for rep in range(a.reps):
        for B in a.batch:
            order = arms[rep % 3:] + arms[:rep % 3]  # rotated: each arm goes first in turn
            results = {}
            for arm in order:
                if arm == "no cache":
                    results[arm] = arm_no_cache(engine, prompts[B], a.new, point)
                else:
                    results[arm] = arm_cached(engine, prompts[B], a.new, capture if arm == "cached+capture" else None)
            check_same(results, B)
            gap = min(gap, results["no cache"]["min_top2_gap"])
            for arm in arms:
                raw[B][arm].append({k: v for k, v in results[arm].items() if k != "tokens"})
            overhead += [r["wall"] - r["prompt"] - r["decode"] for arm, r in results.items() if arm != "no cache"]
            log(f"rep {rep + 1}/{a.reps} B={B}: " + ", ".join(
                f"{arm} {1e3 * results[arm]['per_step']:.1f} ms/step" for arm in arms))
        t0 = time.perf_counter()
        engine.run([[0]], point, positions="last", logits=True)
        one_token.append(time.perf_counter() - t0)

    batches = {}
    for B in a.batch:
        times = {arm: {k: [r[k] for r in raw[B][arm]] for k in raw[B][arm][0] if k != "calls"} for arm in arms}
        c, n, k = raw[B]["cached"], raw[B]["no cache"], raw[B]["cached+capture"]
        ratios = {
            "nocache_per_token": [y["per_token"] / x["per_token"] for x, y in zip(c, n)],
            "nocache_per_step": [y["per_step"] / x["per_step"] for x, y in zip(c, n)],
            "capture_per_step": [z["per_step"] / x["per_step"] for x, z in zip(c, k)],
            "capture_wall": [z["wall"] / x["wall"] for x, z in zip(c, k)],
        }
        batches[B] = {"times": times, "ratios": ratios}
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["/usr/bin/python3", "bench/generate_bench.py"] + sys.argv[1:]),
        "args": vars(a), "machine": machine(), "torch": torch.__version__,
        "model": model, "arch": cfg["arch"], "layers": cfg["num_hidden_layers"], "vocab": cfg["vocab_size"],
        "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "keep_freed_memory": kept, "capture": capture, "capture_points": n_points, "run_point": point,
        "one_token_run_s": med(one_token), "generate_overhead_s": med(overhead), "min_top2_gap": gap,
        "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg(),
        "seconds": time.perf_counter() - start, "batches": batches,
    }
    print(report(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**res, "raw": {str(B): raw[B] for B in a.batch}}, f, indent=1, default=str)
        log(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
