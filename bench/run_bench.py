#!/usr/bin/env python3
"""actcap's benchmark suite: `make bench` runs `/usr/bin/python3 bench/run_bench.py --actcap build/actcap`.

    python3 bench/run_bench.py --actcap build/actcap [--write] [--quick] [--reps N] [--threads N]
                               [--capture-shape BxT] [--models-dir DIR] [--json-out FILE]

In one run, alternating the two sides (A/B, then B/A in the next repetition) and taking medians
over --reps repetitions, it measures with the same intra-op thread count (--threads, default 2):

  1. forward tokens/s of `actcap bench` against a lean eager PyTorch forward
     (bench/eager_forward.py) on gpt2-small and llama-gpt2-small (random-init checkpoints of GPT-2
     124M's shape, made with `actcap init-model`), f32, shapes 1x128, 4x256, 1x1024;
  2. the sgemm roofline (2048^3 torch.mm through the same libtorch_cpu.so.1.13 + OpenBLAS as
     actcap links) and the model FLOP utilisation of each forward;
  3. the cost of capture on gpt2-small at --capture-shape (default 1x128: at 4x256 the seven
     configurations alone would take the whole time budget): every block output, every hook point,
     the bare-reference guard, fingerprinting, transfer verification;
  4. a 3-way virtual-device split (--devices 3) against one device;
  5. peak resident memory of each process (actcap: its JSON; eager: getrusage in its own process).

Every measurement is a fresh process (load outside the timed loop, then warm-up forwards, then
timed forwards; the process reports the median of its timed forwards). The table is printed; with
--write it also replaces the block between `<!-- bench:begin -->` and `<!-- bench:end -->` in
BENCHMARKS.md. Raw results go to --json-out (default build/bench-results.json when build/ exists).
--quick is a smoke run (the `tiny` presets, 1x32, one repetition; under a minute).
"""
import argparse
import datetime
import json
import os
import platform
import hashlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EAGER = REPO / "bench" / "eager_forward.py"
BENCH_MD = REPO / "BENCHMARKS.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

# (shape, warmup, iters) per mode. Every timed process runs warmup + iters forwards.
# The two long shapes take seconds per forward on 2 cores: one warm-up and one timed forward per
# process, and the median over --reps processes.
FULL_SHAPES = [((1, 128), 2, 5), ((4, 256), 1, 1), ((1, 1024), 1, 1)]
QUICK_SHAPES = [((1, 32), 1, 3)]
MODELS_FULL = [("gpt2-small", "gpt2", "gpt2-small"), ("llama-gpt2-small", "llama", "gpt2-small")]
MODELS_QUICK = [("gpt2-tiny", "gpt2", "tiny"), ("llama-tiny", "llama", "tiny")]

# Capture / device configurations of part 3 and 4 (all on the first model, same shape).
CAPTURE_CONFIGS = [
    ("none", []),
    ("blocks", ["--capture", "transformer.h.*"]),
    ("all", ["--capture", "**", "**:input"]),
    ("all, --bare-ref off", ["--capture", "**", "**:input", "--bare-ref", "off"]),
    ("all, --no-fingerprint", ["--capture", "**", "**:input", "--no-fingerprint"]),
    ("--devices 3", ["--devices", "3"]),
    ("--devices 3 --no-verify-transfers", ["--devices", "3", "--no-verify-transfers"]),
]

# The same costs measured inside one process (`actcap bench --ab`): each timed forward of the
# configuration is paired with one of the baseline, alternating which goes first, so both arms
# see the same machine. Separate processes differ by up to +-30% here, far more than the
# few-percent costs the targets are about. (name, extra args, target or None)
AB_CONFIGS = [
    ("every block output vs none", ["--capture", "transformer.h.*", "--ab", "none"], 0.03),
    ("every hook point vs none", ["--capture", "**", "**:input", "--ab", "none"], 0.15),
    ("guard: every hook point, `error` vs `off`", ["--capture", "**", "**:input", "--ab", "bare-ref-off"], 0.01),
    ("fingerprinting: every hook point, XXH3 vs none", ["--capture", "**", "**:input", "--ab", "no-fingerprint"], None),
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, env=None if env is None else dict(os.environ, **env))


# What `actcap` sets for itself (cli/main.cpp: mallopt, and OMP_WAIT_POLICY=passive): the "eager,
# same settings" column gives eager PyTorch the same through environment variables.
SAME_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_TOP_PAD_": str(64 << 20),
                   "OMP_WAIT_POLICY": "passive"}


