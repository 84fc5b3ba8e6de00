"""`actcap verify` from the command line checks everything a reader decodes: a shard header edited
the way the bug report did it ("F32" -> "I32", a shape [5,64] -> [64,5]) exits 1 naming the shard
and the field; single-bit flips spread over the header (the length, names, dtypes, shapes, offsets,
metadata) each exit 1 naming the shard. Every bit of every header byte is flipped in-process by
tests/unit/test_verify.cpp (Verify.EveryBitFlipOfAShardHeaderIsCaught); here each flip costs a
process start, so the CLI sees a sample of 65 (every byte of the length, then about every 8th)."""
import json
import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest

from cli import run

SHARD = "shard-00000.safetensors"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("run") / "out"
    run("run", "demo", "--text", "Hello", "--capture", "transformer.h.0", "--out", d, check=0)
    assert run("verify", d).returncode == 0
    return d


def damaged_copy(folder, dest, edit):
    shutil.copytree(folder, dest)
    raw = bytearray(open(dest / SHARD, "rb").read())
    edit(raw)
    open(dest / SHARD, "wb").write(bytes(raw))
    return dest


def header_length(folder):
    return 8 + struct.unpack("<Q", open(folder / SHARD, "rb").read(8))[0]


@pytest.mark.parametrize("old,new,says", [(b'"F32"', b'"I32"', "dtype I32 in the header, manifest says F32"),
                                          (b"[5,64]", b"[64,5]", "shape [64,5] in the header, manifest says [5,64]")])
def test_verify_names_a_dtype_or_shape_edit(folder, tmp_path, old, new, says):
    def edit(raw):
        at = raw.index(old)
        assert at < header_length(folder)
        raw[at:at + len(old)] = new

    out = damaged_copy(folder, tmp_path / "o", edit)
    p = run("verify", out)
    assert p.returncode == 1, p.stdout
    assert f"BAD  {SHARD} :: " in p.stdout and says in p.stdout, p.stdout
    assert "header checksum" in p.stdout
    issues = json.loads(run("verify", out, "--json").stdout)["issues"]
    assert {i["file"] for i in issues} == {SHARD}


def test_single_bit_flips_across_the_header_each_fail_verify_naming_the_shard(folder, tmp_path):
    n = header_length(folder)
    positions = sorted(set(range(8)) | set(range(8, n, max(1, n // 52))) | {n - 1})

    def check(at):
        out = damaged_copy(folder, tmp_path / f"b{at}",
                           lambda raw: raw.__setitem__(at, raw[at] ^ (1 << (at % 8))))
        p = run("verify", out)
        return at, p.returncode, SHARD in p.stdout

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(check, positions))
    missed = [at for at, rc, named in results if rc != 1 or not named]
    assert not missed, f"header bytes {missed} of {n} flipped without verify failing on {SHARD}"
    assert len(results) >= 50


def test_resume_refuses_a_claimed_shard_whose_header_was_edited(tmp_path):
    """--resume checks every claimed shard exactly as verify does, header included: a dtype edited
    in the header of a shard the journal claims stops the resume (exit 1) naming that shard."""
    (tmp_path / "in.txt").write_text("".join(f"document {i} is short but not empty\n" for i in range(40)))
    args = ["extract", "demo", "--input", tmp_path / "in.txt", "--capture", "transformer.h.1",
            "--shard-size", "4KiB", "--batch-size", "4", "--quiet", "--out", tmp_path / "o"]
    p = run(*args, env={"ACTCAP_KILL_AT": "journal:2"})
    assert p.returncode == -9, p.stderr
    shard = tmp_path / "o" / "shard-00000.safetensors"
    raw = bytearray(shard.read_bytes())
    at = raw.index(b'"F32"')
    raw[at:at + 5] = b'"I32"'
    shard.write_bytes(bytes(raw))
    p = run(*args, "--resume")
    assert p.returncode == 1, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "shard-00000.safetensors" in line and "header" in line, line


def test_every_edit_of_a_long_manifest_breaks_its_seal_and_reformatting_does_not(tmp_path):
    """verify streams the manifest (the shard list is never held) and takes manifest_checksum over
    the canonical dump as the entries go by: an edit anywhere in the list, a removed or swapped
    entry, or a top-level change fails the seal; the same JSON indented or ordered otherwise
    passes."""
    docs = [[(i * 7 + j) % 250 for j in range(3 + i % 11)] for i in range(30)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in docs))
    good = tmp_path / "good"
    run("extract", "demo", "--input", tmp_path / "in.jsonl", "--capture", "transformer.h.0", "--out", good,
        "--shard-size", "2KiB", "--quiet", check=0)
    m = json.load(open(good / "manifest.json"))
    assert len(m["shards"]) >= 8
    mid = len(m["shards"]) // 2

    def edited(name, change):
        d = tmp_path / name
        shutil.copytree(good, d)
        body = json.load(open(d / "manifest.json"))
        change(body)
        (d / "manifest.json").write_text(json.dumps(body, indent=2, sort_keys=True))
        return run("verify", d)

    def checksum(b):
        sums = b["shards"][mid]["checksums"]
        key = sorted(sums)[0]
        sums[key] = "0" * 16
    edits = {
        "checksum": checksum,
        "removed": lambda b: b["shards"].pop(mid),
        "swapped": lambda b: b["shards"].__setitem__(slice(mid, mid + 2), b["shards"][mid:mid + 2][::-1]),
        "rows": lambda b: b.__setitem__("rows", b["rows"] + 1),
        "model": lambda b: b["model"].__setitem__("path", "elsewhere"),
    }
    for name, change in edits.items():
        p = edited(name, change)
        assert p.returncode == 1 and "do not match manifest_checksum" in p.stdout + p.stderr, (name, p.stdout)
    d = tmp_path / "reformatted"
    shutil.copytree(good, d)
    body = json.load(open(d / "manifest.json"))
    reordered = {k: body[k] for k in sorted(body, reverse=True)}  # other key order, no indentation
    (d / "manifest.json").write_text(json.dumps(reordered))
    assert run("verify", d).returncode == 0
