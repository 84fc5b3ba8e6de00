"""actcap generate from the command line: the output folder's contract (rows of every prompt and
generated token, __rows__.token / __rows__.step, verify), the JSON summary, text prompts, the plan's
KV cache, bad input as one line and exit 2, and resuming a folder of the previous format. Parity
with the independent reference: tests/python/test_generate_parity.py."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import st  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
from cli import one_error_line, run  # noqa: E402


def shard(out):
    return st.load(str(out / "shard-00000.safetensors"))[0]


def generate(*args, check=0):
    p = run("generate", *args, check=check)
    return p


def test_rows_tokens_steps_and_verify(tmp_path):
    out = tmp_path / "g"
    p = generate("demo", "--tokens", "1,2,3;4,5", "--max-new-tokens", "4", "--capture", "transformer.h.*",
                 "transformer.wte:input", "--out", out, "--json", "--devices", "3")
    summary = json.loads(p.stdout)
    seqs = summary["sequences"]
    assert [s["prompt_length"] for s in seqs] == [3, 2]
    assert [s["generated"] for s in seqs] == [4, 4] and [s["finish"] for s in seqs] == ["length"] * 2
    assert summary["forwards"] == 5 and summary["rows"] == 7 + 6
    t = shard(out)
    final = [s["tokens"] for s in seqs]
    assert t["__rows__.seq"].tolist() == [0] * 7 + [1] * 6
    assert t["__rows__.pos"].tolist() == list(range(7)) + list(range(6))
    assert t["__rows__.token"].tolist() == final[0] + final[1]
    assert t["transformer.wte:input"].tolist() == final[0] + final[1]  # what the model was fed
    assert t["__rows__.step"].tolist() == [0, 0, 0, 1, 2, 3, 4] + [0, 0, 1, 2, 3, 4]
    m = json.load(open(out / "manifest.json"))
    assert m["format"] == "actcap/3" and m["complete"] and m["generation"] == {"sequences": 2, "steps": 4}
    assert m["rows"] == 13 and t["transformer.h.3"].shape == (13, 64)
    assert run("verify", out).returncode == 0


def test_text_prompt_prints_the_continuation(tmp_path):
    p = generate("demo", "--text", "hello", "--max-new-tokens", "3")
    lines = p.stdout.splitlines()
    assert lines[0].startswith("sequence 0 (length, ") and lines[0].endswith(" new):" + lines[0].split(":", 1)[1])
    assert len(lines[0].split(":", 1)[1].split()) == 3
    assert "forwards" in lines[-1]


def test_input_file_and_stop_token(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [7, 8]}\n')
    plain = json.loads(generate("demo", "--input", tmp_path / "p.jsonl", "--max-new-tokens", "5", "--json",
                                "--temperature", "1", "--seed", "5").stdout)
    first = plain["sequences"][0]["tokens"][3]
    stopped = json.loads(generate("demo", "--input", tmp_path / "p.jsonl", "--max-new-tokens", "5", "--json",
                                  "--temperature", "1", "--seed", "5", "--stop-token", first).stdout)
    s0 = stopped["sequences"][0]
    assert s0["finish"] == "stop" and s0["tokens"] == [1, 2, 3, first]


def test_the_plan_counts_the_cache(tmp_path):
    # demo: 4 layers, 64 wide (keys + values per token: 2 x 4 x 64 float32 = 2 KiB per sequence).
    j = json.loads(generate("demo", "--tokens", "1,2,3;4,5", "--max-new-tokens", "7", "--json",
                            "--devices", "2").stdout)
    want = 2 * 4 * 64 * 4 * 2 * (3 + 7)  # 2 sequences x (longest prompt + new tokens)
    assert j["kv_cache_bytes"] == want
    assert sum(d["reserve"] for d in j["devices"]) == want  # nothing captured: the cache alone
    assert all(d["reserve"] > 0 for d in j["devices"])  # each layer's cache on its own device
    # On one device: a budget of exactly the planned total fits; half the cache less, which the
    # model, workspace and capture staging would fit without it, does not.
    one = json.loads(generate("demo", "--tokens", "1,2,3;4,5", "--max-new-tokens", "7", "--json",
                              "--devices", "cpu").stdout)["devices"][0]
    assert one["reserve"] == want
    fits = generate("demo", "--tokens", "1,2,3;4,5", "--max-new-tokens", "7", "--devices", "cpu",
                    "--max-memory", f"cpu={one['total']}", check=None)
    assert fits.returncode == 0, fits.stderr
    short = generate("demo", "--tokens", "1,2,3;4,5", "--max-new-tokens", "7", "--devices", "cpu",
                     "--max-memory", f"cpu={one['total'] - want // 2}", check=None)
    assert short.returncode == 2 and "reserve" in short.stderr, short.stderr


@pytest.mark.parametrize("args,needle", [
    (["--tokens", "1,2", "--max-new-tokens", "100000"], "past the context"),
    (["--tokens", "1,2", "--max-new-tokens", "0"], "at least 1"),
    (["--tokens", "1,2", "--temperature", "-1"], "temperature"),
    (["--tokens", "1,2", "--top-p", "0"], "top-p"),
    (["--tokens", "1,2", "--top-k", "-2"], "top-k"),
    (["--tokens", "1,2", "--stop-token", "99999"], "outside the vocabulary"),
    (["--tokens", "1,99999"], "99999"),
    (["--tokens", "1,2", "--text", "x"], "one of --tokens, --text or --input"),
    ([], "one of --tokens, --text or --input"),
    (["--tokens", "1,2", "--capture", "transformer.h.0"], "--out"),
    (["--tokens", "1,2", "--capture", "nope.*", "--out", "OUT"], "nope"),
    (["--tokens", "1,2", "--capture", "transformer.h.0", "--out", "OUT", "--positions", "last"], "--positions"),
    # the budget covers every token of the whole generation (2 + 300 rows of 256 bytes > 64 KiB)
    (["--tokens", "1,2", "--max-new-tokens", "300", "--capture", "transformer.h.0", "--out", "OUT",
      "--capture-budget", "64KiB"], "capture budget"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    args = [str(tmp_path / "o") if a == "OUT" else a for a in args]
    p = generate("demo", *args, check=None)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in one_error_line(p)
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_an_existing_folder_needs_overwrite(tmp_path):
    out = tmp_path / "g"
    generate("demo", "--tokens", "1,2", "--max-new-tokens", "1", "--capture", "transformer.h.0", "--out", out)
    p = generate("demo", "--tokens", "1,2", "--max-new-tokens", "1", "--capture", "transformer.h.0", "--out", out,
                 check=None)
    assert p.returncode == 2 and "--overwrite" in one_error_line(p)
    generate("demo", "--tokens", "1,2", "--max-new-tokens", "1", "--capture", "transformer.h.0", "--out", out,
             "--overwrite")


def test_resume_refuses_a_folder_of_the_previous_format(tmp_path):
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"input_ids": list(range(1, 40))}) + "\n" for _ in range(12)))
    out = tmp_path / "x"
    args = ("extract", "demo", "--input", corpus, "--capture", "transformer.h.1", "--shard-size", "16KiB",
            "--quiet", "--out", out)
    p = run(*args, env={"ACTCAP_KILL_AT": "shard-write:2"})
    assert p.returncode != 0
    m = out / "manifest.json"
    m.write_text(m.read_text().replace('"actcap/3"', '"actcap/2"'))
    p = run(*args, "--resume")
    assert p.returncode == 2
    line = one_error_line(p)
    assert "actcap/2" in line and "actcap/3" in line and "--overwrite" in line
