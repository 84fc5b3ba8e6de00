"""Ranked extract (docs/scale.md): `mpirun -np 3`, an environment-only launch (RANK/WORLD_SIZE, as
torchrun sets them) and --rank/--world-size each write one dataset that verify passes and whose
rows are a single process's; kill -9 of one rank, then --resume of that rank alone (or of all
under mpirun); a failing rank named; another world size refused; merge repairs the manifest."""
import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import st  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
from cli import ACTCAP, one_error_line, run, write_jsonl  # noqa: E402

POINTS = ("transformer.h.1", "transformer.ln_f")
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None and not os.environ.get("CI"),
                                  reason="mpirun not installed (make deps installs openmpi-bin)")


def args(inp, out, *extra):
    # --batch-size 1: a row's values then do not depend on which documents share its batch, so the
    # ranks' rows equal a single process's bit for bit (with larger batches, to the last bits).
    # --devices cpu: on a CUDA build each rank would otherwise take the GPU of its local rank
    # (docs/scale.md), which a one-GPU machine lacks for ranks 1 and 2.
    return ["extract", "demo", "--input", str(inp), "--capture", *POINTS, "--out", str(out), "--quiet",
            "--shard-size", "16KiB", "--stats", "--batch-size", "1", "--devices", "cpu", *extra]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "SLURM_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(extra)
    return env


