"""bench/gpu_bench.py (the GPU benchmark the kit's `bench` stage runs) without a GPU: its
`--device cpu --smoke` run measures the actcap arms (and the HF-shaped stand-in) on tiny shapes and
writes a report of real figures; what a GPU run may meet is made to happen here: an arm raising in
a round, a model's child process crashing or hanging, HF loading other weights or a different
model, a SIGTERM, a spent budget; its normal mode refuses, in one line, to run without CUDA."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_bench.py"
NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"
SAME_MODEL = "same model as HF (last layer in f32, one sequence, within 0.001 of HF's largest magnitude): "

# A stand-in for transformers (written to a folder put on PYTHONPATH): from_pretrained checks the
# arguments the benchmark passes and returns tests/python/hf_modules.py's GPT-2 for gpt2
# checkpoints and, for llama ones, a Llama shaped as transformers 5's LlamaForCausalLM (base_model
# `model`, decoder layers `model.layers` returning the hidden states, a float32 rotary inv_freq
# buffer from tests/python/reference.py's RoPE, llama3 scaling included). Knobs, by checkpoint
# folder name: FAKE_HF_CRASH (the process dies of SIGSEGV in from_pretrained, as a native crash
# would), FAKE_HF_HANG (it never returns), FAKE_HF_UNEXPECTED (loading info with an unexpected key),
# FAKE_HF_PERTURB (gpt2 only: position embeddings 2% larger: a model that differs as a RoPE setting
# would, by about 1e-2).
FAKE_TRANSFORMERS = '''
import json, os, signal, sys, time, types
from pathlib import Path
import torch
import torch.nn.functional as F
sys.path.insert(0, %(tests)r)
from hf_modules import GPT2LMHeadModel, GPT2Model
import reference as R

__version__ = "5.3.0"
logging = types.SimpleNamespace(set_verbosity_error=lambda: None)


class Base(GPT2Model):  # GPT2Model's call as the benchmark makes it
    def forward(self, input_ids=None, use_cache=None):
        return super().forward(input_ids)


class CausalLM(torch.nn.Module):
    def __init__(self, inner, impl):
        super().__init__()
        self.transformer = inner.transformer
        self.transformer.__class__ = Base
        self.config = types.SimpleNamespace(_attn_implementation=impl)

    @property
    def base_model(self):
        return self.transformer


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


class LlamaRotaryEmbedding(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        inv_freq, self.scaling = R.rope_parameters(c.rope, c.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, T):
        pos = torch.arange(T, device=x.device).float()
        emb = torch.outer(pos, self.inv_freq.float())
        emb = torch.cat((emb, emb), dim=-1)
        return (emb.cos() * self.scaling).to(x.dtype), (emb.sin() * self.scaling).to(x.dtype)


class LlamaAttention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv, self.hd = c.heads, c.kv_heads, c.head_dim
        self.q_proj = torch.nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = R.apply_rope(q, cos, sin), R.apply_rope(k, cos, sin)
        k = k.repeat_interleave(self.nh // self.nkv, dim=1)  # repeat_kv
        v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        att = (q @ k.transpose(-1, -2)) * self.hd ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, torch.finfo(att.dtype).min)
        att = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, -1))


class LlamaMLP(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = torch.nn.Linear(c.hidden, c.inner, bias=False)
        self.up_proj = torch.nn.Linear(c.hidden, c.inner, bias=False)
        self.down_proj = torch.nn.Linear(c.inner, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(torch.nn.Module):  # returns the hidden states, as in transformers 5
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(c.hidden, c.eps)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden, c.eps)
        self.mlp = LlamaMLP(c)

    def forward(self, h, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden)
        self.layers = torch.nn.ModuleList(LlamaDecoderLayer(c) for _ in range(c.layers))
        self.norm = LlamaRMSNorm(c.hidden, c.eps)
        self.rotary_emb = LlamaRotaryEmbedding(c)

    def forward(self, input_ids=None, use_cache=None):
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(h, input_ids.shape[1])
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.norm(h)


class LlamaForCausalLM(torch.nn.Module):  # no lm_head: the benchmark calls the base model only
    def __init__(self, path, impl):
        super().__init__()
        c = R.Config(R.load_config(path))
        self.model = LlamaModel(c)
        self.config = types.SimpleNamespace(_attn_implementation=impl)
        w = {k: v for k, v in R.load_weights(path).items() if k != "lm_head.weight"}
        self.load_state_dict(w, strict=True)

    @property
    def base_model(self):
        return self.model


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(path, **kw):
        assert set(kw) <= {"attn_implementation", "output_loading_info", "dtype", "device_map"}, kw
        assert kw["output_loading_info"] and "dtype" in kw and "torch_dtype" not in kw, kw
        name = Path(path).name
        if name == os.environ.get("FAKE_HF_CRASH"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if name == os.environ.get("FAKE_HF_HANG"):
            time.sleep(3600)
        info = {"missing_keys": {"lm_head.weight"}, "unexpected_keys": set(), "mismatched_keys": [],
                "error_msgs": []}
        if name == os.environ.get("FAKE_HF_UNEXPECTED"):
            return None, dict(info, unexpected_keys={"model.layers.0.extra.weight"})
        if json.loads((Path(path) / "config.json").read_text())["model_type"] == "llama":
            return LlamaForCausalLM(path, kw["attn_implementation"]).to(kw["dtype"]).eval(), info
        m = GPT2LMHeadModel.from_checkpoint(path).to(kw["dtype"])
        if name == os.environ.get("FAKE_HF_PERTURB"):
            with torch.no_grad():
                m.transformer.wpe.weight.mul_(1.02)
        return CausalLM(m, kw["attn_implementation"]), info
'''


def table_row(report, label):
    """The cells of the markdown table row whose first cell is `label`."""
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in the report:\n{report}")


def smoke(actcap_bin, tmp_path, *extra, env=None):
    """The smoke run's command, its report in tmp_path/bench.md and tmp_path/bench.json."""
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--actcap", actcap_bin,
           "--models-dir", str(tmp_path / "models"), "--out", str(tmp_path / "bench.md"),
           "--json-out", str(tmp_path / "bench.json"), *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def fake_transformers(tmp_path, **knobs):
    """The environment of a run that imports FAKE_TRANSFORMERS as transformers."""
    fake = tmp_path / "fakehf" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_TRANSFORMERS % {"tests": str(REPO / "tests" / "python")})
    return {**os.environ, "PYTHONPATH": str(fake.parent), **knobs}


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_run_with_the_real_transformers(actcap_bin, ac, tmp_path):
    """The smoke run against transformers itself where it imports (`make torch2-check`'s sid root:
    5.12): every HF arm measured on every model, and each model the same as HF's in f32."""
    transformers = pytest.importorskip("transformers")
    run = smoke(actcap_bin, tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = (tmp_path / "bench.md").read_text()
    assert f"transformers {transformers.__version__}" in report
    for label in ("HF eager, no hooks", "HF sdpa, no hooks", "HF eager + clone hooks (seed)",
                  "HF sdpa + clone hooks (seed)", "HF sdpa + actcap.SafeCapturer",
                  "actcap every-layer capture (bf16, verified)"):
        cells = table_row(report, label)
        assert len(cells) == 3 and all(re.fullmatch(NUMBER, c) for c in cells), (label, cells)
    agree = table_row(report, "last layer in f32, one sequence, actcap vs HF: max abs diff / max abs HF")
    assert all(float(c.split()[0]) < 1e-5 for c in agree), agree
    assert all(report.split(f"{k}: {SAME_MODEL}")[1].split("\n")[0].endswith("→ PASS")
               for k in ("gpt2-small", "llama-3.2-1b", "llama-3-8b")), report
    assert "error" not in report.lower() and "not measured" not in report, report


def test_smoke_run_on_cpu_reports_real_figures(actcap_bin, ac, tmp_path):
    # the HF arms on transformers' shapes (the stand-in's GPT-2 and Llama): every path a GPU run takes
    # but the device's own
    run = smoke(actcap_bin, tmp_path, env=fake_transformers(tmp_path))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = (tmp_path / "bench.md").read_text()
    assert report == run.stdout.rstrip("\n") + "\n"  # the file is what was printed
    assert f"torch {torch.__version__}" in report and "mode: smoke" in report
    assert "transformers 5.3.0" in report  # what the children imported (no metadata to read here)
    assert "one child process per model" in report and "in progress" not in report
    # the models run in PRIORITY order (the 8B shape first); the report's columns stay in model order
    starts = [run.stderr.index(f"gpu_bench: {k} 2x32: ") for k in ("llama-3-8b", "gpt2-small", "llama-3.2-1b")]
    assert starts == sorted(starts), run.stderr
    # actcap's arms, and HF's with and without the seed's hooks, measured on every model (the Llama
    # path of transformers included): numbers, not placeholders
    for label in ("actcap forward (final-norm last token only)",
                  "actcap every-layer capture (bf16, verified)",
                  "the same, blocking copies (second engine, copy_window=0)",
                  "actcap extract --forward-only (CLI, own timer: 16 batches; weights placed before it, "
                  "the first batch's cold start in it)",
                  "actcap extract, every layer to shards (CLI, the same; the writes and their fsync in it)",
                  "HF sdpa, no hooks", "HF eager + clone hooks (seed)", "HF sdpa + actcap.SafeCapturer"):
        cells = table_row(report, label)
        assert len(cells) == 3 and all(re.fullmatch(NUMBER, c) for c in cells), (label, cells)
        assert all(float(c.replace(",", "")) > 0 for c in cells), (label, cells)
    for label in ("actcap capture vs actcap forward", "actcap capture, blocking copies vs actcap forward"):
        cost = table_row(report, label)
        assert all(re.fullmatch(r"[+-][0-9]+\.[0-9]%", c) for c in cost), (label, cost)
    added = table_row(report, "time added per forward (ms): overlapped / blocking copies")
    assert all(re.fullmatch(r"[+-][0-9]+\.[0-9]{2} / [+-][0-9]+\.[0-9]{2}", c) for c in added), added
    # actcap's own counters: one copy queued per layer with the default window, none with 0
    stats = table_row(report, "actcap's counters of one capture (device_stats): copies queued / copy-window waits")
    assert [re.fullmatch(r"overlapped ([0-9]+) / [0-9]+; blocking 0 / 0", c).group(1) for c in stats] == \
        ["4", "4", "2"], stats
    assert all(re.fullmatch(r"[0-9]+\.[0-9]{2}x", c) for c in table_row(report, "actcap capture speed / HF sdpa + clone hooks"))
    assert re.fullmatch(NUMBER, table_row(report, "host copy_ GB/s (no GPU)")[0])
    shards = table_row(report, "actcap extract's shards written to")
    assert shards == ["tmpfs (/dev/shm)"] * 3 if os.access("/dev/shm", os.W_OK) else all(
        c.startswith("disk") for c in shards), shards
    # actcap and HF's shapes ran the same weights: in f32 the last layer agrees to rounding, the
    # Llamas' (llama3 rope_scaling) included
    agree = table_row(report, "last layer in f32, one sequence, actcap vs HF: max abs diff / max abs HF")
    assert all(float(c.split()[0]) < 1e-5 and c.endswith("(vs hf sdpa)") for c in agree), agree
    info = table_row(report, "the same in the bf16 timed runs (information only)")
    assert all(float(c.split()[0]) < 2e-2 for c in info), info
    assert report.count(SAME_MODEL) == 3
    assert all(report.split(f"{k}: {SAME_MODEL}")[1].split("\n")[0].endswith("→ PASS")
               for k in ("gpt2-small", "llama-3.2-1b", "llama-3-8b")), report
    assert re.fullmatch(r"[0-9.]+ \+ [0-9.]+", table_row(
        report, "load s: actcap.load (host only) + its first run (places the weights)")[2])
    assert "every-layer capture ≤ 5% over none: " in report and "not a measurement of the targets" in report
    assert "error" not in report.lower() and "not measured" not in report, report
    assert "estimate" not in report.lower()
    raw = json.loads((tmp_path / "bench.json").read_text())
    assert raw["complete"] and [m["key"] for m in raw["models"]] == ["gpt2-small", "llama-3.2-1b", "llama-3-8b"]
    assert all(len(m["seconds"]["actcap capture"]) == len(m["seconds"]["actcap capture, blocking copies"])
               == m["rounds"] == 5 for m in raw["models"])
    assert not list((tmp_path / "models").glob("gpu-bench-*"))  # the children's parts are gone
    assert raw["cli_work_root"] is None or not Path(raw["cli_work_root"]).exists()  # and their shards


def test_the_schedule_runs_the_8b_first_and_one_overrunning_child_costs_no_later_model_its_minimum():
    gb = load_bench()
    mins, S = gb.MIN_MODEL_S["full"], gb.STOP_WAIT_S
    keys = sorted(mins, key=gb.PRIORITY.index)
    assert keys[0] == "llama-3-8b"
    for end in (60.0, 70.0, 100.0, 134.0, 135.0, 145.0, 150.0, 165.0, 180.0, 300.0):  # the children's time
        plan = gb.planned(keys, mins, end)
        assert plan[:1] == ["llama-3-8b"] or end < mins["llama-3-8b"]
        for overrun in (None, *keys):  # none, or this one model overruns as far as it can
            now, ran = 0.0, []
            for i, k in enumerate(keys):
                left = end - now
                kept = gb.planned(keys[i:], mins, left)
                if k not in kept:
                    continue
                share = gb.model_share(k, kept, mins, left)
                deadline, stop_at = gb.child_window(now, share, end)
                # a child that keeps to its own deadline is never stopped: STOP_WAIT_S of grace,
                # the last model's too, and no stop past the children's end
                assert deadline <= stop_at - S + 1e-9 and stop_at <= end + 1e-9, (end, k)
                assert deadline - now >= mins[k] - S - 1e-9, (end, k, deadline - now)
                ran.append(k)
                # kept to its deadline, or overran: stopped at stop_at, killed STOP_WAIT_S later
                now = stop_at + S if k == overrun else deadline
            # every model planned at the start runs, where the budget has the 2 * STOP_WAIT_S one
            # overrun costs (without them the least costs win)
            if overrun is None or end >= sum(mins[k] for k in plan) + 2 * S:
                assert ran == plan, (end, overrun, ran)
    # with room to spare the shares are in proportion to the least costs
    assert gb.model_share("llama-3-8b", keys, mins, 270.0) == pytest.approx(130.0)
    # the last model has no later one to protect: all that is left
    assert gb.model_share("llama-3.2-1b", ["llama-3.2-1b"], mins, 50.0) == 50.0


def test_an_arm_raising_mid_rounds_is_dropped_and_the_others_keep_their_figures():
    gb = load_bench()
    b = gb.Bench(types.SimpleNamespace(device="cpu", budget_s=600), torch)
    calls = {"ok": 0, "late": 0}

    def ok():
        calls["ok"] += 1

    def late():  # its first call, its warm-up and round 1 pass; round 2 raises
        calls["late"] += 1
        if calls["late"] == 4:
            raise RuntimeError("snapshot changed since it was captured\nmore")

    def broken():
        raise ValueError("at once")
    res = {"key": "m", "errors": {}, "notes": [], "tokens": 64, "hf_attn": {}}
    assert b.rotate({"ok": ok, "late": late, "broken": broken}, 5, 100.0, res) == 5
    assert res["rounds"] == 5 and len(res["seconds"]["ok"]) == 5 and calls["ok"] == 7
    assert res["errors"] == {"broken": "ValueError: at once",
                             "late": "round 2: RuntimeError: snapshot changed since it was captured"}
    assert len(res["seconds"]["late"]) == 1 and "broken" not in res["seconds"]
    gb.derive(res)
    assert list(res["tps"]) == ["ok"]  # an arm that raised has no figure

    # a stop (SIGTERM) in round 3 keeps rounds 1 and 2
    def stop():
        calls["stop"] = calls.get("stop", 0) + 1
        if calls["stop"] == 5:
            raise gb.Stop()
    res = {"key": "m", "errors": {}, "notes": [], "tokens": 64}
    with pytest.raises(gb.Stop):
        b.rotate({"ok": ok, "stop": stop}, 5, 100.0, res)
    assert res["rounds"] == 2 and len(res["seconds"]["stop"]) == 2 and len(res["seconds"]["ok"]) >= 2

    # no time left: one round, then the rounds stop and say why
    b.deadline = time.perf_counter()
    res = {"key": "m", "errors": {}, "notes": [], "tokens": 64}
    assert b.rotate({"ok": ok}, 5, 100.0, res, reserve_s=1.0) == 5
    assert res["rounds"] == 1 and res["notes"] == ["1 of 5 rounds: the budget left no time for more"]


def test_a_crashed_child_a_rejected_load_and_a_different_model_leave_the_rest(actcap_bin, ac, tmp_path):
    env = fake_transformers(tmp_path, FAKE_HF_CRASH="llama-3.2-1b", FAKE_HF_UNEXPECTED="llama-3-8b",
                            FAKE_HF_PERTURB="gpt2-small")
    run = smoke(actcap_bin, tmp_path, env=env)
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]
    report = (tmp_path / "bench.md").read_text()
    assert "transformers 5.3.0" in report
    # gpt2: both attention implementations ran; the model differs by about 1e-2 in f32, which the
    # check catches, where the bf16 figure stays inside bf16's bar of 0.1
    for label in ("HF sdpa, no hooks", "HF eager, no hooks", "HF sdpa + clone hooks (seed)",
                  "HF sdpa + actcap.SafeCapturer", "actcap every-layer capture (bf16, verified)"):
        assert re.fullmatch(NUMBER, table_row(report, label)[0]), label
    agree = table_row(report, "last layer in f32, one sequence, actcap vs HF: max abs diff / max abs HF")[0]
    assert 1e-3 < float(agree.split()[0]) < 0.1 and "(vs hf sdpa)" in agree, agree
    assert float(table_row(report, "the same in the bf16 timed runs (information only)")[0].split()[0]) < 0.1
    assert f"gpt2-small: {SAME_MODEL}" in report
    assert report.split(f"gpt2-small: {SAME_MODEL}")[1].split("\n")[0].endswith("→ FAIL")
    # llama-3.2-1b: its child died; its error names the signal and the step, stderr has the stack
    assert re.search(r"llama-3.2-1b, child process: killed by SIGSEGV during hf sdpa load", report), report
    assert "Fatal Python error: Segmentation fault" in run.stderr
    # llama-3-8b: HF's loading info rejected (logged when it happened), actcap measured regardless
    assert "llama-3-8b, hf sdpa load: RuntimeError: transformers' loading info: 1 unexpected_keys" in report
    assert re.search(r"gpu_bench: llama-3-8b: ERROR hf sdpa load: .*unexpected_keys", run.stderr), run.stderr
    cells = table_row(report, "actcap every-layer capture (bf16, verified)")
    assert cells[0] != "—" and cells[1] == "—" and re.fullmatch(NUMBER, cells[2]), cells
    assert re.fullmatch(NUMBER, table_row(
        report, "actcap extract, every layer to shards (CLI, the same; the writes and their fsync in it)")[2])


