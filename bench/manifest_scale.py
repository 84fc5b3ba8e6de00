#!/usr/bin/env python3
"""How verify, --resume and merge scale with the number of shards (issue 17 item 6).

    PYTHONPATH=build/python /usr/bin/python3 bench/manifest_scale.py --actcap build/actcap \
        [--shards 10000,100000] [--extract 2000,20000] [--work /tmp/manifest-scale] [--ranks 4]

Builds synthetic datasets of N shards cheaply: one real shard written by `actcap extract` (the demo
model, one document), hard-linked N times under the names a run gives them, and a manifest listing
all N with the real entry's checksums (sealed with actcap's own XXH3). Each file is a complete,
valid shard, so `verify` opens and checks every one of them. For each N it times, as separate
processes, with their peak resident memory (getrusage of the child):

  verify      a complete single-process dataset;
  open        the same opened from Python (actcap.open, then its last shard's tensors read and
              checked), in a fresh interpreter; "import" is that interpreter with actcap (and
              torch) imported and nothing opened, the floor of the open step's memory;
  resume      the same run unfinished (half its shards in manifest.json, half in manifest.journal),
              resumed: every claimed shard re-checked, the journal taken in, the run completed;
  merge       the same shards as the rank manifests of --ranks ranks, assembled by `actcap merge`;
  verify      the merged dataset.

With --extract N1,N2,...: a real `actcap extract` of N one-document shards each (the demo model,
N 4-token documents, --shard-size 1KB): its peak memory must not grow with N (the running extract
keeps no shard list).

Per-shard time constant across N (µs/shard) means linear; the manifest's size on disk is printed.
"""
import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

_core = None  # actcap._core (XXH3 as actcap computes it), imported in main(): it loads torch


