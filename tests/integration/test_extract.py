"""actcap extract: layout, windows, bad input, verify, interop (faults: test_faults.py)."""
import json
import os
import re
import struct
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import st  # noqa: E402  minimal safetensors reader written from the spec
sys.path.insert(0, os.path.dirname(__file__))
from cli import corpus, one_error_line, run, write_jsonl  # noqa: E402



def shards(out):
    m = json.load(open(out / "manifest.json"))
    return m, [st.load(str(out / s["file"]))[0] for s in m["shards"]]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    run("init-model", "--arch", "llama", "--preset", "tiny", "--seed", "2", "--out", d, check=0)
    return d


def test_layout_rows_and_values(llama, tmp_path):
    docs = corpus(25)
    write_jsonl(tmp_path / "in.jsonl", docs)
    out = tmp_path / "out"
    run("extract", llama, "--input", tmp_path / "in.jsonl", "--capture", "model.layers.*", "lm_head", "--out", out,
        "--batch-size", "4", "--shard-size", "40KiB", "--devices", "3", "--quiet", check=0)
    m, data = shards(out)
    assert m["complete"] and len(m["shards"]) > 1
    seq = np.concatenate([d["__rows__.seq"] for d in data])
    pos = np.concatenate([d["__rows__.pos"] for d in data])
    expect = [(i, p) for i, d in enumerate(docs) for p in range(len(d))]  # every real token once, in order
    assert list(zip(seq.tolist(), pos.tolist())) == expect
    tok = np.concatenate([d["__rows__.token"] for d in data])
    assert tok.tolist() == [t for d in docs for t in d]  # each row's token id
    # Values: each document alone through `run` (batch composition may change the last bits).
    for i in [0, 7, 24]:
        alone = tmp_path / f"alone{i}"
        run("run", llama, "--tokens", ",".join(map(str, docs[i])), "--capture", "model.layers.*", "lm_head", "--out",
            alone, check=0)
        ref = st.load(str(alone / "shard-00000.safetensors"))[0]
        rows = seq == i
        for name in ["model.layers.0", "model.layers.3", "lm_head"]:
            got = np.concatenate([d[name] for d in data])[rows]
            np.testing.assert_allclose(got, ref[name], atol=1e-5, rtol=1e-5)
    assert run("verify", out).returncode == 0


def test_txt_corpus_with_tokenizer_and_positions(tmp_path):
    (tmp_path / "in.txt").write_text("hello world\n\nsecond document here\nthird\n")
    out = tmp_path / "out"
    run("extract", "demo", "--input", tmp_path / "in.txt", "--capture", "transformer.h.1", "--positions", "last",
        "--dtype", "f16", "--out", out, "--quiet", check=0)
    m, data = shards(out)
    d = data[0]
    assert d["__rows__.seq"].tolist() == [0, 2, 3]  # line indices; the blank line is no document
    assert d["__rows__.pos"].tolist() == [10, 19, 4]
    assert d["transformer.h.1"].dtype == np.float16


def test_windows_export_every_position_once(llama, tmp_path):
    docs = [list(range(1, 300)), [5, 6, 7]]
    write_jsonl(tmp_path / "in.jsonl", docs)
    p = run("extract", llama, "--input", tmp_path / "in.jsonl", "--capture", "model.norm", "--out", tmp_path / "a",
            "--max-length", "64")
    # Both are required: exit 2 (bad input), and the error names the first line of the input (the
    # 299-token document does not fit --max-length 64 without --stride). Grouped explicitly: the old
    # `A and B or C` passed on C alone, whatever the exit code.
    err = one_error_line(p)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert re.search(r"in\.jsonl:1:|\bline 1\b", err), err
    run("extract", llama, "--input", tmp_path / "in.jsonl", "--capture", "model.norm", "--out", tmp_path / "b",
        "--max-length", "64", "--stride", "48", "--quiet", check=0)
    _, data = shards(tmp_path / "b")
    seq = np.concatenate([d["__rows__.seq"] for d in data])
    pos = np.concatenate([d["__rows__.pos"] for d in data])
    assert list(zip(seq.tolist(), pos.tolist())) == [(0, i) for i in range(299)] + [(1, i) for i in range(3)]
    # windows keep each position's own token
    tok = np.concatenate([d["__rows__.token"] for d in data])
    assert tok.tolist() == docs[0] + docs[1]


@pytest.mark.parametrize("content,needle", [
    ('{"input_ids": [1, 2]}\n{"input_ids": [1, \n', ":2:"),
    ('{"input_ids": [1, 2]}\n{"text": 5}\n', ":2:"),
    ('{"input_ids": [1, 99999]}\n', "99999"),
])
def test_bad_lines(llama, tmp_path, content, needle):
    (tmp_path / "in.jsonl").write_text(content)
    p = run("extract", llama, "--input", tmp_path / "in.jsonl", "--capture", "model.norm", "--out", tmp_path / "o")
    assert p.returncode == 2 and needle in one_error_line(p)
    assert not (tmp_path / "o" / "manifest.json").exists() or not json.load(open(tmp_path / "o" / "manifest.json"))["complete"]


