#!/usr/bin/env python3
"""Lean eager PyTorch forward of a GPT-2 / Llama-family / Mixtral checkpoint: the baseline of bench/run_bench.py
and bench/moe_bench.py.

    python3 bench/eager_forward.py MODEL --batch B --seq T --iters N --warmup W --threads 2 --json
    python3 bench/eager_forward.py MODEL --batch B --seq T --profile     # per-op table, one forward
    python3 bench/eager_forward.py --self-check                          # vs tests/python/reference.py
    python3 bench/eager_forward.py --sgemm 2048 --reps 5 --threads 2     # sgemm roofline, JSON

tests/python/reference.py is the parity oracle: it runs each sequence alone and keeps every hook
point (input and output) alive, so it is the wrong thing to time. This file reuses its config
resolution, RoPE and name normalisation, and does what a user of eager PyTorch would time: one
batched forward [B, T] -> logits [B, T, V] with torch.nn.functional ops under
torch.inference_mode(), no hooks, nothing kept but the logits. Semantics follow Hugging Face's
modeling_gpt2.py / modeling_llama.py (eager attention, no cache, no padding, eval mode), with two
deliberate speed choices a careful eager user would make too:
  - GELU-tanh ("gelu_new", "gelu_fast", "gelu_pytorch_tanh") uses the fused F.gelu(approximate="tanh")
    (the same kernel actcap calls), not HF's 5-op Python formula;
  - the causal mask is an additive [T, T] bias (0 / -inf) added in place, as actcap does.

Weights are read tensor by tensor with numpy.fromfile (no whole-file buffer, no mmap kept), so the
resident set after loading is the weights plus the interpreter and torch, and the peak resident set
reported in --json (getrusage ru_maxrss of this process) is what eager inference itself needs.
The JSON line has the keys of `actcap bench --json` that run_bench.py reads.
"""
import argparse
import json
import math
import os
import resource
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import reference as ref  # noqa: E402  (Config, RoPE, name normalisation)
import st  # noqa: E402  (checkpoint_files)

_NP = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}

_GELU_TANH = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh")


def _act(name):
    if name in _GELU_TANH:
        return lambda x: F.gelu(x, approximate="tanh")
    return ref._act(name)


