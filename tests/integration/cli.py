"""Shared by the CLI integration tests: run the binary, read its one error line, write corpora."""
import json
import os
import subprocess

import numpy as np

ACTCAP = os.environ.get("ACTCAP", os.path.join(os.path.dirname(__file__), "..", "..", "build", "actcap"))


def run(*args, check=None, env=None, timeout=600, **kw):
    """Runs actcap with args (stringified); check=N asserts the exit code; env adds variables."""
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run([ACTCAP, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=full_env,
                       **kw)
    if check is not None:
        assert p.returncode == check, p.stderr + p.stdout
    return p


def one_error_line(p):
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("actcap: error: "), p.stderr
    return lines[0]


def write_jsonl(path, docs):
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({"input_ids": d}) + "\n")


def corpus(n, seed=0, lo=3, hi=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 512, rng.integers(lo, hi)).tolist() for _ in range(n)]
