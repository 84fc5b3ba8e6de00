#!/usr/bin/env python3
"""actcap's GPU benchmark (issue 15 item 8; BENCHMARKS.md "GPU benchmark"): actcap against Hugging
Face transformers on the same weights, side by side in one process, tokens/s.

    python3 bench/gpu_bench.py [--actcap build-gpu/actcap] [--out bench.md] [--quick]
    python3 bench/gpu_bench.py --device cpu --smoke --out /tmp/bench.md   # testable without a GPU

scripts/gpu-check.sh runs it as its `bench` stage. Models (random-init checkpoints in Hugging Face
layout, bf16 on disk; timing does not depend on the weights' values):
  gpt2-small    `actcap init-model --arch gpt2 --preset gpt2-small --dtype bf16` (GPT-2 124M), 8x1024
  llama-3.2-1b  Llama-3.2-1B's config.json values written over `actcap init-model --arch llama
                --preset llama-3.1-8b --config-only`; weights written here (N(0, 0.02), norms 1), 4x1024
  llama-3-8b    the llama-3.1-8b preset (Llama-3-8B's dimensions) cut to --layers-8b of its 32 layers
                (default 8: a full 16 GB checkpoint cannot be written and loaded by three
                runtimes within the time budget); weights written here, 4x1024
Checkpoints are cached under --models-dir with a stamp of what made them.

Per model, in one process, every arm is timed once per round, the order rotated every round, the
device synchronized before and after each timed call (medians over the rounds; tokens/s = B*T /
median seconds). The HF arms call the base model (GPT2Model / LlamaModel: no LM head, no KV cache)
under torch.inference_mode(), because actcap's extraction skips the head when nothing hooks it:
  hf eager / hf sdpa                 transformers forward, attn_implementation eager / sdpa, no hooks
  hf eager / sdpa + clone hooks      the seed's hooks: a forward hook on every decoder layer keeping
                                     output.detach().clone().cpu()
  hf sdpa + actcap.SafeCapturer      actcap's Python capturer on the same HF model, every layer,
                                     every snapshot read back (verified) inside the timing
  actcap forward                     actcap's engine (`actcap.load(..., devices="cuda:0")`), capturing
                                     only the final norm's last position (a [B, hidden] snapshot;
                                     the run returns only when it is on the host)
  actcap capture                     the same run capturing every decoder layer's output, all
                                     positions, stored as bf16, verified, returned as host tensors
Then, in separate processes (the run's own timer, first batch included):
  actcap extract --forward-only      the CLI over a corpus of random token ids
  actcap extract --capture layers    the same corpus, every layer written to verified shards on disk
And the device->host copy bandwidth: torch.empty(pin_memory=True).copy_(cuda_tensor) and a plain
.cpu() (pageable), against the capture's marginal bandwidth (captured bytes / (capture - forward)).

Targets (issue 15): every-layer capture <= 5% over none (actcap capture vs actcap forward);
extraction >= 2x HF + clone hooks (actcap capture vs hf sdpa + clone hooks); and, so that the
speeds compare the same model, the last layer's output within 0.1 of HF's largest magnitude. If
actcap has no --compute-dtype (checked in `actcap extract --help` and actcap.load's signature) it
computes in f32 (bf16 weights widened per layer) while HF computes in bf16: the report says the
comparison is not dtype-matched.

--budget-s bounds the whole run (default 180 s; --quick 90 s): rounds shrink to fit (at least 3),
and what no longer fits is reported as skipped, never estimated. SIGTERM writes what was measured.
Exit status: 0 measured (targets are judged in the report, not in the exit status), 1 some
measurement failed (the report names it), 2 the environment cannot run it (no CUDA, no
transformers, no actcap binary): one line on stderr.

--device cpu --smoke: tiny shapes on the CPU, so that the script itself is tested without a GPU
(tests/python/test_gpu_bench.py). Without transformers, the gpt2 HF arms use the HF-shaped GPT-2 of
tests/python/hf_modules.py (written from transformers' modeling_gpt2.py) and say so; the llama HF
arms are then not run.
"""
import argparse
import datetime
import gc
import hashlib
import importlib.util
import inspect
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEIGHTS_VERSION = 1  # bump when write_llama_checkpoint's output changes (invalidates the cache)