def test_sigterm_writes_the_report_of_what_finished(actcap_bin, ac, tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--actcap", actcap_bin,
           "--models-dir", str(tmp_path / "models"), "--out", str(tmp_path / "bench.md"),
           "--json-out", str(tmp_path / "bench.json"), "--models", "gpt2-small,llama-3-8b"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "bench.md"
    end = time.monotonic() + 300
    # the report is written after each model: after llama-3-8b (PRIORITY: it runs first), while
    # gpt2-small runs
    while not (out.exists() and "this time after llama-3-8b" in out.read_text()):
        assert p.poll() is None and time.monotonic() < end, p.communicate()
        time.sleep(0.1)
    first = out.read_text()
    assert re.fullmatch(NUMBER, table_row(first, "actcap every-layer capture (bf16, verified)")[0])
    assert not json.loads((tmp_path / "bench.json").read_text())["complete"]
    while not (tmp_path / "models" / "gpt2-small" / "bench-stamp.json").exists():  # its child measures
        assert p.poll() is None and time.monotonic() < end, p.communicate()
        time.sleep(0.05)
    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert time.monotonic() - t < 15, stderr
    assert p.returncode == 1, stderr
    report = out.read_text()
    assert report == stdout.rstrip("\n") + "\n"
    assert "stopped by SIGTERM (stage timeout)" in report and "in progress" not in report
    # the columns in model order: gpt2-small, then llama-3-8b, whose figures are kept
    assert table_row(report, "actcap every-layer capture (bf16, verified)")[1] == \
        table_row(first, "actcap every-layer capture (bf16, verified)")[0]
    assert "gpt2-small: stopped by SIGTERM during" in report  # its child saved what it had
    assert json.loads((tmp_path / "bench.json").read_text())["complete"]


def test_a_hanging_model_is_stopped_at_its_share_and_the_run_ends_inside_its_budget(actcap_bin, ac, tmp_path):
    env = fake_transformers(tmp_path, FAKE_HF_HANG="llama-3-8b")
    t = time.monotonic()
    run = smoke(actcap_bin, tmp_path, "--budget-s", "30", "--models", "llama-3-8b", env=env)
    took = time.monotonic() - t
    # not a failure, but not a complete run: its targets were not measured
    assert run.returncode == 3, run.stdout[-4000:] + run.stderr[-4000:]
    # the first target not measured is named: which one depends on how far the model got in its share
    # (on a loaded machine it is stopped before the comparison with HF)
    assert re.search(r"gpu_bench: incomplete \(exit 3\): llama-3-8b: [^\n]*: not measured", run.stderr), run.stderr
    assert took < 30, took
    report = (tmp_path / "bench.md").read_text()
    # the load that hangs was started (the budget left it its estimate) and stopped
    assert re.search(r"llama-3-8b: stopped during hf sdpa load: over its [0-9]+ s share of the budget", report), report
    assert "stopped by SIGTERM" not in report  # the parent's note, not the child's


def test_a_spent_budget_skips_the_models_and_says_so(actcap_bin, tmp_path):
    run = smoke(actcap_bin, tmp_path, "--budget-s", "0")
    assert run.returncode == 3, run.stderr  # incomplete
    assert "gpu_bench: incomplete (exit 3): gpt2-small not run; llama-3.2-1b not run; llama-3-8b not run\n" in run.stderr
    report = (tmp_path / "bench.md").read_text()
    assert "of a 0 s budget" in report  # 0 is a budget, not "the default"
    assert report.count("s of the 0 s budget left, at least 5 s needed") == 3, report
    assert "—" in table_row(report, "rounds") and "error" not in report.lower()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_the_benchmark_refuses_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "bench.md")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--device cpu --smoke" in lines[0], run.stderr
    assert run.stdout == "" and not (tmp_path / "bench.md").exists()
    cpu = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert cpu.returncode == 2 and len(cpu.stderr.strip().splitlines()) == 1, cpu
    assert "--smoke" in cpu.stderr