# ---------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------

def ensure_model(actcap, models_dir, name, arch, preset):
    out = Path(models_dir) / name
    stamp = out / "bench-stamp.json"
    want = {"arch": arch, "preset": preset, "seed": 1}
    if stamp.exists() and (out / "config.json").exists():
        try:
            if json.loads(stamp.read_text()) == want:
                return out
        except ValueError:
            pass
    log(f"making {out}: actcap init-model --arch {arch} --preset {preset} --seed 1")
    r = sh([actcap, "init-model", "--arch", arch, "--preset", preset, "--seed", "1", "--out", str(out)])
    if r.returncode:
        raise SystemExit(f"init-model failed: {r.stderr.strip()}")
    stamp.write_text(json.dumps(want))
    return out


def model_flops(ckpt, batch, seq):
    """FLOPs of one forward of [batch, seq]: see BENCHMARKS.md (multiply-add = 2 FLOPs).

    2 * P_mm * tokens + 2 * V * H * tokens + 4 * L * seq^2 * (n_head * head_dim) * batch, where P_mm
    counts the weights of the matmuls inside the blocks (biases, norms, embeddings excluded)."""
    c = json.loads((Path(ckpt) / "config.json").read_text())
    if c["model_type"] == "gpt2":
        H, L, V = c["n_embd"], c["n_layer"], c["vocab_size"]
        inner = c.get("n_inner") or 4 * H
        p_mm = L * (H * 3 * H + H * H + 2 * H * inner)
        d_attn = H
    else:
        H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        nh = c["num_attention_heads"]
        nkv = c.get("num_key_value_heads") or nh
        hd = c.get("head_dim") or H // nh
        inner = c["intermediate_size"]
        p_mm = L * (H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 3 * H * inner)
        d_attn = nh * hd
    tokens = batch * seq
    return 2 * p_mm * tokens + 2 * V * H * tokens + 4 * L * seq * seq * d_attn * batch


def lib_of(path, name):
    r = sh(["ldd", str(path)])
    for line in r.stdout.splitlines():
        if name in line and "=>" in line:
            return os.path.realpath(line.split("=>")[1].split("(")[0].strip())
    return None