def die(msg, code=2):
    """One line on stderr and the exit status: what the environment lacks."""
    print(f"gpu_bench: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def log(msg):
    print(f"gpu_bench: {msg}", file=sys.stderr, flush=True)


class Stop(BaseException):
    """SIGTERM (the kit's stage timeout): stop measuring, write the report of what was measured.
    A BaseException, so that the per-arm `except Exception` handlers let it through."""


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------

# Llama-3.2-1B's config.json (meta-llama/Llama-3.2-1B), the values that differ from the template.
LLAMA_3_2_1B = {
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
# Tiny stand-ins for --smoke (same code paths, seconds on two cores).
LLAMA_TINY = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "vocab_size": 512, "max_position_embeddings": 256}


class Spec:
    """One benchmarked model: how its checkpoint is made and the batch it runs."""

    def __init__(self, key, label, arch, batch, seq, init=None, overrides=None, cut_from=None):
        self.key, self.label, self.arch, self.batch, self.seq = key, label, arch, batch, seq
        self.init = init            # gpt2: the init-model preset
        self.overrides = overrides  # llama: config values over the llama-3.1-8b preset's
        self.cut_from = cut_from    # the real model's depth when fewer layers are written

    @property
    def shape(self):
        return f"{self.batch}x{self.seq}"


def specs_for(a):
    if a.smoke:
        return [Spec("gpt2-small", "gpt2 tiny preset (smoke)", "gpt2", 2, 32, init="tiny"),
                Spec("llama-3.2-1b", "llama tiny, tied (smoke)", "llama", 2, 32,
                     overrides=dict(LLAMA_TINY, tie_word_embeddings=True)),
                Spec("llama-3-8b", "llama tiny, 2 layers (smoke)", "llama", 2, 32,
                     overrides=dict(LLAMA_TINY, num_hidden_layers=2, tie_word_embeddings=False))]
    b, s = (2, 512) if a.quick else (4, 1024)
    layers = a.layers_8b or (4 if a.quick else 8)
    return [Spec("gpt2-small", "GPT-2 124M shape (init-model gpt2-small)", "gpt2", 2 * b, s,
                 init="gpt2-small"),
            Spec("llama-3.2-1b", "Llama-3.2-1B shape (16 layers, 2048 wide, tied)", "llama", b, s,
                 overrides=LLAMA_3_2_1B),
            Spec("llama-3-8b", f"Llama-3-8B shape (llama-3.1-8b preset), {layers} of 32 layers",
                 "llama", b, s, overrides={"num_hidden_layers": layers},
                 cut_from=32 if layers < 32 else None)]


def run_cli(actcap, *args, timeout=None):
    return subprocess.run([str(actcap), *[str(x) for x in args]], capture_output=True, text=True,
                          timeout=timeout)


def stamp_ok(out, want):
    stamp = out / "bench-stamp.json"
    try:
        return json.loads(stamp.read_text()) == want and (out / "config.json").exists() and \
            (out / "model.safetensors").exists()
    except (OSError, ValueError):
        return False


def ensure_checkpoint(spec, actcap, models_dir, torch, device):
    """The checkpoint folder of `spec`, made (or reused when its stamp matches)."""
    out = Path(models_dir) / spec.key
    if spec.arch == "gpt2":
        want = {"arch": "gpt2", "preset": spec.init, "dtype": "bf16", "seed": 1}
        if not stamp_ok(out, want):
            log(f"making {out}: actcap init-model --arch gpt2 --preset {spec.init} --dtype bf16")
            shutil.rmtree(out, ignore_errors=True)
            r = run_cli(actcap, "init-model", "--arch", "gpt2", "--preset", spec.init, "--seed", 1,
                        "--dtype", "bf16", "--out", out)
            if r.returncode:
                raise RuntimeError(f"init-model failed: {r.stderr.strip()}")
            (out / "bench-stamp.json").write_text(json.dumps(want))
        return out
    want = {"arch": "llama", "template": "llama-3.1-8b", "overrides": spec.overrides, "seed": 1,
            "version": WEIGHTS_VERSION}
    if not stamp_ok(out, want):
        shutil.rmtree(out, ignore_errors=True)
        r = run_cli(actcap, "init-model", "--arch", "llama", "--preset", "llama-3.1-8b", "--seed", 1,
                    "--dtype", "bf16", "--config-only", "--out", out)
        if r.returncode:
            raise RuntimeError(f"init-model --config-only failed: {r.stderr.strip()}")
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(spec.overrides)
        if "rope_scaling" in spec.overrides and "rope_parameters" in cfg:  # newer naming, if used
            cfg["rope_parameters"] = dict(cfg["rope_parameters"], **spec.overrides["rope_scaling"],
                                          rope_theta=cfg["rope_theta"])
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        t0 = time.perf_counter()
        size = write_llama_checkpoint(out / "model.safetensors", cfg, 1, torch, device)
        log(f"wrote {out} ({size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s")
        (out / "bench-stamp.json").write_text(json.dumps(want))
    return out


def llama_tensors(cfg):
    """(name, shape, is_norm) of every tensor of a Llama checkpoint in HF layout."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    out = [("model.embed_tokens.weight", [V, H], False)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [H], True),
                (p + "self_attn.q_proj.weight", [nh * hd, H], False),
                (p + "self_attn.k_proj.weight", [nkv * hd, H], False),
                (p + "self_attn.v_proj.weight", [nkv * hd, H], False),
                (p + "self_attn.o_proj.weight", [H, nh * hd], False),
                (p + "post_attention_layernorm.weight", [H], True),
                (p + "mlp.gate_proj.weight", [I, H], False),
                (p + "mlp.up_proj.weight", [I, H], False),
                (p + "mlp.down_proj.weight", [H, I], False)]
    out.append(("model.norm.weight", [H], True))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [V, H], False))
    return out


def write_llama_checkpoint(path, cfg, seed, torch, device):
    """A bf16 safetensors file of random weights (N(0, 0.02); norms 1), generated on `device`
    (fast on a GPU) one tensor at a time and streamed to disk; returns its size in bytes."""
    tensors = llama_tensors(cfg)
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_suffix(".tmp")
    gen = torch.Generator(device=device)
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for i, (name, shape, is_norm) in enumerate(tensors):
            if is_norm:
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                gen.manual_seed(seed * 1_000_003 + i)
                t = (torch.randn(shape, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()
            f.write(t.view(torch.int16).numpy().tobytes())
    os.replace(tmp, path)
    return 8 + len(text) + offset


def hidden(output):
    """A decoder layer's hidden states: transformers 4.x layers return a tuple, 5.x the tensor."""
    return output[0] if isinstance(output, (tuple, list)) else output


class HFModel:
    """The HF base model (no LM head) of a checkpoint, one instance per attention implementation."""

    def __init__(self, kind, base, layers, prefix, impl, dtype, load_s):
        self.kind, self.base, self.layers, self.prefix = kind, base, layers, prefix
        self.impl, self.dtype, self.load_s = impl, dtype, load_s

    def __call__(self, ids):
        if self.kind == "transformers":
            return self.base(input_ids=ids, use_cache=False)
        return self.base(ids)


def load_hf(transformers, torch, ckpt, arch, impl, device, dtype):
    t0 = time.perf_counter()
    kw = {"attn_implementation": impl, "output_loading_info": True}
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    kw["dtype" if major_minor >= (4, 56) else "torch_dtype"] = dtype
    if device != "cpu" and importlib.util.find_spec("accelerate"):  # device_map needs it
        kw["device_map"] = {"": device}
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), **kw)
    missing = [k for k in info.get("missing_keys", []) if not k.endswith("lm_head.weight")]
    if missing:  # transformers would have initialised them randomly: not the same weights
        raise RuntimeError(f"transformers did not find {len(missing)} weights, e.g. {missing[:3]}")
    p = next(model.parameters())
    if p.dtype != dtype or str(p.device) != str(torch.device(device)):
        model = model.to(device=device, dtype=dtype)
    model.eval()
    base = model.base_model
    layers = base.h if arch == "gpt2" else base.layers
    got = getattr(model.config, "_attn_implementation", impl)
    return HFModel("transformers", base, layers, "h" if arch == "gpt2" else "layers", got, dtype,
                   time.perf_counter() - t0)