def load_weights(ckpt_dir):
    """name -> float32 torch tensor; one read per tensor, nothing else kept."""
    files, _ = st.checkpoint_files(ckpt_dir)
    out = {}
    for path in files:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            base = 8 + n
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                b, e = info["data_offsets"]
                dt = np.dtype(_NP[info["dtype"]])
                f.seek(base + b)
                arr = np.fromfile(f, dtype=dt, count=(e - b) // dt.itemsize).reshape(info["shape"])
                if info["dtype"] == "BF16":
                    arr = st.bf16_bits_to_f32(arr)
                t = torch.from_numpy(arr)
                out[name] = t.to(torch.float32) if t.is_floating_point() else t
    return out


class EagerModel:
    def __init__(self, ckpt_dir):
        self.cfg = c = ref.Config(ref.load_config(ckpt_dir))
        w = load_weights(ckpt_dir)
        if c.arch == "gpt2":
            w = ref._norm_gpt2_names(w)
            emb_key, prefix = "wte.weight", "transformer."
        else:
            w = ref._norm_llama_names(w)
            emb_key, prefix = "model.embed_tokens.weight", ""
        if c.tie:
            src = w.get(emb_key, w.get("lm_head.weight"))
            w[emb_key] = src
            w["lm_head.weight"] = src
        for name, shape in ref.expected_shapes(c).items():
            key = name[len(prefix):] if prefix and name.startswith(prefix) else name
            if key not in w or list(w[key].shape) != list(shape):
                raise ref.ReferenceError(f"{name}: missing or not of shape {shape}")
        if c.arch == "mixtral":
            # HF transformers 5 holds each expert's w1 and w3 as one gate_up matrix (its load-time
            # conversion): one GEMM for both, as a user of transformers runs it.
            for i in range(c.layers):
                p = f"model.layers.{i}.block_sparse_moe"
                for e in range(c.experts):
                    x = f"{p}.experts.{e}"
                    w[x + ".gate_up"] = torch.cat([w.pop(x + ".w1.weight"), w.pop(x + ".w3.weight")])
        self.w = w
        self.act = _act(c.act)

    def forward(self, ids):
        """ids [B, T] int64 -> logits [B, T, V] float32."""
        return self._gpt2(ids) if self.cfg.arch == "gpt2" else self._llama(ids)

    @staticmethod
    def _causal_bias(T):
        return torch.full((T, T), float("-inf")).triu_(1)

    def _gpt2(self, ids):
        c, w = self.cfg, self.w
        B, T = ids.shape
        H, nh, hd = c.hidden, c.heads, c.head_dim
        bias = self._causal_bias(T)
        pos = torch.arange(T)
        h = F.embedding(ids, w["wte.weight"]) + F.embedding(pos, w["wpe.weight"])  # [B, T, H]
        scale = 1.0 / math.sqrt(hd) if c.scale_attn_weights else 1.0

        def ln(x, p):
            return F.layer_norm(x, (H,), w[p + ".weight"], w[p + ".bias"], c.eps)

        def conv1d(x, p):  # HF Conv1D: x @ W[in, out] + b
            return torch.addmm(w[p + ".bias"], x.reshape(-1, x.shape[-1]), w[p + ".weight"])

        for i in range(c.layers):
            p = f"h.{i}"
            qkv = conv1d(ln(h, p + ".ln_1"), p + ".attn.c_attn").view(B, T, 3, nh, hd).permute(2, 0, 3, 1, 4)
            s = scale / (i + 1) if c.scale_by_layer else scale
            att = torch.matmul(qkv[0], qkv[1].transpose(-1, -2)).mul_(s).add_(bias)
            att = F.softmax(att, dim=-1)
            o = torch.matmul(att, qkv[2]).transpose(1, 2).reshape(B * T, H)
            h = h + conv1d(o, p + ".attn.c_proj").view(B, T, H)
            m = conv1d(self.act(conv1d(ln(h, p + ".ln_2"), p + ".mlp.c_fc")), p + ".mlp.c_proj")
            h = h + m.view(B, T, H)
        return F.linear(ln(h, "ln_f"), w["lm_head.weight"])

    def _llama(self, ids):
        c, w = self.cfg, self.w
        B, T = ids.shape
        nh, nkv, hd = c.heads, c.kv_heads, c.head_dim
        groups = nh // nkv
        scaling = hd ** -0.5
        cos, sin = ref.rope_cos_sin(c.rope, hd, T)
        biases = {}
        for win in set(c.windows):
            b = self._causal_bias(T)
            if win is not None and win < T:
                b.masked_fill_(torch.ones(T, T, dtype=torch.bool).tril_(-int(win)), float("-inf"))
            biases[win] = b

        def rms(x, p):
            var = x.pow(2).mean(-1, keepdim=True)
            return w[p + ".weight"] * (x * torch.rsqrt(var + c.eps))

        def lin(x, p):
            return F.linear(x, w[p + ".weight"], w.get(p + ".bias"))

        h = F.embedding(ids, w["model.embed_tokens.weight"])
        for i in range(c.layers):
            p = f"model.layers.{i}"
            x = rms(h, p + ".input_layernorm")
            q = lin(x, p + ".self_attn.q_proj").view(B, T, nh, hd).transpose(1, 2)
            k = lin(x, p + ".self_attn.k_proj").view(B, T, nkv, hd).transpose(1, 2)
            v = lin(x, p + ".self_attn.v_proj").view(B, T, nkv, hd).transpose(1, 2)
            q = ref.apply_rope(q, cos, sin)
            k = ref.apply_rope(k, cos, sin)
            if groups > 1:  # repeat_kv
                k = k[:, :, None].expand(B, nkv, groups, T, hd).reshape(B, nh, T, hd)
                v = v[:, :, None].expand(B, nkv, groups, T, hd).reshape(B, nh, T, hd)
            att = torch.matmul(q, k.transpose(-1, -2)).mul_(scaling).add_(biases[c.windows[i]])
            att = F.softmax(att, dim=-1)
            o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, nh * hd)
            h = h + lin(o, p + ".self_attn.o_proj")
            x2 = rms(h, p + ".post_attention_layernorm")
            if c.arch == "mixtral":
                h = h + self._sparse_moe(x2, p + ".block_sparse_moe")
                continue
            d = lin(self.act(lin(x2, p + ".mlp.gate_proj")) * lin(x2, p + ".mlp.up_proj"), p + ".mlp.down_proj")
            h = h + d
        return F.linear(rms(h, "model.norm"), w["lm_head.weight"])

    def _sparse_moe(self, x, p):
        """Mixtral's sparse block as transformers 5 runs it by default (MixtralTopKRouter, then the
        grouped_mm experts path in plain ops): softmax in float32, top k renormalised, (token, slot)
        pairs sorted by expert, one GEMM per expert on its rows, the k weighted outputs of a token
        summed."""
        c, w = self.cfg, self.w
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = F.softmax(F.linear(flat, w[p + ".gate.weight"]), dim=-1)
        top, idx = torch.topk(probs, c.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        ids = idx.reshape(-1)
        order = torch.sort(ids, stable=True).indices
        counts = torch.bincount(ids, minlength=c.experts).tolist()
        token = order // c.top_k
        weight = top.reshape(-1)[order, None]
        out = torch.empty(ids.shape[0], shape[-1])
        start = 0
        inner = c.moe_inner
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = slice(start, start + n)
            gu = F.linear(flat[token[rows]], w[f"{p}.experts.{e}.gate_up"])
            y = F.linear(self.act(gu[:, :inner]) * gu[:, inner:], w[f"{p}.experts.{e}.w2.weight"])
            out[order[rows]] = y * weight[rows]
            start += n
        return out.view(-1, c.top_k, shape[-1]).sum(1).view(shape)


def bench_tokens(batch, seq, vocab):
    """The same deterministic xorshift token ids as `actcap bench` (content does not change the cost)."""
    x = 88172645463325252
    m = (1 << 64) - 1
    out = []
    for _ in range(batch):
        row = []
        for _ in range(seq):
            x ^= (x << 13) & m
            x ^= x >> 7
            x ^= (x << 17) & m
            row.append(x % vocab)
        out.append(row)
    return torch.tensor(out, dtype=torch.int64)


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sgemm(n, reps, threads):
    """GFLOP/s of n x n x n float32 torch.mm: into a preallocated output (the GEMM alone: the
    roofline) and allocating its output each call (as every matmul of a forward does)."""
    torch.set_num_threads(threads)
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    res = {"n": n, "reps": reps, "threads": torch.get_num_threads(), "torch": torch.__version__}
    with torch.inference_mode():
        for key, fn in (("out", lambda: torch.mm(a, b, out=c)), ("alloc", lambda: torch.mm(a, b))):
            g = []
            for i in range(2 + reps):
                t = time.perf_counter()
                r = fn()
                s = time.perf_counter() - t
                del r
                if i >= 2:
                    g.append(2.0 * n ** 3 / s / 1e9)
            g.sort()
            res[key + "_gflops"] = g
            res[key + "_median_gflops"] = g[len(g) // 2]
    return res


def self_check():
    """Logits of this forward vs reference.py on small random checkpoints (needs build/actcap)."""
    import subprocess
    import tempfile
    actcap = os.environ.get("ACTCAP", str(REPO / "build" / "actcap"))
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        for arch in ("gpt2", "llama", "mistral", "qwen2", "mixtral"):
            ck = os.path.join(d, arch)
            subprocess.run([actcap, "init-model", "--arch", arch, "--preset", "tiny", "--seed", "3", "--out", ck],
                           check=True, stdout=subprocess.DEVNULL)
            m = EagerModel(ck)
            ids = bench_tokens(3, 40, m.cfg.vocab_size)
            with torch.inference_mode():
                got = m.forward(ids).numpy()
            want = ref.Model(ck)
            for b in range(ids.shape[0]):
                exp = want.forward(ids[b].tolist())["lm_head"]
                err = float(np.abs(got[b] - exp).max() / max(1e-6, float(np.abs(exp).max())))
                worst = max(worst, err)
                if err > 1e-5:
                    raise SystemExit(f"self-check FAILED: {arch} sequence {b}: relative max error {err:.3g}")
    print(f"self-check ok: gpt2, llama, mistral, qwen2, mixtral logits match reference.py (worst relative error {worst:.2g})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", action="store_true", help="one forward under torch.autograd.profiler; per-op table")
    ap.add_argument("--self-check", action="store_true")
    ap.add_argument("--sgemm", type=int, metavar="N", help="print the JSON of N x N x N torch.mm GFLOP/s instead")
    ap.add_argument("--reps", type=int, default=5, help="with --sgemm: timed repetitions (after 2 untimed)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.self_check:
        return self_check()
    if a.sgemm:
        print(json.dumps(sgemm(a.sgemm, a.reps, a.threads)))
        return 0
    if not a.model:
        ap.error("MODEL is required")
    t0 = time.perf_counter()
    model = EagerModel(a.model)
    load_s = time.perf_counter() - t0
    if a.seq > (model.cfg.n_positions if model.cfg.arch == "gpt2" else model.cfg.raw.get("max_position_embeddings", a.seq)):
        raise SystemExit(f"--seq {a.seq} exceeds the model's context")
    ids = bench_tokens(a.batch, a.seq, model.cfg.vocab_size)
    rss_loaded = peak_rss_bytes()
    with torch.inference_mode():
        if a.profile:
            model.forward(ids)  # warm-up
            with torch.autograd.profiler.profile() as prof:
                t = time.perf_counter()
                model.forward(ids)
                wall = time.perf_counter() - t
            print(f"one forward {a.batch}x{a.seq}: {wall:.3f} s")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
            return 0
        secs = []
        for i in range(a.warmup + a.iters):
            t = time.perf_counter()
            logits = model.forward(ids)
            s = time.perf_counter() - t
            del logits
            if i >= a.warmup:
                secs.append(s)
    secs.sort()
    median = secs[len(secs) // 2]
    res = {"tokens_per_s": a.batch * a.seq / median, "median_s": median, "min_s": secs[0], "max_s": secs[-1],
           "iters": a.iters, "batch": a.batch, "seq": a.seq, "threads": torch.get_num_threads(),
           "peak_rss_bytes": peak_rss_bytes(), "rss_after_load_bytes": rss_loaded, "load_s": load_s,
           "torch": torch.__version__}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{a.batch}x{a.seq}: {res['tokens_per_s']:.0f} tokens/s (median {median * 1000:.1f} ms of {a.iters}, "
              f"{res['threads']} threads), peak RSS {res['peak_rss_bytes'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
