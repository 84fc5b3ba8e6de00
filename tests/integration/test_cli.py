"""CLI-level tests of actcap on bad input.

Every bad input must give exit code 2 and exactly one line on stderr that starts with
`actcap: error: ` and names the offending file / tensor / field / flag, with no crash output
(no "terminate called", no C++ or Python trace). Broken checkpoints are built in Python from a
valid `actcap init-model` tiny GPT-2. A few happy-path checks close the file.
"""
import json
import os
import re
import subprocess

import numpy as np
import pytest

import actcap_helpers as H
import st

pytestmark = pytest.mark.usefixtures("actcap_bin")

TENSOR = "transformer.h.1.mlp.c_fc.weight"   # a tensor every tiny GPT-2 has
ST_FILE = "model.safetensors"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def assert_input_error(proc, *needles, any_of=(), out_dir=None):
    """Exit 2, one `actcap: error: ` line on stderr containing every needle and one of any_of."""
    err = proc.stderr
    ctx = f"\nexit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{err[-4000:]}"
    for bad in H.CRASH_MARKERS:
        assert bad not in err, f"crash output {bad!r} on stderr" + ctx
    assert proc.returncode == 2, "expected exit code 2 (bad input)" + ctx
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0], "stderr must be exactly one line" + ctx
    line = lines[0]
    assert line.startswith("actcap: error: "), "stderr must start with 'actcap: error: '" + ctx
    for n in needles:
        assert str(n) in line, f"error message does not mention {n!r}" + ctx
    if any_of:
        assert any(str(n) in line for n in any_of), f"error message names none of {list(any_of)[:12]}" + ctx
    if out_dir is not None and os.path.exists(os.path.join(out_dir, "manifest.json")):
        with open(os.path.join(out_dir, "manifest.json")) as f:
            assert json.load(f).get("complete") is not True, "failed run left a complete manifest"
    return line


def run_cmd(model_dir, out_dir, tokens="1,2,3", capture=("**",), extra=()):
    return H.actcap("run", model_dir, "--tokens", tokens, "--capture", *capture, "--out", out_dir, *extra)


def st_path(model_dir):
    return os.path.join(model_dir, ST_FILE)


def entries_by_offset(header):
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def short(name):
    """Tensor name without the optional GPT-2 `transformer.` prefix (either form may be printed)."""
    return name[len("transformer."):] if name.startswith("transformer.") else name


# ---------------------------------------------------------------------------------------------
# malformed safetensors
# ---------------------------------------------------------------------------------------------

