#!/usr/bin/env python3
"""actcap's GPU benchmark (issue 15 item 8; BENCHMARKS.md "GPU benchmark"): actcap against Hugging
Face transformers on the same weights, side by side in one process per model, tokens/s.

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

Each model runs in a child process of its own (this script with --child): a native crash, a
poisoned CUDA context or a hang costs that model only. The child saves what it has measured after
every step; the parent merges the parts and rewrites --out and --json-out after each model, so that
a SIGTERM (forwarded to the child) or even a SIGKILL of the parent leaves the report of what
finished. faulthandler prints the Python stack of a crash; every error is logged when it happens.

Per model, every arm is timed once per round, the order rotated every round, the device
synchronized before and after each timed call (medians over the rounds; tokens/s = B*T / median
seconds). An arm that raises (in its warm-up or in any round) is dropped there and reported; the
others go on. The HF arms call the base model (GPT2Model / LlamaModel: no LM head, no KV cache)
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
                                     (the copies overlapped with the compute: the default window)
  actcap capture, blocking copies    the same capture by a second engine on the same weights loaded
                                     with copy_window=0 (each capture copied inside its hook): what
                                     the overlap saves, measured in the same rounds; not run when
                                     two placed copies of the weights would not fit in free GPU
                                     memory (a loaded engine's window cannot be changed)
After the rounds, one more capture of the first engine gives actcap's own counters
(Engine.device_stats(): capture copies queued, copy-window waits). Then, in separate processes
(the run's own timer over --cli-batches batches, default 16; the weights are loaded and placed
before it starts, the first batch's cold start is in it):
  actcap extract --forward-only      the CLI over a corpus of random token ids
  actcap extract --capture layers    the same corpus, every layer written to verified shards (on
                                     tmpfs, /dev/shm, when it has room: there fsync costs nothing;
                                     else under --models-dir); the writes and fsync are in its timer
And the device->host copy bandwidth: 20 back-to-back copies timed with CUDA events,
torch.empty(pin_memory=True).copy_(cuda_tensor, non_blocking=True) and a plain .cpu() (pageable),
beside the capture's effective throughput (captured bytes / time added over the forward: every
cost of capturing, not a link bandwidth).

Targets (issue 15): every-layer capture <= 5% over none (actcap capture vs actcap forward);
extraction >= 2x HF + clone hooks (actcap capture vs hf sdpa + clone hooks); and, so that the
speeds compare the same model, the last layer's output computed in f32 on both sides (HF's model
converted to float32 after the timings, a second actcap engine with compute_dtype f32; one
sequence) within 1e-3 of HF's largest magnitude. bf16 would hide a RoPE difference (dropping
llama3's rope_scaling moves the last layer by about 1e-2): the bf16 runs' difference is reported as
information only. If actcap has no --compute-dtype (checked in `actcap extract --help` and
actcap.load's signature) it computes in f32 (bf16 weights widened per layer) while HF computes in
bf16: the report says the comparison is not dtype-matched.

--budget-s bounds the whole run (default 180 s; --quick 90 s), imports included. The models run in
PRIORITY order (the 8B shape first). Each is given a share of what is left in proportion to its
least cost (MIN_MODEL_S), capped so that even a child stopped at the last moment leaves the later
models their least costs, and is skipped when less than its least cost is left (when not every
model fits, PRIORITY says which are kept). A child's own deadline is STOP_WAIT_S before the moment
the parent stops it (SIGTERM: it saves what it has), so that only a child that overran its
deadline is reported as over its share. Inside a model, each HF load, actcap's loads, the f32
check and each CLI run is started only when the time left covers its estimate (the CLI's timeout
is what is left), and the rounds shrink to fit (3 or more unless the budget runs out). What does
not fit is reported as skipped, never estimated. Exit status: 0 measured (targets are judged in the
report, not in the exit status), 1 some measurement failed or the run was stopped (the report names
it), 2 the environment cannot run it (no CUDA, no transformers, no actcap binary): one line on
stderr, 3 incomplete: a planned model was not run or a target was not measured (the kit reports the
stage as incomplete).

--device cpu --smoke: tiny shapes on the CPU, so that the script itself is tested without a GPU
(tests/python/test_gpu_bench.py). Without transformers, the gpt2 HF arms use the HF-shaped GPT-2 of
tests/python/hf_modules.py (written from transformers' modeling_gpt2.py) and say so; the llama HF
arms are then not run.
"""
import argparse
import datetime
import faulthandler
import gc
import hashlib
import importlib.metadata
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

START = time.perf_counter()  # the budget counts from here: imports included
REPO = Path(__file__).resolve().parents[1]
WEIGHTS_VERSION = 1  # bump when write_llama_checkpoint's output changes (invalidates the cache)
# The least time (s) a model is started with: its checkpoint, the HF and actcap loads, warm-ups,
# 3 rounds, the f32 check and the CLI runs (the review's estimates for an H200, plus the child's
# imports). A model's share of the time left is in proportion to these.
MIN_MODEL_S = {"full": {"gpt2-small": 25, "llama-3.2-1b": 45, "llama-3-8b": 65},
               "quick": {"gpt2-small": 15, "llama-3.2-1b": 25, "llama-3-8b": 35},
               "smoke": {"gpt2-small": 5, "llama-3.2-1b": 5, "llama-3-8b": 5}}
# The order the models run in and, when not every model fits, the ones kept: the 8B shape, the
# model issue 15 cares about most, then the cheap gpt2.
PRIORITY = ["llama-3-8b", "gpt2-small", "llama-3.2-1b"]
REPORT_RESERVE_S = 3.0  # kept back from the children: merging and writing the report
# How long a stopped child may take to save its part before SIGKILL; also kept back, so that a
# child stopped at the last moment still ends inside the budget. A child's own deadline is this
# long before the parent stops it.
STOP_WAIT_S = 5.0
INCOMPLETE = 3  # the exit status when a planned model was not run or a target was not measured
# Kept free on the GPU beside two placed copies of the weights (the arenas, HF's activations)
# before a second actcap engine (blocking copies) is loaded.
GPU_MARGIN_BYTES = 8 * 2**30


