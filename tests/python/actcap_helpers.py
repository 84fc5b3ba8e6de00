"""Shared helpers for the CLI-level tests: invoking the binary, reading its output, comparing."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import st

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = REPO / "build" / "actcap"
TOL = 1e-5  # max abs diff allowed between actcap and the reference, every point
ROWS_SEQ = "__rows__.seq"
ROWS_POS = "__rows__.pos"
ROWS_TOKEN = "__rows__.token"
ROWS = {ROWS_SEQ, ROWS_POS, ROWS_TOKEN}  # the row tensors of every actcap/3 shard
FORMAT = "actcap/3"

# Text that must never appear on stderr: uncaught C++ exceptions, LibTorch traces, Python traces.
CRASH_MARKERS = ("terminate called", "what():", "Traceback", "Exception raised from", "frame #",
                 "Aborted", "Segmentation fault", "core dumped")


def under_ci():
    """True when the environment says CI (CI=true, as CI services set it; also 1 / yes)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_or_fail(reason):
    """For a missing tool (binary, node, npm): a skip with the reason on a developer machine, a
    failure under CI, where a skip would silently drop the test (no silent skips there)."""
    if under_ci():
        pytest.fail(f"{reason} (CI=true: a missing tool is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def binary_path():
    return os.environ.get("ACTCAP") or str(DEFAULT_BINARY)


def python_package_dir():
    """<build>/python: where `make build` puts the actcap package (the build of $ACTCAP)."""
    return Path(binary_path()).resolve().parent / "python"


def actcap(*args, timeout=120, check=False):
    """Runs the binary; returns CompletedProcess (text mode). check=True asserts exit code 0."""
    proc = subprocess.run([binary_path(), *[str(a) for a in args]], capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, (
            f"actcap {' '.join(map(str, args))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def run_python(*args, timeout=120, env=None):
    """`python3 ARGS...` (this interpreter) in a fresh process that imports the built actcap
    package (python_package_dir on PYTHONPATH); env: more variables. Returns CompletedProcess."""
    full = dict(os.environ, PYTHONPATH=str(python_package_dir()), **(env or {}))
    return subprocess.run([sys.executable, *[str(a) for a in args]], env=full,
                          capture_output=True, text=True, timeout=timeout)


def init_model(out, arch, preset="tiny", seed=0, dtype=None, tie=None):
    args = ["init-model", "--arch", arch, "--preset", preset, "--seed", seed]
    if dtype is not None:
        args += ["--dtype", dtype]
    if tie is not None:
        args += ["--tie-word-embeddings", "true" if tie else "false"]
    args += ["--out", out]
    actcap(*args, check=True)
    return Path(out)


def tokens_arg(seqs):
    return ";".join(",".join(str(int(t)) for t in s) for s in seqs)


def run_capture(model, out, seqs, capture=("**", "**:input"), extra=()):
    actcap("run", model, "--tokens", tokens_arg(seqs), "--capture", *capture, "--out", out, *extra,
           check=True)
    return read_capture(out)


def read_capture(out):
    """Returns (manifest dict, tensors dict name -> np.ndarray, shard metadata dict)."""
    out = Path(out)
    with open(out / "manifest.json") as f:
        manifest = json.load(f)
    assert len(manifest.get("shards", [])) == 1, f"expected one shard: {manifest.get('shards')}"
    shard = manifest["shards"][0]["file"]
    tensors, meta = st.load(str(out / shard))
    return manifest, tensors, meta


def read_all_shards(out):
    """Every shard of an output folder, in manifest order: (manifest dict, name -> np.ndarray with
    the shards' rows concatenated)."""
    out = Path(out)
    with open(out / "manifest.json") as f:
        manifest = json.load(f)
    parts = [st.load(str(out / s["file"]))[0] for s in manifest["shards"]]
    return manifest, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def padded(seqs, side="right", pad=0):
    """A padded batch of token sequences, as torch tensors: (ids [B, T], attention_mask [B, T])."""
    import torch  # only the tests that build torch batches need it
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.int64)
    mask = torch.zeros((len(seqs), T), dtype=torch.int64)
    for i, s in enumerate(seqs):
        cols = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        ids[i, cols] = torch.tensor(s, dtype=torch.int64)
        mask[i, cols] = 1
    return ids, mask


def load_config(model_dir):
    with open(Path(model_dir) / "config.json") as f:
        return json.load(f)


def save_config(model_dir, cfg):
    with open(Path(model_dir) / "config.json", "w") as f:
        json.dump(cfg, f, indent=2)


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return Path(dst)


def random_tokens(vocab_size, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab_size, size=n)] for n in lengths]


def compare_points(ref, got, tol=TOL, label="", rel_tol=None, worst=None, scaled=False):
    """ref/got: name -> array. Returns a list of failure strings (empty when everything matches).

    rel_tol: also require max|got - ref| / max|ref| <= rel_tol at every float point.
    scaled: the bound is tol * max(1, max|ref|) instead of tol.
    worst: a dict that receives the largest "abs" and "rel" differences seen (for reports).
    Every comparison is written so that a NaN on either side fails it."""
    failures = []
    for name, r in ref.items():
        if name not in got:
            failures.append(f"{label}{name}: missing from actcap output")
            continue
        g = got[name]
        if tuple(g.shape) != tuple(r.shape):
            failures.append(f"{label}{name}: shape {tuple(g.shape)} != reference {tuple(r.shape)}")
            continue
        if r.dtype == np.int64:
            if g.dtype != np.int64 or not np.array_equal(g, r):
                failures.append(f"{label}{name}: int64 ids differ (actcap dtype {g.dtype})")
            continue
        if g.dtype != np.float32:
            failures.append(f"{label}{name}: dtype {g.dtype}, expected float32")
            continue
        if r.size == 0:
            continue
        if not np.all(np.isfinite(g)):
            failures.append(f"{label}{name}: non-finite values")
            continue
        d = float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64))))
        scale = float(np.max(np.abs(r)))
        rel = d / scale if scale > 0 else d
        if worst is not None:
            worst["abs"] = max(worst.get("abs", 0.0), d)
            worst["rel"] = max(worst.get("rel", 0.0), rel)
        limit = tol * max(1.0, scale) if scaled else tol
        if not d <= limit:
            failures.append(f"{label}{name}: max abs diff {d:.3e} > {limit:.3g} "
                            f"(|ref| max {scale:.3g})")
        elif rel_tol is not None and not rel <= rel_tol:
            failures.append(f"{label}{name}: max diff / max |ref| {rel:.3e} > {rel_tol:g} "
                            f"(|ref| max {scale:.3g})")
    return failures