def test_the_kit_reports_an_incomplete_bench_as_incomplete_not_as_passed(actcap_bin, tmp_path):
    """scripts/gpu-check.sh's `bench` stage: the benchmark's exit status 3 (here: no budget, no
    model run) is "incomplete" in the stage's line and the summary, never "All stages passed"."""
    build = tmp_path / "build-gpu"
    build.mkdir()
    (build / "actcap").symlink_to(actcap_bin)
    env = dict(os.environ, PYTHON=sys.executable, GPU_BUILD=str(build),
               GPU_BENCH_ARGS="--device cpu --smoke --budget-s 0")  # after the kit's own --budget-s
    run = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(tmp_path / "r"), "bench"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    report = (tmp_path / "r" / "report.md").read_text()
    assert run.returncode == 1, report
    assert "| bench | incomplete (exit 3: a model not run or a target not measured) |" in report, report
    assert "Incomplete: bench" in report and "All stages passed" not in report and "Failed:" not in report
    assert "## GPU benchmark" in report and "not run: 0 s of the 0 s budget left" in report


# ---- the branches only a GPU takes, run here against stand-ins for torch.cuda and transformers ----

def test_a_second_engine_is_loaded_only_when_both_copies_of_the_weights_fit_in_free_gpu_memory():
    gb = load_bench()
    GiB = 2**30

    def bench(free=None, error=None):
        def mem_get_info():
            if error:
                raise RuntimeError(error)
            return free, 141 * GiB
        cuda = types.SimpleNamespace(mem_get_info=mem_get_info)
        return types.SimpleNamespace(device="cuda:0", torch=types.SimpleNamespace(cuda=cuda))

    def res():
        return {"key": "llama-3-8b", "checkpoint_gib": 15.0, "notes": []}

    need = 2 * 15 * GiB + gb.GPU_MARGIN_BYTES
    r = res()
    assert gb.blocking_fits(bench(free=need), r) and r["notes"] == []
    r = res()
    assert not gb.blocking_fits(bench(free=need - 1), r)
    assert "blocking copies not run" in r["notes"][0] and f"{need / GiB:.1f} GiB" in r["notes"][0]
    assert f"{(need - 1) / GiB:.1f} GiB of GPU memory is free" in r["notes"][0], r["notes"]
    r = res()  # not knowing the free memory is no reason to risk running out of it
    assert not gb.blocking_fits(bench(error="CUDA error: busy"), r)
    assert "the free GPU memory is unknown (" in r["notes"][0] and "busy" in r["notes"][0], r["notes"]
    assert gb.blocking_fits(types.SimpleNamespace(device="cpu", torch=None), res())


