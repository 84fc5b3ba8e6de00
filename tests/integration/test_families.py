"""Every architecture family through the CLI (issue 13, "Done when"): `extract` over 3 devices,
killed after its second shard and finished with `--resume`, gives the uninterrupted run's files
byte for byte; `compare` over 3 devices is bit-identical to one device on every point; and bad
input (a missing config field, a tensor of the wrong shape, a missing tensor) is one line on
stderr naming the field or tensor, exit 2; `repro --arch A` shows the hazard and each defence on a
12-block model of the family (the library side: `Repro.EveryArchitecture`,
tests/unit/test_capture.cpp).

Each family is its tiny preset (`init-model --arch A --preset tiny`, 4 layers). To add one, append
a Family to FAMILIES; `test_families_cover_every_architecture` fails until every architecture the
binary knows is listed.
"""
import json
import os
import re
import signal
import sys
from collections import namedtuple

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import st  # noqa: E402  minimal safetensors reader written from the spec
sys.path.insert(0, os.path.dirname(__file__))
from cli import assert_same_files, corpus, manifest, one_error_line, run, write_jsonl  # noqa: E402

# arch: init-model's --arch; layers: the blocks' module prefix; tensor: a weight of layer 1 that
# only this family has (or has in this form), deleted / reshaped by the bad-input tests; field: a
# config.json field to delete, and what the error names then: the field where the architecture
# requires it, or, where transformers has a default (GPT-NeoX, GPT-J, GPT-Neo, OPT, Phi, Phi-3), the first tensor whose shape
# disagrees with that default.
Family = namedtuple("Family", "arch layers tensor field names")
FAMILIES = [
    Family("gpt2", "transformer.h", "attn.c_attn.weight", "n_embd", "n_embd"),
    Family("llama", "model.layers", "mlp.gate_proj.weight", "hidden_size", "hidden_size"),
    Family("mistral", "model.layers", "self_attn.k_proj.weight", "intermediate_size", "intermediate_size"),
    Family("qwen2", "model.layers", "self_attn.q_proj.bias", "num_attention_heads", "num_attention_heads"),
    Family("qwen3", "model.layers", "self_attn.q_norm.weight", "hidden_size", "hidden_size"),
    Family("olmo", "model.layers", "mlp.down_proj.weight", "hidden_size", "hidden_size"),
    Family("olmo2", "model.layers", "self_attn.k_norm.weight", "hidden_size", "hidden_size"),
    Family("smollm3", "model.layers", "self_attn.o_proj.weight", "hidden_size", "hidden_size"),
    Family("olmo3", "model.layers", "post_attention_layernorm.weight", "hidden_size", "hidden_size"),
    Family("gemma", "model.layers", "mlp.up_proj.weight", "vocab_size", "vocab_size"),
    Family("gemma2", "model.layers", "post_feedforward_layernorm.weight", "vocab_size", "vocab_size"),
    Family("gpt_neox", "gpt_neox.layers", "attention.query_key_value.weight", "hidden_size",
           "gpt_neox.embed_in.weight"),
    Family("gptj", "transformer.h", "mlp.fc_in.weight", "n_embd", "transformer.wte.weight"),
    Family("gpt_neo", "transformer.h", "attn.attention.q_proj.weight", "hidden_size",
           "transformer.wte.weight"),
    Family("opt", "model.decoder.layers", "self_attn_layer_norm.weight", "hidden_size",
           "model.decoder.embed_positions.weight"),
    Family("phi", "model.layers", "mlp.fc1.weight", "hidden_size", "model.embed_tokens.weight"),
    Family("phi3", "model.layers", "mlp.gate_up_proj.weight", "hidden_size", "model.embed_tokens.weight"),
    Family("gemma3_text", "model.layers", "self_attn.k_norm.weight", "hidden_size",
           "model.embed_tokens.weight"),
    Family("mixtral", "model.layers", "block_sparse_moe.gate.weight", "intermediate_size",
           "intermediate_size"),
    Family("qwen3_moe", "model.layers", "mlp.gate.weight", "hidden_size", "hidden_size"),
    Family("qwen2_moe", "model.layers", "mlp.shared_expert_gate.weight", "hidden_size",
           "hidden_size"),
    Family("olmoe", "model.layers", "self_attn.q_norm.weight", "hidden_size", "hidden_size"),
    Family("gpt_oss", "model.layers", "self_attn.sinks", "hidden_size", "hidden_size"),
    Family("deepseek_v3", "model.layers", "self_attn.kv_a_proj_with_mqa.weight", "hidden_size",
           "hidden_size"),
    Family("deepseek_v2", "model.layers", "self_attn.kv_b_proj.weight", "hidden_size", "hidden_size"),
]
BY_ARCH = {f.arch: f for f in FAMILIES}
ARCHS = [f.arch for f in FAMILIES]
# run, extract and compare re-execute themselves with this set unless it is (cli/main.cpp): set
# here, each command starts once (the runs do not change; the suite's time does).
ENV = {"OMP_WAIT_POLICY": "passive"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> its tiny preset checkpoint (read-only), made once per module."""
    root = tmp_path_factory.mktemp("families")
    made = {}

    def get(arch):
        if arch not in made:
            run("init-model", "--arch", arch, "--preset", "tiny", "--seed", "3", "--out", root / arch, check=0)
            made[arch] = root / arch
        return made[arch]
    return get


def test_families_cover_every_architecture():
    """The binary's list of architectures (init-model's --arch error names them) is FAMILIES."""
    # every other option given: a newer CLI11 (2.6) reports a missing required option before a bad choice
    line = one_error_line(run("init-model", "--arch", "no-such-arch", "--preset", "tiny", "--seed", "1",
                              "--out", "/nonexistent"))
    known = re.search(r"\{([^}]*)\}", line).group(1)
    # init-model --arch gemma3 writes the same text-only checkpoint as gemma3_text
    same = {"gemma3": "gemma3_text"}
    assert sorted({same.get(a, a) for a in known.split(",")}) == sorted(ARCHS), line


@pytest.mark.parametrize("arch", ARCHS)
def test_repro_per_family(arch):
    """Kept hook references corrupt captures over 3 devices; the guard stops them; clone() and
    the safe capturer are exact."""
    p = run("repro", "--arch", arch, "--devices", "3", "--json", env=ENV, check=0)
    by = {v["name"]: v for v in json.loads(p.stdout)["variants"]}
    assert by["naive"]["mismatched"] > 0, by["naive"]
    assert by["guarded"]["mismatched"] is None and "clone()" in by["guarded"]["error"]
    for v in ("clone", "safe"):
        assert by[v]["mismatched"] == 0 and by[v]["total"] > 0 and by[v]["error"] is None, by[v]


# ---- extract, --resume after a kill, compare --------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_extract_resume_after_kill_equals_uninterrupted(models, tmp_path, arch):
    """Killed (SIGKILL) once its second shard is claimed, then resumed: the same shards, byte for
    byte, as a run that was never interrupted (so the same rows, in the same order)."""
    f = BY_ARCH[arch]
    write_jsonl(tmp_path / "in.jsonl", corpus(8, seed=13, lo=4, hi=24))
    args = ["extract", models(arch), "--input", tmp_path / "in.jsonl", "--capture", f"{f.layers}.*",
            "--batch-size", "2", "--shard-size", "16KiB", "--devices", "3", "--quiet"]
    run(*args, "--out", tmp_path / "ref", env=ENV, check=0)
    ref = manifest(tmp_path / "ref")
    assert len(ref["shards"]) >= 3 and set(ref["device_map"].values()) == {"cpu:0", "cpu:1", "cpu:2"}
    p = run(*args, "--out", tmp_path / "o", env=dict(ENV, ACTCAP_KILL_AT="journal:2"))
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
    assert [s["file"] for s in manifest(tmp_path / "o")["shards"]] == [s["file"] for s in ref["shards"][:2]]
    assert "resumed at line" in run(*args, "--out", tmp_path / "o", "--resume", env=ENV, check=0).stdout
    assert_same_files(tmp_path / "o", tmp_path / "ref")
    rows = np.concatenate([st.load(str(tmp_path / "o" / s["file"]))[0]["__rows__.seq"] for s in ref["shards"]])
    assert rows.size == ref["rows"] and list(np.unique(rows)) == list(range(8))


@pytest.mark.parametrize("arch", ARCHS)
def test_compare_3_devices_bit_identical(models, arch):
    """`compare` over 3 devices: every point, inputs included, and the model's logits (soft-capped
    for Gemma 2) bit-identical to one device."""
    f = BY_ARCH[arch]
    p = run("compare", models(arch), "--tokens", "1,2,3,4,5,6,7,8,9,10,11;7,8", "--capture", "**", "**:input",
            "--devices", "3", "--json", env=ENV, check=0)
    j = json.loads(p.stdout)
    assert j["equal"] and j["points"] and all(r["equal"] for r in j["points"])
    assert set(j["device_map"].values()) == {"cpu:0", "cpu:1", "cpu:2"}
    assert j["device_map"][f"{f.layers}.3"] in {"cpu:1", "cpu:2"}
    # Mixtral's checkpoint keeps its experts' block under block_sparse_moe; the module is `mlp`.
    part = f"{f.layers}.3.{f.tensor.rsplit('.', 1)[0]}".replace(".block_sparse_moe.", ".mlp.")
    assert {"logits", part, f"{part}:input"} <= {r["point"] for r in j["points"]}


# ---- bad input: one line, exit 2 --------------------------------------------------------------

def bad_input_line(model, tmp_path):
    p = run("run", model, "--tokens", "1,2,3", "--capture", "**", "--out", tmp_path / "o", env=ENV)
    assert p.returncode == 2, (p.returncode, p.stderr)
    line = one_error_line(p)
    assert not (tmp_path / "o" / "manifest.json").exists()
    return line


def broken_copy(models, arch, tmp_path, edit):
    """A copy of the family's checkpoint with edit(tensors) applied to model.safetensors."""
    m = tmp_path / "m"
    m.mkdir()
    src = models(arch)
    (m / "config.json").write_text((src / "config.json").read_text())
    tensors = st.load_checkpoint(str(src))
    edit(tensors)
    st.save(str(m / "model.safetensors"), tensors, metadata={"format": "pt"})
    return m


