"""extract --stats / --stats-only: per point and feature count, mean, variance, min, max and the
top-k rows, equal to numpy over the stored rows (float64), identical whatever the shard size, with
or without the rows stored, and after a kill -9 and --resume; --skip-special; bad input."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import st  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
from cli import one_error_line, run, write_jsonl  # noqa: E402

POINTS = ("transformer.h.1", "transformer.ln_f")


def extract(out, inp, *extra, env=None, check=0):
    return run("extract", "demo", "--input", inp, "--capture", *POINTS, "--out", out, "--quiet", *extra,
               env=env, check=check)


def rows_of(out):
    m = json.load(open(out / "manifest.json"))
    data = [st.load(str(out / s["file"]))[0] for s in m["shards"]]
    cat = {k: np.concatenate([d[k] for d in data]) for k in data[0] if not k.startswith("__stats__")}
    return m, cat


def stats_of(out):
    return st.load(str(out / "stats.safetensors"))[0]


def numpy_top(x, seq, pos, tok, k):
    """The k largest values per feature, ties to the earlier row (rows are in (line, position)
    order), padded with -inf / -1."""
    n = x.shape[0]
    flat = x.reshape(n, -1)
    order = np.argsort(-flat, axis=0, kind="stable")[:k]
    val = np.take_along_axis(flat, order, axis=0)
    ids = [a[order] for a in (seq, pos, tok)]
    if n < k:
        pad = k - n
        val = np.concatenate([val, np.full((pad, flat.shape[1]), -np.inf)])
        ids = [np.concatenate([i, np.full((pad, flat.shape[1]), -1)]) for i in ids]
    shape = (k,) + x.shape[1:]
    return (val.reshape(shape),) + tuple(i.reshape(shape) for i in ids)


@pytest.fixture(scope="module")
def inp(tmp_path_factory):
    d = tmp_path_factory.mktemp("stats")
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 256, rng.integers(5, 60)).tolist() for _ in range(40)]  # demo: bytes
    docs[7] = docs[3][:]  # a repeated document: equal activations, so tied top-k values
    write_jsonl(d / "in.jsonl", docs)
    return d / "in.jsonl", docs


def test_stats_equal_numpy_over_the_stored_rows(inp, tmp_path):
    path, docs = inp
    out = tmp_path / "a"
    extract(out, path, "--stats", "--top-k", "5", "--shard-size", "48KiB", "--devices", "3")
    assert run("verify", out).returncode == 0
    m, rows = rows_of(out)
    assert len(m["shards"]) > 2 and m["stats"]["file"] == "stats.safetensors" and m["stats"]["top_k"] == 5
    s = stats_of(out)
    for p in POINTS:
        x = rows[p].astype(np.float64)
        assert s[f"__stats__.{p}.count"].tolist() == [x.shape[0]]
        np.testing.assert_allclose(s[f"__stats__.{p}.mean"], x.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s[f"__stats__.{p}.var"], x.var(0), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(s[f"__stats__.{p}.m2"], x.var(0) * x.shape[0], rtol=1e-10, atol=1e-10)
        assert np.array_equal(s[f"__stats__.{p}.min"], x.min(0))
        assert np.array_equal(s[f"__stats__.{p}.max"], x.max(0))
        val, seq, pos, tok = numpy_top(x, rows["__rows__.seq"], rows["__rows__.pos"], rows["__rows__.token"], 5)
        assert np.array_equal(s[f"__stats__.{p}.top_value"], val), p
        assert np.array_equal(s[f"__stats__.{p}.top_seq"], seq), p
        assert np.array_equal(s[f"__stats__.{p}.top_pos"], pos), p
        assert np.array_equal(s[f"__stats__.{p}.top_token"], tok), p
    # The repeated document ties with its first copy everywhere: the earlier line wins.
    top_seq = s["__stats__.transformer.h.1.top_seq"]
    assert 7 not in set(top_seq[0].tolist()) or 3 not in set(top_seq[0].tolist())
    # Each row's token is the document's.
    assert rows["__rows__.token"].tolist() == [t for d in docs for t in d]


def test_same_stats_whatever_the_shards_and_without_the_rows(inp, tmp_path):
    path, _ = inp
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    # --batch-size 1: the rows themselves are then the same bit for bit whatever the shard size
    # (with larger batches, other shard boundaries group other documents into a batch, and BLAS
    # kernels may round a row's values differently in another batch shape).
    extract(a, path, "--stats", "--shard-size", "48KiB", "--batch-size", "1")
    extract(b, path, "--stats", "--shard-size", "1MiB", "--batch-size", "1")  # one shard: other merges
    extract(c, path, "--stats-only", "--shard-size", "48KiB", "--batch-size", "1")
    sa, sb = stats_of(a), stats_of(b)  # c: its stats file is compared byte for byte below
    for k in sa:
        if k.endswith((".min", ".max", ".count", "top_seq", "top_pos", "top_token")):
            assert np.array_equal(sa[k], sb[k]), k
        else:  # float64 sums in another grouping: the last bits may differ
            np.testing.assert_allclose(sa[k], sb[k], rtol=1e-12, atol=1e-12, err_msg=k)
    assert (a / "stats.safetensors").read_bytes() == (c / "stats.safetensors").read_bytes()
    assert run("verify", c).returncode == 0
    mc = json.load(open(c / "manifest.json"))
    header = st.load(str(c / mc["shards"][0]["file"]))[0]
    assert all(k.startswith("__stats__.") for k in header)  # --stats-only: no activations stored
    assert sum(s["bytes"] for s in mc["shards"]) < sum(s["bytes"] for s in json.load(open(a / "manifest.json"))["shards"])


def test_resume_after_kill_gives_identical_stats(inp, tmp_path):
    path, _ = inp
    ref, out = tmp_path / "ref", tmp_path / "out"
    extract(ref, path, "--stats", "--shard-size", "48KiB")
    p = extract(out, path, "--stats", "--shard-size", "48KiB", env={"ACTCAP_KILL_AT": "shard-write:2"}, check=None)
    assert p.returncode != 0
    assert not (out / "stats.safetensors").exists()
    extract(out, path, "--stats", "--shard-size", "48KiB", "--resume")
    assert (out / "stats.safetensors").read_bytes() == (ref / "stats.safetensors").read_bytes()
    assert run("verify", out).returncode == 0
    # Killed while the merged file is written: resumed, the same bytes.
    out2 = tmp_path / "out2"
    p = extract(out2, path, "--stats-only", "--shard-size", "48KiB", env={"ACTCAP_KILL_AT": "manifest-write:2"},
                check=None)
    extract(out2, path, "--stats-only", "--shard-size", "48KiB", "--resume")
    assert (out2 / "stats.safetensors").read_bytes() == (ref / "stats.safetensors").read_bytes()


def test_damaged_stats_file_fails_verify(inp, tmp_path):
    path, _ = inp
    out = tmp_path / "a"
    extract(out, path, "--stats-only")
    f = out / "stats.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-3] ^= 1
    f.write_bytes(bytes(raw))
    p = run("verify", out, "--json")
    assert p.returncode == 1
    assert {i["file"] for i in json.loads(p.stdout)["issues"]} == {"stats.safetensors"}


def test_skip_special_leaves_special_tokens_out(tmp_path):
    # demo's eos (256, <|endoftext|>) is special: documents that carry it keep it as context only.
    docs = [[256, 72, 105, 256, 33], [104, 256], [256]]
    write_jsonl(tmp_path / "in.jsonl", docs)
    out = tmp_path / "o"
    extract(out, tmp_path / "in.jsonl", "--stats", "--skip-special")
    _, rows = rows_of(out)
    assert rows["__rows__.token"].tolist() == [72, 105, 33, 104]
    assert rows["__rows__.seq"].tolist() == [0, 0, 0, 1] and rows["__rows__.pos"].tolist() == [1, 2, 4, 0]
    assert stats_of(out)["__stats__.transformer.h.1.count"].tolist() == [4]
    # The kept rows are the rows of a run without --skip-special (the special tokens still ran).
    full = tmp_path / "f"
    extract(full, tmp_path / "in.jsonl")
    _, all_rows = rows_of(full)
    keep = all_rows["__rows__.token"] != 256
    assert np.array_equal(all_rows["transformer.h.1"][keep], rows["transformer.h.1"])


@pytest.mark.parametrize("extra,needle", [
    (["--stats", "--capture", "transformer.wte:input"], "floating-point"),
    (["--stats", "--top-k", "-1"], "top-k"),
    (["--stats", "--forward-only"], "forward-only"),
])
def test_bad_input_is_one_line_exit_2(inp, tmp_path, extra, needle):
    path, _ = inp
    p = run("extract", "demo", "--input", path, "--capture", "transformer.h.0", "--out", tmp_path / "x", "--quiet",
            *extra)
    assert p.returncode == 2, p.stderr
    assert needle in one_error_line(p)


def test_resume_refuses_other_stats_settings(inp, tmp_path):
    path, _ = inp
    out = tmp_path / "a"
    p = extract(out, path, "--stats", "--shard-size", "48KiB", env={"ACTCAP_KILL_AT": "shard-write:2"}, check=None)
    assert p.returncode != 0
    p = extract(out, path, "--stats", "--top-k", "3", "--shard-size", "48KiB", "--resume", check=None)
    assert p.returncode == 2 and "settings" in one_error_line(p)