def load_standin(torch, ckpt, device):
    """tests/python/hf_modules.py's GPT-2 (written from modeling_gpt2.py) with the checkpoint's
    weights: the --smoke stand-in for transformers where it is not installed."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    from hf_modules import GPT2LMHeadModel
    t0 = time.perf_counter()
    m = GPT2LMHeadModel.from_checkpoint(ckpt).to(device).eval()
    return HFModel("stand-in", m.transformer, m.transformer.h, "h", "eager (hf_modules)",
                   torch.float32, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, a, torch):
        self.a, self.torch = a, torch
        self.device = a.device if a.device == "cpu" else "cuda:0"
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + a.budget_s
        self.errors = []   # "what: message", each also in the report
        self.notes = []

    def left(self):
        return self.deadline - time.perf_counter()

    def sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def timed(self, fn):
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t

    def rotate(self, arms, rounds, share_s):
        """One warm-up call of each arm (an arm that raises is dropped, its error kept), then
        rounds with the order rotated every round, as many as fit in share_s (at least 3, at most
        `rounds`). Returns {arm: [seconds]}, {arm: error}."""
        errors, live = {}, {}
        warm = 0.0
        for name, fn in arms.items():
            try:
                fn()  # first call: kernels, allocator, pinned pools
                warm += self.timed(fn)
                live[name] = fn
            except Exception as e:  # noqa: BLE001  (reported, never hidden)
                errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                log(f"  {name}: {errors[name]}")
        n = max(3, min(rounds, int(share_s / warm))) if warm > 0 else rounds
        times = {k: [] for k in live}
        order = list(live)
        for r in range(n):
            for k in order[r % len(order):] + order[:r % len(order)] if order else []:
                times[k].append(self.timed(live[k]))
        return times, errors, n


def seed_hooks(hf, names):
    """The seed's capture: a detached CPU clone of every decoder layer's output."""
    outputs = {}

    def make(name):
        def hook(module, args, output):
            outputs[name] = hidden(output).detach().clone().cpu()
        return hook
    return outputs, [m.register_forward_hook(make(n)) for n, m in zip(names, hf.layers)]


def copy_bandwidth(b, nbytes, reps=10):
    """GB/s (1e9 bytes/s) of device->host copies of nbytes: into pinned memory (copy_) and a plain
    .cpu() (pageable, what the seed's hooks do). On --device cpu: a host-to-host copy_."""
    torch = b.torch
    n = max(1, nbytes // 2)
    src = torch.empty(n, dtype=torch.bfloat16, device=b.device).normal_()
    out = {}
    if b.device == "cpu":
        dst = torch.empty(n, dtype=torch.bfloat16)
        kinds = {"host copy_": lambda: dst.copy_(src)}
    else:
        dst = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
        kinds = {"pinned copy_": lambda: dst.copy_(src), "pageable .cpu()": lambda: src.cpu()}
    for k, fn in kinds.items():
        fn()
        secs = [b.timed(fn) for _ in range(reps)]
        out[k] = 2 * n / statistics.median(secs) / 1e9
    return out


def cli_supports(actcap, sub, flag):
    r = run_cli(actcap, sub, "--help", timeout=60)
    return flag in (r.stdout + r.stderr)


def run_extract(b, actcap, ckpt, spec, corpus, capture, compute_dtype, out_dir, extra=()):
    """`actcap extract` forward-only or capturing every layer; its JSON summary + tokens/s."""
    args = ["extract", ckpt, "--input", corpus, "--devices", "cpu:0" if b.device == "cpu" else "cuda:0",
            "--batch-size", spec.batch, "--max-length", spec.seq, "--quiet", "--json"]
    if compute_dtype:
        args += ["--compute-dtype", "bf16"]
    if capture:
        args += ["--capture", capture, "--dtype", "bf16", "--out", out_dir, "--overwrite",
                 "--shard-size", "1GiB"]
    else:
        args += ["--forward-only"]
    args += list(extra)
    t = time.perf_counter()
    r = run_cli(actcap, *args, timeout=max(10.0, b.left()))
    wall = time.perf_counter() - t
    if r.returncode:
        tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"exit {r.returncode}: {tail[0]}")
    j = json.loads(r.stdout)
    return {"tokens": j["tokens"], "seconds": j["seconds"], "tps": j["tokens"] / j["seconds"],
            "bytes_written": j.get("bytes_written", 0), "process_s": wall}


def rel_diff(torch, acts, point, ref, T):
    """max |actcap - HF| / max |HF| of one layer's output (rows mapped by __rows__.seq/pos)."""
    got = acts[point].float()
    idx = acts["__rows__.seq"].long() * T + acts["__rows__.pos"].long()
    want = ref.float().reshape(-1, ref.shape[-1])[idx]
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def bench_model(b, spec, env, res):
    """Every arm of one model; fills res (one dict per model)."""
    torch = b.torch
    ckpt = ensure_checkpoint(spec, env["actcap"], b.a.models_dir, torch, b.device)
    cfg = json.loads((ckpt / "config.json").read_text())
    L = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    H = cfg.get("hidden_size") or cfg.get("n_embd")
    res.update({"layers": L, "hidden": H, "cut_from": spec.cut_from, "label": spec.label,
                "shape": spec.shape, "captured_bytes": L * spec.batch * spec.seq * H * 2})
    gen = torch.Generator().manual_seed(0)
    in_process(b, spec, env, res, ckpt, cfg, gen)
    # in_process's models are gone with its frame: free the GPU before the CLI loads its own copy
    gc.collect()
    if b.device != "cpu":
        torch.cuda.empty_cache()
    cli_extract(b, spec, env, res, ckpt, cfg, gen)


def in_process(b, spec, env, res, ckpt, cfg, gen):
    """HF's and actcap's arms in this process, rotated; the copy bandwidth."""
    torch, a = b.torch, b.a
    L = res["layers"]
    ids_cpu = torch.randint(0, cfg["vocab_size"], (spec.batch, spec.seq), generator=gen)
    ids = ids_cpu.to(b.device)
    tokens = spec.batch * spec.seq
    arms, last = {}, {}
    hf_dtype = torch.bfloat16 if b.device != "cpu" else torch.float32

    # --- HF: one instance per attention implementation (works with every transformers version)
    hfs = {}
    if env["transformers"] is not None:
        for impl in ("eager", "sdpa"):
            try:
                hfs[impl] = load_hf(env["transformers"], torch, ckpt, spec.arch, impl, b.device, hf_dtype)
            except Exception as e:  # noqa: BLE001
                res["errors"][f"hf {impl} load"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    elif spec.arch == "gpt2":
        hfs["eager"] = load_standin(torch, ckpt, b.device)
        res["notes"].append("HF arms: tests/python/hf_modules.py's GPT-2 (transformers is not installed)")
    else:
        res["notes"].append("HF arms not run: transformers is not installed (no stand-in for llama)")
    res["hf_load_s"] = {k: v.load_s for k, v in hfs.items()}
    res["hf_attn"] = {k: v.impl for k, v in hfs.items()}
    for impl, hf in hfs.items():
        if hf.kind == "transformers" and hf.impl != impl:
            res["notes"].append(f"HF asked for attn_implementation={impl} ran {hf.impl}")
    names = [f"{hfs[next(iter(hfs))].prefix}.{i}" for i in range(L)] if hfs else []

    for impl, hf in hfs.items():
        def plain(hf=hf):
            with torch.inference_mode():
                hf(ids)

        def hooked(hf=hf, impl=impl):
            outputs, handles = seed_hooks(hf, names)
            try:
                with torch.inference_mode():
                    hf(ids)
            finally:
                for h in handles:
                    h.remove()
            assert len(outputs) == L
            last[f"hf {impl}"] = outputs[names[-1]]
        arms[f"hf {impl}"] = plain
        arms[f"hf {impl} + clone hooks"] = hooked

    ac = env["ac"]
    if ac is not None and hfs:
        hf = hfs.get("sdpa") or hfs["eager"]
        tag = "sdpa" if "sdpa" in hfs else "eager"

        def safe(hf=hf):
            with torch.inference_mode(), ac.SafeCapturer(hf.base, f"{hf.prefix}.*") as cap:
                hf(ids)
            got = [cap.get(n) for n in names]  # fenced, fingerprint-checked reads
            assert len(got) == L
        arms[f"hf {tag} + actcap.SafeCapturer"] = safe

    # --- actcap's engine from Python
    engine = None
    if ac is not None:
        try:
            t0 = time.perf_counter()
            kw = {"devices": "cpu:0" if b.device == "cpu" else "cuda:0"}
            if env["py_compute_dtype"]:
                kw["compute_dtype"] = "bf16"
            engine = ac.load(str(ckpt), **kw)
            res["actcap_load_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            res["errors"]["actcap load"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if engine is not None:
        points = [p.name for p in engine.points()]
        layer_pat = "transformer.h.*" if spec.arch == "gpt2" else "model.layers.*"
        norm = next((n for n in ("transformer.ln_f", "model.norm") if n in points), None)

        def act_forward():
            engine.run(ids_cpu, capture=norm, positions="last", dtype="bf16")

        def act_capture():
            last["actcap"] = engine.run(ids_cpu, capture=layer_pat, dtype="bf16")
        if norm is None:
            res["errors"]["actcap forward"] = "no final-norm hook point found"
        else:
            arms["actcap forward"] = act_forward
        arms["actcap capture"] = act_capture
        res["actcap_layer_prefix"] = layer_pat[:-2]

    # --- one rotation of every arm
    share = max(5.0, b.left() * env["share"])
    times, errs, rounds = b.rotate(arms, a.rounds, share)
    res["errors"].update(errs)
    res["rounds"] = rounds
    res["seconds"] = times
    res["tps"] = {k: tokens / statistics.median(v) for k, v in times.items() if v}

    def ratio(x, y):
        if times.get(x) and times.get(y):
            return statistics.median(p / q for p, q in zip(times[x], times[y]))
        return None
    res["capture_cost"] = None if ratio("actcap capture", "actcap forward") is None else \
        ratio("actcap capture", "actcap forward") - 1
    for impl in hfs:
        r = ratio(f"hf {impl} + clone hooks", f"hf {impl}")
        res.setdefault("hook_cost", {})[impl] = None if r is None else r - 1
        r = ratio(f"hf {impl} + clone hooks", "actcap capture")  # = speedup of actcap
        res.setdefault("speedup_vs_hooks", {})[impl] = r
    # Agreement: the last layer's output, actcap vs HF (one check that both ran the same model).
    if "actcap" in last:
        for impl in ("sdpa", "eager"):
            if f"hf {impl}" in last:
                try:
                    res["agreement"] = {"vs": f"hf {impl}", "rel": rel_diff(
                        torch, last["actcap"], f"{res['actcap_layer_prefix']}.{L - 1}", last[f"hf {impl}"], spec.seq)}
                except Exception as e:  # noqa: BLE001
                    res["errors"]["agreement"] = f"{type(e).__name__}: {e}"
                break

    # --- device->host bandwidth for this model's per-layer capture size
    try:
        res["copy_gbps"] = copy_bandwidth(b, res["captured_bytes"] // L)
    except Exception as e:  # noqa: BLE001
        res["errors"]["copy bandwidth"] = f"{type(e).__name__}: {e}"



def cli_extract(b, spec, env, res, ckpt, cfg, gen):
    """`actcap extract` forward-only and capturing every layer, if the budget still allows both."""
    torch, a = b.torch, b.a
    need = 3 * (res.get("actcap_load_s") or 5.0) + 6.0
    if b.left() < need:
        res["notes"].append(f"actcap extract (CLI) skipped: {b.left():.0f} s of the budget left, "
                            f"about {need:.0f} s needed")
        return
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-", dir=a.models_dir))
    try:
        corpus = work / "corpus.jsonl"
        docs = spec.batch * env["batches"]
        rows = torch.randint(0, cfg["vocab_size"], (docs, spec.seq), generator=gen).tolist()
        corpus.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
        layer_pat = "transformer.h.*" if spec.arch == "gpt2" else "model.layers.*"
        # The overlapped capture copies against blocking ones (--copy-window 0: each capture is
        # copied inside its hook), when this actcap has the flag.
        runs = [("forward-only", None, ()), ("capture", layer_pat, ())]
        if env.get("cli_copy_window"):
            runs.append(("capture blocking", layer_pat, ("--copy-window", "0")))
        for what, cap, extra in runs:
            try:
                res.setdefault("cli", {})[what] = run_extract(
                    b, env["actcap"], ckpt, spec, corpus, cap, env["cli_compute_dtype"], work / "out",
                    extra)
            except subprocess.TimeoutExpired:
                # the budget ran out under it: not measured, which is not a failure of actcap
                res["notes"].append(f"actcap extract {what} not finished: the {a.budget_s:.0f} s budget "
                                    "ran out during it")
            except Exception as e:  # noqa: BLE001
                res["errors"][f"actcap extract {what}"] = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

ARM_ROWS = [
    ("hf eager", "HF eager, no hooks"),
    ("hf sdpa", "HF sdpa, no hooks"),
    ("hf eager + clone hooks", "HF eager + clone hooks (seed)"),
    ("hf sdpa + clone hooks", "HF sdpa + clone hooks (seed)"),
    ("hf sdpa + actcap.SafeCapturer", "HF sdpa + actcap.SafeCapturer"),
    ("hf eager + actcap.SafeCapturer", "HF eager + actcap.SafeCapturer"),
    ("actcap forward", "actcap forward (final-norm last token only)"),
    ("actcap capture", "actcap every-layer capture (bf16, verified)"),
]


def fmt_tps(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def pct(x):
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def cell(res, arm):
    if arm in res.get("tps", {}):
        return fmt_tps(res["tps"][arm])
    if arm in res.get("errors", {}):
        return "error"
    return "—"


def build_report(run):
    models = run["models"]
    o = []
    o.append("## GPU benchmark (`bench/gpu_bench.py`)")
    o.append("")
    o.append(f"- command: `{run['command']}`; {run['date']}; commit {run['commit']}; "
             f"{run['elapsed_s']:.0f} s of a {run['budget_s']:.0f} s budget; mode: {run['mode']}")
    o.append(f"- {run['env_line']}")
    o.append(f"- actcap: {run['actcap_line']}")
    o.append(f"- dtypes: {run['dtype_line']}")
    o.append("- method: one process; per model every arm once per round, order rotated each round, "
             "the device synchronized around every timed call; TF32 off (PyTorch's default); tokens/s = B*T / median seconds. "
             "HF arms call the base model (no LM head, no cache) under inference_mode.")
    o.append("")
    if models:
        o.append("### Tokens/s")
        o.append("")
        head = "| arm | " + " | ".join(f"{m['key']} {m.get('shape', '')}" for m in models) + " |"
        o.append(head)
        o.append("|---|" + "---:|" * len(models))
        for arm, label in ARM_ROWS:
            if any(arm in m.get("tps", {}) or arm in m.get("errors", {}) for m in models):
                o.append(f"| {label} | " + " | ".join(cell(m, arm) for m in models) + " |")
        for what, label in (("forward-only", "actcap extract --forward-only (CLI, own timer)"),
                            ("capture", "actcap extract, every layer to disk (CLI, own timer)"),
                            ("capture blocking", "the same, blocking copies (`--copy-window 0`)")):
            if any(what in m.get("cli", {}) or f"actcap extract {what}" in m.get("errors", {}) for m in models):
                o.append(f"| {label} | " + " | ".join(
                    fmt_tps(m["cli"][what]["tps"]) if what in m.get("cli", {}) else
                    ("error" if f"actcap extract {what}" in m.get("errors", {}) else "—")
                    for m in models) + " |")
        o.append("| rounds | " + " | ".join(str(m.get("rounds", "—")) for m in models) + " |")
        o.append("")
        o.append("### Capture cost and device→host copies")
        o.append("")
        o.append("| | " + " | ".join(m["key"] for m in models) + " |")
        o.append("|---|" + "---:|" * len(models))

        def row(label, f):
            vals = []
            for m in models:
                try:
                    v = f(m)
                except (KeyError, TypeError, ZeroDivisionError):
                    v = None
                vals.append("—" if v is None else v)
            o.append(f"| {label} | " + " | ".join(vals) + " |")
        row("model", lambda m: m["label"])
        row("captured per forward (every layer, bf16)", lambda m: size_text(m["captured_bytes"]))
        row("actcap capture vs actcap forward", lambda m: pct(m["capture_cost"]))
        row("HF sdpa + clone hooks vs HF sdpa", lambda m: pct(m["hook_cost"]["sdpa"]))
        row("HF eager + clone hooks vs HF eager", lambda m: pct(m["hook_cost"]["eager"]))
        row("actcap capture speed / HF sdpa + clone hooks",
            lambda m: f"{m['speedup_vs_hooks']['sdpa']:.2f}x")
        row("actcap capture speed / HF eager + clone hooks",
            lambda m: f"{m['speedup_vs_hooks']['eager']:.2f}x")
        row("capture marginal D2H GB/s (bytes / (capture − forward))", lambda m: marginal(m, "actcap capture", "actcap forward"))
        row("seed hooks marginal D2H GB/s (HF sdpa)", lambda m: marginal(m, "hf sdpa + clone hooks", "hf sdpa"))
        row("pinned copy_ GB/s (one layer's bytes)", lambda m: f"{m['copy_gbps']['pinned copy_']:.1f}")
        row("pageable .cpu() GB/s", lambda m: f"{m['copy_gbps']['pageable .cpu()']:.1f}")
        row("host copy_ GB/s (no GPU)", lambda m: f"{m['copy_gbps']['host copy_']:.1f}")
        row("last layer, actcap vs HF: max abs diff / max abs HF",
            lambda m: f"{m['agreement']['rel']:.1e} (vs {m['agreement']['vs']})")
        row("load s: HF (eager, sdpa) / actcap", lambda m: " / ".join(
            [", ".join(f"{v:.1f}" for v in m.get("hf_load_s", {}).values()) or "—",
             f"{m['actcap_load_s']:.1f}" if "actcap_load_s" in m else "—"]))
        o.append("")
    o.append("### Targets")
    o.append("")
    for t in run["targets"]:
        o.append(f"- {t}")
    notes = run["notes"] + [f"{m['key']}: {n}" for m in models for n in m.get("notes", [])]
    errors = [f"{m['key']}, {k}: {v}" for m in models for k, v in m.get("errors", {}).items()] + run["errors"]
    if notes:
        o.append("")
        o.append("Notes:")
        o.append("")
        o += [f"- {n}" for n in notes]
    if errors:
        o.append("")
        o.append("Errors (the affected cells say `error`):")
        o.append("")
        o += [f"- {e}" for e in errors]
    return "\n".join(o) + "\n"


def size_text(n):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def marginal(m, arm, base):
    t, b = m["seconds"].get(arm), m["seconds"].get(base)
    if not t or not b:
        return None
    extra = statistics.median(t) - statistics.median(b)
    if extra <= 0:
        return f"all hidden (added time {1e3 * extra:+.2f} ms)"
    return f"{m['captured_bytes'] / extra / 1e9:.1f}"


AGREEMENT_BAR = 0.1  # the bf16 bar of docs/execution.md: largest difference / largest magnitude


def targets(run):
    out = []
    suffix = " (smoke run: tiny shapes on the CPU, not a measurement of the targets)" if run["mode"] == "smoke" else ""
    for m in run["models"]:
        c = m.get("capture_cost")
        if c is None:
            out.append(f"{m['key']}: every-layer capture ≤ 5% over none: not measured")
        else:
            out.append(f"{m['key']}: every-layer capture ≤ 5% over none: {pct(c)} → "
                       f"{'PASS' if c <= 0.05 else 'FAIL'}{suffix}")
        s = m.get("speedup_vs_hooks", {})
        key = "sdpa" if s.get("sdpa") is not None else "eager"
        if s.get(key) is None:
            out.append(f"{m['key']}: extraction ≥ 2x HF + clone hooks: not measured")
        else:
            out.append(f"{m['key']}: extraction ≥ 2x HF {key} + clone hooks: {s[key]:.2f}x → "
                       f"{'PASS' if s[key] >= 2.0 else 'FAIL'}{suffix}")
        # Not a speed target: that both sides ran the same model, without which neither figure means
        # anything (bf16: each rounding is up to 2^-9 relative, over every layer).
        agree = m.get("agreement")
        if agree is None:
            out.append(f"{m['key']}: same model as HF (last layer within {AGREEMENT_BAR:g} of HF's "
                       "largest magnitude): not measured")
        else:
            out.append(f"{m['key']}: same model as HF (last layer within {AGREEMENT_BAR:g} of HF's "
                       f"largest magnitude): {agree['rel']:.1e} vs {agree['vs']} → "
                       f"{'PASS' if agree['rel'] <= AGREEMENT_BAR else 'FAIL'}")
    return out


# ---------------------------------------------------------------------------------------------

def environment(a):
    """Imports and checks; dies with one line when the environment cannot run the benchmark."""
    try:
        import torch
    except ImportError as e:
        die(f"cannot import torch ({e})")
    if a.device == "cpu" and not a.smoke:
        die("--device cpu runs only with --smoke (tiny shapes to test the script); the benchmark needs a GPU")
    if a.device == "cuda" and not torch.cuda.is_available():
        die(f"no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}): the GPU "
            "benchmark needs a GPU; `--device cpu --smoke` tests the script on the CPU")
    transformers = None
    try:
        import transformers
        transformers.logging.set_verbosity_error()
    except ImportError as e:
        if not a.smoke:
            die(f"cannot import transformers ({e}): the HF arms need it (pip install transformers accelerate)")
        transformers = None
    actcap = Path(a.actcap)
    if not (actcap.is_file() and os.access(actcap, os.X_OK)):
        die(f"{actcap} is not an executable actcap binary (build it, or give --actcap)")
    ac, ac_err = None, None
    pkg = Path(a.python_dir or actcap.resolve().parent / "python")
    if list((pkg / "actcap").glob("_core*.so")):
        sys.path.insert(0, str(pkg))
        try:
            import actcap as ac
        except Exception as e:  # noqa: BLE001  (built against another torch, ...)
            ac_err = f"cannot import the actcap package from {pkg}: {type(e).__name__}: {e}"
    else:
        ac_err = f"the actcap Python package is not built in {pkg}"
    return torch, transformers, ac, ac_err


def dtype_line(device, cli_cd, py_cd, ac):
    """What each side computes in, and whether the comparison is dtype-matched."""
    hf = "bf16" if device != "cpu" else "f32 (CPU smoke)"
    py = "bf16" if py_cd else "f32"
    cli = "bf16" if cli_cd else "f32"
    if ac is None:
        py = cli
    sides = f"HF computes in {hf}; actcap's engine (Python) in {py}, `actcap extract` in {cli}"
    widened = "" if py_cd and cli_cd else \
        " (no --compute-dtype yet: bf16 weights widened to f32 per layer)"
    matched = hf.split()[0] == py == cli
    return (f"weights bf16 on disk; {sides}{widened}: "
            + ("dtype-matched" if matched else "NOT dtype-matched")
            + "; every capture is stored as bf16 (HF's hooks copy bf16 outputs)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring and BENCHMARKS.md (GPU benchmark).")
    ap.add_argument("--actcap", default=os.environ.get("ACTCAP") or str(REPO / "build" / "actcap"))
    ap.add_argument("--python-dir", help="the actcap Python package's folder (default: next to --actcap, python/)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (with --device cpu: no GPU needed)")
    ap.add_argument("--quick", action="store_true", help="smaller shapes, 4 of the 8B's layers, 90 s budget")
    ap.add_argument("--rounds", type=int, help="rounds per model (default 10; --quick 5; --smoke 5); fewer if the budget says so")
    ap.add_argument("--layers-8b", type=int, help="layers of the 8B shape to write and run (default 8; --quick 4)")
    ap.add_argument("--models", help="comma-separated subset: gpt2-small,llama-3.2-1b,llama-3-8b")
    ap.add_argument("--budget-s", type=float, help="wall-clock budget of the whole run (default 180; --quick 90)")
    ap.add_argument("--models-dir", help="checkpoint cache (default: <actcap's folder>/gpu-bench-models)")
    ap.add_argument("--out", help="also write the markdown report here")
    ap.add_argument("--json-out", help="raw results (every timing) as JSON")
    a = ap.parse_args()
    a.rounds = a.rounds or (5 if a.quick or a.smoke else 10)
    a.budget_s = a.budget_s or (600 if a.smoke else 90 if a.quick else 180)

    torch, transformers, ac, ac_err = environment(a)
    a.models_dir = a.models_dir or str(Path(a.actcap).resolve().parent / "gpu-bench-models")
    Path(a.models_dir).mkdir(parents=True, exist_ok=True)
    b = Bench(a, torch)

    def on_term(signum, frame):
        raise Stop()
    signal.signal(signal.SIGTERM, on_term)

    actcap = Path(a.actcap).resolve()
    cli_cd = cli_supports(actcap, "extract", "--compute-dtype")
    py_cd = ac is not None and "compute_dtype" in inspect.signature(ac.load).parameters
    specs = specs_for(a)
    if a.models:
        want = a.models.split(",")
        specs = [s for s in specs if s.key in want]
    env = {"actcap": actcap, "transformers": transformers, "ac": ac,
           "cli_compute_dtype": cli_cd, "py_compute_dtype": py_cd, "batches": 2 if a.smoke else 4,
           "cli_copy_window": cli_supports(actcap, "extract", "--copy-window")}
    if b.device != "cpu":
        # PyTorch's default, as libtorch's (said in the report); torch >= 2.9 has the new switch
        # and warns about the old one (mixing both is an error there).
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "ieee"
        else:
            torch.backends.cuda.matmul.allow_tf32 = False

    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()
        except OSError:  # no git on the machine: the commit is unknown, not a reason to stop
            return ""
    commit = os.environ.get("ACTCAP_COMMIT") or git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    gpu = (f"{torch.cuda.get_device_name(0)} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
           if b.device != "cpu" else f"none (--device cpu; {os.cpu_count()} cores)")
    run = {
        "command": " ".join(["python3", "bench/gpu_bench.py"] + sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": (commit or "unknown") + (" (with uncommitted changes)" if dirty else ""),
        "mode": "smoke" if a.smoke else "quick" if a.quick else "full", "budget_s": a.budget_s,
        "env_line": f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
                    f"{torch.backends.cudnn.version() if b.device != 'cpu' else 'n/a'}, GPU {gpu}; "
                    f"transformers {transformers.__version__ if transformers else 'not installed'}; "
                    f"python {platform.python_version()}",
        "actcap_line": f"{actcap} (sha256 {hashlib.sha256(actcap.read_bytes()).hexdigest()[:12]}); "
                       + (f"Python package {Path(ac.__file__).parent}" if ac else f"Python package: {ac_err}"),
        "dtype_line": dtype_line(b.device, cli_cd, py_cd, ac),
        "models": [], "notes": [], "errors": [],
    }
    if ac is None:
        run["notes"].append(f"actcap Python arms not run: {ac_err}")
    for s in specs:
        if s.cut_from:
            run["notes"].append(f"{s.key}: {s.overrides['num_hidden_layers']} of {s.cut_from} layers "
                                "written and run (every other dimension as the real model); tokens/s "
                                "are for that depth, not the full model")
    status = 0
    try:
        for i, s in enumerate(specs):
            res = {"key": s.key, "label": s.label, "shape": s.shape, "errors": {}, "notes": []}
            if b.left() < 10:
                res["notes"].append(f"not run: the {a.budget_s:.0f} s budget is spent")
                run["models"].append(res)
                continue
            env["share"] = 1.0 / (len(specs) - i) * 0.6  # of what is left: leave time for the CLI
            log(f"{s.key} {s.shape} ({b.left():.0f} s left)")
            run["models"].append(res)
            try:
                bench_model(b, s, env, res)
            except Exception as e:  # noqa: BLE001
                res["errors"]["model"] = f"{type(e).__name__}: {e}"
            for k, v in res.get("tps", {}).items():
                log(f"  {k:32s} {fmt_tps(v):>12s} tok/s")
    except Stop:
        run["errors"].append("stopped by SIGTERM (stage timeout): later figures were not measured")
        status = 1
    run["elapsed_s"] = time.perf_counter() - b.t0
    run["targets"] = targets(run)
    if any(m.get("errors") for m in run["models"]) or run["errors"]:
        status = 1
    report = build_report(run)
    print(report)
    if a.out:
        Path(a.out).write_text(report)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(run, indent=1, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
