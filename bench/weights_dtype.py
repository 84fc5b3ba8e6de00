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

`--mxfp4` instead compares gpt-oss's MXFP4 experts kept packed and decoded per expert as they run
(`keep`) against decoded to float32 at load (`f32`): init-model's gpt_oss model of --preset
(default gpt2-small: 12 layers, 768 wide, 4 experts of 2048, 2 per token), f32, with every
expert matrix quantized to MXFP4 here (the other tensors stay f32, so only the experts differ
between the arms). BENCHMARKS.md item 22 quotes it.

`--fp8` instead compares an FP8 checkpoint (quantization_config "fp8", as DeepSeek-V3 ships) kept
packed and decoded per matrix as it runs (`keep`) against decoded at load (`f32`), and against its
BF16 twin kept as stored (what running a BF16 conversion costs): init-model's llama of --preset,
f32, every linear matrix of its layers quantized here to F8_E4M3 in blocks of 128 x 128 with F32
scales (tests/python/synth.py's encoder), config dtype bfloat16; the twin holds those matrices
decoded and rounded to bf16. Embeddings, norms and lm_head stay f32 in both, so only the layers'
matrices differ between the arms. BENCHMARKS.md item 23 quotes it.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import st  # noqa: E402  the minimal safetensors reader / writer

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def mxfp4_pack(w):
    """A stacked expert matrix [E, in, out] (transformers' layout) as MXFP4 blocks [E, out, in / 32,
    16] and scales [E, out, in / 32]: per block of 32 inputs a power-of-two scale putting the
    largest magnitude in [4, 8) (6 is e2m1's largest), each value rounded to the nearest e2m1."""
    import numpy as np
    a = np.ascontiguousarray(w.transpose(0, 2, 1)).astype(np.float32)
    E, out, n = a.shape
    a = a.reshape(E, out, n // 32, 32)
    amax = np.abs(a).max(-1, keepdims=True)
    exp = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-30))) - 2, -127).clip(-127, 127)
    q = np.abs(a) / np.exp2(exp)
    grid = np.array(E2M1, np.float32)
    idx = np.abs(q[..., None] - grid).argmin(-1).astype(np.uint8)
    nib = idx | (np.signbit(a).astype(np.uint8) << 3)
    blocks = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (exp[..., 0] + 127).astype(np.uint8)


def make_mxfp4_model(actcap, preset, models_dir):
    """Written by a child process: the arrays it holds would otherwise stay in this process's
    resident set, which every forked extract starts with (and ru_maxrss counts)."""
    out = os.path.join(models_dir, f"gpt_oss-{preset}-mxfp4")
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        subprocess.run([sys.executable, os.path.abspath(__file__), "--actcap", actcap, "--preset",
                        preset, "--models", models_dir, "--write-mxfp4", out], check=True)
    return out


def write_mxfp4_model(actcap, preset, models_dir, out):
    src = make_model(actcap, "gpt_oss", preset, "f32", models_dir)
    tensors, meta = st.load(os.path.join(src, "model.safetensors"))
    for name in [k for k in tensors if k.endswith((".experts.gate_up_proj", ".experts.down_proj"))]:
        tensors[name + "_blocks"], tensors[name + "_scales"] = mxfp4_pack(tensors.pop(name))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    st.save(os.path.join(out, "model.safetensors"), tensors, metadata=meta)


def make_fp8_models(actcap, preset, models_dir):
    """The FP8 checkpoint and its BF16 twin, written by a child process (see make_mxfp4_model)."""
    out = os.path.join(models_dir, f"llama-{preset}-fp8")
    if not os.path.exists(os.path.join(out, "twin", "model.safetensors")):
        subprocess.run([sys.executable, os.path.abspath(__file__), "--actcap", actcap, "--preset",
                        preset, "--models", models_dir, "--write-fp8", out], check=True)
    return os.path.join(out, "fp8"), os.path.join(out, "twin")


def write_fp8_models(actcap, preset, models_dir, out):
    import synth  # tests/python: the FP8 encoder and decoder written from the format
    src = make_model(actcap, "llama", preset, "f32", models_dir)
    tensors, meta = st.load(os.path.join(src, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    block = (128, 128)
    fp8, twin, fp8_names, twin_names = {}, {}, {}, {}
    for name, v in tensors.items():
        if not (name.startswith("model.layers.") and synth._fp8_quantized(name, v)):
            fp8[name] = twin[name] = v
            continue
        codes, scales = synth.fp8_quantize(v, block)
        fp8[name], fp8_names[name] = codes, "F8_E4M3"
        fp8[name + "_scale_inv"] = scales
        twin[name], twin_names[name] = synth.fp8_decode(codes, scales, block), "BF16"
    q = dict(synth.FP8_QUANTIZATION_CONFIG, weight_block_size=list(block))
    for d, t, names, c in (("fp8", fp8, fp8_names, dict(cfg, quantization_config=q)),
                           ("twin", twin, twin_names, cfg)):
        os.makedirs(os.path.join(out, d), exist_ok=True)
        with open(os.path.join(out, d, "config.json"), "w") as f:
            json.dump(dict(c, torch_dtype="bfloat16"), f, indent=1)
        st.save(os.path.join(out, d, "model.safetensors"), t, metadata=meta, dtype_names=names)


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
    ap.add_argument("--mxfp4", action="store_true", help="gpt-oss's MXFP4 experts (see above)")
    ap.add_argument("--fp8", action="store_true", help="an FP8 checkpoint (see above)")
    ap.add_argument("--write-mxfp4", help=argparse.SUPPRESS)  # make_mxfp4_model's child
    ap.add_argument("--write-fp8", help=argparse.SUPPRESS)  # make_fp8_models' child
    ap.add_argument("--models", default="build/bench-models")
    a = ap.parse_args()
    if a.write_mxfp4:
        return write_mxfp4_model(a.actcap, a.preset, a.models, a.write_mxfp4)
    if a.write_fp8:
        return write_fp8_models(a.actcap, a.preset, a.models, a.write_fp8)
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
    if a.mxfp4:
        a.arch = "gpt_oss"
        model = make_mxfp4_model(a.actcap, a.preset, a.models)
        arms = [("mxfp4", "keep", model), ("mxfp4", "f32", model)]
    if a.fp8:
        fp8, twin = make_fp8_models(a.actcap, a.preset, a.models)
        arms = [("fp8", "keep", fp8), ("fp8", "f32", fp8), ("bf16 twin", "keep", twin)]
    for dtype in ("bf16", "f16", "f32") if not (a.mxfp4 or a.fp8) else ():
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
    if a.fp8:
        pairs = [k["tps"] / t["tps"] for k, t in zip(results[("fp8", "keep")],
                                                      results[("bf16 twin", "keep")])]
        print(f"\nfp8 keep / bf16 twin keep tokens/s, per round: {statistics.median(pairs):.3f} "
              f"({min(pairs):.3f}-{max(pairs):.3f})")


if __name__ == "__main__":
    main()