def canonical(obj):  # nlohmann's dump(): compact, keys sorted (std::map), UTF-8 as is
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def seal(manifest):
    m = dict(manifest)
    m.pop("manifest_checksum", None)
    m["manifest_checksum"] = _core.xxh3_bytes(canonical(m).encode())
    return json.dumps(m, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def journal_line(entry):
    return canonical({"shard": entry, "xxh3": _core.xxh3_bytes(canonical(entry).encode())}) + "\n"


def measure(cmd):
    """Wall seconds and peak resident MiB of one process (os.wait4: that child's own rusage). Run in
    a process of the forkserver (a fresh interpreter without torch): a child's ru_maxrss counts
    the pages of the process it was forked from, before its exec."""
    t0 = time.perf_counter()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {err.strip()}")
    return wall, usage.ru_maxrss / 1024


_pool = None

# A fresh interpreter opening a folder from Python and reading its last shard (argv[1]); without an
# argument, only the imports.
OPEN_AND_READ_LAST = """
import sys
import actcap
if len(sys.argv) > 1:
    ds = actcap.open(sys.argv[1])
    last = ds.shard(ds.shards - 1)
    assert ds.rows > 0 and all(t.shape[0] == last["__rows__.seq"].shape[0] for t in last.values())
"""


def timed(cmd):
    return _pool.apply(measure, ([str(c) for c in cmd],))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actcap", default="build/actcap")
    ap.add_argument("--shards", default="10000,100000")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--work", default="/tmp/manifest-scale")
    ap.add_argument("--extract", default="", help="shard counts of real extract runs, e.g. 2000,20000")
    ap.add_argument("--keep", action="store_true", help="keep the folders (WORK/nN, WORK/nN/ranked)")
    a = ap.parse_args()
    global _core, _pool
    _pool = multiprocessing.get_context("forkserver").Pool(1)
    from actcap import _core as core  # after the forkserver started
    _core = core
    actcap = str(Path(a.actcap).resolve())
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "in.jsonl").write_text(json.dumps({"input_ids": [1, 2, 3, 4]}) + "\n")
    base = work / "base"
    subprocess.run([actcap, "extract", "demo", "--input", work / "in.jsonl", "--capture", "transformer.h.1",
                    "--out", base, "--quiet"], check=True)
    head = json.load(open(base / "manifest.json"))
    entry = head["shards"][0]
    sources = []

    def link(dst):  # a hard link to a copy of the one shard (ext4 allows 65000 links per file)
        if not sources or sources[-1][1] >= 50000:
            copy = work / f"source-{len(sources)}.safetensors"
            shutil.copyfile(base / entry["file"], copy)
            sources.append([copy, 0])
        os.link(sources[-1][0], dst)
        sources[-1][1] += 1
    print(f"{'shards':>8} {'manifest':>10} {'step':>7} {'wall s':>8} {'µs/shard':>9} {'peak RSS MiB':>13}")
    wall, rss = timed([sys.executable, "-c", OPEN_AND_READ_LAST])
    print(f"{'':>8} {'':>10} {'import':>7} {wall:>8.2f} {'':>9} {rss:>13.0f}")
    for n in sorted(int(x) for x in a.shards.split(",")):
        d = work / f"n{n}"
        d.mkdir()
        names = [f"shard-{i:05d}.safetensors" for i in range(n)]
        for name in names:
            link(d / name)
        entries = [dict(entry, file=name, first_line=i, last_line=i, documents=1) for i, name in enumerate(names)]
        m = dict(head, shards=entries, rows=entry["rows"] * n, documents=n)
        m.pop("manifest_checksum", None)
        (d / "manifest.json").write_text(seal(m))
        size = (d / "manifest.json").stat().st_size
        results = [("verify", timed([actcap, "verify", d])),
                   ("open", timed([sys.executable, "-c", OPEN_AND_READ_LAST, d]))]
        # Unfinished: half claimed by the manifest, half by the journal; then resumed.
        half = n // 2
        (d / "manifest.json").write_text(seal(dict(m, complete=False, shards=entries[:half],
                                                   rows=entry["rows"] * half)))
        with open(d / "manifest.journal", "w") as f:
            f.writelines(journal_line(e) for e in entries[half:])
        settings = head["settings"]
        resume = [actcap, "extract", "demo", "--input", work / "in.jsonl", "--capture", *settings["capture"],
                  "--out", d, "--quiet", "--resume"]
        results.append(("resume", timed(resume)))
        done = json.load(open(d / "manifest.json"))
        assert done["complete"] and len(done["shards"]) == n, "resume did not keep every shard"
        # The same shards as the manifests of a ranked run, merged.
        r = d / "ranked"
        r.mkdir()
        per = -(-n // a.ranks)
        for k in range(a.ranks):
            part = entries[k * per:(k + 1) * per]
            renamed = []
            for j, e in enumerate(part):
                name = f"shard-r{k:05d}-{j:05d}.safetensors"
                link(r / name)
                renamed.append(dict(e, file=name))
            lines = [k * per, (k + 1) * per if k + 1 < a.ranks else None]
            rm = dict(head, shards=renamed, rows=entry["rows"] * len(part), documents=len(part), complete=True,
                      rank={"rank": k, "world_size": a.ranks, "lines": lines})
            rm.pop("manifest_checksum", None)
            (r / f"rank-{k:05d}-of-{a.ranks:05d}.json").write_text(seal(rm))
        results.append(("merge", timed([actcap, "merge", r])))
        results.append(("verify", timed([actcap, "verify", r])))
        for step, (wall, rss) in results:
            print(f"{n:>8} {size / 2**20:>8.1f}Mi {step:>7} {wall:>8.2f} {wall / n * 1e6:>9.1f} {rss:>13.0f}")
        if not a.keep:
            shutil.rmtree(d)
    for n in sorted(int(x) for x in a.extract.split(",") if x):
        corpus = work / f"docs{n}.jsonl"
        corpus.write_text((json.dumps({"input_ids": [1, 2, 3, 4]}) + "\n") * n)
        out = work / f"extract{n}"
        wall, rss = timed([actcap, "extract", "demo", "--input", corpus, "--capture", "transformer.h.1",
                           "--shard-size", "1KB", "--out", out, "--quiet"])
        shards = len(json.load(open(out / "manifest.json"))["shards"])
        assert shards == n, f"expected {n} shards, the run wrote {shards}"
        size = (out / "manifest.json").stat().st_size
        print(f"{n:>8} {size / 2**20:>8.1f}Mi {'extract':>7} {wall:>8.2f} {wall / n * 1e6:>9.1f} {rss:>13.0f}")
        if not a.keep:
            shutil.rmtree(out)


if __name__ == "__main__":
    main()