def test_tf32_is_turned_off_through_the_switch_the_torch_has():
    gb = load_bench()

    def fake(matmul):
        return types.SimpleNamespace(backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul)))
    new = types.SimpleNamespace(fp32_precision="tf32", allow_tf32=True)  # torch >= 2.9
    gb.set_tf32_off(fake(new))
    assert new.fp32_precision == "ieee" and new.allow_tf32 is True  # the old switch left alone
    old = types.SimpleNamespace(allow_tf32=True)
    gb.set_tf32_off(fake(old))
    assert old.allow_tf32 is False and not hasattr(old, "fp32_precision")


def test_hf_on_a_gpu_is_placed_by_accelerate_and_only_its_floating_parameters_converted(monkeypatch):
    """load_hf as on the GPU (device cuda:0): with accelerate, device_map puts the model on the
    device at load; without, the model is moved after; a parameter stored in another dtype is
    converted, buffers (RoPE's inv_freq) keep float32; loading problems other than a tied head
    are errors."""
    gb = load_bench()
    calls, models = [], []

    class Param:  # a real parameter that says it is where the model was put
        def __init__(self, p, device):
            self._p, self.device = p, device
            self.dtype = p.dtype

        def is_floating_point(self):
            return self._p.is_floating_point()

        @property
        def data(self):
            return self._p.data

        @data.setter
        def data(self, value):
            self._p.data = value

    class Model(torch.nn.Module):
        def __init__(self, on):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2, dtype=torch.float32))
            self.h = torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))
            self.register_buffer("inv_freq", torch.ones(2, dtype=torch.float32))
            self.base_model = types.SimpleNamespace(layers=["l0", "l1"])
            self.config = types.SimpleNamespace(_attn_implementation="sdpa")
            self.on, self.moved = on, None

        def parameters(self, recurse=True):
            return (Param(p, self.on) for p in super().parameters(recurse))

        def to(self, device):
            self.moved, self.on = device, device
            return self

    info = {"missing_keys": ["lm_head.weight"], "unexpected_keys": [], "mismatched_keys": [],
            "error_msgs": []}

    def from_pretrained(path, **kw):
        calls.append(kw)
        models.append(Model(kw.get("device_map", {}).get("", "cpu")))
        return models[-1], dict(info)

    auto = types.SimpleNamespace(from_pretrained=from_pretrained)
    tf = types.SimpleNamespace(__version__="4.57.1", AutoModelForCausalLM=auto)
    real_find_spec = importlib.util.find_spec

    def accelerate(found):
        monkeypatch.setattr(gb.importlib.util, "find_spec", lambda name, *a: (
            (object() if found else None) if name == "accelerate" else real_find_spec(name, *a)))

    accelerate(True)
    hf = gb.load_hf(tf, torch, "/nowhere", "llama", "sdpa", "cuda:0", torch.bfloat16)
    m = models[-1]
    assert calls[-1]["device_map"] == {"": "cuda:0"} and calls[-1]["dtype"] == torch.bfloat16
    assert calls[-1]["attn_implementation"] == "sdpa" and calls[-1]["output_loading_info"]
    assert m.moved is None  # placed at load
    assert m.w.dtype == torch.bfloat16 and m.h.dtype == torch.bfloat16
    assert m.inv_freq.dtype == torch.float32
    assert (hf.kind, hf.impl, hf.prefix, hf.layers) == ("transformers", "sdpa", "layers", ["l0", "l1"])
    # transformers before 4.56 names the argument torch_dtype
    gb.load_hf(types.SimpleNamespace(__version__="4.55.2", AutoModelForCausalLM=auto),
               torch, "/nowhere", "llama", "eager", "cuda:0", torch.bfloat16)
    assert calls[-1]["torch_dtype"] == torch.bfloat16 and "dtype" not in calls[-1]
    # without accelerate: no device_map, the model moved (not cast) after loading
    accelerate(False)
    gb.load_hf(tf, torch, "/nowhere", "llama", "sdpa", "cuda:0", torch.bfloat16)
    assert "device_map" not in calls[-1] and models[-1].moved == "cuda:0"
    assert models[-1].inv_freq.dtype == torch.float32
    # loading problems other than a tied head are errors
    info["unexpected_keys"] = ["model.layers.0.mlp.extra"]
    with pytest.raises(RuntimeError, match="1 unexpected_keys"):
        gb.load_hf(tf, torch, "/nowhere", "llama", "sdpa", "cuda:0", torch.bfloat16)