def test_skip_bad_lines(llama, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"input_ids": [1, 2]}\nnot json\n{"input_ids": [3]}\n')
    run("extract", llama, "--input", tmp_path / "in.jsonl", "--capture", "model.norm", "--out", tmp_path / "o",
        "--skip-bad-lines", "--quiet", check=0)
    m, data = shards(tmp_path / "o")
    assert m["skipped_lines"] == 1 and data[0]["__rows__.seq"].tolist() == [0, 0, 2]


def test_empty_unreadable_and_nonempty_out(llama, tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    p = run("extract", llama, "--input", tmp_path / "empty.jsonl", "--capture", "model.norm", "--out", tmp_path / "o")
    assert p.returncode == 2 and "no documents" in one_error_line(p)
    p = run("extract", llama, "--input", tmp_path / "missing.jsonl", "--capture", "model.norm", "--out", tmp_path / "o")
    assert p.returncode == 2 and "missing.jsonl" in one_error_line(p)
    write_jsonl(tmp_path / "in.jsonl", corpus(3))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    p = run("extract", llama, "--input", tmp_path / "in.jsonl", "--capture", "model.norm", "--out", tmp_path / "full")
    assert p.returncode == 2 and "--overwrite" in one_error_line(p)
    p = run("extract", "demo", "--input", tmp_path / "in.jsonl", "--capture", "nothing.here", "--out", tmp_path / "n")
    assert p.returncode == 2 and "nearest" in one_error_line(p)


def test_numpy_and_torch_readers_agree(tmp_path):
    out = tmp_path / "o"
    run("extract", "demo", "--input", os.path.join(os.path.dirname(__file__), "..", "..", "data", "demo_corpus.txt"),
        "--capture", "transformer.h.*", "transformer.wte:input", "--out", out, "--quiet", check=0)
    m = json.load(open(out / "manifest.json"))
    for s in m["shards"]:
        path = out / s["file"]
        via_numpy = st.load(str(path))[0]
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        assert header["__metadata__"]["format"] == "pt"
        base = 8 + n
        dt = {"F32": torch.float32, "I64": torch.int64}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            t = torch.frombuffer(bytearray(raw[base + a:base + b]), dtype=dt[info["dtype"]]).reshape(info["shape"])
            assert np.array_equal(t.numpy(), via_numpy[name]), name


def test_extract_and_resume_gemma3(tmp_path):
    """Gemma 3 (local and global layers, q/k norms) through extract over 3 devices: every row equals
    the document run alone; killed after two shards (kill -9) and resumed, the output is byte for
    byte the uninterrupted run's, and it verifies."""
    m = tmp_path / "m"
    run("init-model", "--arch", "gemma3_text", "--preset", "tiny", "--seed", "4", "--out", m, check=0)
    docs = corpus(30, seed=5, lo=8, hi=60)
    write_jsonl(tmp_path / "in.jsonl", docs)
    args = ["extract", m, "--input", tmp_path / "in.jsonl", "--capture", "model.layers.*",
            "model.layers.*.self_attn.q_norm", "--batch-size", "4", "--shard-size", "64KiB", "--devices", "3",
            "--quiet"]
    ref = tmp_path / "ref"
    run(*args, "--out", ref, check=0)
    mref, data = shards(ref)
    assert mref["complete"] and len(mref["shards"]) > 3
    seq = np.concatenate([d["__rows__.seq"] for d in data])
    for i in [0, 11, 29]:
        alone = tmp_path / f"alone{i}"
        run("run", m, "--tokens", ",".join(map(str, docs[i])), "--capture", "model.layers.*",
            "model.layers.*.self_attn.q_norm", "--out", alone, check=0)
        want = st.load(str(alone / "shard-00000.safetensors"))[0]
        for name in ["model.layers.0", "model.layers.2", "model.layers.3.self_attn.q_norm"]:
            got = np.concatenate([d[name] for d in data])[seq == i]
            np.testing.assert_allclose(got, want[name], atol=1e-5, rtol=1e-5)
    out = tmp_path / "out"
    p = run(*args, "--out", out, env={"ACTCAP_KILL_AT": "journal:2"})
    assert p.returncode == -9, (p.returncode, p.stderr)
    p = run(*args, "--out", out, "--resume", check=0)
    assert "resumed at line" in p.stdout
    for s in mref["shards"]:
        assert (out / s["file"]).read_bytes() == (ref / s["file"]).read_bytes(), s["file"]
    assert sorted(os.listdir(out)) == sorted(os.listdir(ref))
    assert run("verify", out).returncode == 0