def machine_info(actcap):
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    r = sh([sys.executable, "-c", "import torch, glob, os; print(torch.__version__); "
            "print(sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), '_C.*.so')))[0])"])
    torch_version, torch_c = (r.stdout.split("\n") + ["", ""])[:2]
    a_lib, p_lib = lib_of(actcap, "libtorch_cpu"), lib_of(torch_c, "libtorch_cpu") if torch_c else None
    blas = lib_of(actcap, "libblas")
    mem_gib = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_gib = int(line.split()[1]) / 2**20
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem_gib, "kernel": platform.release(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch_version.strip(), "python": platform.python_version(),
        "actcap_libtorch": a_lib, "python_libtorch": p_lib, "same_libtorch": bool(a_lib) and a_lib == p_lib,
        "blas": blas, "env": {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_", "MKL_", "MALLOC_"))},
        "loadavg_start": os.getloadavg(),
    }


# ---------------------------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------------------------

def run_json(cmd, what, env=None):
    t = time.perf_counter()
    r = sh(cmd, env)
    wall = time.perf_counter() - t
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode or not lines:
        err = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
        log(f"  FAILED {what} (exit {r.returncode}): {' | '.join(err)}")
        return {"error": f"exit {r.returncode}: {' | '.join(err)}", "cmd": cmd}
    d = json.loads(lines[-1])
    d["wall_s"] = wall
    d["cmd"] = cmd
    return d


def actcap_cmd(actcap, ckpt, shape, warmup, iters, threads, extra=()):
    b, t = shape
    return [str(actcap), "bench", str(ckpt), "--batch", str(b), "--seq", str(t), "--iters", str(iters),
            "--warmup", str(warmup), "--threads", str(threads), *extra, "--json"]


def eager_cmd(ckpt, shape, warmup, iters, threads):
    b, t = shape
    return [sys.executable, str(EAGER), str(ckpt), "--batch", str(b), "--seq", str(t), "--iters", str(iters),
            "--warmup", str(warmup), "--threads", str(threads), "--json"]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def tps_of(runs):
    return [r["tokens_per_s"] for r in runs if "tokens_per_s" in r]


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def fmt_bytes(n):
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def fmt(x, spec=".1f", none="n/a"):
    return none if x is None else format(x, spec)


def judge(values, meets):
    """A target is met when every measured value meets it, missed when none does, and inside the
    noise when the values fall on both sides of it."""
    values = [v for v in values if v is not None]
    hits = [meets(v) for v in values]
    return None if not hits else True if all(hits) else False if not any(hits) else "noise"


def verdict(ok, text):
    word = {True: "met", False: "**missed**", "noise": "inside the noise"}.get(ok, "not measured")
    return word + (f" ({text})" if text else "")


def build_report(res):
    m = res["machine"]
    out = []
    if res.get("quick"):
        out.append("*--quick smoke run: tiny models, one repetition — these numbers say nothing about performance.*")
        out.append("")
    out.append(f"Run: {m['date']} — `{res['command']}` — {res['elapsed_s'] / 60:.1f} min, "
               f"{res['reps']} repetitions, {res['threads']} threads each side. actcap binary: built "
               f"{res['binary']['built']}, sha256 {res['binary']['sha256']}…; repository at {res['binary']['git_head']}"
               f"{' with uncommitted changes under src/include/cli' if res['binary']['src_dirty'] else ''} "
               "when the run started (a copy of the binary taken then is what was timed).")
    out.append("")
    out.append(f"Machine: {m['cpu']}, {m['cores']} cores, {fmt(m['mem_gib'], '.0f')} GiB, Linux {m['kernel']}; "
               f"torch {m['torch']} (Python {m['python']}). actcap and Python torch load "
               f"{'the same' if m['same_libtorch'] else 'DIFFERENT'} libtorch_cpu "
               f"(`{m['actcap_libtorch']}`), BLAS `{m['blas']}`"
               + (f"; environment {', '.join(f'{k}={v}' for k, v in sorted(m['env'].items()))}" if m["env"] else "")
               + f". Load average at start {', '.join(f'{x:.1f}' for x in m['loadavg_start'])}, "
               f"at end {', '.join(f'{x:.1f}' for x in m['loadavg_end'])} (shared machine: other jobs ran "
               "during the run; medians of alternated runs damp but do not remove that).")
    out.append("")
    roof = res["roofline_gflops"]
    out.append(f"**sgemm roofline** (Python `torch.mm` {res['sgemm_n']}^3 f32, {res['threads']} threads, same libtorch "
               f"+ OpenBLAS as actcap; median of {len(res['sgemm_out'])} timings over the run): "
               f"**{fmt(roof)} GFLOP/s** into a preallocated output; {fmt(res['sgemm_alloc_gflops'])} GFLOP/s "
               "when each call allocates its output (as every matmul in a forward does).")
    out.append("")
    out.append("**1. Forward, f32** — tokens/s (median over repetitions), ratio = actcap / eager; "
               "MFU = model FLOPs / time / sgemm roofline; peak RSS = ru_maxrss of the process. "
               "\"eager, same settings\" runs the eager side with the runtime settings actcap gives itself "
               "(`MALLOC_MMAP_MAX_=0`, a high trim threshold, `OMP_WAIT_POLICY=passive`): how much of the gap they are.")
    out.append("")
    out.append("| model | shape | actcap tok/s | eager tok/s | ratio (target ≥1.0, aim 1.3) | per-repetition ratios | "
               "eager, same settings tok/s | ratio to it | "
               "actcap GFLOP/s (MFU) | eager GFLOP/s (MFU) | actcap peak RSS | eager peak RSS |")
    out.append("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for row in res["forward"]:
        a, e = row["actcap_tps"], row["eager_tps"]
        ratio = a / e if a and e else None
        def gf(tps):
            if not tps:
                return "n/a"
            g = row["flops"] * tps / row["tokens"] / 1e9
            return f"{g:.1f} ({100 * g / roof:.0f}%)" if roof else f"{g:.1f}"
        out.append(f"| {row['model']} | {row['shape']} | {fmt(a)} | {fmt(e)} | "
                   f"{fmt(ratio, '.2f')}x | {' '.join(f'{x:.2f}' for x in row['paired_ratios'])} | "
                   f"{fmt(row.get('eager_malloc_tps'))} | "
                   f"{fmt(a / row['eager_malloc_tps'] if a and row.get('eager_malloc_tps') else None, '.2f')}x | "
                   f"{gf(a)} | {gf(e)} | "
                   f"{fmt_bytes(row['actcap_rss'])} | {fmt_bytes(row['eager_rss'])} |")
    out.append("")
    cs = res["capture_shape"]
    out.append(f"**3–4. Capture and devices**, {res['capture_model']} {cs} — tokens/s (median), "
               "cost = extra time per forward against the named baseline (time ratio − 1).")
    out.append("")
    out.append("| configuration | tok/s | points | peak RSS | cost | against | target |")
    out.append("|---|---:|---:|---:|---:|---|---|")
    # Capture and guard targets are judged in 3b (same process); only the split's here.
    targets = {"--devices 3": 0.05}
    for c in res["capture"]:
        cost, against, tgt = c.get("cost"), c.get("against", ""), ""
        name = c["name"]
        if name == "all, --bare-ref off":
            label, cost_s = "guard (`error` vs `off`)", res["derived"].get("guard")
            tgt = "see 3b"
        elif name == "all, --no-fingerprint":
            label, cost_s = "fingerprinting (default vs `--no-fingerprint`)", res["derived"].get("fingerprint")
            tgt = "—"
        elif name == "--devices 3 --no-verify-transfers":
            label, cost_s = "transfer verification (default vs `--no-verify-transfers`)", res["derived"].get("verify")
            tgt = "—"
        else:
            label, cost_s = against, cost
            tgt = f"≤ {targets[name] * 100:.0f}%" if targets.get(name) is not None else ""
        if name == "none":
            label, cost_txt = "baseline (no capture, one device)", "—"
        else:
            cost_txt = "n/a" if cost_s is None else f"{100 * cost_s:+.1f}%"
        out.append(f"| `{name}` | {fmt(c['tps'])} | {c.get('points', '')} | {fmt_bytes(c.get('rss'))} | "
                   f"{cost_txt} | {label} | {tgt} |")
    out.append("")
    if res.get("ab"):
        out.append(f"**3b. The same costs inside one process** (`actcap bench … --ab BASELINE`, {cs}, "
                   f"{2 * res.get('capture_iters', 0)} timed pairs per process, alternating which arm goes first; "
                   "median over the processes). These are what the targets are judged on.")
        out.append("")
        out.append("| cost | median | per process | median of per-forward pair ratios | target |")
        out.append("|---|---:|---|---:|---|")
        def pct(x, spec="+.1f"):
            return "n/a" if x is None else f"{100 * x:{spec}}%"
        for r in res["ab"]:
            per = " ".join(pct(x) for x in r["per_process"])
            target = "—" if r["target"] is None else "≤ " + pct(r["target"], ".0f")
            out.append(f"| {r['name']} | {pct(r['cost'])} | {per} | {pct(r['paired'])} | {target} |")
        out.append("")
    out.append("**Targets**")
    out.append("")
    for t in res["targets"]:
        out.append(f"- {t['what']}: {verdict(t['ok'], t['detail'])}")
    return "\n".join(out)


def evaluate_targets(res):
    t = []
    roof = res["roofline_gflops"]
    for row in res["forward"]:
        a, e = row["actcap_tps"], row["eager_tps"]
        if a and e:
            r = a / e
            per = row.get("paired_ratios") or [r]
            t.append({"what": f"forward ≥ 1.0x eager, {row['model']} {row['shape']}",
                      "ok": judge(per, lambda x: x >= 1.0),
                      "detail": f"{r:.3f}x, per repetition {min(per):.2f}–{max(per):.2f}x"
                                + ("; aim 1.3x met" if min(per) >= 1.3 else "; aim 1.3x not met")})
    for row in res["forward"]:
        if row["model"] == res["capture_model"] and row["shape"] == "4x256" and row["actcap_tps"] and roof:
            g = row["flops"] * row["actcap_tps"] / row["tokens"] / 1e9
            t.append({"what": f"≥ 60% of the sgemm roofline, {row['model']} 4x256", "ok": g / roof >= 0.60,
                      "detail": f"{100 * g / roof:.0f}% = {g:.1f} of {roof:.1f} GFLOP/s"})
    cap = {c["name"]: c for c in res["capture"]}
    for r in res.get("ab", []):
        if r["target"] is not None and r["cost"] is not None:
            per = [x for x in r["per_process"] if x is not None]
            t.append({"what": f"{r['name']} ≤ {100 * r['target']:.0f}% (same process)",
                      "ok": judge(per, lambda x: x <= r["target"]),
                      "detail": f"{100 * r['cost']:+.1f}%, per process "
                                + " ".join(f"{100 * x:+.1f}%" for x in per)})
    if cap.get("--devices 3", {}).get("cost") is not None:
        c = cap["--devices 3"]["cost"]
        per = [b / s - 1 for b, s in zip(tps_of(cap["none"]["runs"]), tps_of(cap["--devices 3"]["runs"]))]
        t.append({"what": "3-way virtual-device split ≤ 5% slower than one device",
                  "ok": judge(per or [c], lambda x: x <= 0.05),
                  "detail": f"{100 * c:+.1f}% (medians of separate processes), repetition by repetition "
                            + " ".join(f"{100 * x:+.1f}%" for x in per)})
    for row in res["forward"]:
        if row["shape"] == res["long_shape"] and row["actcap_rss"] and row["eager_rss"]:
            a, e = row["actcap_rss"], row["eager_rss"]
            ar = [x.get("peak_rss_bytes") for x in row["runs"]["actcap"]]
            er = [x.get("peak_rss_bytes") for x in row["runs"]["eager"]]
            pairs = [x / y for x, y in zip(ar, er) if x and y]
            t.append({"what": f"peak memory at {row['shape']} ≤ eager's, {row['model']}",
                      "ok": judge(pairs or [a / e], lambda x: x <= 1.0),
                      "detail": f"{a / 2**20:,.0f} vs {e / 2**20:,.0f} MiB, {100 * (a / e - 1):+.0f}%"})
    return t


def write_md(report):
    block = f"{BEGIN}\n{report}\n{END}"
    text = BENCH_MD.read_text() if BENCH_MD.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, count=1, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    BENCH_MD.write_text(text)


# ---------------------------------------------------------------------------------------------

def parse_shape(s):
    b, t = s.lower().split("x")
    return int(b), int(t)


def main():
    ap = argparse.ArgumentParser(description="actcap benchmark suite (see BENCHMARKS.md)")
    ap.add_argument("--actcap", default=str(REPO / "build" / "actcap"))
    ap.add_argument("--quick", action="store_true", help="smoke run: small presets, tiny shapes, 1 repetition")
    ap.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    ap.add_argument("--reps", type=int, help="repetitions of every measurement (default 3; --quick 1)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of both sides (default 2)")
    ap.add_argument("--capture-shape", help="BxT of the capture/device section (default 1x128; --quick 1x32)")
    ap.add_argument("--capture-warmup", type=int, default=2)
    ap.add_argument("--capture-iters", type=int, default=5)
    ap.add_argument("--sgemm-n", type=int, default=2048)
    ap.add_argument("--models-dir", help="where the random-init checkpoints are kept (default build/bench-models)")
    ap.add_argument("--json-out", help="raw results (default build/bench-results.json)")
    ap.add_argument("--skip-forward", action="store_true", help="only the roofline and the capture/device section")
    ap.add_argument("--skip-capture", action="store_true", help="only the roofline and the forward section")
    ap.add_argument("--report-from", metavar="JSON", help="measure nothing: print (and with --write, write) "
                    "the report of a saved --json-out file")
    a = ap.parse_args()
    if a.report_from:
        res = json.loads(Path(a.report_from).read_text())
        res["targets"] = evaluate_targets(res)
        report = build_report(res)
        print(report)
        if a.write:
            write_md(report)
            log(f"wrote the table of {a.report_from} into {BENCH_MD}")
        return 0

    built = Path(a.actcap).resolve()
    if not built.exists():
        raise SystemExit(f"{built} does not exist; run `make build` first")
    # Time a frozen copy: a rebuild of build/actcap during the run must not mix two binaries.
    snap_dir = tempfile.mkdtemp(prefix="actcap-bench-")
    actcap = Path(snap_dir) / "actcap"
    shutil.copy2(built, actcap)
    binary = binary_info(built, actcap)
    try:
        return run_suite(a, actcap, binary)
    finally:
        shutil.rmtree(snap_dir, ignore_errors=True)


def binary_info(built, copy):
    h = hashlib.sha256(copy.read_bytes()).hexdigest()[:12]
    mtime = datetime.datetime.fromtimestamp(built.stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = sh(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = sh(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", "src", "include", "cli"]).stdout.strip()
    return {"path": str(built), "sha256": h, "built": mtime, "git_head": head, "src_dirty": bool(dirty)}


def run_suite(a, actcap, binary):
    reps = a.reps or (1 if a.quick else 3)
    shapes = QUICK_SHAPES if a.quick else FULL_SHAPES
    models = MODELS_QUICK if a.quick else MODELS_FULL
    cap_shape = parse_shape(a.capture_shape or ("1x32" if a.quick else "1x128"))
    cap_warm, cap_iters = (1, 3) if a.quick else (a.capture_warmup, a.capture_iters)
    sgemm_n = 512 if a.quick else a.sgemm_n
    build = REPO / "build"
    models_dir = Path(a.models_dir or (build / "bench-models"))
    models_dir.mkdir(parents=True, exist_ok=True)
    json_out = a.json_out or (str(build / ("bench-results-quick.json" if a.quick else "bench-results.json"))
                              if build.is_dir() else None)

    t_start = time.perf_counter()
    machine = machine_info(actcap)
    ckpts = {name: ensure_model(actcap, models_dir, name, arch, preset) for name, arch, preset in models}
    first = models[0][0]

    fwd_runs = {(m, s): {"actcap": [], "eager": [], "eager_malloc": []} for m, _, _ in models for s, _, _ in shapes}
    cap_runs = {name: [] for name, _ in CAPTURE_CONFIGS}
    ab_runs = {name: [] for name, _, _ in AB_CONFIGS}
    sgemm_runs = []

    for rep in range(reps):
        log(f"repetition {rep + 1}/{reps}")
        r = run_json([sys.executable, str(EAGER), "--sgemm", str(sgemm_n), "--reps", "5", "--threads", str(a.threads)],
                     "sgemm")
        sgemm_runs.append(r)
        if "out_median_gflops" in r:
            log(f"  sgemm {sgemm_n}^3: {r['out_median_gflops']:.1f} GFLOP/s (allocating: {r['alloc_median_gflops']:.1f})")
        if not a.skip_forward:
            for m, _, _ in models:
                for shape, warm, iters in shapes:
                    sides = ["actcap", "eager", "eager_malloc"]
                    sides = sides if rep % 2 == 0 else sides[::-1]
                    for side in sides:
                        cmd = (actcap_cmd(actcap, ckpts[m], shape, warm, iters, a.threads) if side == "actcap"
                               else eager_cmd(ckpts[m], shape, warm, iters, a.threads))
                        d = run_json(cmd, f"{side} {m} {shape[0]}x{shape[1]}",
                                     SAME_MALLOC_ENV if side == "eager_malloc" else None)
                        fwd_runs[(m, shape)][side].append(d)
                        if "tokens_per_s" in d:
                            log(f"  {side:6s} {m} {shape[0]}x{shape[1]}: {d['tokens_per_s']:8.1f} tok/s "
                                f"(median {d['median_s']:.3f} s, peak RSS {d['peak_rss_bytes'] / 2**20:,.0f} MiB, "
                                f"process {d['wall_s']:.1f} s)")
        if not a.skip_capture:
            order = CAPTURE_CONFIGS[rep % len(CAPTURE_CONFIGS):] + CAPTURE_CONFIGS[:rep % len(CAPTURE_CONFIGS)]
            if rep % 2:
                order = order[::-1]
            for name, extra in order:
                d = run_json(actcap_cmd(actcap, ckpts[first], cap_shape, cap_warm, cap_iters, a.threads, extra),
                             f"actcap {name}")
                cap_runs[name].append(d)
                if "tokens_per_s" in d:
                    log(f"  actcap {first} {cap_shape[0]}x{cap_shape[1]} [{name}]: {d['tokens_per_s']:8.1f} tok/s "
                        f"(median {d['median_s']:.3f} s, {d['captured_points']} points, "
                        f"peak RSS {d['peak_rss_bytes'] / 2**20:,.0f} MiB)")

            for name, extra, _ in (AB_CONFIGS if rep % 2 == 0 else AB_CONFIGS[::-1]):
                d = run_json(actcap_cmd(actcap, ckpts[first], cap_shape, cap_warm, 2 * cap_iters, a.threads, extra),
                             f"actcap --ab {name}")
                ab_runs[name].append(d)
                if "ab_cost" in d:
                    log(f"  actcap {first} {cap_shape[0]}x{cap_shape[1]} [{name}]: {100 * d['ab_cost']:+.1f}% "
                        f"(per-forward pairs {100 * d['ab_paired_cost']:+.1f}%)")

    machine["loadavg_end"] = os.getloadavg()
    sg_out = [x for r in sgemm_runs for x in r.get("out_gflops", [])]
    sg_alloc = [x for r in sgemm_runs for x in r.get("alloc_gflops", [])]
    res = {
        "command": " ".join([sys.executable, "bench/run_bench.py"] + sys.argv[1:]), "binary": binary,
        "machine": machine, "reps": reps, "threads": a.threads, "quick": a.quick,
        "sgemm_n": sgemm_n, "sgemm_out": sg_out, "sgemm_alloc": sg_alloc,
        "roofline_gflops": med(sg_out), "sgemm_alloc_gflops": med(sg_alloc),
        "forward": [], "capture": [], "capture_model": first,
        "capture_shape": f"{cap_shape[0]}x{cap_shape[1]}", "capture_iters": cap_iters,
        "long_shape": f"{shapes[-1][0][0]}x{shapes[-1][0][1]}",
        "derived": {},
    }
    if not a.skip_forward:
        for m, _, _ in models:
            for shape, warm, iters in shapes:
                runs = fwd_runs[(m, shape)]
                res["forward"].append({
                    "model": m, "shape": f"{shape[0]}x{shape[1]}", "tokens": shape[0] * shape[1],
                    "warmup": warm, "iters": iters,
                    "flops": model_flops(ckpts[m], *shape),
                    "actcap_tps": med(tps_of(runs["actcap"])), "eager_tps": med(tps_of(runs["eager"])),
                    "eager_malloc_tps": med(tps_of(runs["eager_malloc"])),
                    "actcap_rss": med([r.get("peak_rss_bytes") for r in runs["actcap"]]),
                    "eager_rss": med([r.get("peak_rss_bytes") for r in runs["eager"]]),
                    "eager_rss_after_load": med([r.get("rss_after_load_bytes") for r in runs["eager"]]),
                    "paired_ratios": [x["tokens_per_s"] / y["tokens_per_s"]
                                      for x, y in zip(runs["actcap"], runs["eager"])
                                      if "tokens_per_s" in x and "tokens_per_s" in y],
                    "runs": runs,
                })
    if not a.skip_capture:
        tps = {name: med(tps_of(cap_runs[name])) for name, _ in CAPTURE_CONFIGS}

        def cost(name, base):
            return tps[base] / tps[name] - 1 if tps.get(name) and tps.get(base) else None
        against = {"blocks": "none", "all": "none", "--devices 3": "none", "--devices 3 --no-verify-transfers": "none",
                   "all, --bare-ref off": "none", "all, --no-fingerprint": "none"}
        for name, _ in CAPTURE_CONFIGS:
            runs = cap_runs[name]
            res["capture"].append({
                "name": name, "tps": tps[name],
                "points": next((r["captured_points"] for r in runs if "captured_points" in r), ""),
                "rss": med([r.get("peak_rss_bytes") for r in runs]),
                "cost": cost(name, against[name]) if name in against else None,
                "against": f"`{against[name]}`" if name in against else "",
                "runs": runs,
            })
        res["ab"] = [{"name": name, "target": tgt, "cost": med([r.get("ab_cost") for r in ab_runs[name]]),
                      "paired": med([r.get("ab_paired_cost") for r in ab_runs[name]]),
                      "per_process": [r.get("ab_cost") for r in ab_runs[name]], "runs": ab_runs[name]}
                     for name, _, tgt in AB_CONFIGS]
        res["derived"] = {"guard": cost("all", "all, --bare-ref off"),
                          "fingerprint": cost("all", "all, --no-fingerprint"),
                          "verify": cost("--devices 3", "--devices 3 --no-verify-transfers")}
    res["elapsed_s"] = time.perf_counter() - t_start
    res["targets"] = evaluate_targets(res)
    report = build_report(res)
    print(report)
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=1))
        log(f"raw results: {json_out}")
    if a.write:
        write_md(report)
        log(f"wrote the table into {BENCH_MD}")
    failed = [r for runs in list(cap_runs.values()) + [x for v in fwd_runs.values() for x in v.values()]
              for r in runs if "error" in r] + [r for r in sgemm_runs if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