def launch_env(inp, out, world, *extra, env_for=None):
    """The ranks as separate processes started at once, rank and world size in RANK/WORLD_SIZE."""
    procs = []
    for r in range(world):
        env = clean_env(RANK=str(r), WORLD_SIZE=str(world), **((env_for or {}).get(r, {})))
        procs.append(subprocess.Popen([ACTCAP, *args(inp, out, *extra)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return [(p.wait(timeout=600), *p.communicate()) for p in procs]


def mpirun(world, inp, out, *extra, rank_env=None):
    """mpirun -np WORLD actcap extract ...; rank_env {rank: {VAR: value}} starts that rank with
    extra variables (an MPMD launch: one program per rank)."""
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe"]
    for r in range(world):
        if r:
            cmd.append(":")
        env = [f"{k}={v}" for k, v in (rank_env or {}).get(r, {}).items()]
        cmd += ["-np", "1", *(["env", *env] if env else []), ACTCAP, *args(inp, out, *extra)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean_env())


def rows(out):
    m = json.load(open(out / "manifest.json"))
    data = [st.load(str(out / s["file"]))[0] for s in m["shards"]]
    return m, {k: np.concatenate([d[k] for d in data]) for k in data[0] if not k.startswith("__stats__")}


def assert_same_rows(out, ref):
    (m, got), (_, want) = rows(out), rows(ref)
    assert m["complete"]
    assert sorted(got) == sorted(want)
    for k in want:  # the same rows in the same order, bit for bit
        assert np.array_equal(got[k], want[k]), k
    sa, sb = st.load(str(out / "stats.safetensors"))[0], st.load(str(ref / "stats.safetensors"))[0]
    for k in sb:
        if k.endswith((".min", ".max", ".count", "top_seq", "top_pos", "top_token", "top_value")):
            assert np.array_equal(sa[k], sb[k]), k
        else:  # float64 sums grouped by other shard boundaries
            np.testing.assert_allclose(sa[k], sb[k], rtol=1e-12, atol=1e-12, err_msg=k)
    assert run("verify", out).returncode == 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale")
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 256, rng.integers(3, 70)).tolist() for _ in range(45)]
    write_jsonl(d / "in.jsonl", docs)
    single = d / "single"
    run(*args(d / "in.jsonl", single), check=0, env=clean_env())
    return d / "in.jsonl", docs, single


def test_env_launch_is_one_dataset_equal_to_a_single_process(corpus, tmp_path):
    inp, docs, single = corpus
    out = tmp_path / "out"
    results = launch_env(inp, out, 3)
    assert [rc for rc, _, _ in results] == [0, 0, 0], results
    assert sum("assembled" in o and "manifest.json from 3 ranks" in o for _, o, _ in results) >= 1
    assert_same_rows(out, single)
    m = json.load(open(out / "manifest.json"))
    assert m["world_size"] == 3 and [r["rank"] for r in m["ranks"]] == [0, 1, 2]
    assert all(s["file"].startswith(f"shard-r{r['rank']:05d}-")
               for r in m["ranks"] for s in m["shards"][sum(x["shards"] for x in m["ranks"][:r["rank"]]):][:r["shards"]])
    # Contiguous line ranges, balanced by tokens: each rank within one document of a third.
    lines = [r["lines"] for r in m["ranks"]]
    assert lines[0][0] == 0 and lines[0][1] == lines[1][0] and lines[1][1] == lines[2][0] and lines[2][1] is None
    tokens = [sum(len(docs[i]) for i in range(lo, hi if hi is not None else len(docs))) for lo, hi in lines]
    total = sum(tokens)
    assert all(abs(t - total / 3) <= max(map(len, docs)) for t in tokens), tokens
    assert m["rows"] == sum(r["rows"] for r in m["ranks"]) == len(rows(out)[1]["__rows__.seq"])


def test_rank_and_world_size_flags(corpus, tmp_path):
    inp, _, single = corpus
    out = tmp_path / "out"
    for r in (2, 0, 1):  # one after another, in any order: the last to finish assembles
        p = run(*args(inp, out, "--rank", r, "--world-size", 3), env=clean_env(), check=0)
        assert ("; assembled" in p.stdout) == (r == 1), p.stdout
    assert_same_rows(out, single)


@needs_mpirun
def test_mpirun_np3_is_one_dataset_equal_to_a_single_process(corpus, tmp_path):
    inp, _, single = corpus
    out = tmp_path / "out"
    p = mpirun(3, inp, out)
    assert p.returncode == 0, p.stderr + p.stdout
    assert p.stdout.count("; assembled") == 3, p.stdout  # rank 0 assembled after the gather; all know
    assert_same_rows(out, single)
    j = run(*args(inp, tmp_path / "j", "--json"), env=clean_env(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1"),
            check=0)
    assert "rank" not in json.loads(j.stdout)  # a world of one is a single process


def test_kill9_one_rank_then_resume_that_rank_alone(corpus, tmp_path):
    inp, _, single = corpus
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert [r[0] for r in launch_env(inp, ref, 3)] == [0, 0, 0]
    results = launch_env(inp, out, 3, env_for={1: {"ACTCAP_KILL_AT": "shard-write:3"}})
    assert results[1][0] == -9 and results[0][0] == 0 and results[2][0] == 0, results
    assert not (out / "manifest.json").exists()
    v = run("verify", out)
    assert v.returncode == 1 and "actcap merge" in v.stdout + v.stderr
    mg = run("merge", out)
    assert mg.returncode == 1 and "rank 1 of 3 is not complete" in one_error_line(mg)
    assert "--resume --rank 1 --world-size 3" in mg.stderr
    p = run(*args(inp, out, "--resume", "--rank", 1, "--world-size", 3), env=clean_env(), check=0)
    assert "resumed at line" in p.stdout and "; assembled" in p.stdout
    assert_same_rows(out, single)
    for name in sorted(os.listdir(ref)):  # the same files, byte for byte, nothing left over
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    assert sorted(os.listdir(out)) == sorted(os.listdir(ref))


@needs_mpirun
def test_kill9_one_rank_under_mpirun_then_resume_all(corpus, tmp_path):
    inp, _, single = corpus
    out = tmp_path / "out"
    p = mpirun(3, inp, out, rank_env={2: {"ACTCAP_KILL_AT": "shard-write:2"}})
    assert p.returncode != 0
    assert not (out / "manifest.json").exists()
    p = mpirun(3, inp, out, "--resume")
    assert p.returncode == 0, p.stderr + p.stdout
    assert_same_rows(out, single)


@needs_mpirun
def test_a_failing_rank_fails_the_run_naming_it(corpus, tmp_path):
    inp, _, _ = corpus
    out = tmp_path / "out"
    p = mpirun(3, inp, out, rank_env={2: {"ACTCAP_FAULT_SHARD": "1"}})  # its shard 1 damaged on disk
    assert p.returncode != 0
    assert "rank 2 of 3" in p.stderr, p.stderr
    # Every rank names it (mpirun may interleave the ranks' lines, so count rather than split).
    assert p.stderr.count("actcap: error:") == 3 and p.stderr.count("rank 2 of 3") >= 3, p.stderr
    assert not (out / "manifest.json").exists()
    # Without MPI the failing rank exits non-zero itself, naming its rank.
    results = launch_env(inp, tmp_path / "env", 3, env_for={0: {"ACTCAP_FAULT_SHARD": "0"}})
    assert results[0][0] == 1 and "rank 0 of 3:" in results[0][2]
    assert results[1][0] == 0 and results[2][0] == 0


def test_another_world_size_is_refused_and_overwrite_replaces_it(corpus, tmp_path):
    inp, _, single = corpus
    out = tmp_path / "out"
    assert [r[0] for r in launch_env(inp, out, 3)] == [0, 0, 0]
    for extra, env in [(("--resume", "--rank", "0", "--world-size", "2"), {}),
                       (("--resume",), {}),  # a single process
                       (("--resume",), {"RANK": "1", "WORLD_SIZE": "4"})]:
        p = run(*args(inp, out, *extra), env=clean_env(**env))
        assert p.returncode == 2, p.stderr
        assert "written by 3" in one_error_line(p) and "--world-size" in p.stderr
    p = run(*args(inp, out, "--rank", "0", "--world-size", "2"), env=clean_env())
    assert p.returncode == 2 and "overwrit" in one_error_line(p)  # a new run needs --overwrite
    # Rank 1 finishes before rank 0 has started (and removed the 3-rank run's files): it waits for
    # rank 0 rather than refusing the folder (a busy machine once started them in this order).
    late = run(*args(inp, out, "--overwrite"), env=clean_env(RANK="1", WORLD_SIZE="2"), check=0)
    assert late.returncode == 0, late.stderr
    # Not assembled without rank 0; and the 3-rank dataset's manifest.json, which listed the shards
    # rank 1 replaced, is gone rather than left looking complete.
    assert not (out / "manifest.json").exists()
    assert "assembled when every rank" in late.stdout, late.stdout
    results = launch_env(inp, out, 2, "--overwrite")
    assert [r[0] for r in results] == [0, 0], results
    assert not [n for n in os.listdir(out) if "-of-00003" in n or n.startswith("shard-r00002")]
    assert json.load(open(out / "manifest.json"))["world_size"] == 2
    assert_same_rows(out, single)
    # A single process over it, with --overwrite: the ranks' files go too.
    run(*args(inp, out, "--overwrite"), env=clean_env(), check=0)
    assert not [n for n in os.listdir(out) if n.startswith("rank-") or n.startswith("shard-r")]
    assert_same_rows(out, single)


def test_a_rank_starting_again_replaces_its_manifest_before_it_removes_anything(corpus, tmp_path):
    """A rank of a new run (--overwrite) over a dataset of the same world size first replaces its
    own manifest, then removes manifest.json, then its old files: an assembler reading its old
    manifest meanwhile sees the replacement and removes what it wrote (tests/unit/test_merge.cpp).
    Killed while writing that manifest, it has removed nothing: the dataset is whole."""
    inp, _, single = corpus
    out = tmp_path / "out"
    assert [r[0] for r in launch_env(inp, out, 2)] == [0, 0]
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    p = run(*args(inp, out, "--rank", "1", "--world-size", "2", "--overwrite"),
            env=clean_env(ACTCAP_KILL_AT="manifest-write:1"))
    assert p.returncode == -9, p.stderr
    for n, b in before.items():
        assert (out / n).read_bytes() == b, n
    assert run("verify", out).returncode == 0
    # Run again to the end, it assembles the dataset anew with rank 0's files, still complete.
    p = run(*args(inp, out, "--rank", "1", "--world-size", "2", "--overwrite"), env=clean_env())
    assert p.returncode == 0 and "; assembled" in p.stdout, p.stderr
    assert (out / "manifest.json").read_bytes() == before["manifest.json"]
    assert_same_rows(out, single)


def other_corpus(tmp_path):
    rng = np.random.default_rng(12)
    write_jsonl(tmp_path / "other.jsonl", [rng.integers(0, 256, rng.integers(3, 70)).tolist() for _ in range(30)])
    return tmp_path / "other.jsonl"


def test_a_rank_killed_after_its_new_head_then_resumed_is_the_new_run_alone(corpus, tmp_path):
    """An earlier run's rank 1 was killed mid-way (its journal claims shards); a new run over the
    folder with another input has its rank 1 killed right after writing its head, then resumed:
    the earlier journal's shards are not taken in (it went before the head)."""
    inp, _, _ = corpus
    other, out, ref = other_corpus(tmp_path), tmp_path / "out", tmp_path / "ref"
    assert [r[0] for r in launch_env(other, ref, 2)] == [0, 0]
    results = launch_env(inp, out, 2, env_for={1: {"ACTCAP_KILL_AT": "journal:2"}})
    assert results[1][0] == -9 and results[0][0] == 0, results
    r1 = ("--rank", "1", "--world-size", "2")
    p = run(*args(other, out, *r1, "--overwrite"), env=clean_env(ACTCAP_KILL_AT="start"))
    assert p.returncode == -9, p.stderr
    p = run(*args(other, out, *r1, "--resume"), env=clean_env())
    assert p.returncode == 0, p.stderr + p.stdout
    p = run(*args(other, out, "--rank", "0", "--world-size", "2", "--overwrite"), env=clean_env())
    assert p.returncode == 0 and "; assembled" in p.stdout, p.stderr + p.stdout
    assert_same_rows(out, ref)


def test_a_resumed_rank_removes_the_earlier_manifest_json_before_any_file_it_lists(corpus, tmp_path):
    """A complete run; its rank 1 started again (--overwrite) and killed right after its new head,
    before it removed manifest.json; then resumed: manifest.json goes before the rank's old shards,
    so at no moment does it list missing files."""
    inp, _, single = corpus
    out = tmp_path / "out"
    assert [r[0] for r in launch_env(inp, out, 2)] == [0, 0]
    r1 = ("--rank", "1", "--world-size", "2")
    p = run(*args(inp, out, *r1, "--overwrite"), env=clean_env(ACTCAP_KILL_AT="start"))
    assert p.returncode == -9 and (out / "manifest.json").exists(), p.stderr
    p = run(*args(inp, out, *r1, "--resume"), env=clean_env(ACTCAP_KILL_AT="shard-write:1"))
    assert p.returncode == -9, p.stderr
    assert not (out / "manifest.json").exists()
    p = run(*args(inp, out, *r1, "--resume"), env=clean_env())
    assert p.returncode == 0 and "; assembled" in p.stdout, p.stderr + p.stdout
    assert_same_rows(out, single)


def test_a_rank_finishing_before_a_sibling_replaced_an_earlier_runs_manifest_waits(corpus, tmp_path):
    """A new run (another input) over a complete run of the same world size: rank 1 finishes while
    rank 0 still holds the earlier run's manifest. It leaves the assembly to rank 0 (exit 0) rather
    than failing; rank 0 assembles the new run."""
    inp, _, _ = corpus
    other, out, ref = other_corpus(tmp_path), tmp_path / "out", tmp_path / "ref"
    assert [r[0] for r in launch_env(other, ref, 2)] == [0, 0]
    assert [r[0] for r in launch_env(inp, out, 2)] == [0, 0]
    p = run(*args(other, out, "--rank", "1", "--world-size", "2", "--overwrite"), env=clean_env())
    assert p.returncode == 0 and "; assembled" not in p.stdout, p.stderr + p.stdout
    assert not (out / "manifest.json").exists()
    mg = run("merge", out)  # asked explicitly, it names the difference
    assert mg.returncode == 1 and "differs from the other ranks in 'input'" in one_error_line(mg)
    p = run(*args(other, out, "--rank", "0", "--world-size", "2", "--overwrite"), env=clean_env())
    assert p.returncode == 0 and "; assembled" in p.stdout, p.stderr + p.stdout
    assert_same_rows(out, ref)


def test_a_manifest_assembled_from_a_rank_that_ran_again_fails_verify_and_merge_removes_it(corpus, tmp_path):
    """The end state of an assembler killed between writing manifest.json and looking again, while
    a sibling started again (with other settings, the same shard bytes): manifest.json records the
    bytes of the rank manifests it was built from, so verify names the rank that ran again and
    merge, which cannot assemble, removes the stale manifest.json."""
    inp, _, _ = corpus
    out = tmp_path / "out"
    for r in (0, 1):
        p = run(*args(inp, out, "--rank", r, "--world-size", 2), env=clean_env())
        assert p.returncode == 0, p.stderr
    assert run("verify", out).returncode == 0
    stale = (out / "manifest.json").read_bytes()
    assert all("manifest_xxh3" in r for r in json.loads(stale)["ranks"])
    p = run(*args(inp, out, "--rank", "1", "--world-size", "2", "--overwrite", "--skip-bad-lines"),
            env=clean_env())
    assert p.returncode == 0 and "; assembled" not in p.stdout, p.stderr + p.stdout
    (out / "manifest.json").write_bytes(stale)  # as the killed assembler left it
    v = run("verify", out)
    assert v.returncode == 1, v.stdout + v.stderr
    assert "assembled from another version of rank-00001-of-00002.json" in v.stdout + v.stderr
    mg = run("merge", out)
    assert mg.returncode != 0 and "differs from the other ranks in 'settings'" in one_error_line(mg)
    assert "removed" in one_error_line(mg)
    assert not (out / "manifest.json").exists()


def test_a_failed_merge_never_writes_through_a_leftover_temp_linked_to_the_dataset(corpus, tmp_path):
    """An assembler killed inside its moving-aside of manifest.json (between link() and unlink())
    leaves manifest.json.tmp.<pid>-<n> as a second name of the live manifest. A later merge by a
    process of that pid that fails mid-write (here: the file size limit) must leave the dataset as
    it was: its temp files are created new, never opened (and truncated) over such a leftover.
    Leftovers are planted under this version's first temp name and earlier versions' one."""
    inp, _, _ = corpus
    out = tmp_path / "out"
    assert [r[0] for r in launch_env(inp, out, 2)] == [0, 0]
    live = ("manifest.json", "stats.safetensors")
    before = {f: (out / f).read_bytes() for f in live}

    def plant_then_limit():  # in the child, whose pid the merge keeps across exec
        pid = os.getpid()
        for f in live:
            for leftover in (f"{f}.tmp.{pid}-0", f"{f}.tmp.{pid}"):
                os.link(out / f, out / leftover)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    p = subprocess.run([ACTCAP, "merge", str(out)], preexec_fn=plant_then_limit, capture_output=True,
                       text=True, timeout=600, env=clean_env())
    assert p.returncode == 1 and "File too large" in one_error_line(p), p.stderr
    for f in live:
        assert (out / f).read_bytes() == before[f], f
    assert run("verify", out).returncode == 0
    # A new run into a folder holding only such a leftover is refused, naming it.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "manifest.json.tmp.4242-0").write_text("{")
    p = run(*args(inp, fresh, "--rank", "0", "--world-size", "2"), env=clean_env(), check=None)
    assert p.returncode == 2 and ("manifest.json.tmp.4242-0, a temp file left by a process killed while "
                                  "writing manifest.json") in one_error_line(p), p.stderr


def test_an_assembler_killed_mid_write_leaves_no_manifest_and_merge_assembles_it(corpus, tmp_path):
    """The last rank killed (SIGKILL) with manifest.json's temp file half written: no manifest.json
    (verify fails, naming merge), the half-written temp never taken for it; actcap merge then
    assembles the same files as an unkilled run. A merge killed the same way over a complete
    dataset leaves its manifest as it was."""
    inp, _, single = corpus
    ref, out = tmp_path / "ref", tmp_path / "out"
    for r in (0, 1):
        run(*args(inp, ref, "--rank", r, "--world-size", 2), env=clean_env(), check=0)
    run(*args(inp, out, "--rank", 0, "--world-size", 2), env=clean_env(), check=0)
    p = run(*args(inp, out, "--rank", 1, "--world-size", 2),
            env=clean_env(ACTCAP_KILL_AT="merge-write:1"), check=None)
    assert p.returncode == -9, p.stderr
    assert not (out / "manifest.json").exists()
    temps = [f for f in os.listdir(out) if f.startswith("manifest.json.tmp.")]
    assert len(temps) == 1 and (out / temps[0]).stat().st_size > 0, os.listdir(out)
    v = run("verify", out)
    assert v.returncode == 1 and "actcap merge" in v.stdout + v.stderr
    assert "from 2 ranks" in run("merge", out, check=0).stdout
    assert_same_rows(out, single)
    for name in sorted(os.listdir(ref)):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    good = (out / "manifest.json").read_bytes()
    p = run("merge", out, env=clean_env(ACTCAP_KILL_AT="merge-write:1"), check=None)
    assert p.returncode == -9, p.stderr
    assert (out / "manifest.json").read_bytes() == good
    assert run("verify", out).returncode == 0


def test_merge_repairs_a_missing_or_damaged_manifest(corpus, tmp_path):
    inp, _, single = corpus
    out = tmp_path / "out"
    assert [r[0] for r in launch_env(inp, out, 3)] == [0, 0, 0]
    good = (out / "manifest.json").read_bytes()
    stats = (out / "stats.safetensors").read_bytes()
    (out / "manifest.json").unlink()
    (out / "stats.safetensors").unlink()
    assert run("verify", out).returncode == 1
    p = run("merge", out, check=0)
    assert "from 3 ranks" in p.stdout
    assert (out / "manifest.json").read_bytes() == good and (out / "stats.safetensors").read_bytes() == stats
    (out / "manifest.json").write_bytes(good.replace(b'"complete": true', b'"complete": false'))
    assert run("verify", out).returncode == 1
    run("merge", out, check=0)
    assert (out / "manifest.json").read_bytes() == good
    # A damaged rank manifest is named, and nothing is assembled from it.
    r1 = out / "rank-00001-of-00003.json"
    r1.write_text(r1.read_text().replace('"rows"', '"r0ws"', 1))
    p = run("merge", out)
    assert p.returncode == 1 and "rank-00001-of-00003.json" in one_error_line(p)
    assert run("merge", tmp_path).returncode == 2  # no rank manifests at all


def test_more_ranks_than_documents(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [[1, 2, 3], [4, 5, 6, 7]])
    single = tmp_path / "single"
    run(*args(tmp_path / "in.jsonl", single), env=clean_env(), check=0)
    out = tmp_path / "out"
    assert [r[0] for r in launch_env(tmp_path / "in.jsonl", out, 5)] == [0] * 5
    m = json.load(open(out / "manifest.json"))
    assert sum(r["documents"] for r in m["ranks"]) == 2 and sum(r["shards"] == 0 for r in m["ranks"]) >= 3
    assert_same_rows(out, single)


@pytest.mark.parametrize("env,needle", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside a world of 2"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "-1"}, "SLURM_STEP_NUM_TASKS"),
])
def test_bad_launcher_variables_are_one_line_exit_2(corpus, tmp_path, env, needle):
    inp, _, _ = corpus
    p = run(*args(inp, tmp_path / "out"), env=clean_env(**env))
    assert p.returncode == 2 and needle in one_error_line(p)


def test_launcher_variables_in_order_of_precedence(corpus, tmp_path):
    inp, _, _ = corpus
    env = clean_env(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="4",
                    RANK="3", WORLD_SIZE="5")
    j = json.loads(run(*args(inp, tmp_path / "a", "--json"), env=env, check=0).stdout)
    assert j["rank"]["rank"] == 1 and j["rank"]["world_size"] == 2 and "Open MPI" in j["rank"]["source"]
    env = clean_env(SLURM_PROCID="2", SLURM_STEP_NUM_TASKS="4", RANK="3", WORLD_SIZE="5")
    j = json.loads(run(*args(inp, tmp_path / "b", "--json"), env=env, check=0).stdout)
    assert j["rank"]["rank"] == 2 and "Slurm" in j["rank"]["source"] and j["rank"]["assembled"] is False
    j = json.loads(run(*args(inp, tmp_path / "c", "--json", "--rank", "0", "--world-size", "3"), env=env,
                       check=0).stdout)
    assert j["rank"]["rank"] == 0 and j["rank"]["world_size"] == 3 and j["rank"]["source"] == "--rank/--world-size"
    # A Slurm batch script (no srun step): one process, whatever the allocation's task count.
    j = json.loads(run(*args(inp, tmp_path / "d", "--json"), env=clean_env(SLURM_PROCID="0", SLURM_NTASKS="4"),
                       check=0).stdout)
    assert "rank" not in j and j["documents"] == 45
