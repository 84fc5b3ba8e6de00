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


def test_repro_on_named_device_lists():
    p = run("repro", "--on", "cpu:0,cpu:1,cpu:2", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    variants = json.loads(p.stdout)["variants"]
    assert [(v["device_list"], v["devices"]) for v in variants] == \
        [("cpu:0,cpu:1,cpu:2", 3)] * 4 + [("cpu", 1)] * 4
    counted = {(v["name"], v["devices"]): v["mismatched"]
               for v in json.loads(run("repro", "--devices", "3,1", "--json").stdout)["variants"]}
    assert {(v["name"], v["devices"]): v["mismatched"] for v in variants} == counted
    text = run("repro", "--on", "cpu:0,cpu:1")
    assert text.returncode == 0 and "cpu:0,cpu:1  naive" in text.stdout, text.stdout
    for bad, words in [(("--on", "cuda:63"), "cuda:63"), (("--on", "gpu:1"), "gpu:1"),
                       (("--on", "cpu:0", "--devices", "2"), "excludes")]:
        p = run("repro", *bad)
        assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_compare_tolerance():
    # Bit for bit anyway on virtual CPUs: every row equal, within, no difference.
    ok = run("compare", "demo", "--text", "compare me", "--devices", "3", "--tolerance", "1e-4", "--json")
    assert ok.returncode == 0, ok.stderr
    j = json.loads(ok.stdout)
    assert j["equal"] and j["within_tolerance"] and j["tolerance"] == 1e-4 and j["mismatched"] == 0
    assert all(p["equal"] and p["within_tolerance"] and p["rel_rms"] == 0 for p in j["points"])
    # A damaged transfer: each row's verdict follows its figures, exactly as documented.
    for tol in ("1e-4", "1"):
        p = run("compare", "demo", "--text", "compare me", "--devices", "3", "--no-verify-transfers",
                "--tolerance", tol, "--json", env={"ACTCAP_FAULT": "transfer:cpu:1->cpu:2:zeros"})
        j = json.loads(p.stdout)
        assert not j["equal"]
        for r in j["points"]:
            assert r["within_tolerance"] == (r["equal"] or r["max_abs_diff"] <= float(tol) * r["max_abs_reference"]), r
            assert (r["rel_rms"] > 0) == (r["max_abs_diff"] > 0), r
        assert j["mismatched"] == sum(not r["within_tolerance"] for r in j["points"])
        assert p.returncode == (1 if j["mismatched"] else 0)
        if tol == "1e-4":  # zeros instead of the hidden state: far outside
            assert p.returncode == 1 and "MISMATCH" in run("compare", "demo", "--text", "compare me", "--devices",
                                                          "3", "--no-verify-transfers", "--tolerance", tol,
                                                          env={"ACTCAP_FAULT": "transfer:cpu:1->cpu:2:zeros"}).stdout
    for bad in ("-1", "2", "x"):
        p = run("compare", "demo", "--text", "x", "--tolerance", bad)
        assert p.returncode == 2 and "--tolerance" in p.stderr, p.stderr


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
