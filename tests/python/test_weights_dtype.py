"""16-bit checkpoints stay 16-bit: `--weights-dtype keep` (the default) gives exactly the captures of
widening at load (`f32`) while the plan counts half the weight bytes; bad values are one line,
exit 2. (Parity of keep against the reference for every family: test_parity.py's
test_parity_half_precision_checkpoint, which runs the default.)"""
import json

import numpy as np
import pytest

import actcap_helpers as H
import synth
from actcap_helpers import actcap

pytestmark = pytest.mark.usefixtures("actcap_bin")


def assert_keep_equals_f32(m, tmp_path, seqs):
    """keep (over three virtual devices) and f32 capture the same bytes at every point."""
    _, keep, _ = H.run_capture(m, tmp_path / "keep", seqs, extra=("--devices", "3"))
    _, wide, _ = H.run_capture(m, tmp_path / "f32", seqs, extra=("--weights-dtype", "f32"))
    assert set(keep) == set(wide)
    for name in keep:
        assert np.array_equal(keep[name], wide[name]), name


def plan_weights(model, mode="keep"):
    """The weight bytes `actcap plan` counts over all devices."""
    p = actcap("plan", model, "--weights-dtype", mode, "--json", check=True)
    return sum(d["weights"] for d in json.loads(p.stdout)["devices"])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma", "gemma2", "gpt_neox", "gptj", "gpt_neo", "opt", "phi", "phi3", "mixtral", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3", "deepseek_v2"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_keep_and_f32_capture_the_same_bytes(models, tmp_path, arch, dtype):
    m = models(arch, dtype=dtype)
    assert_keep_equals_f32(m, tmp_path, H.random_tokens(H.load_config(m)["vocab_size"], [9, 4], seed=12))


def test_plan_counts_stored_bytes(models):
    m = models("llama", dtype="bf16")
    keep, wide = plan_weights(m, "keep"), plan_weights(m, "f32")
    assert 0.45 * wide < keep < 0.55 * wide, (keep, wide)


def test_bad_weights_dtype_is_one_line(models, tmp_path):
    p = actcap("run", models("llama", dtype="bf16"), "--tokens", "1,2", "--capture", "model.norm", "--weights-dtype", "bf16",
               "--out", tmp_path / "o")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--weights-dtype" in lines[0] and "keep, f32" in lines[0], p.stderr


def test_plan_counts_mxfp4_experts_packed(tmp_path):
    """gpt-oss's MXFP4 experts stay packed in memory (17 bytes per 32 values: 16 of nibbles, one
    scale); the plan counts those bytes, not the decoded matrices'."""
    cfg = synth.tiny_config("gpt_oss_mxfp4")
    m = tmp_path / "mxfp4"
    w = synth.write_checkpoint(str(m), cfg, seed=4)
    twin = tmp_path / "twin"
    synth.write_unquantized_twin(str(m), str(twin), w)
    packed = sum(v.nbytes for k, v in w.items() if k.endswith(("_blocks", "_scales")))
    decoded = sum(v.size * 4 for k, v in synth.mxfp4_unpacked(w).items()
                  if k.endswith(("gate_up_proj", "down_proj")))
    assert plan_weights(twin) - plan_weights(m) == decoded - packed, (decoded, packed)


def test_mxfp4_keep_and_f32_capture_the_same_bytes(tmp_path):
    """MXFP4 experts decoded per expert as they run (keep) or at load (f32): the same float32
    matrices into the same GEMMs, so the same bytes; under f32 the plan counts the decoded float32
    matrices (4 bytes per value, two values per block byte) instead of the packed bytes."""
    m = tmp_path / "mxfp4"
    w = synth.write_checkpoint(str(m), synth.tiny_config("gpt_oss_mxfp4"), seed=6)
    assert_keep_equals_f32(m, tmp_path, H.random_tokens(H.load_config(m)["vocab_size"], [9, 4], seed=13))
    packed = sum(v.nbytes for k, v in w.items() if k.endswith(("_blocks", "_scales")))
    blocks = sum(v.nbytes for k, v in w.items() if k.endswith("_blocks"))
    assert plan_weights(m, "f32") - plan_weights(m, "keep") == blocks * 2 * 4 - packed
