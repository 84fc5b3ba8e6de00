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
# checkpoints. Knobs, by checkpoint folder name: FAKE_HF_CRASH (the process dies of SIGSEGV in
# from_pretrained, as a native crash would), FAKE_HF_HANG (it never returns), FAKE_HF_UNEXPECTED
# (loading info with an unexpected key), FAKE_HF_PERTURB (position embeddings 2% larger: a model
# that differs as a RoPE setting would, by about 1e-2).
FAKE_TRANSFORMERS = '''
import json, os, signal, sys, time, types
from pathlib import Path
import torch
sys.path.insert(0, %(tests)r)
from hf_modules import GPT2LMHeadModel, GPT2Model

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
        if json.loads((Path(path) / "config.json").read_text())["model_type"] != "gpt2":
            raise ValueError("the stand-in has gpt2 only")
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


def test_smoke_run_on_cpu_reports_real_figures(actcap_bin, ac, tmp_path):
    run = smoke(actcap_bin, tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = (tmp_path / "bench.md").read_text()
    assert report == run.stdout.rstrip("\n") + "\n"  # the file is what was printed
    assert f"torch {torch.__version__}" in report and "mode: smoke" in report
    assert "one child process per model" in report and "in progress" not in report
    # actcap's arms measured on every model: numbers, not placeholders
    for label in ("actcap forward (final-norm last token only)",
                  "actcap every-layer capture (bf16, verified)",
                  "actcap extract --forward-only (CLI, own timer: 16 batches, the first placing the weights)",
                  "actcap extract, every layer to disk (CLI, the same)"):
        cells = table_row(report, label)
        assert len(cells) == 3 and all(re.fullmatch(NUMBER, c) for c in cells), (label, cells)
        assert all(float(c.replace(",", "")) > 0 for c in cells), (label, cells)
    # the seed's hooks on the HF-shaped GPT-2 (transformers itself where it is installed)
    hooks = table_row(report, "HF eager + clone hooks (seed)")
    assert re.fullmatch(NUMBER, hooks[0]), hooks
    cost = table_row(report, "actcap capture vs actcap forward")
    assert all(re.fullmatch(r"[+-][0-9]+\.[0-9]%", c) for c in cost), cost
    assert re.fullmatch(r"[0-9]+\.[0-9]{2}x", table_row(report, "actcap capture speed / HF eager + clone hooks")[0])
    assert re.fullmatch(NUMBER, table_row(report, "host copy_ GB/s (no GPU)")[0])
    # actcap and the stand-in ran the same weights: in f32 the last layer agrees to rounding
    agree = table_row(report, "last layer in f32, one sequence, actcap vs HF: max abs diff / max abs HF")[0]
    assert float(agree.split()[0]) < 1e-5, agree
    info = table_row(report, "the same in the bf16 timed runs (information only)")[0]
    assert float(info.split()[0]) < 2e-2, info
    assert report.count(SAME_MODEL) == 3
    assert f"gpt2-small: {SAME_MODEL}" in report and "→ FAIL" not in report.split(f"gpt2-small: {SAME_MODEL}")[1].split("\n")[0]
    assert re.fullmatch(r"[0-9.]+ \+ [0-9.]+", table_row(
        report, "load s: actcap.load (host only) + its first run (places the weights)")[2])
    assert "every-layer capture ≤ 5% over none: " in report and "not a measurement of the targets" in report
    assert "error" not in report.lower(), report
    assert "estimate" not in report.lower()
    raw = json.loads((tmp_path / "bench.json").read_text())
    assert raw["complete"] and [m["key"] for m in raw["models"]] == ["gpt2-small", "llama-3.2-1b", "llama-3-8b"]
    assert all(len(m["seconds"]["actcap capture"]) == m["rounds"] == 5 for m in raw["models"])
    assert not list((tmp_path / "models").glob("gpu-bench-*"))  # the children's parts are gone


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
    assert re.fullmatch(NUMBER, table_row(report, "actcap extract, every layer to disk (CLI, the same)")[2])


def test_sigterm_writes_the_report_of_what_finished(actcap_bin, ac, tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--actcap", actcap_bin,
           "--models-dir", str(tmp_path / "models"), "--out", str(tmp_path / "bench.md"),
           "--json-out", str(tmp_path / "bench.json"), "--models", "gpt2-small,llama-3-8b"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "bench.md"
    end = time.monotonic() + 300
    # the report is written after each model: after gpt2-small, while llama-3-8b runs
    while not (out.exists() and "this time after gpt2-small" in out.read_text()):
        assert p.poll() is None and time.monotonic() < end, p.communicate()
        time.sleep(0.1)
    first = out.read_text()
    assert re.fullmatch(NUMBER, table_row(first, "actcap every-layer capture (bf16, verified)")[0])
    assert not json.loads((tmp_path / "bench.json").read_text())["complete"]
    while not (tmp_path / "models" / "llama-3-8b" / "bench-stamp.json").exists():  # its child measures
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
    assert table_row(report, "actcap every-layer capture (bf16, verified)")[0] == \
        table_row(first, "actcap every-layer capture (bf16, verified)")[0]
    assert "llama-3-8b: stopped by SIGTERM during" in report  # its child saved what it had
    assert json.loads((tmp_path / "bench.json").read_text())["complete"]


def test_a_hanging_model_is_stopped_at_its_share_and_the_run_ends_inside_its_budget(actcap_bin, ac, tmp_path):
    env = fake_transformers(tmp_path, FAKE_HF_HANG="llama-3-8b")
    t = time.monotonic()
    run = smoke(actcap_bin, tmp_path, "--budget-s", "25", "--models", "llama-3-8b", env=env)
    took = time.monotonic() - t
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert took < 25, took
    report = (tmp_path / "bench.md").read_text()
    assert re.search(r"llama-3-8b: stopped during [^:]+: over its [0-9]+ s share of the budget", report), report
    assert "stopped by SIGTERM" not in report  # the parent's note, not the child's


def test_a_spent_budget_skips_the_models_and_says_so(actcap_bin, tmp_path):
    run = smoke(actcap_bin, tmp_path, "--budget-s", "0")
    assert run.returncode == 0, run.stderr
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