def die(msg, code=2):
    """One line on stderr and the exit status: what the environment lacks."""
    print(f"gpu_bench: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def log(msg):
    print(f"gpu_bench: {msg}", file=sys.stderr, flush=True)


def error_text(e):
    """An exception in one line: its type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def record(res, what, msg):
    """An error of one model, kept for the report and logged at once (a crash later loses nothing)."""
    res["errors"][what] = msg if isinstance(msg, str) else error_text(msg)
    log(f"{res['key']}: ERROR {what}: {res['errors'][what]}")


class Stop(BaseException):
    """SIGTERM (the kit's stage timeout): stop measuring, write the report of what was measured.
    A BaseException, so that the per-arm `except Exception` handlers let it through."""


def stop_on_sigterm():
    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the report short
        raise Stop()
    signal.signal(signal.SIGTERM, on_term)


def write_atomic(path, text):
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    # Missing weights are initialised randomly, unexpected or mismatched ones left out: any of
    # them (a tied head aside) means HF does not run the checkpoint's weights.
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        found = sorted(str(k) for k in (info.get(key) or [])
                       if key != "missing_keys" or not str(k).endswith("lm_head.weight"))
        if found:
            problems.append(f"{len(found)} {key}, e.g. {found[:3]}")
    if problems:
        raise RuntimeError("transformers' loading info: " + "; ".join(problems))
    # Where from_pretrained left the model elsewhere (no accelerate): moved, not cast; a cast of the
    # whole model would also make the float32 buffers bf16 (LlamaRotaryEmbedding.inv_freq: RoPE off
    # by radians at 1024 positions), so only floating parameters are converted, if any differ.
    if str(next(model.parameters()).device) != str(torch.device(device)):
        model = model.to(device)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
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
    def __init__(self, a, torch, deadline=None):
        self.a, self.torch = a, torch
        self.device = a.device if a.device == "cpu" else "cuda:0"
        self.t0 = START
        self.deadline = START + a.budget_s if deadline is None else deadline  # perf_counter time
        self.part, self.res = None, None  # a child: the file its model's results are saved to

    def left(self):
        return self.deadline - time.perf_counter()

    def save(self):
        """A child's results so far, for the parent: written after every step and round."""
        if self.part:
            write_atomic(self.part, json.dumps(self.res, default=str))

    def step(self, res, what):
        """The step now running (named in the report if the child dies in it)."""
        res["step"] = what
        self.save()

    def afford(self, res, what, need):
        """Whether `what`, about `need` seconds, fits in the time left; a note when it does not."""
        if self.left() >= need:
            return True
        res["notes"].append(f"{what} skipped: {max(0.0, self.left()):.1f} s of the budget left, "
                            f"about {need:.1f} s needed")
        log(f"{res['key']}: {res['notes'][-1]}")
        return False

    def sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def timed(self, fn):
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t

    def rotate(self, arms, rounds, share_s, res, reserve_s=0.0):
        """A first call of each arm (placement, kernels, allocator, pinned pools; timed on its own
        into res["first_call_s"]) and a timed warm-up, then rounds with the order rotated every
        round, as many as fit in share_s (at most `rounds`; at least 3 unless the time left falls
        to reserve_s). An arm that raises, in its warm-up or in any round, is dropped there with
        its error recorded; the others go on. res["seconds"] grows round by round (saved after
        each), so that a stop keeps the finished rounds; res["rounds"] counts them."""
        times = res.setdefault("seconds", {})
        first = res.setdefault("first_call_s", {})
        live, warm = {}, 0.0
        for name, fn in arms.items():
            try:
                first[name] = self.timed(fn)
                warm += self.timed(fn)
                live[name] = fn
                times[name] = []
            except Exception as e:  # noqa: BLE001  (reported, never hidden)
                record(res, name, e)
            self.save()
        n = max(3, min(rounds, int(share_s / warm))) if warm > 0 else rounds
        order = list(live)
        res["rounds"] = 0
        for r in range(n):
            if not order:
                break
            if r and self.left() < reserve_s + warm:
                res["notes"].append(f"{r} of {n} rounds: the budget left no time for more")
                log(f"{res['key']}: {res['notes'][-1]}")
                break
            for k in order[r % len(order):] + order[:r % len(order)]:
                try:
                    times[k].append(self.timed(live[k]))
                except Exception as e:  # noqa: BLE001
                    record(res, k, f"round {r + 1}: {error_text(e)}")
                    order.remove(k)
            res["rounds"] = r + 1
            self.save()
        return n


def seed_hooks(hf, names):
    """The seed's capture: a detached CPU clone of every decoder layer's output."""
    outputs = {}

    def make(name):
        def hook(module, args, output):
            outputs[name] = hidden(output).detach().clone().cpu()
        return hook
    return outputs, [m.register_forward_hook(make(n)) for n, m in zip(names, hf.layers)]


def copy_bandwidth(b, nbytes, reps=5, burst=20):
    """GB/s (1e9 bytes/s) of device->host copies of nbytes: into pinned memory (copy_, queued
    back-to-back) and a plain .cpu() (pageable, what the seed's hooks do); each sample is `burst`
    copies between two CUDA events (one copy is too short for a host timer around two syncs),
    the median of `reps` samples. On --device cpu: a host-to-host copy_, timed on the host."""
    torch = b.torch
    n = max(1, nbytes // 2)
    src = torch.empty(n, dtype=torch.bfloat16, device=b.device).normal_()
    out = {}
    if b.device == "cpu":
        dst = torch.empty(n, dtype=torch.bfloat16)
        kinds = {"host copy_": lambda: dst.copy_(src)}
    else:
        dst = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
        kinds = {"pinned copy_": lambda: dst.copy_(src, non_blocking=True),
                 "pageable .cpu()": lambda: src.cpu()}
    for k, fn in kinds.items():
        fn()
        b.sync()
        secs = []
        for _ in range(reps):
            if b.device == "cpu":
                secs.append(b.timed(lambda: [fn() for _ in range(burst)]) / burst)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(burst):
                fn()
            end.record()
            end.synchronize()
            secs.append(start.elapsed_time(end) / 1e3 / burst)  # ms -> s
        out[k] = 2 * n / statistics.median(secs) / 1e9
    return out


def cli_help(actcap, sub):
    r = run_cli(actcap, sub, "--help", timeout=15)
    return r.stdout + r.stderr


def run_extract(b, actcap, ckpt, spec, corpus, capture, compute_dtype, out_dir, extra=()):
    """`actcap extract` forward-only or capturing every layer; its JSON summary + tokens/s (the
    run's own timer: the weights are loaded and placed before it starts; every batch, the first's
    cold start, and for a capture the shard writes and their fsync, are in it)."""
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
    r = run_cli(actcap, *args, timeout=max(1.0, b.left()))  # started only when it fits (cli_extract)
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


def checkpoint_gib(ckpt):
    return sum(f.stat().st_size for f in Path(ckpt).glob("*.safetensors")) / 2**30


def estimates(res, batches):
    """Seconds the expensive steps of a model are expected to take, before they are measured (the
    first figures are rough: load and placement at about 1 s per GiB of checkpoint; capture runs
    write what they capture at 1 GB/s), then from what was measured."""
    gib = res["checkpoint_gib"]
    cli = res.get("cli", {})
    fwd = cli["forward-only"]["process_s"] if "forward-only" in cli else 3.0 + gib
    cap = cli["capture"]["process_s"] if "capture" in cli else fwd + res["captured_bytes"] * batches / 1e9
    loads = res.get("hf_load_s", {})
    return {"hf load": max(loads.values()) if loads else 2.0 + 1.5 * gib,
            "actcap load": 1.0 + gib, "f32 check": 2.0 + 1.5 * gib,
            "cli forward-only": fwd, "cli capture": cap}


def bench_model(b, spec, env, res):
    """Every arm of one model; fills res (one dict per model). A failure in this process still
    leaves the CLI runs, which are processes of their own."""
    torch = b.torch
    b.step(res, "checkpoint")
    ckpt = ensure_checkpoint(spec, env["actcap"], b.a.models_dir, torch, b.device)
    cfg = json.loads((ckpt / "config.json").read_text())
    L = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    H = cfg.get("hidden_size") or cfg.get("n_embd")
    res.update({"layers": L, "hidden": H, "cut_from": spec.cut_from, "label": spec.label,
                "shape": spec.shape, "tokens": spec.batch * spec.seq,
                "captured_bytes": L * spec.batch * spec.seq * H * 2,
                "checkpoint_gib": checkpoint_gib(ckpt)})
    gen = torch.Generator().manual_seed(0)
    try:
        in_process(b, spec, env, res, ckpt, cfg, gen)
    except Exception as e:  # noqa: BLE001  (what it measured is kept; the CLI runs still run)
        record(res, f"in-process ({res.get('step')})", e)
    # in_process's models are gone with its frame: free the GPU before the CLI loads its own copy
    gc.collect()
    if b.device != "cpu":
        torch.cuda.empty_cache()
    cli_extract(b, spec, env, res, ckpt, cfg, gen)


def in_process(b, spec, env, res, ckpt, cfg, gen):
    """HF's and actcap's arms in this process, rotated; the copy bandwidth; the f32 check."""
    torch, a = b.torch, b.a
    L = res["layers"]
    ids_cpu = torch.randint(0, cfg["vocab_size"], (spec.batch, spec.seq), generator=gen)
    ids = ids_cpu.to(b.device)
    arms, last = {}, {}
    hf_dtype = torch.bfloat16 if b.device != "cpu" else torch.float32
    est = estimates(res, env["batches"])
    cli_s = est["cli forward-only"] + est["cli capture"]
    engines = 2 if env["ac"] is not None else 0  # actcap's: overlapped and blocking copies

    # --- HF: one instance per attention implementation (works with every transformers version);
    # sdpa first (the targets' comparison), eager only if the CLI runs still fit after it
    hfs = {}
    if env["transformers"] is not None:
        for impl in ("sdpa", "eager"):
            est = estimates(res, env["batches"])
            # eager only if both actcap engines, the f32 check and the CLI runs still fit after it
            need = est["hf load"] + engines * est["actcap load"] + est["f32 check"] + \
                (cli_s if impl == "eager" else 0)
            if not b.afford(res, f"HF {impl} load", need):
                continue
            b.step(res, f"hf {impl} load")
            try:
                hfs[impl] = load_hf(env["transformers"], torch, ckpt, spec.arch, impl, b.device, hf_dtype)
                res.setdefault("hf_load_s", {})[impl] = hfs[impl].load_s
            except Exception as e:  # noqa: BLE001
                record(res, f"hf {impl} load", e)
    elif spec.arch == "gpt2":
        hfs["eager"] = load_standin(torch, ckpt, b.device)
        res["hf_load_s"] = {"eager": hfs["eager"].load_s}
        res["notes"].append("HF arms: tests/python/hf_modules.py's GPT-2 (transformers is not installed)")
    else:
        res["notes"].append("HF arms not run: transformers is not installed (no stand-in for llama)")
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

    # --- actcap's engine from Python; a second one on the same weights copying each capture inside
    # its hook (copy_window=0), for the overlapped-vs-blocking comparison in the same rounds
    engine = blocking = None
    devices = "cpu:0" if b.device == "cpu" else "cuda:0"
    kw = {"devices": devices}
    if env["py_compute_dtype"]:
        kw["compute_dtype"] = "bf16"
    if ac is not None and b.afford(res, "actcap load", estimates(res, env["batches"])["actcap load"]):
        b.step(res, "actcap load")
        try:
            t0 = time.perf_counter()
            engine = ac.load(str(ckpt), **kw)
            res["actcap_load_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            record(res, "actcap load", e)
    if engine is not None and not env["py_copy_window"]:
        res["notes"].append("actcap capture, blocking copies not run: this actcap.load has no copy_window")
    elif engine is not None and blocking_fits(b, res) and b.afford(
            res, "actcap capture, blocking copies (a second engine)",
            sum(estimates(res, env["batches"])[k] for k in ("actcap load", "f32 check"))):
        b.step(res, "actcap load (blocking copies)")
        try:
            blocking = ac.load(str(ckpt), copy_window=0, **kw)
        except Exception as e:  # noqa: BLE001
            record(res, "actcap load (blocking copies)", e)
    layer_pat = "transformer.h.*" if spec.arch == "gpt2" else "model.layers.*"
    res["actcap_layer_prefix"] = layer_pat[:-2]
    if engine is not None:
        points = [p.name for p in engine.points()]
        norm = next((n for n in ("transformer.ln_f", "model.norm") if n in points), None)

        def act_forward():
            engine.run(ids_cpu, capture=norm, positions="last", dtype="bf16")

        def act_capture():
            last["actcap"] = engine.run(ids_cpu, capture=layer_pat, dtype="bf16")

        def act_blocking():
            blocking.run(ids_cpu, capture=layer_pat, dtype="bf16")
        if norm is None:
            record(res, "actcap forward", "no final-norm hook point found")
        else:
            arms["actcap forward"] = act_forward
        arms["actcap capture"] = act_capture
        if blocking is not None:
            arms["actcap capture, blocking copies"] = act_blocking

    # --- one rotation of every arm: the rounds get what the f32 check and the CLI leave
    est = estimates(res, env["batches"])
    check_s = est["f32 check"] if engine is not None and hfs else 0.0
    b.step(res, "rounds")
    b.rotate(arms, a.rounds, max(0.0, b.left() - check_s - cli_s), res, reserve_s=check_s)
    derive(res)
    # actcap's own counters of one capture run (they count from the last placement, which each run
    # makes): the first engine's last round may have been its forward, so one more capture
    if engine is not None and env["py_copy_window"] and "actcap capture" in res.get("seconds", {}) and \
            "actcap capture" not in res["errors"]:
        b.step(res, "device_stats")
        try:
            act_capture()
            res["device_stats"] = {"overlapped": engine.device_stats()}
            if "actcap capture, blocking copies" in res.get("seconds", {}) and \
                    "actcap capture, blocking copies" not in res["errors"]:
                res["device_stats"]["blocking"] = blocking.device_stats()  # its last run: a capture
        except Exception as e:  # noqa: BLE001
            record(res, "device_stats", e)
    blocking = None  # its timings are done: its weights leave the GPU before the f32 check
    # The bf16 runs' last layer, actcap vs HF: information only (bf16 rounding hides a RoPE error).
    if "actcap" in last and "actcap capture" not in res["errors"]:
        for impl in ("sdpa", "eager"):
            if f"hf {impl}" in last:
                try:
                    res["agreement_bf16"] = {"vs": f"hf {impl}", "rel": rel_diff(
                        torch, last["actcap"], f"{res['actcap_layer_prefix']}.{L - 1}", last[f"hf {impl}"], spec.seq)}
                except Exception as e:  # noqa: BLE001
                    record(res, "agreement (bf16)", e)
                break
    arms.clear()
    last.clear()

    # --- device->host bandwidth for this model's per-layer capture size
    b.step(res, "copy bandwidth")
    try:
        res["copy_gbps"] = copy_bandwidth(b, res["captured_bytes"] // L)
    except Exception as e:  # noqa: BLE001
        record(res, "copy bandwidth", e)

    # --- the same model? The last layer in f32 on both sides (HF's timings are done: its model is
    # converted in place), one sequence.
    if engine is not None and hfs and b.afford(res, "the f32 check (same model as HF)", check_s):
        b.step(res, "f32 check")
        impl = "sdpa" if "sdpa" in hfs else "eager"
        del engine  # the bf16 engine: its timings are done
        try:
            res["agreement"] = {"vs": f"hf {impl}", "dtype": "f32", "sequences": 1, "rel": agreement_f32(
                b, spec, env, res, ckpt, hfs[impl], ids, ids_cpu, devices)}
        except Exception as e:  # noqa: BLE001
            record(res, "agreement (f32)", e)
    b.save()


def blocking_fits(b, res):
    """Whether a second actcap engine (blocking copies) fits on the GPU: both engines' placed weights
    (at most the checkpoint's bytes each) and GPU_MARGIN_BYTES within the free memory, HF's models
    already placed; a note when not. A loaded engine's copy window cannot be changed, so there
    is no cheaper way to measure both modes in one process."""
    if b.device == "cpu":
        return True
    need = 2 * res["checkpoint_gib"] * 2**30 + GPU_MARGIN_BYTES
    try:
        free, _ = b.torch.cuda.mem_get_info()
    except Exception as e:  # noqa: BLE001  (not knowing is no reason to risk running out)
        free, why = 0, f"the free GPU memory is unknown ({error_text(e)})"
    else:
        why = f"{free / 2**30:.1f} GiB of GPU memory is free"
    if free >= need:
        return True
    res["notes"].append(f"actcap capture, blocking copies not run: two placed copies of the weights "
                        f"and {GPU_MARGIN_BYTES / 2**30:.0f} GiB for the arenas need "
                        f"{need / 2**30:.1f} GiB, {why} (a loaded engine's copy window cannot be "
                        "changed)")
    log(f"{res['key']}: {res['notes'][-1]}")
    return False


def agreement_f32(b, spec, env, res, ckpt, hf, ids, ids_cpu, devices):
    """max |actcap - HF| / max |HF| of the last layer's output for the first sequence, both in f32:
    HF's model converted to float32, a second actcap engine with compute_dtype f32."""
    torch, L = b.torch, res["layers"]
    out = {}
    handle = hf.layers[L - 1].register_forward_hook(
        lambda m, args, o: out.__setitem__("hf", hidden(o).detach().float().cpu()))
    try:
        hf.base.float()
        with torch.inference_mode():
            hf(ids[:1])
    finally:
        handle.remove()
    kw = {"devices": devices}
    if env["py_compute_dtype"]:
        kw["compute_dtype"] = "f32"
    engine = env["ac"].load(str(ckpt), **kw)
    point = f"{res['actcap_layer_prefix']}.{L - 1}"
    return rel_diff(torch, engine.run(ids_cpu[:1], capture=point), point, out["hf"], spec.seq)


def derive(res):
    """tokens/s and the ratios from the raw seconds. An arm that raised has no figures (its seconds
    stay in the JSON): its error is what the report shows."""
    errors = res.get("errors", {})
    times = {k: v for k, v in res.get("seconds", {}).items() if v and k not in errors}
    res["tps"] = {k: res["tokens"] / statistics.median(v) for k, v in times.items()}

    def ratio(x, y):  # median of the per-round ratios (both arms' i-th times are of round i)
        if times.get(x) and times.get(y):
            return statistics.median(p / q for p, q in zip(times[x], times[y]))
        return None
    r = ratio("actcap capture", "actcap forward")
    res["capture_cost"] = None if r is None else r - 1
    r = ratio("actcap capture, blocking copies", "actcap forward")
    res["capture_cost_blocking"] = None if r is None else r - 1
    res["hook_cost"], res["speedup_vs_hooks"] = {}, {}
    for impl in res.get("hf_attn", {}):
        r = ratio(f"hf {impl} + clone hooks", f"hf {impl}")
        res["hook_cost"][impl] = None if r is None else r - 1
        res["speedup_vs_hooks"][impl] = ratio(f"hf {impl} + clone hooks", "actcap capture")  # actcap's speedup


def cli_work_dir(a, env, res):
    """The folder of the CLI runs' corpus and shards: under the parent's folder on tmpfs (/dev/shm,
    where fsync costs nothing: the timer then holds actcap's writing, not the disk's) when it has
    room for them with 1 GiB to spare, else under --models-dir; res["cli_out"] says which."""
    need = res["captured_bytes"] * env["batches"] * 1.1 + 2**30
    shm = env.get("shm_dir")
    if shm:
        try:
            if shutil.disk_usage(shm).free >= need:
                res["cli_out"] = "tmpfs (/dev/shm)"
                return Path(tempfile.mkdtemp(prefix=f"{res['key']}-", dir=shm))
            why = f"/dev/shm has {shutil.disk_usage(shm).free / 2**30:.1f} GiB free, {need / 2**30:.1f} needed"
        except OSError as e:
            why = f"/dev/shm: {error_text(e)}"
    else:
        why = "no writable /dev/shm"
    res["cli_out"] = f"disk (--models-dir; {why})"
    return Path(tempfile.mkdtemp(prefix="gpu-bench-", dir=a.models_dir))


def cli_extract(b, spec, env, res, ckpt, cfg, gen):
    """`actcap extract` forward-only and capturing every layer, each started only when its
    estimate fits in the time left. (Blocking copies are measured in-process: a CLI run of its own
    costs the process's start, load and placement again.)"""
    torch, a = b.torch, b.a
    work = cli_work_dir(a, env, res)
    try:
        corpus = work / "corpus.jsonl"
        docs = spec.batch * env["batches"]
        rows = torch.randint(0, cfg["vocab_size"], (docs, spec.seq), generator=gen).tolist()
        corpus.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
        layer_pat = "transformer.h.*" if spec.arch == "gpt2" else "model.layers.*"
        runs = [("forward-only", None, ()), ("capture", layer_pat, ())]
        for what, cap, extra in runs:
            est = estimates(res, env["batches"])["cli forward-only" if cap is None else "cli capture"]
            if not b.afford(res, f"actcap extract {what}", est):
                continue
            b.step(res, f"actcap extract {what}")
            try:
                res.setdefault("cli", {})[what] = run_extract(
                    b, env["actcap"], ckpt, spec, corpus, cap, env["cli_compute_dtype"], work / "out",
                    extra)
            except subprocess.TimeoutExpired:
                # the budget ran out under it: not measured, which is not a failure of actcap
                res["notes"].append(f"actcap extract {what} not finished: the {a.budget_s:.0f} s budget "
                                    "ran out during it")
                log(f"{res['key']}: {res['notes'][-1]}")
            except Exception as e:  # noqa: BLE001
                record(res, f"actcap extract {what}", e)
            b.save()
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
    ("actcap capture, blocking copies", "the same, blocking copies (second engine, copy_window=0)"),
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
    o.append("- method: one child process per model (a crash costs that model only); per model every arm "
             "once per round, order rotated each round, the device synchronized around every timed call; "
             "TF32 off (PyTorch's default); tokens/s = B*T / median seconds. "
             "HF arms call the base model (no LM head, no cache) under inference_mode.")
    if not run.get("complete"):
        o.append(f"- **in progress**: rewritten after each model, this time after "
                 f"{', '.join(m['key'] for m in models) or 'none'}; if the run is no longer going on, "
                 "it was killed before it finished")
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
        n = run.get("cli_batches")
        for what, label in (("forward-only", f"actcap extract --forward-only (CLI, own timer: {n} batches; "
                                             "weights placed before it, the first batch's cold start in it)"),
                            ("capture", "actcap extract, every layer to shards (CLI, the same; the writes "
                                        "and their fsync in it)")):
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
        row("actcap capture, blocking copies vs actcap forward", lambda m: pct(m["capture_cost_blocking"]))
        row("time added per forward (ms): overlapped / blocking copies", lambda m: added_ms(m))
        row("actcap's counters of one capture (device_stats): copies queued / copy-window waits",
            lambda m: stats_text(m["device_stats"]))
        row("HF sdpa + clone hooks vs HF sdpa", lambda m: pct(m["hook_cost"]["sdpa"]))
        row("HF eager + clone hooks vs HF eager", lambda m: pct(m["hook_cost"]["eager"]))
        row("actcap capture speed / HF sdpa + clone hooks",
            lambda m: f"{m['speedup_vs_hooks']['sdpa']:.2f}x")
        row("actcap capture speed / HF eager + clone hooks",
            lambda m: f"{m['speedup_vs_hooks']['eager']:.2f}x")
        # everything a capture adds (copies, verification, bookkeeping) per byte: not a link bandwidth
        row("actcap capture: effective capture throughput GB/s (captured bytes / time added over actcap forward)",
            lambda m: marginal(m, "actcap capture", "actcap forward"))
        row("the same, blocking copies", lambda m: marginal(m, "actcap capture, blocking copies", "actcap forward"))
        row("HF sdpa + clone hooks: effective capture throughput GB/s (captured bytes / time added over HF sdpa)",
            lambda m: marginal(m, "hf sdpa + clone hooks", "hf sdpa"))
        row("pinned copy_ GB/s (one layer's bytes; 20 back-to-back, CUDA events)",
            lambda m: f"{m['copy_gbps']['pinned copy_']:.1f}")
        row("pageable .cpu() GB/s (the same)", lambda m: f"{m['copy_gbps']['pageable .cpu()']:.1f}")
        row("host copy_ GB/s (no GPU)", lambda m: f"{m['copy_gbps']['host copy_']:.1f}")
        row("last layer in f32, one sequence, actcap vs HF: max abs diff / max abs HF",
            lambda m: f"{m['agreement']['rel']:.1e} (vs {m['agreement']['vs']})")
        row("the same in the bf16 timed runs (information only)",
            lambda m: f"{m['agreement_bf16']['rel']:.1e} (vs {m['agreement_bf16']['vs']})")
        row("load s: HF from_pretrained onto the device (the first includes transformers' imports)",
            lambda m: ", ".join(f"{k} {v:.1f}" for k, v in m["hf_load_s"].items()) or None)
        row("actcap extract's shards written to", lambda m: m["cli_out"])
        row("load s: actcap.load (host only) + its first run (places the weights)", lambda m: (
            f"{m['actcap_load_s']:.1f} + "
            f"{m['first_call_s'].get('actcap forward', m['first_call_s'].get('actcap capture')):.1f}"))
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


def added_s(m, arm, base):
    """The time `arm` adds to `base`, median against median (s); None when either is missing."""
    t, b = m["seconds"].get(arm), m["seconds"].get(base)
    if not t or not b or arm in m["errors"] or base in m["errors"]:
        return None
    return statistics.median(t) - statistics.median(b)


def added_ms(m):
    """The time a capture adds to the forward, median against median, overlapped / blocking copies."""
    got = [added_s(m, arm, "actcap forward") for arm in ("actcap capture", "actcap capture, blocking copies")]
    return None if got == [None, None] else " / ".join("—" if x is None else f"{1e3 * x:+.2f}" for x in got)


def stats_text(stats):
    """Engine.device_stats() of one capture, summed over devices: copies queued / waits, per engine."""
    return "; ".join(f"{k} {sum(d['capture_copies'] for d in v)} / {sum(d['copy_waits'] for d in v)}"
                     for k, v in stats.items()) or None


def marginal(m, arm, base):
    extra = added_s(m, arm, base)
    if extra is None:
        return None
    if extra <= 0:
        return f"all hidden (added time {1e3 * extra:+.2f} ms)"
    return f"{m['captured_bytes'] / extra / 1e9:.1f}"


# f32 on both sides, where the noise is about 1e-6 or less. Measured with tests/python/reference.py
# on a narrower Llama: dropping llama3's rope_scaling moves the last layer by 1.2e-2, a wrong
# rope_theta by 7.9e-2; bf16's bar of 0.1 passed both.
AGREEMENT_BAR = 1e-3


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
        # anything.
        agree = m.get("agreement")
        what = (f"{m['key']}: same model as HF (last layer in f32, one sequence, within "
                f"{AGREEMENT_BAR:g} of HF's largest magnitude)")
        if agree is None:
            out.append(f"{what}: not measured")
        else:
            out.append(f"{what}: {agree['rel']:.1e} vs {agree['vs']} → "
                       f"{'PASS' if agree['rel'] <= AGREEMENT_BAR else 'FAIL'}")
    return out


# ---------------------------------------------------------------------------------------------

def environment(a, package=True):
    """Imports and checks; dies with one line when the environment cannot run the benchmark. The
    parent leaves the actcap package to its children (`package`): they report what they found."""
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
    if not package:  # the parent: the children import transformers (seconds of the budget)
        if importlib.util.find_spec("transformers") is None and not a.smoke:
            die("cannot find transformers: the HF arms need it (pip install transformers accelerate)")
    else:
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
    if not package:
        return torch, transformers, ac, ac_err
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


def dtype_line(device, cli_cd, pkg):
    """What each side computes in, and whether the comparison is dtype-matched (`pkg`: what a
    child found of the actcap package, None before any child ran)."""
    hf = "bf16" if device != "cpu" else "f32 (CPU smoke)"
    py_cd = bool(pkg and pkg["compute_dtype"])
    py = "bf16" if py_cd else "f32"
    cli = "bf16" if cli_cd else "f32"
    if not (pkg and pkg["path"]):
        py = cli
    sides = f"HF computes in {hf}; actcap's engine (Python) in {py}, `actcap extract` in {cli}"
    widened = "" if py_cd and cli_cd else \
        " (no --compute-dtype yet: bf16 weights widened to f32 per layer)"
    matched = hf.split()[0] == py == cli
    return (f"weights bf16 on disk; {sides}{widened}: "
            + ("dtype-matched" if matched else "NOT dtype-matched")
            + "; every capture is stored as bf16 (HF's hooks copy bf16 outputs)")


def planned(keys, mins, left):
    """The models among `keys` to run in `left` seconds: all of them when their least costs fit,
    else those that fit taken in PRIORITY order."""
    if sum(mins[k] for k in keys) <= left:
        return list(keys)
    kept, total = [], 0
    for k in sorted(keys, key=PRIORITY.index):
        if total + mins[k] <= left:
            kept.append(k)
            total += mins[k]
    return kept


def model_share(key, kept, mins, left):
    """Seconds for model `key` (the first of `kept`, the models still to run, in the order they
    run) out of `left`: in proportion to the least costs, but no more than leaves the later ones
    their least costs even if this child is stopped at the last moment (its share, then
    2 * STOP_WAIT_S: the grace before SIGTERM and the wait before SIGKILL); never under its own."""
    share = left * mins[key] / sum(mins[k] for k in kept)
    later = sum(mins[k] for k in kept[kept.index(key) + 1:])
    if later:
        share = min(share, left - later - 2 * STOP_WAIT_S)
    return max(mins[key], share)


def child_window(now, share, end):
    """(the child's own deadline, when the parent stops it) for a child started at `now` with
    `share` seconds, the children's time ending at `end`: the stop STOP_WAIT_S after the share but
    not past `end`, the deadline at least STOP_WAIT_S before the stop, so that a child that kept
    to its deadline is never stopped (the last model's share reaches `end`)."""
    stop_at = min(now + share + STOP_WAIT_S, end)
    return min(now + share, stop_at - STOP_WAIT_S), stop_at


def child_args(a):
    """The command-line options a child shares with its parent."""
    args = ["--actcap", a.actcap, "--device", a.device, "--rounds", a.rounds, "--budget-s", a.budget_s,
            "--models-dir", a.models_dir, "--cli-batches", a.cli_batches]
    if a.python_dir:
        args += ["--python-dir", a.python_dir]
    if a.layers_8b:
        args += ["--layers-8b", a.layers_8b]
    args += [flag for flag, on in (("--smoke", a.smoke), ("--quick", a.quick)) if on]
    return [str(x) for x in args]


def end_child(child):
    """SIGTERM (the child saves its part), then SIGKILL if it has not exited STOP_WAIT_S later;
    False if it has not exited STOP_WAIT_S after that either (stuck in the driver)."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            try:
                child.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                return False
    return True


def run_child(a, b, spec, res, share_s, env, parts):
    """One model in a child process with share_s seconds; its saved part merged into res, whatever
    became of the child. A SIGTERM here is passed on to the child before the Stop goes up."""
    part = parts / f"{spec.key}.json"
    now = time.perf_counter()
    deadline, stop_at = child_window(now, share_s, b.deadline - REPORT_RESERVE_S - STOP_WAIT_S)
    share_s = deadline - now  # what the child is told (and the report says)
    log(f"{spec.key} {spec.shape}: {share_s:.0f} s (stopped {stop_at - now:.0f} s after its start at the "
        f"latest) of the {b.deadline - REPORT_RESERVE_S - STOP_WAIT_S - now:.0f} s left")
    child, over, gone = None, False, True
    try:
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *child_args(a), "--models", spec.key,
             "--child", str(part), "--child-env", json.dumps(dict(env, deadline=time.time() + share_s))],
            stdout=sys.stderr)  # the child's stdout is not the report
        child.wait(timeout=max(0.0, stop_at - time.perf_counter()))
    except subprocess.TimeoutExpired:
        over = True
    finally:
        # A SIGTERM from here to the part's read waits (blocked, then raised as Stop once it is
        # read): stopping the child and reading what it saved must not be cut short.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            if child is not None:
                gone = end_child(child)  # over its time, or a Stop going up: the child saves first
            try:
                res.update(json.loads(part.read_text()))
            except (OSError, ValueError):
                pass
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    step = res.pop("step", None)
    if not gone:
        record(res, "child process", f"did not exit {2 * STOP_WAIT_S:.0f} s after SIGTERM and SIGKILL "
               f"(during {step or 'its start'}; stuck in the driver?); what it measured before is kept")
    elif over:  # the child's own note on the SIGTERM says less
        res["notes"] = [n for n in res["notes"] if not n.startswith("stopped by SIGTERM")]
        res["notes"].append(f"stopped during {step or 'its start'}: over its {share_s:.0f} s share of "
                            "the budget (what it measured before is kept)")
        log(f"{spec.key}: {res['notes'][-1]}")
    elif child.returncode or step != "done":
        rc = child.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        record(res, "child process", f"{how} during {step or 'its start'}; what it measured before "
               "is kept (a crash's Python stack is in the log, from faulthandler)")


def set_tf32_off(torch):
    # PyTorch's default, as libtorch's (said in the report); torch >= 2.9 has the new switch and
    # warns about the old one (mixing both is an error there).
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False


def child_main(a):
    """One model (--models KEY) in this process; its results saved to --child after every step."""
    torch, transformers, ac, ac_err = environment(a)
    env = json.loads(a.child_env)
    b = Bench(a, torch, time.perf_counter() + env.pop("deadline") - time.time())
    spec = next(s for s in specs_for(a) if s.key == a.models)
    py_cd = ac is not None and "compute_dtype" in inspect.signature(ac.load).parameters
    res = {"key": spec.key, "label": spec.label, "shape": spec.shape, "errors": {}, "notes": [],
           "package": {"path": str(Path(ac.__file__).parent) if ac else None, "error": ac_err,
                       "compute_dtype": py_cd},
           "transformers": transformers.__version__ if transformers else None}
    b.part, b.res = Path(a.child), res
    stop_on_sigterm()
    env.update({"actcap": Path(a.actcap).resolve(), "transformers": transformers, "ac": ac,
                "py_compute_dtype": py_cd, "batches": a.cli_batches,
                # load(copy_window=) and Engine.device_stats() came together
                "py_copy_window": ac is not None and "copy_window" in inspect.signature(ac.load).parameters})
    if b.device != "cpu":
        set_tf32_off(torch)
    try:
        try:
            bench_model(b, spec, env, res)
        except Exception as e:  # noqa: BLE001
            record(res, res.get("step") or "model", e)
        res["step"] = "done"
    except Stop:
        res["notes"].append(f"stopped by SIGTERM during {res.get('step')}: what was measured before is kept")
        log(f"{spec.key}: {res['notes'][-1]}")
    b.save()
    return 0


def transformers_version():
    """transformers' installed version without importing it (seconds of the parent's budget); the
    children say which one they imported."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "installed" if importlib.util.find_spec("transformers") else "not installed"


def incomplete(run):
    """What a complete run would have measured and this one did not: planned models not run,
    targets not measured ('' when nothing is missing)."""
    skipped = [m["key"] for m in run["models"] if any(n.startswith("not run") for n in m.get("notes", []))]
    return "; ".join([f"{k} not run" for k in skipped] + [
        t for t in run["targets"] if t.endswith(": not measured") and t.split(":")[0] not in skipped])


def write_outputs(a, b, run, complete=False):
    """The report and the JSON of what is measured so far (after each model, and at the end)."""
    run["elapsed_s"] = time.perf_counter() - b.t0
    run["complete"] = complete
    pkg = run["package"]
    run["actcap_line"] = run["actcap_bin"] + "; " + (
        f"Python package {pkg['path']}" if pkg and pkg["path"] else
        f"Python package: {pkg['error']}" if pkg else "Python package: no model ran")
    run["dtype_line"] = dtype_line(b.device, run["cli_compute_dtype"], pkg)
    run["env_line"] = f"{run['env_base']}; transformers {run['transformers']}; python {platform.python_version()}"
    run["targets"] = targets(run)
    report = build_report(run)
    if a.out:
        write_atomic(a.out, report)
    if a.json_out:
        write_atomic(a.json_out, json.dumps(run, indent=1, default=str))
    return report


def main():
    faulthandler.enable()  # a native crash prints the Python stack
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
    ap.add_argument("--cli-batches", type=int, default=16,
                    help="batches of each `actcap extract` run (default 16; its timer starts after the weights are "
                         "placed, the first batch's cold start is in it)")
    ap.add_argument("--models-dir", help="checkpoint cache (default: <actcap's folder>/gpu-bench-models)")
    ap.add_argument("--out", help="also write the markdown report here (rewritten after each model)")
    ap.add_argument("--json-out", help="raw results (every timing) as JSON (rewritten after each model)")
    ap.add_argument("--child", help=argparse.SUPPRESS)      # a child: the file it saves its model's results to
    ap.add_argument("--child-env", help=argparse.SUPPRESS)  # a child: what the parent found, its deadline
    a = ap.parse_args()
    a.rounds = a.rounds or (5 if a.quick or a.smoke else 10)
    if a.budget_s is None:
        a.budget_s = 600 if a.smoke else 90 if a.quick else 180
    # The GPU machine has no network: transformers reads the local folders only, and must not wait
    # for a DNS lookup should a later version try one.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if a.child:
        return child_main(a)

    torch, _, _, _ = environment(a, package=False)
    a.models_dir = str(Path(a.models_dir or Path(a.actcap).resolve().parent / "gpu-bench-models").resolve())
    Path(a.models_dir).mkdir(parents=True, exist_ok=True)
    b = Bench(a, torch)
    stop_on_sigterm()  # from here on a SIGTERM still writes the report
    mode = "smoke" if a.smoke else "quick" if a.quick else "full"
    actcap = Path(a.actcap).resolve()
    run = {
        "command": " ".join(["python3", "bench/gpu_bench.py"] + sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": "unknown", "mode": mode, "budget_s": a.budget_s, "cli_batches": a.cli_batches,
        "env_base": f"torch {torch.__version__}", "transformers": transformers_version(),
        "actcap_bin": str(actcap), "cli_compute_dtype": False,
        "package": None, "models": [], "notes": [], "errors": [],
    }
    specs = specs_for(a)
    if a.models:
        want = a.models.split(",")
        specs = [s for s in specs if s.key in want]
    order = [s.key for s in specs]  # the report's columns; the models run in PRIORITY order
    specs.sort(key=lambda s: PRIORITY.index(s.key))
    status = 0
    parts = Path(tempfile.mkdtemp(prefix="gpu-bench-parts-", dir=a.models_dir))
    # The CLI runs' shards go to tmpfs when there is one (each child checks its room); removed here
    # at the end, whatever became of the children.
    shm = None
    if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK):
        try:
            shm = tempfile.mkdtemp(prefix="gpu-bench-", dir="/dev/shm")
        except OSError:
            shm = None
    run["cli_work_root"] = shm
    try:
        def git(*args):
            try:
                return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                                      timeout=10).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):  # the commit is unknown, not a reason to stop
                return ""
        commit = os.environ.get("ACTCAP_COMMIT") or git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        run["commit"] = (commit or "unknown") + (" (with uncommitted changes)" if dirty else "")
        gpu = (f"{torch.cuda.get_device_name(0)} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
               if b.device != "cpu" else f"none (--device cpu; {os.cpu_count()} cores)")
        run["env_base"] = (f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
                           f"{torch.backends.cudnn.version() if b.device != 'cpu' else 'n/a'}, GPU {gpu}")
        run["actcap_bin"] = f"{actcap} (sha256 {hashlib.sha256(actcap.read_bytes()).hexdigest()[:12]})"
        try:
            help_text = cli_help(actcap, "extract")
        except subprocess.TimeoutExpired:
            help_text = ""
            run["errors"].append(f"`{actcap} extract --help` did not answer in 15 s")
            log(run["errors"][-1])
        run["cli_compute_dtype"] = "--compute-dtype" in help_text
        env = {"cli_compute_dtype": run["cli_compute_dtype"], "shm_dir": shm}
        for s in specs:
            if s.cut_from:
                run["notes"].append(f"{s.key}: {s.overrides['num_hidden_layers']} of {s.cut_from} layers "
                                    "written and run (every other dimension as the real model); tokens/s "
                                    "are for that depth, not the full model")
        mins = MIN_MODEL_S[mode]
        for i, s in enumerate(specs):
            res = {"key": s.key, "label": s.label, "shape": s.shape, "errors": {}, "notes": []}
            run["models"].append(res)
            run["models"].sort(key=lambda m: order.index(m["key"]))
            left = b.left() - REPORT_RESERVE_S - STOP_WAIT_S
            kept = planned([x.key for x in specs[i:]], mins, left)
            if s.key not in kept:
                res["notes"].append(f"not run: {max(0.0, left):.0f} s of the {a.budget_s:.0f} s budget "
                                    f"left, at least {mins[s.key]} s needed" + (
                                        f" and not enough for every model: the time went to {', '.join(kept)}"
                                        if kept else ""))
                log(f"{s.key}: {res['notes'][-1]}")
                write_outputs(a, b, run)
                continue
            # its part of what is left, in proportion to the least costs of the models to run
            share = model_share(s.key, kept, mins, left)
            try:
                run_child(a, b, s, res, share, env, parts)
            finally:
                pkg = res.pop("package", None)
                version = res.pop("transformers", None)
                if version:  # what the child imported: the one measured
                    run["transformers"] = version
                if pkg and run["package"] is None:
                    run["package"] = pkg
                    if pkg["error"]:
                        run["notes"].append(f"actcap Python arms not run: {pkg['error']}")
                if "tokens" in res:
                    derive(res)
            for k, v in res.get("tps", {}).items():
                log(f"  {k:32s} {fmt_tps(v):>12s} tok/s")
            write_outputs(a, b, run)
    except Stop:
        run["errors"].append("stopped by SIGTERM (stage timeout): later figures were not measured")
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what is left is writing the report
        shutil.rmtree(parts, ignore_errors=True)
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
    report = write_outputs(a, b, run, complete=True)
    if any(m.get("errors") for m in run["models"]) or run["errors"]:
        status = 1
    elif status == 0 and incomplete(run):
        status = INCOMPLETE
        log(f"incomplete (exit {INCOMPLETE}): {incomplete(run)}")
    print(report)
    return status


if __name__ == "__main__":
    sys.exit(main())