def test_truncated_safetensors(model, tmp_path):
    p = st_path(model)
    blob = open(p, "rb").read()
    open(p, "wb").write(blob[: len(blob) // 2])
    assert_input_error(run_cmd(model, tmp_path / "out"), ST_FILE, out_dir=tmp_path / "out")


def test_header_length_past_end_of_file(model, tmp_path):
    p = st_path(model)
    header, data = st.read_raw(p)
    size = os.path.getsize(p)
    st.write_raw(p, header, data, header_len=size + 1000)
    assert_input_error(run_cmd(model, tmp_path / "out"), ST_FILE)


def test_header_length_huge(model, tmp_path):
    p = st_path(model)
    header, data = st.read_raw(p)
    st.write_raw(p, header, data, header_len=2 ** 63 + 5)
    assert_input_error(run_cmd(model, tmp_path / "out"), ST_FILE)


@pytest.mark.parametrize("junk", [b"this is not json at all!", b'{"a": {"dtype": "F32", "shape": [1],   '],
                         ids=["garbage", "unterminated-object"])
def test_header_not_json(model, tmp_path, junk):
    p = st_path(model)
    _, data = st.read_raw(p)
    st.write_raw(p, None, data, header_bytes=junk)
    assert_input_error(run_cmd(model, tmp_path / "out"), ST_FILE)


def test_unknown_dtype(model, tmp_path):
    p = st_path(model)
    header, data = st.read_raw(p)
    assert header[TENSOR]["dtype"] == "F32"
    header[TENSOR]["dtype"] = "F33"          # same length: offsets stay valid
    st.write_raw(p, header, data)
    assert_input_error(run_cmd(model, tmp_path / "out"), "F33", any_of=[TENSOR, short(TENSOR)])


def test_shape_does_not_match_byte_count(model, tmp_path):
    p = st_path(model)
    header, data = st.read_raw(p)
    header[TENSOR]["shape"][-1] += 1
    st.write_raw(p, header, data)
    assert_input_error(run_cmd(model, tmp_path / "out"), any_of=[TENSOR, short(TENSOR)])


def test_offsets_outside_data(model, tmp_path):
    p = st_path(model)
    header, data = st.read_raw(p)
    last = entries_by_offset(header)[-1]
    b, e = header[last]["data_offsets"]
    header[last]["data_offsets"] = [b + 64, e + 64]   # same size, ends 64 bytes past the data
    st.write_raw(p, header, data)
    assert_input_error(run_cmd(model, tmp_path / "out"), any_of=[last, short(last)])


def test_overlapping_offsets(model, tmp_path):
    p = st_path(model)
    header, data = st.read_raw(p)
    order = entries_by_offset(header)
    prev, last = order[-2], order[-1]
    b, e = header[last]["data_offsets"]
    header[last]["data_offsets"] = [b - 4, e - 4]     # overlaps `prev` by 4 bytes
    st.write_raw(p, header, data[:-4])                # and the data section stays fully covered
    assert_input_error(run_cmd(model, tmp_path / "out"),
                       any_of=[prev, short(prev), last, short(last)])


# ---------------------------------------------------------------------------------------------
# checkpoint vs config
# ---------------------------------------------------------------------------------------------

def test_missing_tensor(model, tmp_path):
    w = st.load_checkpoint(str(model))
    del w[TENSOR]
    st.save(st_path(model), w, metadata={"format": "pt"})
    assert_input_error(run_cmd(model, tmp_path / "out"), short(TENSOR))


def test_tensor_shape_does_not_match_config(model, tmp_path):
    cfg = H.load_config(model)
    cfg["n_embd"] = cfg["n_embd"] * 2              # n_head still divides it
    H.save_config(model, cfg)
    names = list(st.load_checkpoint(str(model)))
    assert_input_error(run_cmd(model, tmp_path / "out"), any_of=names + [short(n) for n in names])


def test_unknown_model_type(model, tmp_path):
    cfg = H.load_config(model)
    cfg["model_type"] = "bert"
    H.save_config(model, cfg)
    assert_input_error(run_cmd(model, tmp_path / "out"), "bert", "gpt2", "llama", "mistral", "qwen2")


def test_missing_config_field_without_default(model, tmp_path):
    cfg = H.load_config(model)
    del cfg["vocab_size"]
    H.save_config(model, cfg)
    assert_input_error(run_cmd(model, tmp_path / "out"), "vocab_size")


def test_heads_do_not_divide_width(model, tmp_path):
    cfg = H.load_config(model)
    width = cfg["n_embd"]
    heads = 5 if width % 5 else next(h for h in range(3, width) if width % h)
    cfg["n_head"] = heads
    H.save_config(model, cfg)
    assert_input_error(run_cmd(model, tmp_path / "out"), any_of=["n_head", "n_embd"])


def test_config_not_json(model, tmp_path):
    with open(os.path.join(model, "config.json"), "w") as f:
        f.write("{ not json")
    assert_input_error(run_cmd(model, tmp_path / "out"), "config.json")


def test_missing_config(model, tmp_path):
    os.remove(os.path.join(model, "config.json"))
    assert_input_error(run_cmd(model, tmp_path / "out"), "config.json")


def test_missing_model_dir(tmp_path):
    missing = tmp_path / "no-such-model"
    assert_input_error(run_cmd(missing, tmp_path / "out"), "no-such-model")


def test_pickle_only_checkpoint(model, tmp_path):
    os.remove(st_path(model))
    # a tiny valid pickle (protocol 2, the dict {}) standing in for torch.save output
    with open(os.path.join(model, "pytorch_model.bin"), "wb") as f:
        f.write(b"\x80\x02}q\x00.")
    line = assert_input_error(run_cmd(model, tmp_path / "out"))
    assert "safetensors" in line.lower(), line


def test_index_names_missing_shard(model, tmp_path):
    w = st.load_checkpoint(str(model))
    os.remove(st_path(model))
    st.save_sharded(str(model), w, n_shards=2)
    os.remove(os.path.join(model, "model-00002-of-00002.safetensors"))
    assert_input_error(run_cmd(model, tmp_path / "out"), "model-00002-of-00002.safetensors")


# ---------------------------------------------------------------------------------------------
# bad requests
# ---------------------------------------------------------------------------------------------

def test_token_id_outside_vocabulary(tiny_gpt2, tmp_path):
    vocab = H.load_config(tiny_gpt2)["vocab_size"]
    bad = 99999 if vocab <= 99999 else vocab + 1
    assert_input_error(run_cmd(tiny_gpt2, tmp_path / "out", tokens=f"1,{bad}"), str(bad), str(vocab),
                       out_dir=tmp_path / "out")


def test_token_not_a_number(tiny_gpt2, tmp_path):
    assert_input_error(run_cmd(tiny_gpt2, tmp_path / "out", tokens="1,abc,3"), "abc")


def test_unknown_flag(tiny_gpt2, tmp_path):
    assert_input_error(run_cmd(tiny_gpt2, tmp_path / "out", extra=["--bogus"]), "--bogus")


def test_unknown_flag_points(tiny_gpt2):
    assert_input_error(H.actcap("points", tiny_gpt2, "--bogus"), "--bogus")


def test_init_model_unknown_arch(actcap_bin, tmp_path):
    proc = H.actcap("init-model", "--arch", "bert", "--preset", "tiny", "--seed", "0", "--out", tmp_path / "m")
    assert_input_error(proc, "bert")


@pytest.mark.parametrize("command", ["run", "compare", "doctor", "plan"])
def test_a_cuda_device_this_machine_lacks_is_refused_by_name(tiny_gpt2, tmp_path, command):
    """cuda:63 exists nowhere: refused before anything runs, naming the device and what this
    machine has (a LibTorch without CUDA, or its GPU count), not with a backend error."""
    devices = "cpu:0,cuda:63"
    if command == "run":
        proc = run_cmd(tiny_gpt2, tmp_path / "out", extra=["--devices", devices])
    elif command == "doctor":
        proc = H.actcap("doctor", "--devices", devices)
    elif command == "plan":
        proc = H.actcap("plan", tiny_gpt2, "--devices", devices)
    else:
        proc = H.actcap("compare", tiny_gpt2, "--tokens", "1,2,3", "--devices", devices)
    line = assert_input_error(proc, "device cuda:63: this", "--devices",
                              any_of=("without CUDA", "CUDA device"),
                              out_dir=tmp_path / "out" if command == "run" else None)
    assert "empty_strided" not in line and "backend" not in line, line


def test_an_unverified_plan_may_name_gpus_this_machine_lacks(tiny_gpt2):
    """Planning never touches a device: only probing links (verified transfers) and running do."""
    proc = H.actcap("plan", tiny_gpt2, "--devices", "cuda:62,cuda:63", "--no-verify-transfers", "--json")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["device_map"].values()) <= {"cuda:62", "cuda:63"}


def test_capture_pattern_matching_nothing(tiny_gpt2, tmp_path):
    line = assert_input_error(run_cmd(tiny_gpt2, tmp_path / "out", capture=["transformer.h.0.atn"]),
                              "transformer.h.0.atn")
    # the nearest real names are suggested
    assert "transformer.h.0.attn" in line, line


def test_out_dir_not_empty_without_overwrite(tiny_gpt2, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert_input_error(run_cmd(tiny_gpt2, out), any_of=[str(out), "--out", "--overwrite"])
    assert (out / "keep.txt").read_text() == "precious", "refused run must not touch the directory"
    ok = run_cmd(tiny_gpt2, out, extra=["--overwrite"])
    assert ok.returncode == 0, ok.stderr
    with open(out / "manifest.json") as f:
        assert json.load(f)["complete"] is True


# ---------------------------------------------------------------------------------------------
# happy paths
# ---------------------------------------------------------------------------------------------

def gpt2_catalogue(n_layer, n_embd, n_inner, vocab):
    """name -> (per-token shape, dtype) of every hook point of a GPT-2, from the modules of HF's
    GPT2LMHeadModel (modeling_gpt2.py): transformer.wte / wpe (inputs: the int64 token and
    position ids), per block h.N itself, ln_1, attn, attn.c_attn (q|k|v: 3 * n_embd), attn.c_proj,
    ln_2, mlp, mlp.c_fc (n_inner), mlp.act, mlp.c_proj, then transformer.ln_f and lm_head (vocab).
    Each module's output is NAME and its first input NAME:input. The dropouts (transformer.drop,
    attn.attn_dropout, attn.resid_dropout, mlp.dropout) are identities in eval and no hook points,
    as in tests/python/reference.py. So 4 * 2 + n_layer * 10 * 2 points."""
    E, I = n_embd, n_inner
    cat = {"transformer.wte": ([E], "F32"), "transformer.wte:input": ([], "I64"),
           "transformer.wpe": ([E], "F32"), "transformer.wpe:input": ([], "I64"),
           "transformer.ln_f": ([E], "F32"), "transformer.ln_f:input": ([E], "F32"),
           "lm_head": ([vocab], "F32"), "lm_head:input": ([E], "F32")}
    block = {  # suffix: (output shape, input shape)
        "": ([E], [E]), ".ln_1": ([E], [E]), ".attn": ([E], [E]), ".attn.c_attn": ([3 * E], [E]),
        ".attn.c_proj": ([E], [E]), ".ln_2": ([E], [E]), ".mlp": ([E], [E]),
        ".mlp.c_fc": ([I], [E]), ".mlp.act": ([I], [I]), ".mlp.c_proj": ([E], [I])}
    for i in range(n_layer):
        for suffix, (out_shape, in_shape) in block.items():
            cat[f"transformer.h.{i}{suffix}"] = (out_shape, "F32")
            cat[f"transformer.h.{i}{suffix}:input"] = (in_shape, "F32")
    return cat


# The built-in demo model (README: "a 4-block GPT-2 with a byte-level tokenizer"): n_embd 64,
# 4 heads, n_inner 4 * 64, vocabulary of the 256 bytes + <|endoftext|>.
DEMO_CATALOGUE = gpt2_catalogue(n_layer=4, n_embd=64, n_inner=4 * 64, vocab=256 + 1)
# Each attention module's patterns: [heads, keys], keys the run's (0 in the catalogue).
DEMO_CATALOGUE.update({f"transformer.h.{i}.attn:{kind}": ([4, 0], "F32")
                       for i in range(4) for kind in ("scores", "probs")})


def test_points_demo():
    """Every row of the table is a point of the catalogue with its shape and dtype, no point is
    missing or listed twice, and the closing count agrees (96 = 8 + 4 blocks * (10 modules * 2 + 2
    attention patterns), a pattern's keys printed as `keys`)."""
    proc = H.actcap("points", "demo")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip("\n").split("\n")
    assert lines[0].split() == ["point", "per-token", "dtype"], lines[0]
    rows = []
    for line in lines[1:-1]:
        m = re.fullmatch(r"(\S+)\s+(\[[0-9, ]*(?:keys)?\])\s+(F32|I64)\s*", line)
        assert m, f"unparsable row {line!r}"
        assert ("keys" in m.group(2)) == m.group(1).endswith((":scores", ":probs")), line
        rows.append((m.group(1), (json.loads(m.group(2).replace("keys", "0")), m.group(3))))
    assert len(rows) == len(dict(rows)), "a point is listed twice"
    assert dict(rows) == DEMO_CATALOGUE
    assert len(DEMO_CATALOGUE) == 96
    assert lines[-1] == f"{len(DEMO_CATALOGUE)} hook points (gpt2, 4 layers)"


def test_points_demo_json():
    proc = H.actcap("points", "demo", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["model"] == "demo" and doc["model_type"] == "gpt2" and doc["compute_dtype"] == "f32"
    pts = doc["points"]
    assert all({"name", "shape", "dtype"} <= set(p) for p in pts)
    got = {p["name"]: (p["shape"], p["dtype"]) for p in pts}
    assert len(got) == len(pts), "a point is listed twice"
    assert got == DEMO_CATALOGUE


def test_points_under_a_compute_dtype():
    """The dtypes `run --compute-dtype` gives: every float point in that dtype, the ids still
    int64; a bad name is a one-line input error naming the choices."""
    proc = H.actcap("points", "demo", "--compute-dtype", "bf16", "--json")
    assert proc.returncode == 0, proc.stderr
    got = {p["name"]: (p["shape"], p["dtype"]) for p in json.loads(proc.stdout)["points"]}
    assert got == {k: (shape, "BF16" if dtype == "F32" else dtype)
                   for k, (shape, dtype) in DEMO_CATALOGUE.items()}
    assert_input_error(H.actcap("points", "demo", "--compute-dtype", "f8"), "f8")


def test_run_demo_text(tmp_path):
    out = tmp_path / "out"
    proc = H.actcap("run", "demo", "--text", "hi", "--capture", "**", "--out", out)
    assert proc.returncode == 0, proc.stderr
    manifest, tensors, meta = H.read_capture(out)
    assert manifest["format"] == H.FORMAT and manifest["complete"] is True
    rows = manifest["shards"][0]["rows"]
    assert rows >= 1
    for r in H.ROWS:
        assert tensors[r].shape == (rows,), r
    assert set(manifest["points"]) == set(tensors) - H.ROWS


def test_run_valid_model_clean_stderr(tiny_gpt2, tmp_path):
    """A clean run of every point (outputs and inputs) of a valid model: no crash text on stderr,
    every tensor written has [rows, per-token shape] with rows = the tokens given, the row index
    says which sequence / position each row is, and the rows hold those tokens (the embedding's
    input ids are the tokens, its output the matching rows of the checkpoint's wte)."""
    seqs = [[1, 2, 3], [4]]
    out = tmp_path / "out"
    proc = run_cmd(tiny_gpt2, out, tokens=H.tokens_arg(seqs), capture=("**", "**:input"))
    assert proc.returncode == 0, proc.stderr
    for bad in H.CRASH_MARKERS:
        assert bad not in proc.stderr
    cfg = H.load_config(tiny_gpt2)
    E = cfg["n_embd"]
    cat = gpt2_catalogue(cfg["n_layer"], E, cfg.get("n_inner") or 4 * E, cfg["vocab_size"])
    manifest, tensors, _ = H.read_capture(out)
    n = sum(len(s) for s in seqs)
    assert manifest["complete"] is True
    assert manifest["rows"] == n and manifest["shards"][0]["rows"] == n
    assert set(manifest["points"]) == set(cat)
    assert set(tensors) == set(cat) | H.ROWS
    for name, (shape, dtype) in cat.items():
        assert manifest["points"][name]["shape"] == shape and manifest["points"][name]["dtype"] == dtype, name
        t = tensors[name]
        assert t.shape == (n, *shape), (name, t.shape)
        assert t.dtype == (np.int64 if dtype == "I64" else np.float32), (name, t.dtype)
    assert tensors[H.ROWS_SEQ].tolist() == [i for i, s in enumerate(seqs) for _ in s]
    assert tensors[H.ROWS_POS].tolist() == [p for s in seqs for p in range(len(s))]
    tokens = [t for s in seqs for t in s]
    assert tensors[H.ROWS_TOKEN].tolist() == tokens
    assert tensors["transformer.wte:input"].tolist() == tokens
    assert tensors["transformer.wpe:input"].tolist() == tensors[H.ROWS_POS].tolist()
    wte = st.load_checkpoint(str(tiny_gpt2))["transformer.wte.weight"]
    assert np.array_equal(tensors["transformer.wte"], wte[tokens])


# ---------------------------------------------------------------------------------------------
# hostile sizes: refused from the size alone, under an address-space cap that would make any
# attempt to read them whole fail loudly
# ---------------------------------------------------------------------------------------------

def _cap_memory():
    import resource
    cap = 3 << 30  # LibTorch and its thread pools need well under this; a 64 GiB read does not fit
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


@pytest.mark.parametrize("victim,needle", [("config.json", "over the limit"),
                                           ("tokenizer.json", "over the limit"),
                                           ("model.safetensors.index.json", "over the limit")])
def test_huge_side_files_are_refused_without_reading(model, tmp_path, victim, needle):
    path = os.path.join(model, victim)
    if victim != "config.json":
        open(path, "wb").close()
    os.truncate(path, 64 << 30)  # sparse: costs no disk
    if victim == "model.safetensors.index.json":
        os.remove(st_path(model))  # make the loader look for the index
    if victim == "tokenizer.json":
        cmd = [H.binary_path(), "tokenize", "--tokenizer", path, "--input", "-"]
    else:
        cmd = [H.binary_path(), "run", str(model), "--tokens", "1,2", "--capture", "lm_head", "--out", str(tmp_path / "o")]
    p = subprocess.run(cmd, input="hi\n", capture_output=True, text=True, timeout=120, preexec_fn=_cap_memory)
    assert_input_error(p, needle, victim)
