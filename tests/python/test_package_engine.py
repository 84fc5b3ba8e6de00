"""actcap's engine from Python: load, points, plan, run, compare, extract, open — each checked
against the CLI writing the same thing, and bad input raising typed errors."""
import os
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import actcap_helpers as H

SEQS = [[5, 17, 300, 42, 7, 99, 1], [8, 9, 10]]


@pytest.fixture(scope="module")
def engine(ac, gpt2_ckpt):
    return ac.load(gpt2_ckpt, devices=3)


def test_points_and_resolve(ac, engine):
    pts = engine.points()
    assert pts[0].name == "transformer.wte:input" or pts[0].name.startswith("transformer.")
    names = [p.name for p in pts]
    assert "transformer.h.3.mlp" in names and "lm_head" in names
    got = engine.resolve("transformer.h.*", dtype=torch.float16)
    assert [p.name for p in got] == [f"transformer.h.{i}" for i in range(4)]
    assert all(p.dtype == torch.float16 and p.shape == [64] for p in got)
    assert engine.config["arch"] == "gpt2" and engine.config["num_hidden_layers"] == 4
    assert len(engine.fingerprint) == 16


def test_run_equals_the_cli_run_byte_for_byte(ac, engine, gpt2_ckpt, tmp_path):
    out = engine.run(SEQS, ["transformer.h.*", "transformer.ln_f"], positions="1:", dtype="bf16")
    assert list(out) == [f"transformer.h.{i}" for i in range(4)] + [
        "transformer.ln_f", "__rows__.seq", "__rows__.pos", "__rows__.token"]
    cli = tmp_path / "cli"
    H.actcap("run", gpt2_ckpt, "--tokens", H.tokens_arg(SEQS), "--capture", "transformer.h.*",
             "transformer.ln_f", "--positions", "1:", "--dtype", "bf16", "--devices", "3",
             "--out", cli, check=True)
    ref = ac.open(cli)
    for name, t in out.items():
        assert t.dtype == ref[name].dtype
        assert torch.equal(t, ref[name]), name
    assert out["__rows__.seq"].tolist() == [0] * 6 + [1] * 2
    assert out["__rows__.pos"].tolist() == list(range(1, 7)) + [1, 2]
    assert out["__rows__.token"].tolist() == SEQS[0][1:] + SEQS[1][1:]