def test_copy_bandwidth_on_a_gpu_times_bursts_between_cuda_events():
    """copy_bandwidth as on the GPU (device cuda:0), with stand-ins for the device and its events:
    the destination of the copy_ is pinned, each sample is the events' elapsed milliseconds over a
    burst (read after the end event synchronized), the figure the median sample in GB/s."""
    gb = load_bench()
    made, log = [], []
    samples = iter([4.0, 1.0, 2.0, 9.0, 3.0] * 2)  # ms per burst: the median of each five is 3.0

    def empty(*shape, dtype=None, device=None, pin_memory=False):
        made.append({"device": device, "pin_memory": pin_memory})
        return torch.empty(*shape, dtype=dtype)

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.recorded = self.synced = False

        def record(self):
            log.append("record")
            self.recorded = True

        def synchronize(self):
            assert self.recorded
            self.synced = True

        def elapsed_time(self, end):  # like CUDA: both recorded, the end one complete
            assert self.recorded and end.recorded and end.synced
            return next(samples)

    cuda = types.SimpleNamespace(Event=Event)
    fake = types.SimpleNamespace(empty=empty, bfloat16=torch.bfloat16, cuda=cuda)
    syncs = []
    b = types.SimpleNamespace(device="cuda:0", torch=fake, sync=lambda: syncs.append(1),
                              timed=lambda fn: pytest.fail("a GPU copy is timed by events, not the host"))
    nbytes = 2**20
    got = gb.copy_bandwidth(b, nbytes, reps=5, burst=20)
    assert made == [{"device": "cuda:0", "pin_memory": False}, {"device": None, "pin_memory": True}]
    assert set(got) == {"pinned copy_", "pageable .cpu()"} and len(syncs) == 2  # a warm-up each
    assert log == ["record"] * 20  # start and end of 5 samples, for each of the two kinds
    want = nbytes / (3.0 / 1e3 / 20) / 1e9  # 20 copies of 1 MiB in 3 ms
    assert got["pinned copy_"] == pytest.approx(want) and got["pageable .cpu()"] == pytest.approx(want)
