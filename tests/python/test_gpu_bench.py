"""bench/gpu_bench.py (the GPU benchmark the kit's `bench` stage runs) without a GPU: its
`--device cpu --smoke` run measures the actcap arms (and the HF-shaped stand-in) on tiny shapes and
writes a report of real figures; its normal mode refuses, in one line, to run without CUDA."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_bench.py"
NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"


def table_row(report, label):
    """The cells of the markdown table row whose first cell is `label`."""
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in the report:\n{report}")


def test_smoke_run_on_cpu_reports_real_figures(actcap_bin, ac, tmp_path):
    out = tmp_path / "bench.md"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--actcap", actcap_bin,
         "--models-dir", str(tmp_path / "models"), "--out", str(out),
         "--json-out", str(tmp_path / "bench.json")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = out.read_text()
    assert report == run.stdout.rstrip("\n") + "\n"  # the file is what was printed
    assert f"torch {torch.__version__}" in report and "mode: smoke" in report
    # actcap's arms measured on every model: numbers, not placeholders
    for label in ("actcap forward (final-norm last token only)",
                  "actcap every-layer capture (bf16, verified)",
                  "actcap extract --forward-only (CLI, own timer)",
                  "actcap extract, every layer to disk (CLI, own timer)"):
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
    # actcap and the stand-in ran the same weights: the last layer agrees closely
    agree = table_row(report, "last layer, actcap vs HF: max abs diff / max abs HF")[0]
    assert float(agree.split()[0]) < 2e-2, agree
    assert report.count("same model as HF (last layer within 0.1 of HF's largest magnitude): ") == 3
    assert "→ FAIL" not in report.split("same model as HF", 1)[1].split("\n")[0], report
    assert "every-layer capture ≤ 5% over none: " in report and "not a measurement of the targets" in report
    assert "error" not in report.lower(), report
    assert "estimate" not in report.lower()


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