def test_run_inputs_logits_and_explicit_positions(ac, engine):
    ids = torch.tensor([[5, 17, 300, 0], [8, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    a = engine.run(ids, "transformer.h.0", attention_mask=mask, logits=True)
    b = engine.run([[5, 17, 300], [8, 9, 10, 11]], "transformer.h.0", logits=True)
    assert torch.equal(a["transformer.h.0"], b["transformer.h.0"])
    assert a["logits"].shape == (2, 4, 512)
    c = engine.run(SEQS, "transformer.h.1", positions=[[0, 6], [2]])
    full = engine.run(SEQS, "transformer.h.1")
    assert torch.equal(c["transformer.h.1"], full["transformer.h.1"][[0, 6, 9]])
    assert c["__rows__.pos"].tolist() == [0, 6, 2]


def test_compare_proves_the_split_run_equal(ac, engine):
    res = engine.compare(SEQS, "**")
    assert res.equal and res.mismatched == 0
    assert res.rows[-1]["point"] == "logits"
    assert len(set(res.device_map.values())) == 3
    within = engine.compare(SEQS, "transformer.h.*", tolerance=1e-4)
    assert within.equal and within.tolerance == 1e-4
    assert all(r["equal"] and r["within_tolerance"] and r["rel_rms"] == 0 for r in within.rows)
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ac.InputError, match="tolerance"):
            engine.compare(SEQS, tolerance=bad)


def test_plan(ac, engine):
    plan = engine.plan("transformer.h.*", batch=4, seq=64)
    assert set(plan.device_map.values()) == {"cpu:0", "cpu:1", "cpu:2"}
    assert "cpu:1" in str(plan) and len(plan.devices) == 3
    budget = ac.load("demo", devices=2, max_memory={"cpu:0": "10KiB", "cpu:1": "10KiB"})
    with pytest.raises(ac.InputError, match="cpu:0"):
        budget.plan(batch=8, seq=64)


def write_corpus(path, n=30):
    lines = [" ".join(f"w{(i * 7 + j) % 13}" for j in range(3 + i % 9)) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return lines


def test_extract_from_python_equals_the_cli_and_opens_as_tensors(ac, actcap_bin, tmp_path):
    corpus = tmp_path / "in.txt"
    write_corpus(corpus)
    seen = []
    py_out, cli_out = tmp_path / "py", tmp_path / "cli"
    summary = ac.extract("demo", corpus, py_out, "transformer.h.*", devices=3, batch_size=4,
                         shard_size="8KiB", progress=seen.append)
    assert summary["documents_done"] == 30 and summary["shards_written"] > 1
    assert seen and seen[-1]["documents_done"] == 30
    H.actcap("extract", "demo", "--input", corpus, "--capture", "transformer.h.*", "--devices", "3",
             "--batch-size", "4", "--shard-size", "8KiB", "--out", cli_out, "--quiet", check=True)
    a, b = ac.open(py_out), ac.open(cli_out)
    assert a.rows == b.rows and a.shards == b.shards and a.points == b.points
    for p in a.points + ["__rows__.seq", "__rows__.pos", "__rows__.token"]:
        assert torch.equal(a[p], b[p]), p
    assert (py_out / "manifest.json").read_bytes().count(b'"rows"') == (cli_out / "manifest.json").read_bytes().count(b'"rows"')
    a.verify()
    # the shards are memory-mapped: one shard's tensors share the file's pages
    first = a.shard(0)
    assert first["transformer.h.0"].shape[0] == first["__rows__.seq"].shape[0]


def test_dataset_batches_are_seeded_and_cover_every_row_once(ac, tmp_path):
    corpus = tmp_path / "in.txt"
    write_corpus(corpus, 20)
    out = tmp_path / "out"
    ac.extract("demo", corpus, out, ["transformer.h.1", "transformer.h.2"], shard_size="4KiB",
               progress=False)
    ds = ac.open(out)
    assert ds.shards > 2
    every = ds["transformer.h.1"]
    got = list(ds.batches("transformer.h.1", 7, seed=3))
    assert [len(b) for b in got[:-1]] == [7] * (len(got) - 1)
    again = list(ds.batches("transformer.h.1", 7, seed=3))
    other = list(ds.batches("transformer.h.1", 7, seed=4))
    assert all(torch.equal(x, y) for x, y in zip(got, again))
    assert not all(torch.equal(x, y) for x, y in zip(got, other))
    perm = torch.randperm(ds.rows, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.cat(got), every[perm])
    inorder = torch.cat(list(ds.batches("transformer.h.1", 5, shuffle=False)))
    assert torch.equal(inorder, every)
    both = next(ds.batches(["transformer.h.1", "transformer.h.2"], 4, dtype=torch.float64))
    assert set(both) == {"transformer.h.1", "transformer.h.2"} and both["transformer.h.2"].dtype == torch.float64
    assert sum(len(b) for b in ds.batches("transformer.h.2", 6, drop_last=True)) == ds.rows // 6 * 6


def test_open_checks_every_tensor_it_reads(ac, tmp_path):
    corpus = tmp_path / "in.txt"
    write_corpus(corpus, 6)
    out = tmp_path / "out"
    ac.extract("demo", corpus, out, "transformer.h.0", progress=False)
    shard = out / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01  # the last tensor's bytes (__rows__.token)
    shard.write_bytes(bytes(data))
    ds = ac.open(out)
    ds["transformer.h.0"]  # undamaged tensor reads fine
    ds["__rows__.pos"]
    with pytest.raises(ac.RunError, match=r"__rows__.token.*checksum"):
        ds.tokens


def test_progress_lines_and_tqdm(ac, tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "in.txt"
    write_corpus(corpus, 5)
    ac.extract("demo", corpus, tmp_path / "a", "transformer.h.0", progress="lines")
    assert "actcap: 5/5 docs" in capsys.readouterr().err
    updates = []

    class FakeTqdm:
        def __init__(self, total, **kw):
            self.total, self.n = total, 0

        def set_postfix_str(self, s, refresh=True):
            pass

        def refresh(self):
            updates.append((self.n, self.total))

        def close(self):
            updates.append("closed")

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    ac.extract("demo", corpus, tmp_path / "b", "transformer.h.0", progress=True)
    assert updates[-2] == (5, 5) and updates[-1] == "closed"


def test_bad_input_raises_typed_errors(ac, engine, tmp_path):
    with pytest.raises(ac.InputError):
        ac.load(tmp_path / "nothing-here")
    with pytest.raises(ac.InputError, match="unknown device 'gpu:1'"):
        ac.load("demo", devices="cpu:0,gpu:1")
    with pytest.raises(ac.InputError, match=r"matches no hook point.*nearest"):
        engine.run(SEQS, "transformer.h.9.mlpp")
    with pytest.raises(ac.InputError, match="vocab|outside"):
        engine.run([[100000]], "transformer.h.0")
    with pytest.raises(ac.InputError, match="tokenizer"):
        engine.run("some text", "transformer.h.0")
    with pytest.raises(ac.InputError, match="over the capture budget"):
        engine.run(SEQS, "**", budget="1KiB")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    corpus = tmp_path / "in.txt"
    write_corpus(corpus, 3)
    with pytest.raises(ac.InputError, match="not empty"):
        ac.extract("demo", corpus, tmp_path / "busy", "transformer.h.0", progress=False)
    with pytest.raises(ac.InputError, match="not an actcap output folder"):
        ac.open(tmp_path / "busy")
    with pytest.raises(ac.InputError, match="not a folder"):
        ac.open(tmp_path / "in.txt")
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "manifest.json").write_text(json.dumps({"format": "other/1"}))
    with pytest.raises(ac.InputError, match="not an actcap manifest"):
        ac.open(tmp_path / "fake")
    good = tmp_path / "good"
    ac.extract("demo", corpus, good, "transformer.h.0", progress=False)
    with pytest.raises(ac.InputError, match="not a point.*nearest: transformer.h.0"):
        ac.open(good)["transformer.h.00"]


def test_readme_quickstart_prints_what_the_readme_shows(ac):
    """examples/quickstart.py is the README's Python worked example: its output is the README's."""
    repo = Path(__file__).resolve().parents[2]
    run = H.run_python(repo / "examples" / "quickstart.py", timeout=300)
    assert run.returncode == 0, run.stderr
    readme = (repo / "README.md").read_text()
    shown = readme.split("$ PYTHONPATH=build/python python3 examples/quickstart.py\n", 1)[1]
    shown = shown.split("```", 1)[0]
    assert run.stdout == shown


def test_keep_freed_memory_sets_glibc_options(ac):
    """actcap.keep_freed_memory() calls mallopt (in a child process: it is process-wide)."""
    run = H.run_python("-c", "import actcap; print(actcap.keep_freed_memory())")
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stdout + run.stderr


def test_one_engine_from_two_threads_runs_one_forward_at_a_time(ac, engine):
    import threading
    want = {len(s): engine.run(s, "transformer.h.2") for s in ([SEQS[0]], SEQS + [SEQS[0]])}
    bad = []

    def work(seqs):
        for _ in range(8):
            got = engine.run(seqs, "transformer.h.2")
            if not torch.equal(got["transformer.h.2"], want[len(seqs)]["transformer.h.2"]):
                bad.append(len(seqs))

    threads = [threading.Thread(target=work, args=(s,)) for s in ([SEQS[0]], SEQS + [SEQS[0]])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_positions_lists_and_one_dimensional_inputs(ac, engine):
    with pytest.raises(ac.InputError, match="one list of positions per sequence"):
        engine.run(SEQS, "transformer.h.0", positions=[0, 1])
    with pytest.raises(ac.InputError, match="gives 1 lists for 2 sequences"):
        engine.run(SEQS, "transformer.h.0", positions=[[0]])
    ids = torch.tensor([5, 17, 300, 42])
    out = engine.run(ids, "transformer.h.0", attention_mask=torch.tensor([0, 1, 1, 1]))
    assert out["__rows__.pos"].tolist() == [0, 1, 2]
    assert torch.equal(out["transformer.h.0"], engine.run([[17, 300, 42]], "transformer.h.0")["transformer.h.0"])


def test_extract_stats_from_python_equals_the_cli(ac, tmp_path):
    corpus = tmp_path / "in.txt"
    write_corpus(corpus, 12)
    py_out, cli_out = tmp_path / "py", tmp_path / "cli"
    ac.extract("demo", corpus, py_out, "transformer.h.2", stats=True, top_k=3, shard_size="8KiB",
               progress=False)
    H.actcap("extract", "demo", "--input", corpus, "--capture", "transformer.h.2", "--stats", "--top-k", "3",
             "--shard-size", "8KiB", "--out", cli_out, "--quiet", check=True)
    assert (py_out / "stats.safetensors").read_bytes() == (cli_out / "stats.safetensors").read_bytes()
    ds = ac.open(py_out)
    s = ds.stats()["transformer.h.2"]
    x = ds["transformer.h.2"].double()
    assert int(s["count"]) == x.shape[0] == len(ds.tokens)
    assert torch.allclose(s["mean"], x.mean(0), rtol=1e-12, atol=1e-12)
    assert torch.allclose(s["var"], x.var(0, unbiased=False), rtol=1e-10, atol=1e-12)
    assert torch.equal(s["top_value"][0], x.max(0).values)
    best = s["top_seq"][0, 5], s["top_pos"][0, 5]  # the row of feature 5's largest value
    seq, pos = ds.rows_of()
    row = ((seq == best[0]) & (pos == best[1])).nonzero().item()
    assert x[row, 5] == s["top_value"][0, 5] and ds.tokens[row] == s["top_token"][0, 5]
    only = tmp_path / "only"
    ac.extract("demo", corpus, only, "transformer.h.2", stats_only=True, top_k=3, shard_size="8KiB",
               progress=False)
    assert (only / "stats.safetensors").read_bytes() == (cli_out / "stats.safetensors").read_bytes()
    with pytest.raises(ac.InputError, match="no statistics"):
        ac.open(_plain(ac, corpus, tmp_path)).stats()


def _plain(ac, corpus, tmp_path):
    out = tmp_path / "plain"
    ac.extract("demo", corpus, out, "transformer.h.2", progress=False)
    return out


def test_generate_from_python(ac, engine):
    g = engine.generate(SEQS, "transformer.h.*", max_new_tokens=3, stop_at_eos=False)
    assert [len(s.generated) for s in g.sequences] == [3, 3] and g.forwards == 4
    rows = sum(len(s.tokens) for s in g.sequences)
    assert g.activations["transformer.h.0"].shape[0] == rows
    assert g.activations["__rows__.token"].tolist() == g.sequences[0].tokens + g.sequences[1].tokens
    full = engine.run([s.tokens for s in g.sequences], "transformer.h.*")
    for i in range(4):
        torch.testing.assert_close(g.activations[f"transformer.h.{i}"], full[f"transformer.h.{i}"],
                                   rtol=1e-5, atol=1e-5)
    assert torch.equal(g.activations["__rows__.pos"], full["__rows__.pos"])
    with pytest.raises(ac.InputError, match="past the context"):
        engine.generate(SEQS, max_new_tokens=10 ** 6)


def test_ranked_extract_from_python_is_one_dataset(ac, actcap_bin, tmp_path):
    """rank=/world_size= (or torchrun's RANK/WORLD_SIZE): each call extracts its share, the last to
    finish assembles manifest.json; the rows are the single process's (docs/scale.md)."""
    corpus = tmp_path / "in.txt"
    write_corpus(corpus)
    out, single = tmp_path / "ranked", tmp_path / "single"
    first = ac.extract("demo", corpus, out, "transformer.h.1", rank=1, world_size=2, batch_size=1,
                       shard_size="4KiB", progress=False)
    assert first["rank"] == 1 and first["world_size"] == 2 and not first["assembled"]
    assert first["lines"][0] > 0 and first["lines"][1] is None
    with pytest.raises(ac.RunError, match="rank 0 of 2 has not started"):
        ac.merge(out)
    last = ac.extract("demo", corpus, out, "transformer.h.1", rank=0, world_size=2, batch_size=1,
                      shard_size="4KiB", progress=False)
    assert last["assembled"] and last["lines"] == (0, first["lines"][0])
    H.actcap("extract", "demo", "--input", corpus, "--capture", "transformer.h.1", "--batch-size", "1",
             "--out", single, "--quiet", check=True)
    a, b = ac.open(out), ac.open(single)
    assert a.rows == b.rows
    for p in ["transformer.h.1", "__rows__.seq", "__rows__.pos", "__rows__.token"]:
        assert torch.equal(a[p], b[p]), p
    a.verify()
    (out / "manifest.json").unlink()
    assert ac.merge(out)["world_size"] == 2
    ac.open(out).verify()
    with pytest.raises(ac.InputError, match="no rank manifests"):
        ac.merge(tmp_path)
    # torchrun's variables, in a process of its own
    env = dict(os.environ, RANK="0", WORLD_SIZE="3", PYTHONPATH=os.pathsep.join(sys.path))
    code = ("import actcap, json, sys; print(json.dumps(actcap.extract('demo', sys.argv[1], sys.argv[2], "
            "'transformer.h.1', progress=False)))")
    p = subprocess.run([sys.executable, "-c", code, str(corpus), str(tmp_path / "env")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["rank"] == 0 and got["world_size"] == 3 and not got["assembled"]


def test_open_keeps_the_shard_list_compactly_and_still_checks_what_the_manifest_says(ac, tmp_path):
    corpus = tmp_path / "in.txt"
    write_corpus(corpus, 12)
    out = tmp_path / "out"
    ac.extract("demo", corpus, out, "transformer.h.0", shard_size="2KiB", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    ds = ac.open(out)
    assert ds.shards == len(manifest["shards"]) > 3 and ds.manifest["shards"] == []
    assert ds.rows == sum(e["rows"] for e in manifest["shards"]) == manifest["rows"]
    for i, e in enumerate(manifest["shards"]):  # what the index gives back is the manifest's text
        s = ds._shards[i]
        assert (s.file, s.rows, s.header_xxh3, s.checksums) == (e["file"], e["rows"], e["header_xxh3"],
                                                                 e["checksums"])
    every = ds["transformer.h.0"]
    assert every.shape[0] == ds.rows

    def opened_with(change):
        m = json.loads(json.dumps(manifest))
        change(m)
        (out / "manifest.json").write_text(json.dumps(m))
        return ac.open(out)

    # a checksum that is not 16 lowercase hex digits is kept as text: it matches nothing
    ds = opened_with(lambda m: m["shards"][1]["checksums"].update(
        {"transformer.h.0": m["shards"][1]["checksums"]["transformer.h.0"].upper()}))
    ds.shard(0)
    with pytest.raises(ac.RunError, match=r"shard-00001.*'transformer.h.0' has checksum"):
        ds.shard(1)
    ds = opened_with(lambda m: m["shards"][2]["checksums"].pop("__rows__.pos"))
    with pytest.raises(ac.RunError, match=r"shard-00002.*no checksum for tensor '__rows__.pos'"):
        ds.shard(2)
    ds = opened_with(lambda m: m["shards"][2].update({"header_xxh3": 12345}))
    with pytest.raises(ac.RunError, match=r"shard-00002.*header_xxh3"):
        ds.shard(2)
    ds = opened_with(lambda m: m["shards"][0].pop("header_xxh3"))  # no header checksum: not checked
    assert torch.equal(ds["transformer.h.0"], every)
    for change, message in [
            (lambda m: m["shards"].__setitem__(1, 7), "shard entry 1 is not a JSON object"),
            (lambda m: m["shards"][3].pop("file"), "shard entry 3 names no file"),
            (lambda m: m.update({"shards": {"a": 1}}), "'shards' is not a list")]:
        with pytest.raises(ac.InputError, match=message):
            opened_with(change)
    with pytest.raises(ac.InputError, match="shard entry 2's rows is not a count"):
        opened_with(lambda m: m["shards"][2].update({"rows": "3"}))
    ds = opened_with(lambda m: None)
    assert ds._shards[-1].file == manifest["shards"][-1]["file"]
    with pytest.raises(IndexError):
        ds._shards[len(manifest["shards"])]
    (out / "manifest.json").write_text(json.dumps(manifest)[:-40])
    with pytest.raises(ac.InputError, match="not a readable JSON manifest"):
        ac.open(out)


def test_copy_window_bounds_the_copies_in_flight_and_changes_no_capture(ac, gpt2_ckpt):
    queued = ac.load(gpt2_ckpt, devices=3)
    blocking = ac.load(gpt2_ckpt, devices=3, copy_window=0)
    tight = ac.load(gpt2_ckpt, devices=3, copy_window="1KiB")
    a = queued.run(SEQS, "transformer.h.*")
    for other in (blocking, tight):
        b = other.run(SEQS, "transformer.h.*")
        assert list(b) == list(a) and all(torch.equal(a[n], b[n]) for n in a)
    stats = {e: {s["device"]: s for s in e.device_stats()} for e in (queued, blocking, tight)}
    assert sorted(stats[queued]) == ["cpu:0", "cpu:1", "cpu:2"]
    assert sum(s["capture_copies"] for s in stats[queued].values()) == 4  # one per block
    assert sum(s["capture_bytes"] for s in stats[queued].values()) == 4 * 10 * 64 * 4
    assert all(s["capture_copies"] == 0 for s in stats[blocking].values())  # copied in the hook
    # Each copy (2560 B) is over a 1 KiB window: queued still, a hook waiting only for one in flight.
    assert sum(s["capture_copies"] for s in stats[tight].values()) == 4
    assert all(s["copy_waits"] <= s["capture_copies"] for s in stats[tight].values())
    assert all(s["weight_bytes"] > 0 for s in stats[queued].values())
    for bad, match in ((-1, "negative"), ("lots", "lots"), (1.5, "not a number of bytes")):
        with pytest.raises(ac.InputError, match=match):
            ac.load(gpt2_ckpt, devices=3, copy_window=bad)
