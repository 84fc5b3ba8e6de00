"""repro, compare and verify from the command line."""
import json
import os
import subprocess

ACTCAP = os.environ.get("ACTCAP", os.path.join(os.path.dirname(__file__), "..", "..", "build", "actcap"))


def run(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([ACTCAP, *map(str, args)], capture_output=True, text=True, timeout=300, env=e)


def test_repro_shows_the_hazard_and_each_defence():
    p = run("repro", "--devices", "1,3,4", "--json")
    assert p.returncode == 0, p.stderr
    by = {(v["name"], v["devices"]): v for v in json.loads(p.stdout)["variants"]}
    for n in (3, 4):
        assert by[("naive", n)]["mismatched"] > 0 and by[("naive", n)]["max_abs_err"] > 0
        assert by[("guarded", n)]["mismatched"] is None and "clone()" in by[("guarded", n)]["error"]
        for v in ("clone", "safe"):
            assert by[(v, n)]["mismatched"] == 0 and by[(v, n)]["total"] == 24 and by[(v, n)]["error"] is None


def test_compare_split_equals_single_and_fault_is_exit_1():
    ok = run("compare", "demo", "--text", "compare me", "--capture", "**", "**:input", "--devices", "4", "--json")
    assert ok.returncode == 0, ok.stderr
    j = json.loads(ok.stdout)
    assert j["equal"] and all(p["equal"] for p in j["points"]) and len(j["points"]) == 89
    bad = run("compare", "demo", "--text", "compare me", "--devices", "3", "--no-verify-transfers",
              env={"ACTCAP_FAULT": "transfer:cpu:1->cpu:2:bitflip"})
    assert bad.returncode == 1 and "MISMATCH" in bad.stdout


def test_verify_flags_every_damaged_tensor(tmp_path):
    out = tmp_path / "o"
    assert run("run", "demo", "--text", "verify me", "--capture", "transformer.h.*", "--out", out).returncode == 0
    assert run("verify", out).returncode == 0
    shard = out / "shard-00000.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0x01  # inside __rows__.token, the last tensor
    shard.write_bytes(bytes(raw))
    p = run("verify", out, "--json")
    assert p.returncode == 1
    issues = json.loads(p.stdout)["issues"]
    assert [i["tensor"] for i in issues] == ["__rows__.token"]
    assert run("verify", tmp_path / "nope").returncode == 2
