"""Shared by the CLI integration tests: run the binary, read its one error line, write corpora,
read an extract's manifest and compare two extract outputs."""
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


def manifest(out):
    """manifest.json, with the shards an unfinished run claims in manifest.journal (whole lines)."""
    m = json.load(open(out / "manifest.json"))
    journal = out / "manifest.journal"
    if not m["complete"] and journal.exists():
        for line in journal.read_text().split("\n")[:-1]:  # after the last newline: an unfinished append
            if json.loads(line)["shard"]["file"] not in [s["file"] for s in m["shards"]]:
                m["shards"].append(json.loads(line)["shard"])
    return m


def assert_same_files(out, ref):
    """Both runs complete, with the same shard files byte for byte and nothing else left over."""
    got, want = manifest(out), manifest(ref)
    assert got["complete"] and want["complete"]
    assert [s["file"] for s in got["shards"]] == [s["file"] for s in want["shards"]]
    for s in want["shards"]:
        assert open(out / s["file"], "rb").read() == open(ref / s["file"], "rb").read(), s["file"]
    assert sorted(os.listdir(out)) == sorted(os.listdir(ref))  # no leftover temp or unclaimed files
    assert run("verify", out).returncode == 0