@pytest.mark.parametrize("arch", ARCHS)
def test_missing_config_field_is_one_line_exit_2(models, tmp_path, arch):
    f = BY_ARCH[arch]
    m = broken_copy(models, arch, tmp_path, lambda t: None)
    cfg = json.loads((m / "config.json").read_text())
    del cfg[f.field]
    (m / "config.json").write_text(json.dumps(cfg))
    line = bad_input_line(m, tmp_path)
    if f.names == f.field:
        assert f"config.json: missing required field '{f.field}'" in line, line
    else:
        assert re.search(rf"tensor {re.escape(f.names)} has shape \[.*\] but config.json implies", line), line


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_of_the_wrong_shape_is_one_line_exit_2(models, tmp_path, arch):
    name = f"{BY_ARCH[arch].layers}.1.{BY_ARCH[arch].tensor}"
    m = broken_copy(models, arch, tmp_path, lambda t: t.__setitem__(name, t[name][:-1].copy()))
    line = bad_input_line(m, tmp_path)
    assert re.search(rf"tensor {re.escape(name)} has shape \[.*\] but config.json implies", line), line


@pytest.mark.parametrize("arch", ARCHS)
def test_missing_tensor_is_one_line_exit_2(models, tmp_path, arch):
    name = f"{BY_ARCH[arch].layers}.1.{BY_ARCH[arch].tensor}"
    m = broken_copy(models, arch, tmp_path, lambda t: t.pop(name))
    line = bad_input_line(m, tmp_path)
    assert f"missing tensor {name}" in line, line
