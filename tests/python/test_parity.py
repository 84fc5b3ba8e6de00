"""Parity tests: actcap's captured activations vs. the independent Python reference (reference.py).

Every test creates a checkpoint (`actcap init-model`, possibly rewritten here in Python, or written
from scratch by synth.py), runs `actcap run ... --capture '**' '**:input'`, and compares EVERY point
the reference produces with the shard (max abs diff <= 1e-5), requiring the two name sets to be
equal and `__rows__.seq` / `__rows__.pos` to be exact. Batched runs are compared per sequence with
the reference run of that sequence alone.
"""
import json
import os

import numpy as np
import pytest

import actcap_helpers as H
import reference
import st
import synth

ARCHS = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo2", "olmo3", "gemma2", "gemma3_text", "gpt_neox", "gptj", "gpt_neo", "opt", "phi", "phi3",
         "mixtral", "qwen3_moe", "olmoe", "gpt_oss", "gemma", "olmo", "qwen2_moe", "deepseek_v3",
         "deepseek_v2"]
LLAMA_FAMILY = ["llama", "mistral", "qwen2", "qwen3"]

pytestmark = pytest.mark.usefixtures("actcap_bin")


# ---------------------------------------------------------------------------------------------
# the parity check
# ---------------------------------------------------------------------------------------------

def check_manifest(manifest, tensors, meta, n_rows):
    assert manifest.get("format") == H.FORMAT, manifest.get("format")
    assert manifest.get("complete") is True
    shards = manifest["shards"]
    assert [s["file"] for s in shards] == ["shard-00000.safetensors"]
    assert shards[0]["rows"] == n_rows
    assert isinstance(shards[0].get("checksums"), dict)
    assert meta.get("format") == "pt", f"shard __metadata__ = {meta}"
    names = set(tensors) - H.ROWS
    assert set(manifest["points"]) == names, (
        f"manifest points vs shard tensors: only in manifest {sorted(set(manifest['points']) - names)}, "
        f"only in shard {sorted(names - set(manifest['points']))}")
    for name in names:
        t = tensors[name]
        info = manifest["points"][name]
        assert t.shape[0] == n_rows, f"{name}: {t.shape[0]} rows, expected {n_rows}"
        assert info["shape"] == list(t.shape[1:]), f"{name}: manifest shape {info['shape']} vs {t.shape}"
        want = {np.dtype("float32"): "F32", np.dtype("int64"): "I64"}.get(t.dtype)
        assert info["dtype"] == want, f"{name}: manifest dtype {info['dtype']}, tensor {t.dtype}"


def check_parity(model_dir, seqs, out_dir, ref_dir=None, rope_seq_len=None, rel_tol=None,
                 worst=None):
    """Runs actcap on `seqs` (one batch) and compares with the reference per sequence.

    ref_dir: checkpoint the reference reads (default model_dir). rope_seq_len: the length the
    reference's RoPE sees for every sequence (HF derives dynamic / longrope scaling from the largest
    position id of the padded batch). rel_tol: also bound max|diff| / max|ref| per point. worst:
    receives the largest abs / rel differences."""
    manifest, tensors, meta = H.run_capture(model_dir, out_dir, seqs)
    refs = reference.run(str(ref_dir or model_dir), seqs, rope_seq_len=rope_seq_len)

    exp_seq = np.concatenate([np.full(len(s), i, dtype=np.int64) for i, s in enumerate(seqs)])
    exp_pos = np.concatenate([np.arange(len(s), dtype=np.int64) for s in seqs])
    exp_tok = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
    for key, exp in ((H.ROWS_SEQ, exp_seq), (H.ROWS_POS, exp_pos), (H.ROWS_TOKEN, exp_tok)):
        assert key in tensors, f"shard lacks {key}"
        assert tensors[key].dtype == np.int64, f"{key} dtype {tensors[key].dtype}"
        assert np.array_equal(tensors[key], exp), f"{key} = {tensors[key].tolist()}, expected {exp.tolist()}"

    got_names = set(tensors) - H.ROWS
    ref_names = set(refs[0])
    assert got_names == ref_names, (
        f"point sets differ:\n  only in actcap: {sorted(got_names - ref_names)}\n"
        f"  only in reference: {sorted(ref_names - got_names)}")

    failures = []
    for i in range(len(seqs)):
        sel = tensors[H.ROWS_SEQ] == i
        got_i = {k: tensors[k][sel] for k in got_names}
        failures += H.compare_points(refs[i], got_i, label=f"seq {i}: ", rel_tol=rel_tol,
                                     worst=worst)
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:40])

    check_manifest(manifest, tensors, meta, len(exp_seq))
    return manifest, tensors, refs


def tokens_for(model_dir, lengths, seed=0):
    return H.random_tokens(reference.Config(H.load_config(model_dir)).vocab_size, lengths, seed=seed)


def ref_differs(dir_a, dir_b, seqs, min_diff=1e-4):
    """True when the reference outputs of two checkpoints differ by more than min_diff at some
    point: guards that a variant test actually exercises the feature (the sliding window, the rope
    scaling...), so that an implementation ignoring it would fail the 1e-5 parity check."""
    a = reference.run(str(dir_a), seqs)
    b = reference.run(str(dir_b), seqs)
    worst = 0.0
    for x, y in zip(a, b):
        for k in x:
            if x[k].dtype == np.float32 and k in y and x[k].shape == y[k].shape:
                worst = max(worst, float(np.max(np.abs(x[k] - y[k]))))
    return worst > min_diff


# ---------------------------------------------------------------------------------------------
# init-model produces an exact HF layout
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_init_model_hf_layout(models, arch):
    """Names and shapes exactly as HF (tied: embedding only); norms/biases perturbed."""
    m = models(arch)
    cfg = H.load_config(m)
    assert cfg["model_type"] == arch
    c = reference.Config(cfg)
    tensors = st.load_checkpoint(str(m))
    expected = reference.expected_shapes(cfg)
    if c.tie:
        del expected["lm_head.weight"]
    got = {k: list(v.shape) for k, v in tensors.items()}
    assert got == dict(expected), (
        f"only in checkpoint: {sorted(set(got) - set(expected))}; missing: {sorted(set(expected) - set(got))}; "
        f"shape differences: {[(k, got[k], expected[k]) for k in got if k in expected and got[k] != expected[k]]}")
    assert c.layers == 4, "tiny preset has 4 layers"
    for k, v in tensors.items():
        if k.endswith("norm.weight") or ".ln_" in k and k.endswith(".weight") or k.endswith("layernorm.weight"):
            assert not np.allclose(v, 1.0), f"{k} is all ones: norm weights must be perturbed"
        if k.endswith(".bias"):
            assert not np.allclose(v, 0.0), f"{k} is all zeros: biases must be perturbed"
    if arch in LLAMA_FAMILY:
        assert c.kv_heads < c.heads, "tiny llama-family presets use GQA"
    if arch == "mistral":
        assert cfg.get("sliding_window") == 8
    if arch == "qwen2":
        assert all(f"model.layers.{i}.self_attn.{p}.bias" in tensors
                   for i in range(c.layers) for p in ("q_proj", "k_proj", "v_proj"))
        assert not any(k.endswith("o_proj.bias") for k in tensors)
    if arch == "qwen3":
        assert all(f"model.layers.{i}.self_attn.{p}.weight" in tensors
                   for i in range(c.layers) for p in ("q_norm", "k_norm"))
        assert not any(k.endswith(".bias") for k in tensors), "attention_bias defaults to false"


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_init_model_deterministic(actcap_bin, tmp_path, arch):
    a = H.init_model(tmp_path / "a", arch, seed=7)
    b = H.init_model(tmp_path / "b", arch, seed=7)
    c = H.init_model(tmp_path / "c", arch, seed=8)
    ta, tb, tc = (st.load_checkpoint(str(d)) for d in (a, b, c))
    assert set(ta) == set(tb) and all(np.array_equal(ta[k], tb[k]) for k in ta), "same seed, different weights"
    assert any(not np.array_equal(ta[k], tc[k]) for k in ta), "different seeds, same weights"


# ---------------------------------------------------------------------------------------------
# architectures
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_parity_single_sequence(models, tmp_path, arch):
    m = models(arch)
    check_parity(m, tokens_for(m, [11], seed=1), tmp_path / "out")


def test_parity_llama_gqa(models, tmp_path):
    m = models("llama")
    cfg = H.load_config(m)
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    check_parity(m, tokens_for(m, [16], seed=2), tmp_path / "out")


def test_parity_mistral_sliding_window(models, tmp_path):
    """20 tokens with sliding_window 8: keys older than the window must be masked."""
    m = models("mistral")
    cfg = H.load_config(m)
    assert cfg["sliding_window"] is not None and cfg["sliding_window"] < 20
    seqs = tokens_for(m, [20], seed=3)
    # the window must matter for these tokens, or the test proves nothing
    full = H.copy_model(m, tmp_path / "full")
    cfg_full = dict(cfg, sliding_window=None)
    H.save_config(full, cfg_full)
    assert ref_differs(m, full, seqs)
    check_parity(m, seqs, tmp_path / "out")


def test_parity_mistral_no_window(models, tmp_path):
    """sliding_window null -> plain causal attention."""
    m = H.copy_model(models("mistral"), tmp_path / "m")
    cfg = H.load_config(m)
    cfg["sliding_window"] = None
    H.save_config(m, cfg)
    check_parity(m, tokens_for(m, [20], seed=3), tmp_path / "out")


def test_parity_qwen2_biases(models, tmp_path):
    m = models("qwen2")
    tensors = st.load_checkpoint(str(m))
    assert "model.layers.0.self_attn.q_proj.bias" in tensors
    check_parity(m, tokens_for(m, [12], seed=4), tmp_path / "out")


def test_parity_qwen2_use_sliding_window(models, tmp_path):
    """HF Qwen2: with use_sliding_window true, layers i >= max_window_layers use the window."""
    m = H.copy_model(models("qwen2"), tmp_path / "m")
    cfg = H.load_config(m)
    cfg.update(use_sliding_window=True, sliding_window=4, max_window_layers=2)
    cfg.pop("layer_types", None)
    H.save_config(m, cfg)
    seqs = tokens_for(m, [14], seed=5)
    plain = H.copy_model(models("qwen2"), tmp_path / "plain")
    assert ref_differs(m, plain, seqs)
    check_parity(m, seqs, tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# Qwen3: q_norm / k_norm, head_dim default, windows, 4.x / 5.x configs
# ---------------------------------------------------------------------------------------------

def _set_qk_norm(src, dst, value):
    m = H.copy_model(src, dst)
    w = st.load_checkpoint(str(m))
    for k in w:
        if k.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            w[k] = np.full_like(w[k], value)
    st.save(str(m / "model.safetensors"), w, metadata={"format": "pt"})
    return m


def test_parity_qwen3_qk_norm_points(models, tmp_path):
    """model.layers.N.self_attn.{q,k}_norm and their :input are captured with per-token shape
    [num_attention_heads | num_key_value_heads, head_dim] (HF's q_proj(x).view(..., -1, head_dim)),
    in the manifest, in `points --json` and when captured alone; the norms' weights matter."""
    m = models("qwen3")
    c = reference.Config(H.load_config(m))
    seqs = tokens_for(m, [13, 6], seed=40)
    assert ref_differs(m, _set_qk_norm(m, tmp_path / "unit", 1.0), seqs), "q/k norm weights have no effect"
    manifest, _, refs = check_parity(m, seqs, tmp_path / "out")
    listed = {p["name"]: p["shape"] for p in json.loads(H.actcap("points", m, "--json", check=True).stdout)["points"]}
    for i in range(c.layers):
        for nm, n in (("q_norm", c.heads), ("k_norm", c.kv_heads)):
            for suffix in ("", ":input"):
                name = f"model.layers.{i}.self_attn.{nm}{suffix}"
                assert manifest["points"][name]["shape"] == [n, c.head_dim], name
                assert listed[name] == [n, c.head_dim], name
    pats = ["model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm:input"]
    _, got, _ = H.run_capture(m, tmp_path / "alone", seqs, capture=pats)
    want = {f"model.layers.{i}.self_attn.q_norm" for i in range(c.layers)} | {
        f"model.layers.{i}.self_attn.k_norm:input" for i in range(c.layers)}
    assert set(got) - H.ROWS == want
    for i in range(len(seqs)):
        sel = got[H.ROWS_SEQ] == i
        fails = H.compare_points({k: refs[i][k] for k in want}, {k: got[k][sel] for k in want}, label=f"seq {i}: ")
        assert not fails, "\n".join(fails)


def test_parity_qwen3_head_dim_absent_is_128(actcap_bin, tmp_path):
    """Qwen3Config.head_dim defaults to 128 (not hidden_size / num_attention_heads = 8): a config
    without head_dim and a checkpoint whose q_proj is [4 * 128, 32]."""
    cfg = synth.tiny_config("qwen3", hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    del cfg["head_dim"]
    m = tmp_path / "m"
    w = synth.write_checkpoint(str(m), cfg, seed=41)
    assert "head_dim" not in H.load_config(m)
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (512, 32)
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (256, 32)
    assert w["model.layers.0.self_attn.q_norm.weight"].shape == (128,)
    check_parity(m, tokens_for(m, [10, 4], seed=42), tmp_path / "out")


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "attention_bias"])
def test_parity_qwen3_real_config_layout(actcap_bin, tmp_path, bias):
    """Qwen3-0.6B's config.json fields, nulls included (rope_scaling, sliding_window), at tiny
    size; attention_bias true adds q/k/v AND o_proj biases."""
    real = synth.QWEN3_0_6B_CONFIG
    cfg = dict(real, vocab_size=384, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
               bos_token_id=1, eos_token_id=2, attention_bias=bias)
    m = tmp_path / "m"
    w = synth.write_checkpoint(str(m), cfg, seed=43, dtype="bf16")
    assert ("model.layers.0.self_attn.o_proj.bias" in w) == bias
    written = H.load_config(m)
    assert written["rope_scaling"] is None and written["sliding_window"] is None
    check_parity(m, tokens_for(m, [12, 5], seed=44), tmp_path / "out")


def test_parity_qwen3_use_sliding_window(models, tmp_path):
    """use_sliding_window true: layers i >= max_window_layers use the window; false: none do,
    whatever sliding_window and max_window_layers say."""
    src = models("qwen3")
    m = with_config(src, tmp_path / "m", use_sliding_window=True, sliding_window=4, max_window_layers=2,
                    layer_types=None)
    assert reference.Config(H.load_config(m)).windows == [None, None, 4, 4]
    seqs = tokens_for(m, [14, 9], seed=45)
    assert ref_differs(m, src, seqs)
    check_parity(m, seqs, tmp_path / "out")
    off = with_config(src, tmp_path / "off", use_sliding_window=False, sliding_window=4, max_window_layers=0,
                      layer_types=None)
    assert not ref_differs(off, src, seqs, min_diff=0.0)
    check_parity(off, seqs, tmp_path / "out-off")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_parity_layer_types_override_max_window_layers(models, tmp_path, arch):
    """transformers 5.x writes layer_types; it decides which layers slide, not max_window_layers
    (Qwen2Config / Qwen3Config only derive layer_types from max_window_layers when absent)."""
    src = models(arch)
    L = reference.Config(H.load_config(src)).layers
    types = ["sliding_attention", "full_attention"] * (L // 2) + ["sliding_attention"] * (L % 2)
    m = with_config(src, tmp_path / "m", use_sliding_window=True, sliding_window=4, max_window_layers=2,
                    layer_types=types)
    by_mwl = with_config(src, tmp_path / "mwl", use_sliding_window=True, sliding_window=4, max_window_layers=2,
                         layer_types=None)
    assert reference.Config(H.load_config(m)).windows == [4 if t == "sliding_attention" else None for t in types]
    seqs = tokens_for(m, [14, 9], seed=46)
    assert ref_differs(m, by_mwl, seqs), "layer_types has no effect beyond max_window_layers"
    check_parity(m, seqs, tmp_path / "out")


def _bit_identical(a, b):
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    diff = [k for k in a if not np.array_equal(a[k], b[k])]
    assert not diff, f"captures differ at {diff[:10]}"


@pytest.mark.parametrize("rope", ["yarn", "llama3"])
def test_parity_qwen3_v4_and_v5_configs_identical(models, tmp_path, rope):
    """One Qwen3 model written as transformers 4.x does (rope_theta + rope_scaling,
    use_sliding_window + max_window_layers, torch_dtype) and as 5.x does (rope_parameters with
    rope_theta inside, layer_types, dtype; max_window_layers left at 28 so only layer_types can
    give the window): same reference, bit-identical captures, parity for both."""
    src = models("qwen3")
    cfg = H.load_config(src)
    if rope == "yarn":
        scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
        theta = 100.0
    else:
        theta = 500000.0
        scaling = llama3_scaling(cfg, theta=theta)
    v4 = with_config(src, tmp_path / "v4", rope_theta=theta, rope_scaling=scaling, rope_parameters=None,
                     use_sliding_window=True, sliding_window=6, max_window_layers=2, layer_types=None,
                     dtype=None, torch_dtype="float32")
    cfg5 = synth.to_v5(H.load_config(v4))
    cfg5["max_window_layers"] = 28
    assert "torch_dtype" not in cfg5 and "rope_theta" not in cfg5 and "rope_scaling" not in cfg5
    v5 = H.copy_model(v4, tmp_path / "v5")
    H.save_config(v5, cfg5)
    seqs = tokens_for(src, [24, 7], seed=47)
    plain = with_config(src, tmp_path / "plain", rope_theta=theta, rope_scaling=None, rope_parameters=None)
    assert ref_differs(v4, plain, seqs), f"{rope} scaling and the window have no effect"
    ra, rb = reference.run(str(v4), seqs), reference.run(str(v5), seqs)
    for x, y in zip(ra, rb):
        _bit_identical(x, y)
    _, ta, _ = check_parity(v4, seqs, tmp_path / "out4", rel_tol=1e-5)
    _, tb, _ = check_parity(v5, seqs, tmp_path / "out5", rel_tol=1e-5)
    _bit_identical(ta, tb)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral", "qwen2", "olmo", "olmo2", "gemma", "gemma2"])
def test_parity_v5_config_other_archs(models, tmp_path, arch):
    """transformers 5.x config.json for the other families: dtype instead of torch_dtype,
    rope_parameters (rope_theta 500 inside, so ignoring it shows), Qwen2 with layer_types (here
    the list max_window_layers gives, so this test needs no layer_types support). Same captures,
    bit for bit, as the 4.x form of the same config."""
    src = models(arch)
    changes = {} if arch == "gpt2" else dict(rope_theta=500.0, rope_scaling=None, rope_parameters=None)
    if arch == "qwen2":
        changes.update(use_sliding_window=True, sliding_window=4, max_window_layers=2, layer_types=None)
    v4 = with_config(src, tmp_path / "v4", **changes)
    cfg5 = synth.to_v5(H.load_config(v4))
    assert "torch_dtype" not in cfg5 and cfg5["dtype"] == "float32"
    if arch != "gpt2":
        assert cfg5["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}
    if arch == "qwen2":
        assert cfg5["layer_types"] == ["full_attention"] * 2 + ["sliding_attention"] * 2
    if arch == "gemma2":
        assert cfg5["layer_types"] == ["sliding_attention", "full_attention"] * 2
    v5 = H.copy_model(v4, tmp_path / "v5")
    H.save_config(v5, cfg5)
    seqs = tokens_for(src, [12, 5], seed=48)
    if arch != "gpt2":
        assert ref_differs(v5, src, seqs)
    _, ta, _ = check_parity(v4, seqs, tmp_path / "out4")
    _, tb, _ = check_parity(v5, seqs, tmp_path / "out5")
    _bit_identical(ta, tb)


QWEN3_0_6B_KEYS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                   "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
                   "eos_token_id", "hidden_act", "attention_bias", "use_sliding_window"]


def test_init_model_qwen3_0_6b_preset_config(actcap_bin, tmp_path):
    """`init-model --arch qwen3 --preset qwen3-0.6b` describes Qwen/Qwen3-0.6B (synth.QWEN3_0_6B_CONFIG).
    The weights would be 2.4 GB, so only config.json is written (--config-only)."""
    out = tmp_path / "m"
    H.actcap("init-model", "--arch", "qwen3", "--preset", "qwen3-0.6b", "--seed", 0, "--config-only",
             "--out", out, check=True)
    assert not (out / "model.safetensors").exists(), "--config-only wrote weights"
    cfg = H.load_config(out)
    real = synth.QWEN3_0_6B_CONFIG
    bad = {k: (cfg.get(k), real[k]) for k in QWEN3_0_6B_KEYS if cfg.get(k) != real[k]}
    assert not bad, f"(init-model, Qwen3-0.6B): {bad}"
    c, r = reference.Config(cfg), reference.Config(real)
    assert (c.rope, c.windows) == (r.rope, r.windows)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)


# ---------------------------------------------------------------------------------------------
# OLMo 2: norms on the sublayer outputs, q_norm / k_norm over the whole projection
# ---------------------------------------------------------------------------------------------

def _scale_weights(src, dst, suffixes, value):
    m = H.copy_model(src, dst)
    w = st.load_checkpoint(str(m))
    for k in w:
        if k.endswith(suffixes):
            w[k] = np.full_like(w[k], value)
    st.save(str(m / "model.safetensors"), w, metadata={"format": "pt"})
    return m


def test_parity_olmo2_norm_points(models, tmp_path):
    """q_norm / k_norm points are [heads * head_dim] per token (one RMSNorm over the projection,
    before the head split), in the manifest and `points --json`; each of the four norm weights
    of a layer changes the result (so a pre-norm block or per-head q/k norms would fail)."""
    m = models("olmo2")
    c = reference.Config(H.load_config(m))
    seqs = tokens_for(m, [13, 6], seed=60)
    for i, suffixes in enumerate([("self_attn.q_norm.weight", "self_attn.k_norm.weight"),
                                  ("post_attention_layernorm.weight",), ("post_feedforward_layernorm.weight",)]):
        assert ref_differs(m, _scale_weights(m, tmp_path / f"w{i}", suffixes, 1.0), seqs), suffixes
    manifest, _, _ = check_parity(m, seqs, tmp_path / "out")
    listed = {p["name"]: p["shape"] for p in json.loads(H.actcap("points", m, "--json", check=True).stdout)["points"]}
    assert not any(n.endswith("input_layernorm") for n in listed), "OLMo 2 has no pre-norm"
    for i in range(c.layers):
        for nm, n in (("q_norm", c.heads), ("k_norm", c.kv_heads)):
            for suffix in ("", ":input"):
                name = f"model.layers.{i}.self_attn.{nm}{suffix}"
                assert manifest["points"][name]["shape"] == [n * c.head_dim], name
                assert listed[name] == [n * c.head_dim], name


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "attention_bias"])
def test_parity_olmo2_real_config_layout(actcap_bin, tmp_path, bias):
    """OLMo-2-0425-1B's config.json fields at tiny size (rope_scaling null, no head_dim, pad id),
    bf16; attention_bias true adds q/k/v and o_proj biases."""
    cfg = dict(synth.OLMO2_1B_CONFIG, vocab_size=384, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, eos_token_id=2,
               pad_token_id=1, attention_bias=bias)
    m = tmp_path / "m"
    w = synth.write_checkpoint(str(m), cfg, seed=61, dtype="bf16")
    assert ("model.layers.0.self_attn.o_proj.bias" in w) == bias
    check_parity(m, tokens_for(m, [12, 5], seed=62), tmp_path / "out")


OLMO2_1B_KEYS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
                 "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id", "hidden_act",
                 "attention_bias", "rope_theta", "rope_scaling"]


def check_preset_config(tmp_path, arch, preset, real, keys):
    """`init-model --arch ARCH --preset PRESET --config-only` writes only config.json, and it agrees
    with the real model's on `keys`, RoPE, windows and every weight shape."""
    out = tmp_path / "m"
    H.actcap("init-model", "--arch", arch, "--preset", preset, "--seed", 0, "--config-only", "--out", out,
             check=True)
    assert not (out / "model.safetensors").exists(), "--config-only wrote weights"
    cfg = H.load_config(out)
    bad = {k: (cfg.get(k), real.get(k)) for k in keys if cfg.get(k) != real.get(k)}  # absent: None
    assert not bad, f"(init-model, {preset}): {bad}"
    c, r = reference.Config(cfg), reference.Config(real)
    # yarn's truncate is true unless a file says otherwise (init-model writes it out)
    rope = lambda x: dict({"truncate": True} if x.get("rope_type") == "yarn" else {}, **x)  # noqa: E731
    assert (rope(c.rope), c.windows, c.tie) == (rope(r.rope), r.windows, r.tie)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)


def test_init_model_olmo2_1b_preset_config(actcap_bin, tmp_path):
    """`init-model --arch olmo2 --preset olmo-2-1b` describes allenai/OLMo-2-0425-1B."""
    check_preset_config(tmp_path, "olmo2", "olmo-2-1b", synth.OLMO2_1B_CONFIG, OLMO2_1B_KEYS)


# ---------------------------------------------------------------------------------------------
# OLMo 3: OLMo 2's layer with sliding windows on the layers layer_types names
# ---------------------------------------------------------------------------------------------

# The released OLMo 3 7B / 32B config.json files as public repositories quote them (the fields that
# describe the model; no network to the Hub here). Their token ids are not compared: the quotes
# disagree on them.
OLMO3_YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
              "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1}
OLMO3_7B_CONFIG = {
    "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "attention_bias": False, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 65536, "rms_norm_eps": 1e-06, "rope_theta": 500000,
    "rope_scaling": OLMO3_YARN, "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 100278,
    "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 8,
}
OLMO3_32B_CONFIG = dict(OLMO3_7B_CONFIG, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                        num_attention_heads=40, num_key_value_heads=8,
                        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 16)
OLMO3_KEYS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
              "rms_norm_eps", "tie_word_embeddings", "hidden_act", "attention_bias", "rope_theta",
              "sliding_window"]


def test_parity_olmo3_windows(models, tmp_path):
    """The tiny preset slides an 8-key window on layers 0-2 (layer 3 full, Olmo3Config's default
    pattern), shorter than the sequence: the window changes the output and matches. Other
    layer_types with a 3-key window match; a window as long as the sequence is full attention bit
    for bit. A listed layer_types equal to the default is the same model."""
    src = models("olmo3")
    cfg = H.load_config(src)
    assert cfg["sliding_window"] == 8
    assert "layer_types" not in cfg and reference.Config(cfg).windows == [8, 8, 8, None]
    seqs = tokens_for(src, [14, 6], seed=91)
    full = with_config(src, tmp_path / "full", layer_types=["full_attention"] * 4)
    assert ref_differs(src, full, seqs), "the sliding layers' window changed nothing"
    listed = with_config(src, tmp_path / "listed", layer_types=["sliding_attention"] * 3 + ["full_attention"])
    _, a, _ = check_parity(src, seqs, tmp_path / "o_src", rel_tol=1e-5)
    _, b, _ = check_parity(listed, seqs, tmp_path / "o_listed")
    assert all(np.array_equal(a[k], b[k]) for k in a), "Olmo3Config's default layer_types"
    _, f, _ = check_parity(full, seqs, tmp_path / "o_full", rel_tol=1e-5)
    _, w, _ = check_parity(with_config(src, tmp_path / "wide", sliding_window=14), seqs, tmp_path / "o_wide")
    assert all(np.array_equal(f[k], w[k]) for k in f)
    other = with_config(src, tmp_path / "other", sliding_window=3,
                        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"])
    assert ref_differs(src, other, seqs)
    check_parity(other, seqs, tmp_path / "o_other", rel_tol=1e-5)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "attention_bias"])
def test_parity_olmo3_real_config_layout(actcap_bin, tmp_path, bias):
    """OLMo 3 7B's config.json fields at tiny size, bf16 weights: yarn RoPE (over 16 original
    positions, so that the 40-token sequence runs past them and the ramp matters), the default
    layer_types (no field) with a 6-key window; attention_bias adds q/k/v and o_proj biases."""
    cfg = dict(OLMO3_7B_CONFIG, vocab_size=384, hidden_size=32, intermediate_size=80, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, sliding_window=6,
               rope_scaling=dict(OLMO3_YARN, original_max_position_embeddings=16), eos_token_id=2,
               attention_bias=bias)
    del cfg["layer_types"]
    m = tmp_path / "m"
    w = synth.write_checkpoint(str(m), cfg, seed=92, dtype="bf16")
    assert ("model.layers.0.self_attn.o_proj.bias" in w) == bias
    seqs = tokens_for(m, [40, 9], seed=93)
    plain = with_config(m, tmp_path / "plain", rope_scaling=None)
    assert ref_differs(m, plain, seqs), "yarn changed nothing"
    check_parity(m, seqs, tmp_path / "out")


@pytest.mark.parametrize("preset,real", [("olmo-3-7b", OLMO3_7B_CONFIG), ("olmo-3-32b", OLMO3_32B_CONFIG)])
def test_init_model_olmo3_preset_config(actcap_bin, tmp_path, preset, real):
    """`init-model --arch olmo3 --preset olmo-3-7b / olmo-3-32b` describe the released models."""
    check_preset_config(tmp_path, "olmo3", preset, real, OLMO3_KEYS)


# ---------------------------------------------------------------------------------------------
# SmolLM3: Llama's layer with NoPE layers (no rotary embedding) and windows as layer_types says
# ---------------------------------------------------------------------------------------------

# HuggingFaceTB/SmolLM3-3B's config.json as public repositories quote it (the fields that describe
# the model; no network to the Hub here). Its token ids are not compared: the quotes disagree.
SMOLLM3_3B_CONFIG = {
    "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "attention_bias": False, "mlp_bias": False,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 65536, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None, "use_sliding_window": False,
    "no_rope_layer_interval": 4, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)],
    "tie_word_embeddings": True, "vocab_size": 128256,
}
SMOLLM3_KEYS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
                "rms_norm_eps", "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias", "rope_theta",
                "sliding_window", "use_sliding_window", "no_rope_layer_interval"]


def test_parity_smollm3_nope_layers_and_windows(models, tmp_path):
    """The tiny preset's layer 3 is NoPE (SmolLM3Config's default: every fourth layer): q and k
    unrotated there, which changes the output and matches; so do no_rope_layers of their own, an
    interval of 2, use_sliding_window with a 3-key window (the NoPE layers slide by default), and
    layer_types listed. Listing the default no_rope_layers is the same model bit for bit. (Listed
    sliding layers without use_sliding_window, which transformers' eager attention slides and its
    flash attention does not, are checked against transformers in test_transformers_parity.)"""
    src = models("smollm3")
    cfg = H.load_config(src)
    assert "no_rope_layers" not in cfg and cfg["no_rope_layer_interval"] == 4 and not cfg["use_sliding_window"]
    seqs = tokens_for(src, [14, 6], seed=95)
    _, a, _ = check_parity(src, seqs, tmp_path / "o_src", rel_tol=1e-5)
    listed = with_config(src, tmp_path / "listed", no_rope_layers=[1, 1, 1, 0])
    _, b, _ = check_parity(listed, seqs, tmp_path / "o_listed")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    all_rope = with_config(src, tmp_path / "all_rope", no_rope_layers=[1, 1, 1, 1])
    assert ref_differs(src, all_rope, seqs), "the NoPE layer changed nothing"
    variants = {
        "own": dict(no_rope_layers=[0, 1, 0, 1]),
        "interval": dict(no_rope_layer_interval=2),
        "sliding": dict(use_sliding_window=True, sliding_window=3),
        "types": dict(use_sliding_window=True, sliding_window=3,
                      layer_types=["sliding_attention", "full_attention"] * 2),
    }
    for name, changes in variants.items():
        m = with_config(src, tmp_path / name, **changes)
        assert ref_differs(src, m, seqs), name
        check_parity(m, seqs, tmp_path / f"o_{name}", rel_tol=1e-5)


def test_init_model_smollm3_3b_preset_config(actcap_bin, tmp_path):
    """`init-model --arch smollm3 --preset smollm3-3b` describes HuggingFaceTB/SmolLM3-3B."""
    check_preset_config(tmp_path, "smollm3", "smollm3-3b", SMOLLM3_3B_CONFIG, SMOLLM3_KEYS)


# ---------------------------------------------------------------------------------------------
# Gemma 2: (1 + w) norms, scaled embedding, four norms per layer, soft-caps, windows on even layers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["olmo", "olmoe"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_parity_clip_qkv_bites(actcap_bin, tmp_path, arch, dtype):
    """clip_qkv 0.05 clamps most of q, k and v (after OLMoE's q/k norms), before RoPE: the
    reference's points change, actcap matches them, and the projection points (OLMoE: the norms)
    are the unclamped values, beyond the clip."""
    def model(name, clip):
        m = tmp_path / name
        synth.write_checkpoint(str(m), synth.tiny_config(arch, clip_qkv=clip, attention_bias=True),
                               seed=73, dtype=dtype)
        return m
    m = model("m", 0.05)
    seqs = tokens_for(m, [13, 6], seed=74)
    assert ref_differs(m, model("none", None), seqs)
    _, got, _ = check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5 if dtype == "f32" else 1e-2)
    q = "model.layers.0.self_attn." + ("q_norm" if arch == "olmoe" else "q_proj")
    assert np.abs(got[q]).max() > 0.5


def test_gemma_activation_fields_that_differ_are_named(models, tmp_path):
    """A Gemma config with the legacy hidden_act "gelu" beside hidden_activation
    "gelu_pytorch_tanh" runs the latter (the reference's rule too) and says so on stderr, naming
    both and what transformers 5 runs instead."""
    m = with_config(models("gemma"), tmp_path / "m", hidden_act="gelu",
                    hidden_activation="gelu_pytorch_tanh")
    p = H.actcap("run", m, "--tokens", "1,2,3", "--capture", "lm_head", "--out", tmp_path / "o")
    assert p.returncode == 0, p.stderr
    assert "hidden_activation 'gelu_pytorch_tanh' runs, not hidden_act 'gelu'" in p.stderr, p.stderr
    check_parity(m, tokens_for(m, [9, 4], seed=75), tmp_path / "out")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "qwen2_moe"])
def test_qwen_sliding_window_zero_without_use_sliding_window_is_none(models, tmp_path, arch):
    """transformers 5 saves Qwen2-MoE's sliding_window as 0 when use_sliding_window is false (and
    ignores the field then, as for Qwen2 and Qwen3): read as no window, the same captures as
    without the field."""
    seqs = tokens_for(models(arch), [12, 5], seed=76)
    zero = with_config(models(arch), tmp_path / "zero", use_sliding_window=False, sliding_window=0)
    null = with_config(models(arch), tmp_path / "null", use_sliding_window=False,
                       sliding_window=None)
    _, a, _ = check_parity(zero, seqs, tmp_path / "out0", ref_dir=null)
    _, b, _ = check_parity(null, seqs, tmp_path / "out1")
    _bit_identical(a, b)


def _gemma2_synth(tmp_path, name, seed=70, dtype="f32", **changes):
    """A synth.py Gemma 2 (3 layers, layers 0 and 2 slide with window 4, head_dim 16 != 32 / 4)."""
    m = tmp_path / name
    synth.write_checkpoint(str(m), synth.tiny_config("gemma2", **changes), seed=seed, dtype=dtype)
    return m


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_parity_gemma2_softcap_bites_and_window(actcap_bin, tmp_path, dtype):
    """attn_logit_softcapping 0.3 (scores reach several units, so tanh saturates) and sliding
    window 4 on layers 0 and 2 over 14 tokens: each changes the reference's points, and actcap
    matches it on every point, 1e-5 absolute and relative."""
    m = _gemma2_synth(tmp_path, "m", dtype=dtype, attn_logit_softcapping=0.3)
    seqs = tokens_for(m, [14, 9], seed=71)
    assert reference.Config(H.load_config(m)).windows == [4, None, 4]
    assert ref_differs(m, _gemma2_synth(tmp_path, "nocap", dtype=dtype, attn_logit_softcapping=None), seqs)
    assert ref_differs(m, _gemma2_synth(tmp_path, "nowin", dtype=dtype, attn_logit_softcapping=0.3,
                                        sliding_window=64), seqs)
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


def test_parity_gemma2_norms_embedding_and_scale(actcap_bin, tmp_path):
    """Each Gemma 2 specific changes the points, so ignoring it fails parity: the four norms'
    (1 + w), query_pre_attn_scalar (not head_dim), hidden_activation (not hidden_act), and the
    model.embed_tokens point, which is the embedding times sqrt(hidden_size)."""
    m = _gemma2_synth(tmp_path, "m", hidden_act="silu", query_pre_attn_scalar=7)
    seqs = tokens_for(m, [12, 5], seed=72)
    assert ref_differs(m, _gemma2_synth(tmp_path, "scalar", hidden_act="silu"), seqs)
    assert not ref_differs(m, _gemma2_synth(tmp_path, "act", query_pre_attn_scalar=7), seqs, min_diff=0.0)
    for i, suffix in enumerate(["input_layernorm.weight", "post_attention_layernorm.weight",
                                "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]):
        assert ref_differs(m, _scale_weights(m, tmp_path / f"n{i}", (suffix,), 0.0), seqs), suffix
    _, got, refs = check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)
    w = st.load_checkpoint(str(m))["model.embed_tokens.weight"]
    np.testing.assert_allclose(refs[0]["model.embed_tokens"], w[seqs[0]] * np.float32(32 ** 0.5), rtol=1e-6)


def test_parity_gemma2_layer_types(models, tmp_path):
    """transformers 5.x layer_types decides which layers slide (here the odd ones, the opposite
    of the default), with a window shorter than the sequence."""
    src = models("gemma2")
    L = reference.Config(H.load_config(src)).layers
    types = ["full_attention", "sliding_attention"] * (L // 2)
    m = with_config(src, tmp_path / "m", layer_types=types, sliding_window=3)
    dflt = with_config(src, tmp_path / "d", sliding_window=3)
    assert reference.Config(H.load_config(m)).windows == [None, 3] * (L // 2)
    seqs = tokens_for(m, [15, 6], seed=73)
    assert ref_differs(m, dflt, seqs), "layer_types has no effect"
    check_parity(m, seqs, tmp_path / "out")
    check_parity(dflt, seqs, tmp_path / "out-d")


def test_parity_gemma2_real_config_layout(actcap_bin, tmp_path):
    """gemma-2-2b's config.json fields at tiny size (hidden_act and hidden_activation, both caps,
    pad id, cache_implementation), bf16, tied."""
    cfg = dict(synth.GEMMA2_2B_CONFIG, vocab_size=384, hidden_size=32, intermediate_size=80, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
               max_position_embeddings=128, sliding_window=5, attn_logit_softcapping=1.0)
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=74, dtype="bf16")
    check_parity(m, tokens_for(m, [12, 7], seed=75), tmp_path / "out")


GEMMA2_2B_KEYS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                  "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id", "hidden_act",
                  "hidden_activation", "attention_bias", "query_pre_attn_scalar", "sliding_window",
                  "attn_logit_softcapping", "final_logit_softcapping", "rope_theta", "initializer_range"]


def test_init_model_gemma2_2b_preset_config(actcap_bin, tmp_path):
    """`init-model --arch gemma2 --preset gemma-2-2b` describes google/gemma-2-2b."""
    check_preset_config(tmp_path, "gemma2", "gemma-2-2b", synth.GEMMA2_2B_CONFIG, GEMMA2_2B_KEYS)


# ---------------------------------------------------------------------------------------------
# Gemma 3: per-head q/k norms, local and global layers with their own RoPE, Gemma 2's block,
# Gemma3ForConditionalGeneration checkpoints (both key layouts), 4.x and 5.x configs
# ---------------------------------------------------------------------------------------------

def _gemma3_synth(tmp_path, name, seed=80, dtype="f32", multimodal=None, drop=(), **changes):
    """A synth.py Gemma 3 (4 layers: 0 and 2 local with window 4 and RoPE base 10000, 1 and 3
    global with base 1e6; head_dim 16 != 32 / 4). multimodal: None (Gemma3ForCausalLM) or the
    Gemma3ForConditionalGeneration key layout ("new", "old", "none": no text weights). drop: text
    config keys to leave out."""
    cfg = synth.tiny_config("gemma3_text", **changes)
    for k in drop:
        cfg.pop(k)
    if multimodal:
        cfg = synth.gemma3_multimodal(cfg, layout=multimodal)
    m = tmp_path / name
    synth.write_checkpoint(str(m), cfg, seed=seed, dtype=dtype)
    return m


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_parity_gemma3_local_and_global_layers(actcap_bin, tmp_path, dtype):
    """Local layers (0, 2) attend within a window of 4 over 14 tokens and rotate with
    rope_local_base_freq, global ones (1, 3) attend causally with rope_theta: the window and the
    local base each change the reference's points, and actcap matches every point, 1e-5 absolute and
    relative, for f32, bf16 and f16 checkpoints."""
    m = _gemma3_synth(tmp_path, "m", dtype=dtype)
    c = reference.Config(H.load_config(m))
    assert c.windows == [4, None, 4, None]
    assert (c.local_rope["rope_theta"], c.rope["rope_theta"]) == (10000.0, 1e6)
    seqs = tokens_for(m, [14, 9], seed=81)
    assert ref_differs(m, _gemma3_synth(tmp_path, "nowin", dtype=dtype, sliding_window=64), seqs)
    assert ref_differs(m, _gemma3_synth(tmp_path, "onebase", dtype=dtype, rope_local_base_freq=1e6), seqs)
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5, worst=worst)
    report(f"gemma3 local/global {dtype}", worst)


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 8.0},
                                     {"rope_type": "dynamic", "factor": 2.0}], ids=["linear", "dynamic"])
def test_parity_gemma3_rope_scaling_on_global_layers_only(actcap_bin, tmp_path, scaling):
    """rope_scaling applies to the global layers only (Gemma 3 4B+: linear, factor 8): it changes
    layer 1's attention, while layer 0 (local, the first to run) is bit for bit the unscaled model's.
    Dynamic with max_position_embeddings 16 over 24 tokens recomputes the global table only."""
    extra = dict(max_position_embeddings=16) if scaling["rope_type"] == "dynamic" else {}
    m = _gemma3_synth(tmp_path, "m", rope_scaling=scaling, **extra)
    plain = _gemma3_synth(tmp_path, "plain", **extra)
    seqs = tokens_for(m, [24, 7], seed=82)
    a, b = reference.run(str(m), seqs)[0], reference.run(str(plain), seqs)[0]
    assert all(np.array_equal(a[k], b[k]) for k in a if k.startswith("model.layers.0."))
    assert float(np.max(np.abs(a["model.layers.1.self_attn"] - b["model.layers.1.self_attn"]))) > 1e-4
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rope_seq_len=24, rel_tol=1e-5, worst=worst)
    report(f"gemma3 rope_scaling {scaling['rope_type']}", worst)


def test_parity_gemma3_qk_norms_scale_embedding_and_no_attention_softcap(actcap_bin, tmp_path):
    """q_norm / k_norm are (1 + w) RMSNorms per head ([heads | kv_heads, head_dim] per token, in the
    manifest and `points --json`), their weights matter; query_pre_attn_scalar (not head_dim) scales
    the scores; attn_logit_softcapping is NOT applied (transformers' Gemma3Attention never passes it):
    a cap of 0.3 leaves the reference unchanged and actcap matches it; model.embed_tokens is the
    embedding module's scaled output, weight[ids] * float32(sqrt(hidden_size))."""
    m = _gemma3_synth(tmp_path, "m", query_pre_attn_scalar=7, attn_logit_softcapping=0.3)
    c = reference.Config(H.load_config(m))
    seqs = tokens_for(m, [12, 5], seed=83)
    assert not ref_differs(m, _gemma3_synth(tmp_path, "nocap", query_pre_attn_scalar=7), seqs, min_diff=0.0)
    assert ref_differs(m, _gemma3_synth(tmp_path, "scalar", attn_logit_softcapping=0.3), seqs)
    for i, suffix in enumerate(["self_attn.q_norm.weight", "self_attn.k_norm.weight"]):
        assert ref_differs(m, _scale_weights(m, tmp_path / f"n{i}", (suffix,), 0.0), seqs), suffix
    manifest, _, refs = check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)
    listed = {p["name"]: p["shape"] for p in json.loads(H.actcap("points", m, "--json", check=True).stdout)["points"]}
    for i in range(c.layers):
        for nm, n in (("q_norm", c.heads), ("k_norm", c.kv_heads)):
            for suffix in ("", ":input"):
                name = f"model.layers.{i}.self_attn.{nm}{suffix}"
                assert manifest["points"][name]["shape"] == [n, c.head_dim] == listed[name], name
    w = st.load_checkpoint(str(m))["model.embed_tokens.weight"]
    np.testing.assert_array_equal(refs[0]["model.embed_tokens"], w[seqs[0]] * np.float32(32 ** 0.5))


def test_parity_gemma3_final_softcap_bites(actcap_bin, tmp_path):
    """final_logit_softcapping 0.5 with logits of several units: the cap bites (the reference's
    model logits stay within 0.5 while lm_head reaches past it) and every point, lm_head (uncapped,
    as transformers' module returns it) included, matches. That actcap's model logits are the capped
    ones: tests/unit/test_model.cpp (EveryArch.HooksSeeConsistentValuesAndDoNotChangeLogits, with a
    cap) and the 3-device `compare` in tests/integration/test_devices_cli.py."""
    m = _gemma3_synth(tmp_path, "m", final_logit_softcapping=0.5)
    seqs = tokens_for(m, [10, 4], seed=84)
    model = reference.Model(str(m))
    lm, capped = model.forward(seqs[0])["lm_head"], model.final_logits(seqs[0])
    assert np.abs(lm).max() > 1.0 and np.abs(capped).max() <= 0.5
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


def test_parity_gemma3_layer_types_override_the_pattern(actcap_bin, tmp_path):
    """transformers 5's layer_types decides which layers are local, not sliding_window_pattern."""
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    m = _gemma3_synth(tmp_path, "m", layer_types=types)
    assert reference.Config(H.load_config(m)).windows == [None, 4, 4, None]
    seqs = tokens_for(m, [15, 6], seed=85)
    assert ref_differs(m, _gemma3_synth(tmp_path, "pattern"), seqs), "layer_types has no effect"
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}],
                         ids=["default", "linear", "yarn"])
def test_parity_gemma3_v4_and_v5_configs_identical(actcap_bin, tmp_path, scaling):
    """One Gemma 3 model as transformers 4.x writes it (rope_theta, rope_scaling,
    rope_local_base_freq, sliding_window_pattern, torch_dtype) and as 5.x does (rope_parameters keyed
    by layer type, layer_types, dtype): the same reference, bit-identical captures, parity for both."""
    v4 = _gemma3_synth(tmp_path, "v4", rope_theta=5000.0, rope_local_base_freq=100.0, rope_scaling=scaling,
                       max_position_embeddings=64)
    cfg5 = synth.gemma3_to_v5(H.load_config(v4))
    assert not {"rope_theta", "rope_scaling", "rope_local_base_freq", "sliding_window_pattern", "torch_dtype"} & set(cfg5)
    v5 = H.copy_model(v4, tmp_path / "v5")
    H.save_config(v5, cfg5)
    seqs = tokens_for(v4, [30, 7], seed=86)
    assert ref_differs(v4, _gemma3_synth(tmp_path, "plain", max_position_embeddings=64), seqs)
    for x, y in zip(reference.run(str(v4), seqs), reference.run(str(v5), seqs)):
        _bit_identical(x, y)
    _, ta, _ = check_parity(v4, seqs, tmp_path / "out4", rel_tol=1e-5)
    _, tb, _ = check_parity(v5, seqs, tmp_path / "out5", rel_tol=1e-5)
    _bit_identical(ta, tb)


def test_parity_gemma3_v5_scaled_local_rope(actcap_bin, tmp_path):
    """transformers 5 can scale the local layers' RoPE too (rope_parameters.sliding_attention): it
    changes layer 0, and actcap follows it; config_to_json can only write it back in 5.x's layout."""
    m = _gemma3_synth(tmp_path, "m", drop=("rope_theta", "rope_local_base_freq", "rope_scaling"),
                      rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                                       "sliding_attention": {"rope_type": "linear", "factor": 3.0}})
    c = reference.Config(H.load_config(m))
    assert (c.local_rope["rope_type"], c.local_rope["rope_theta"], c.rope["rope_theta"]) == ("linear", 10000.0, 5000.0)
    seqs = tokens_for(m, [16, 5], seed=87)
    unscaled = _gemma3_synth(tmp_path, "u", rope_theta=5000.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
    a, b = reference.run(str(m), seqs)[0], reference.run(str(unscaled), seqs)[0]
    assert float(np.max(np.abs(a["model.layers.0.self_attn"] - b["model.layers.0.self_attn"]))) > 1e-4
    assert np.array_equal(a["model.layers.0.self_attn.v_proj"], b["model.layers.0.self_attn.v_proj"])
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


def _gemma3_text_points(tensors):
    """Gemma3ForConditionalGeneration's point names mapped to Gemma3ForCausalLM's."""
    return {k.replace("model.language_model.", "model.", 1): v for k, v in tensors.items()}


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("layout", ["new", "old"])
def test_parity_gemma3_conditional_generation(actcap_bin, tmp_path, layout, tie):
    """A Gemma3ForConditionalGeneration checkpoint (model_type gemma3, text_config, vision tower and
    projector tensors) with the keys transformers >= 4.52 saves (model.language_model.*, lm_head)
    or the Hub's older ones (language_model.model.*, language_model.lm_head): the text model runs,
    the vision tensors are skipped without a warning, the points carry HF's names
    (model.language_model.layers.N..., lm_head), and they equal the text-only model's with the same
    weights, bit for bit."""
    m = _gemma3_synth(tmp_path, "m", multimodal=layout, tie_word_embeddings=tie, seed=88)
    names = set(st.load_checkpoint(str(m)))
    text = "model.language_model." if layout == "new" else "language_model.model."
    assert f"{text}layers.0.self_attn.q_norm.weight" in names
    assert any("vision_tower." in k for k in names) and any("multi_modal_projector." in k for k in names)
    assert (("lm_head.weight" if layout == "new" else "language_model.lm_head.weight") in names) == (not tie)
    seqs = tokens_for(m, [13, 6], seed=89)
    _, got, _ = check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)
    assert "model.language_model.layers.3.self_attn.k_norm" in got and "lm_head" in got
    p = H.actcap("run", m, "--tokens", H.tokens_arg(seqs), "--capture", "lm_head", "--out", tmp_path / "quiet")
    assert p.returncode == 0 and p.stderr.strip() == "", p.stderr
    plain = _gemma3_synth(tmp_path, "plain", tie_word_embeddings=tie, seed=88)
    _, want, _ = H.run_capture(plain, tmp_path / "out-plain", seqs)
    _bit_identical(_gemma3_text_points(got), want)


def test_parity_gemma3_conditional_generation_text_config_defaults(actcap_bin, tmp_path):
    """The text_config of Gemma 3 4B's config.json lists only what differs from Gemma3TextConfig's
    defaults: here num_attention_heads (8), num_key_value_heads (4), head_dim (256),
    query_pre_attn_scalar (256), sliding_window_pattern (6: layer 5 of 7 is global), rope_theta,
    rope_local_base_freq, max_position_embeddings, rms_norm_eps and hidden_activation come from
    them (bf16, old key layout, rope_scaling linear 8 as the 4B)."""
    drop = ("num_attention_heads", "num_key_value_heads", "head_dim", "query_pre_attn_scalar",
            "sliding_window_pattern", "rope_theta", "rope_local_base_freq", "max_position_embeddings",
            "rms_norm_eps", "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping",
            "attention_bias", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
    m = _gemma3_synth(tmp_path, "m", multimodal="old", dtype="bf16", drop=drop, num_hidden_layers=7,
                      sliding_window=5, rope_scaling={"rope_type": "linear", "factor": 8.0})
    text = H.load_config(m)["text_config"]
    assert not set(drop) & set(text)
    c = reference.Config(H.load_config(m))
    assert (c.heads, c.kv_heads, c.head_dim, c.query_pre_attn_scalar) == (8, 4, 256, 256.0)
    assert c.windows == [5, 5, 5, 5, 5, None, 5]
    check_parity(m, tokens_for(m, [12, 8], seed=90), tmp_path / "out", rel_tol=1e-5)


GEMMA3_1B_KEYS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                  "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id",
                  "hidden_activation", "attention_bias", "query_pre_attn_scalar", "sliding_window",
                  "sliding_window_pattern", "attn_logit_softcapping", "final_logit_softcapping",
                  "rope_theta", "rope_local_base_freq", "rope_scaling"]


def test_init_model_gemma3_1b_preset_config(actcap_bin, tmp_path):
    """`init-model --arch gemma3_text --preset gemma-3-1b` describes google/gemma-3-1b-pt."""
    check_preset_config(tmp_path, "gemma3_text", "gemma-3-1b", synth.GEMMA3_1B_CONFIG, GEMMA3_1B_KEYS)
    c = reference.Config(H.load_config(tmp_path / "m"))
    assert [i for i, w in enumerate(c.windows) if w is None] == [5, 11, 17, 23]
    assert c.local_rope == reference.Config(synth.GEMMA3_1B_CONFIG).local_rope


def test_gemma3_multimodal_without_text_weights_is_one_line_exit_2(actcap_bin, tmp_path):
    """A Gemma 3 multimodal checkpoint holding only the vision tower and the projector: one line,
    exit 2, naming the missing text tensor under both layouts' names."""
    m = _gemma3_synth(tmp_path, "m", multimodal="none")
    line = _one_line_exit_2(m, tmp_path)
    assert "missing tensor model.language_model.embed_tokens.weight" in line, line
    assert "language_model.model.embed_tokens.weight" in line and "Gemma3ForConditionalGeneration" in line, line


# Bad input: one line on stderr, exit 2.
# A missing config field, a missing tensor and a wrong tensor shape, for every family:
# tests/integration/test_families.py.
BAD_CONFIGS = {
    "olmo2_kv_heads": ("olmo2", dict(num_key_value_heads=3)),
    "gemma2_null_window": ("gemma2", dict(sliding_window=None)),
    "gemma2_layer_types_length": ("gemma2", dict(layer_types=["full_attention"])),
    "gemma2_bad_softcap": ("gemma2", dict(attn_logit_softcapping=-1.0)),
    "gemma2_activation": ("gemma2", dict(hidden_activation="tanhish")),
    "gemma2_bidirectional": ("gemma2", dict(use_bidirectional_attention=True)),
    "gemma3_missing_hidden_size": ("gemma3_text", dict(hidden_size=None)),
    "gemma3_null_window": ("gemma3_text", dict(sliding_window=None)),
    "gemma3_pattern_zero": ("gemma3_text", dict(sliding_window_pattern=0)),
    "gemma3_layer_types_length": ("gemma3_text", dict(layer_types=["full_attention"])),
    "gemma3_flat_rope_parameters": ("gemma3_text", dict(rope_parameters={"rope_type": "linear", "factor": 2.0})),
    "gemma3_local_base": ("gemma3_text", dict(rope_local_base_freq=-1.0)),
    "gemma3_rope_type": ("gemma3_text", dict(rope_scaling={"rope_type": "su", "factor": 2.0})),
    "gemma3_bidirectional": ("gemma3_text", dict(use_bidirectional_attention=True)),
    "gemma3_heads": ("gemma3_text", dict(num_key_value_heads=3)),
    # transformers 4.x reads a legacy `type` as the rope type, 5.x's merge keeps the entry's default
    "gemma3_legacy_type": ("gemma3_text", dict(rope_scaling={"type": "linear", "factor": 8.0})),
    "gemma_bidirectional": ("gemma", dict(use_bidirectional_attention=True)),
    "gemma_activation": ("gemma", dict(hidden_activation="tanhish")),
    "gemma_kv_default": ("gemma", dict(num_key_value_heads=None)),  # absent: 16, not 4's divisor
    "olmo_clip_zero": ("olmo", dict(clip_qkv=0)),
    "olmo_clip_negative": ("olmo", dict(clip_qkv=-8.0)),
    "olmo_clip_string": ("olmo", dict(clip_qkv="8")),
    "olmoe_clip_negative": ("olmoe", dict(clip_qkv=-1.0)),
    "qwen2_moe_null_window": ("qwen2_moe", dict(use_sliding_window=True, sliding_window=None)),
    "qwen2_moe_null_kv_heads": ("qwen2_moe", dict(num_key_value_heads="null")),
    # DeepSeek-V3: what transformers cannot run (or runs wrong), and an FP8 config over float weights
    "deepseek_v3_kv_default": ("deepseek_v3", dict(num_key_value_heads=None)),  # absent: 128
    "deepseek_v3_kv_heads": ("deepseek_v3", dict(num_key_value_heads=2)),
    "deepseek_v3_head_dim": ("deepseek_v3", dict(head_dim=6)),
    "deepseek_v3_qk_head_dim": ("deepseek_v3", dict(qk_head_dim=12)),
    "deepseek_v3_odd_rope": ("deepseek_v3", dict(qk_rope_head_dim=7)),
    "deepseek_v3_groups": ("deepseek_v3", dict(n_group=3)),
    "deepseek_v3_groups_of_one": ("deepseek_v3", dict(n_group=8)),
    "deepseek_v3_topk_group": ("deepseek_v3", dict(topk_group=5)),
    "deepseek_v3_top_k_beyond_kept": ("deepseek_v3", dict(num_experts_per_tok=5)),
    "deepseek_v3_no_experts": ("deepseek_v3", dict(n_routed_experts=0)),
    "deepseek_v3_fp8": ("deepseek_v3", dict(quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})),
    "deepseek_v3_null_topk_group": ("deepseek_v3", dict(topk_group="null")),
    "deepseek_v3_null_v_head_dim": ("deepseek_v3", dict(v_head_dim="null")),
    "deepseek_v3_no_shared": ("deepseek_v3", dict(n_shared_experts=0)),
    # DeepSeek-V2
    "deepseek_v2_null_shared": ("deepseek_v2", dict(n_shared_experts="null")),
    "deepseek_v2_no_shared": ("deepseek_v2", dict(n_shared_experts=0)),
    "deepseek_v2_top_k_absent": ("deepseek_v2", dict(num_experts_per_tok=None)),
    "deepseek_v2_topk_method": ("deepseek_v2", dict(topk_method="noaux_tc")),
    "deepseek_v2_group_without_n_group": ("deepseek_v2", dict(topk_method="group_limited_greedy",
                                                               n_group="null", topk_group=2)),
    "deepseek_v2_top_k_beyond_kept": ("deepseek_v2", dict(topk_method="group_limited_greedy", n_group=4,
                                                           topk_group=1, num_experts_per_tok=3)),
    "deepseek_v2_kv_heads": ("deepseek_v2", dict(num_key_value_heads=2)),
    "deepseek_v2_fp8": ("deepseek_v2", dict(quantization_config={"quant_method": "fp8"})),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_one_line_exit_2(models, tmp_path, case):
    arch, changes = BAD_CONFIGS[case]
    m = H.copy_model(models(arch), tmp_path / "m")
    cfg = H.load_config(m)
    for k, v in changes.items():
        if v is None and k in ("hidden_size", "num_key_value_heads", "num_experts_per_tok"):
            cfg.pop(k)  # absent (Gemma 3: Gemma3TextConfig's default, which the weights contradict)
        elif v == "null":
            cfg[k] = None
        else:
            cfg[k] = v
    H.save_config(m, cfg)
    p = H.actcap("run", m, "--tokens", "1,2,3", "--capture", "lm_head", "--out", tmp_path / "o")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    assert "config.json" in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------
# tied / untied embeddings, storage dtypes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("arch", ARCHS)
def test_parity_tie_word_embeddings(models, tmp_path, arch, tie):
    m = models(arch, tie=tie)
    cfg = H.load_config(m)
    assert reference.Config(cfg).tie == tie, "config.json does not record --tie-word-embeddings"
    names = set(st.load_checkpoint(str(m)))
    head = "embed_out.weight" if arch == "gpt_neox" else "lm_head.weight"
    assert (head in names) == (not tie), "tied checkpoints store only the embedding"
    check_parity(m, tokens_for(m, [9], seed=6), tmp_path / "out")


@pytest.mark.parametrize("dtype,st_name", [("f16", "F16"), ("bf16", "BF16")])
@pytest.mark.parametrize("arch", ARCHS)
def test_parity_half_precision_checkpoint(models, tmp_path, arch, dtype, st_name):
    m = models(arch, dtype=dtype)
    dts = set(st.dtypes(str(m / "model.safetensors")).values())
    assert dts == {st_name}, f"--dtype {dtype} checkpoint holds {dts}"
    check_parity(m, tokens_for(m, [10], seed=7), tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# padded batch
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_parity_padded_batch(models, tmp_path, arch):
    """3 sequences of lengths 7, 13, 2 in one run: each equals its run alone; rows exact."""
    m = models(arch)
    check_parity(m, tokens_for(m, [7, 13, 2], seed=8), tmp_path / "out")


def test_lm_head_alone_bit_identical(models, tmp_path):
    for arch in ("gpt2", "llama"):
        m = models(arch)
        seqs = tokens_for(m, [5, 9], seed=9)
        _, alone, _ = H.run_capture(m, tmp_path / f"{arch}-alone", seqs, capture=["lm_head"])
        _, full, _ = H.run_capture(m, tmp_path / f"{arch}-all", seqs)
        assert set(alone) == {"lm_head"} | H.ROWS
        assert np.array_equal(alone["lm_head"], full["lm_head"]), (
            f"{arch}: logits differ when captured alone, max diff "
            f"{float(np.max(np.abs(alone['lm_head'] - full['lm_head']))):.3e}")
        assert np.array_equal(alone[H.ROWS_SEQ], full[H.ROWS_SEQ])
        assert np.array_equal(alone[H.ROWS_POS], full[H.ROWS_POS])


def test_capture_patterns(models, tmp_path):
    """`*` = one segment, `**` = any number of segments; `:input` selects input points."""
    m = models("gpt2")
    L = reference.Config(H.load_config(m)).layers
    seqs = tokens_for(m, [4], seed=10)
    cases = [
        (["transformer.h.*"], {f"transformer.h.{i}" for i in range(L)}),
        (["**.c_proj"], {f"transformer.h.{i}.{s}.c_proj" for i in range(L) for s in ("attn", "mlp")}),
        (["transformer.h.*.attn", "lm_head:input"], {f"transformer.h.{i}.attn" for i in range(L)} | {"lm_head:input"}),
        (["**:input"], {k for k in reference.points(str(m)) if k.endswith(":input")}),
        (["**"], {k for k in reference.points(str(m)) if not k.endswith(":input")}),
    ]
    ref = reference.run(str(m), seqs)[0]
    for i, (pats, want) in enumerate(cases):
        _, got, _ = H.run_capture(m, tmp_path / f"o{i}", seqs, capture=pats)
        names = set(got) - H.ROWS
        assert names == want, f"--capture {pats}: extra {sorted(names - want)}, missing {sorted(want - names)}"
        fails = H.compare_points({k: ref[k] for k in want}, got)
        assert not fails, "\n".join(fails)


# ---------------------------------------------------------------------------------------------
# checkpoint variants (rewritten in Python)
# ---------------------------------------------------------------------------------------------

def test_parity_gpt2_unprefixed_with_buffers(models, tmp_path):
    """GPT-2 keys without `transformer.` (as in openai-community/gpt2), plus the attn.bias /
    attn.masked_bias buffers that old HF checkpoints carry (F32 [1,1,P,P] causal mask and F32
    scalar; must be ignored)."""
    src = models("gpt2")
    m = tmp_path / "m"
    m.mkdir()
    cfg = H.load_config(src)
    H.save_config(m, cfg)
    w = st.load_checkpoint(str(src))
    c = reference.Config(cfg)
    P = c.n_positions
    out = {}
    for k, v in w.items():
        out[k[len("transformer."):] if k.startswith("transformer.") else k] = v
    for i in range(c.layers):
        out[f"h.{i}.attn.bias"] = np.tril(np.ones((P, P), dtype=np.float32)).reshape(1, 1, P, P)
        out[f"h.{i}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    st.save(str(m / "model.safetensors"), out, metadata={"format": "pt"})
    assert not any(k.startswith("transformer.") for k in st.load_checkpoint(str(m)))
    check_parity(m, tokens_for(m, [8, 3], seed=11), tmp_path / "out", ref_dir=src)


def test_parity_llama_tied_stored_as_lm_head(models, tmp_path):
    src = models("llama", tie=True)
    m = H.copy_model(src, tmp_path / "m")
    w = st.load_checkpoint(str(m))
    w["lm_head.weight"] = w.pop("model.embed_tokens.weight")
    st.save(str(m / "model.safetensors"), w, metadata={"format": "pt"})
    check_parity(m, tokens_for(m, [9], seed=12), tmp_path / "out", ref_dir=src)


def test_parity_llama_rotary_inv_freq_keys(models, tmp_path):
    src = models("llama")
    m = H.copy_model(src, tmp_path / "m")
    cfg = H.load_config(m)
    c = reference.Config(cfg)
    inv = reference.rope_inv_freq(c.rope, c.head_dim).numpy()
    w = st.load_checkpoint(str(m))
    for i in range(c.layers):
        w[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = inv.copy()
    st.save(str(m / "model.safetensors"), w, metadata={"format": "pt"})
    check_parity(m, tokens_for(m, [9], seed=13), tmp_path / "out", ref_dir=src)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_parity_sharded_checkpoint(models, tmp_path, arch):
    src = models(arch)
    m = H.copy_model(src, tmp_path / "m")
    w = st.load_checkpoint(str(m))
    os.remove(m / "model.safetensors")
    st.save_sharded(str(m), w, n_shards=2)
    with open(m / "model.safetensors.index.json") as f:
        idx = json.load(f)
    assert len(set(idx["weight_map"].values())) == 2 and idx["metadata"]["total_size"] > 0
    check_parity(m, tokens_for(m, [9, 4], seed=14), tmp_path / "out", ref_dir=src)


def llama3_scaling(cfg, theta=500000.0):
    """llama3 rope_scaling whose original_max_position_embeddings puts the wavelengths of this
    model's head_dim in all three regimes of _compute_llama3_parameters (kept / smoothed / divided):
    the band [orig/4, orig] is centred on the second wavelength."""
    c = reference.Config(cfg)
    rope = dict(c.rope, rope_type="default", rope_theta=theta)
    wl = 2 * np.pi / reference.rope_inv_freq(rope, c.head_dim).double().numpy()
    assert len(wl) >= 3, "head_dim too small for a meaningful llama3 test"
    orig = int(round(2 * wl[1]))
    return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": orig}


def _rope_variant(cfg, variant):
    cfg = dict(cfg)
    for k in ("rope_scaling", "rope_parameters"):
        cfg.pop(k, None)
    if variant == "llama3":
        cfg["rope_theta"] = 500000.0
        cfg["rope_scaling"] = llama3_scaling(cfg)
    elif variant == "v5_default":
        theta = 1000.0 if cfg.pop("rope_theta", None) != 1000.0 else 2000.0
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    elif variant == "v5_llama3":
        scaling = llama3_scaling(cfg)
        cfg.pop("rope_theta", None)
        cfg["rope_parameters"] = dict(scaling, rope_theta=500000.0)
    elif variant == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    else:
        raise ValueError(variant)
    return cfg


@pytest.mark.parametrize("variant", ["llama3", "v5_default", "v5_llama3", "linear"])
def test_parity_llama_rope_config_variants(models, tmp_path, variant):
    """rope_theta 500000 + llama3 rope_scaling, transformers-v5 rope_parameters, linear scaling."""
    src = models("llama")
    m = H.copy_model(src, tmp_path / "m")
    cfg = _rope_variant(H.load_config(src), variant)
    H.save_config(m, cfg)
    c = reference.Config(cfg)
    if "llama3" in variant:
        inv = reference.rope_inv_freq(dict(c.rope, rope_type="default"), c.head_dim).double().numpy()
        wl = 2 * np.pi / inv
        o = c.rope["original_max_position_embeddings"]
        assert (wl < o / 4).any() and (wl > o).any() and ((wl >= o / 4) & (wl <= o)).any(), wl
    seqs = tokens_for(m, [16], seed=15)
    if "llama3" in variant:
        # the scaling itself (not just rope_theta) must change the output
        plain = H.copy_model(src, tmp_path / "plain")
        H.save_config(plain, dict(_rope_variant(H.load_config(src), "linear"),
                                  rope_theta=500000.0, rope_scaling=None))
        assert ref_differs(m, plain, seqs), "llama3 scaling has no effect"
    assert ref_differs(m, src, seqs), "variant does not change the output"
    check_parity(m, seqs, tmp_path / "out")


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_parity_explicit_head_dim(actcap_bin, tmp_path, arch):
    """config head_dim (16) != hidden_size / num_attention_heads (8): q/k/v/o shapes follow it."""
    cfg = synth.tiny_config(arch, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16)
    if arch == "mistral":
        cfg["sliding_window"] = 6
    m = tmp_path / "m"
    w = synth.write_checkpoint(str(m), cfg, seed=21)
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (64, 32)
    assert w["model.layers.0.self_attn.o_proj.weight"].shape == (32, 64)
    check_parity(m, tokens_for(m, [11, 5], seed=16), tmp_path / "out")


@pytest.mark.parametrize("arch", ARCHS)
def test_parity_python_written_checkpoint(actcap_bin, tmp_path, arch):
    """A checkpoint written by synth.py (not by actcap), bf16 and untied for variety."""
    cfg = synth.tiny_config(arch, tie_word_embeddings=(arch != "gpt2"))
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=22, dtype="bf16")
    check_parity(m, tokens_for(m, [12, 3], seed=17), tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# points --json
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_points_json_matches_reference(models, arch):
    m = models(arch)
    proc = H.actcap("points", m, "--json", check=True)
    listed = json.loads(proc.stdout)["points"]
    got = {p["name"]: (list(p["shape"]), p["dtype"]) for p in listed}
    assert len(got) == len(listed), "duplicate names in points --json"
    # Attention patterns: [heads, keys], keys 0 in the catalogue (the run's key length); the
    # reference's one-token forward has [heads, 1].
    ref = reference.Model(str(m)).forward([0], patterns=True)
    patterns = {k: [v.shape[1], 0] for k, v in ref.items() if k.endswith((":scores", ":probs"))}
    assert patterns, "the reference records no attention pattern"
    for k, shape in patterns.items():
        assert got.pop(k, None) == (shape, "F32"), k
    want = {k: (shape, dt) for k, (shape, dt) in reference.points(str(m)).items()}
    assert set(got) == set(want), (f"only in actcap: {sorted(set(got) - set(want))}; "
                                   f"only in reference: {sorted(set(want) - set(got))}")
    bad = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not bad, f"shape/dtype mismatches (actcap, reference): {bad}"


# ---------------------------------------------------------------------------------------------
# RoPE dynamic / yarn / longrope and GPT-2's attention options
#
# Each test rewrites config.json of an `actcap init-model` tiny checkpoint (the options change no
# weight shape), checks with the reference that the option changes the output (so an
# implementation ignoring it fails), and requires parity on every point, 1e-5 absolute and 1e-5
# relative to the point's largest value. The figures line (pytest -s) gives the worst differences.
#
# Checked to fail by mutating the C++ temporarily (src/models/parts/rope.cpp, src/models/arch/gpt2.cpp), each
# mutation failing the tests named:
#   - dynamic never recomputed past max_position_embeddings: dynamic_ntk_past_context (3 archs),
#     dynamic_ntk_padded_batch
#   - dynamic recomputed from seq_len - 1 (the largest position, not + 1): the same tests
#   - yarn attention factor dropped (cos/sin unscaled): every yarn test
#   - yarn ramp without truncate's floor/ceil: yarn[v4_defaults-*], yarn[attention_factor]
#   - yarn mscale / mscale_all_dim ignored: yarn[v5_mscale]
#   - longrope always short_factor: longrope_phi3_layout[*-long], longrope_v5
#   - longrope long_factor from seq_len >= original (off by one):
#     longrope_phi3_layout[*-at_original]
#   - longrope attention factor dropped: every longrope test
#   - GPT-2 scores divided by layer_idx instead of layer_idx + 1 (layer 0 by zero), or not by it
#     at all: gpt2_attention_options[by_layer, by_layer_reorder, unscaled_by_layer_reorder]
#   - GPT-2 1 / sqrt(head_dim) applied despite scale_attn_weights false when
#     scale_attn_by_inverse_layer_idx is set: gpt2_attention_options[unscaled_by_layer_reorder]
# reorder_and_upcast_attn alone moves HF's result by float32 rounding only (actcap always computes
# attention that way, docs/hook-points.md): only refusing the option can fail its test.
# ---------------------------------------------------------------------------------------------

def with_config(src, dst, **changes):
    """A copy of checkpoint `src` whose config.json has `changes` (None removes the key)."""
    m = H.copy_model(src, dst)
    cfg = H.load_config(m)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    H.save_config(m, cfg)
    return m


def report(name, worst):
    print(f"figures {name}: max abs diff {worst.get('abs', 0.0):.3e}, "
          f"max diff / max |ref| {worst.get('rel', 0.0):.3e}")


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_parity_dynamic_ntk_past_context(models, tmp_path, arch):
    """Dynamic NTK with max_position_embeddings 32, factor 2: 48 positions run past the trained
    context (HF recomputes inv_freq for seq_len 48); actcap's context is factor * 32 = 64."""
    src = models(arch)
    m = with_config(src, tmp_path / "m", max_position_embeddings=32, rope_parameters=None,
                    rope_scaling={"type": "dynamic", "factor": 2.0})
    plain = with_config(src, tmp_path / "plain", max_position_embeddings=32)
    seqs = tokens_for(m, [48], seed=31)
    assert ref_differs(m, plain, seqs), "dynamic scaling has no effect at 48 positions"
    # within the trained context dynamic is the default RoPE
    short = tokens_for(m, [32], seed=32)
    assert not ref_differs(m, plain, short, min_diff=0.0)
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5, worst=worst)
    check_parity(m, short, tmp_path / "out-short", rel_tol=1e-5, worst=worst)
    report(f"dynamic {arch}", worst)
    too_long = H.actcap("run", m, "--tokens", H.tokens_arg(tokens_for(m, [65], seed=33)),
                        "--capture", "lm_head", "--out", tmp_path / "out-65")
    assert too_long.returncode == 2 and "context is 64 positions" in too_long.stderr, too_long.stderr


def test_parity_dynamic_ntk_padded_batch(models, tmp_path):
    """In a padded batch HF derives the dynamic base from the batch's largest position id, so the
    10-token sequence batched with a 48-token one runs with the 48-position table."""
    m = with_config(models("llama"), tmp_path / "m", max_position_embeddings=32,
                    rope_scaling={"type": "dynamic", "factor": 2.0})
    seqs = tokens_for(m, [48, 10], seed=34)
    alone = reference.run(str(m), seqs[1:])[0]
    batched = reference.run(str(m), seqs[1:], rope_seq_len=48)[0]
    assert max(float(np.max(np.abs(alone[k] - batched[k]))) for k in alone
               if alone[k].dtype == np.float32) > 1e-4
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rope_seq_len=48, rel_tol=1e-5, worst=worst)
    report("dynamic padded batch", worst)


YARN_VARIANTS = {
    # rope_theta 100 and original 64 put the ramp over dims 0..5 of head_dim 16
    "v4_defaults": dict(rope_theta=100.0, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "v5_mscale": dict(rope_theta=None, rope_scaling=None, rope_parameters={
        "rope_type": "yarn", "rope_theta": 100.0, "factor": 8.0,
        "original_max_position_embeddings": 64, "beta_fast": 8, "beta_slow": 0.5,
        "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False}),
    "attention_factor": dict(rope_theta=100.0, original_max_position_embeddings=64, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "attention_factor": 0.8}),
}


@pytest.mark.parametrize("variant,arch", [("v4_defaults", a) for a in LLAMA_FAMILY] +
                         [("v5_mscale", "llama"), ("attention_factor", "qwen2")])
def test_parity_yarn(models, tmp_path, variant, arch):
    """YaRN at 80 positions (> original_max_position_embeddings 64): v4 defaults (beta 32/1,
    truncate, attention factor 0.1 ln(factor) + 1), v5 rope_parameters with beta / mscale /
    mscale_all_dim / truncate false, an explicit attention_factor with the original context at the
    top level."""
    src = models(arch)
    m = with_config(src, tmp_path / "m", **YARN_VARIANTS[variant])
    theta_only = with_config(src, tmp_path / "theta", rope_theta=100.0)
    seqs = tokens_for(m, [80], seed=35)
    assert ref_differs(m, theta_only, seqs), "yarn scaling has no effect"
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5, worst=worst)
    report(f"yarn {variant} {arch}", worst)


SHORT_FACTOR = [1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7]
LONG_FACTOR = [1.1, 1.4, 2.0, 3.0, 4.5, 7.0, 11.0, 16.0]


@pytest.mark.parametrize("regime,lengths", [pytest.param("short", [12, 9], id="short"),
                                            pytest.param("at_original", [16, 5], id="at_original"),
                                            pytest.param("long", [40, 12], id="long")])
@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_parity_longrope_phi3_layout(models, tmp_path, arch, regime, lengths):
    """LongRoPE as Phi-3 writes it: original_max_position_embeddings 16 at the top level,
    max_position_embeddings 64, no factor (so 4, attention factor sqrt(1 + ln 4 / ln 16)).
    Batches up to 16 positions use short_factor, longer ones long_factor for every sequence of
    the batch (the 12-token sequence of the long batch too)."""
    src = models(arch)
    m = with_config(src, tmp_path / "m", max_position_embeddings=64,
                    original_max_position_embeddings=16, rope_scaling={
                        "type": "longrope", "short_factor": SHORT_FACTOR,
                        "long_factor": LONG_FACTOR})
    seqs = tokens_for(m, lengths, seed=36)
    T = max(lengths)
    assert ref_differs(m, src, seqs), "longrope has no effect"
    if regime == "long":  # the long factors matter for the short sequence of the batch
        a = reference.run(str(m), seqs[1:])[0]
        b = reference.run(str(m), seqs[1:], rope_seq_len=T)[0]
        assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a if a[k].dtype == np.float32) > 1e-4
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rope_seq_len=T, rel_tol=1e-5, worst=worst)
    report(f"longrope {regime} {arch}", worst)


def test_parity_longrope_v5(models, tmp_path):
    """rope_parameters with the original context inside, an explicit factor and attention_factor."""
    src = models("llama")
    m = with_config(src, tmp_path / "m", rope_theta=None, rope_scaling=None, rope_parameters={
        "rope_type": "longrope", "rope_theta": 5000.0, "factor": 8.0, "attention_factor": 1.2,
        "original_max_position_embeddings": 16, "short_factor": SHORT_FACTOR,
        "long_factor": LONG_FACTOR})
    seqs = tokens_for(m, [30], seed=37)
    assert ref_differs(m, src, seqs)
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5, worst=worst)
    report("longrope v5", worst)


GPT2_OPTIONS = {
    "by_layer": dict(scale_attn_by_inverse_layer_idx=True),
    "reorder": dict(reorder_and_upcast_attn=True),
    "by_layer_reorder": dict(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True),
    "unscaled_by_layer_reorder": dict(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True,
                                      reorder_and_upcast_attn=True),
}


@pytest.mark.parametrize("option", list(GPT2_OPTIONS))
def test_parity_gpt2_attention_options(models, tmp_path, option):
    """scale_attn_by_inverse_layer_idx (scores / (layer_idx + 1)) and reorder_and_upcast_attn
    (HF's _upcast_and_reordered_attn: float32 baddbmm with the scale folded in), alone and
    together, batched."""
    src = models("gpt2")
    m = with_config(src, tmp_path / "m", **GPT2_OPTIONS[option])
    seqs = tokens_for(m, [14, 5], seed=38)
    if option != "reorder":  # reordering alone changes float32 rounding only
        assert ref_differs(m, src, seqs), f"{option} has no effect"
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5, worst=worst)
    report(f"gpt2 {option}", worst)


# ---------------------------------------------------------------------------------------------
# GPT-NeoX (Pythia): parallel and sequential residual, partial rotary, both config layouts
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_parity_neox_residual(models, tmp_path, parallel):
    """use_parallel_residual true: mlp(ln2(x)) + attn(ln1(x)) + x; false: sequential. The two
    differ (so neither form can pass for the other), and each matches on every point."""
    src = models("gpt_neox")
    assert H.load_config(src)["use_parallel_residual"] is True
    m = with_config(src, tmp_path / "m", use_parallel_residual=parallel)
    seqs = tokens_for(m, [13, 6], seed=40)
    if not parallel:
        assert ref_differs(m, src, seqs), "use_parallel_residual has no effect"
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5, worst=worst)
    report(f"neox parallel={parallel}", worst)


@pytest.mark.parametrize("pct", [0.5, 1.0, 0.125])
def test_parity_neox_rotary_pct(models, tmp_path, pct):
    """rotary_pct: the first int(head_dim * pct) features of q and k rotate (head_dim 16 in the
    tiny preset: 8, 16, 2 of them; the preset's 0.25 rotates 4), the rest pass through."""
    src = models("gpt_neox")
    m = with_config(src, tmp_path / "m", rotary_pct=pct)
    seqs = tokens_for(m, [15], seed=41)
    assert ref_differs(m, src, seqs), f"rotary_pct {pct} has no effect"
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


@pytest.mark.parametrize("rope", ["default", "linear", "dynamic"])
def test_parity_neox_v4_and_v5_configs_identical(models, tmp_path, rope):
    """The same model in transformers 4.x form (rotary_pct, rotary_emb_base, rope_scaling) and
    5.x form (rope_parameters holding rope_theta and partial_rotary_factor, dtype): identical
    shards, and parity with the reference."""
    src = models("gpt_neox")
    extra = {} if rope == "default" else {"factor": 2.0}
    v4 = with_config(src, tmp_path / "v4", rotary_pct=0.5, rotary_emb_base=500.0,
                     rope_scaling=None if rope == "default" else dict(type=rope, **extra))
    cfg = H.load_config(v4)
    for k in ("rotary_pct", "rotary_emb_base", "rope_scaling", "torch_dtype"):
        cfg.pop(k, None)
    cfg["dtype"] = "float32"
    cfg["rope_parameters"] = dict(rope_type=rope, rope_theta=500.0, partial_rotary_factor=0.5, **extra)
    v5 = H.copy_model(src, tmp_path / "v5")
    H.save_config(v5, cfg)
    seqs = tokens_for(src, [20 if rope != "dynamic" else 300], seed=42)
    assert ref_differs(v4, src, seqs)
    _, a, _ = check_parity(v4, seqs, tmp_path / "o4")
    _, b, _ = check_parity(v5, seqs, tmp_path / "o5")
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bias", [True, False], ids=["attention_bias", "no_attention_bias"])
def test_parity_neox_python_written(actcap_bin, tmp_path, bias):
    """A synth.py checkpoint (rotary_pct 0.5, untied), with and without attention biases; its
    head stored as embed_out.weight."""
    cfg = synth.tiny_config("gpt_neox", attention_bias=bias)
    m = tmp_path / "m"
    w = synth.write_checkpoint(str(m), cfg, seed=23)
    assert ("gpt_neox.layers.0.attention.dense.bias" in w) == bias
    assert "gpt_neox.layers.0.mlp.dense_h_to_4h.bias" in w
    check_parity(m, tokens_for(m, [12, 4], seed=43), tmp_path / "out")


def test_parity_neox_head_stored_as_lm_head(models, tmp_path):
    """Newer transformers name the head lm_head: a checkpoint storing lm_head.weight loads; the
    point keeps HF's classic name embed_out."""
    src = models("gpt_neox")
    m = H.copy_model(src, tmp_path / "m")
    tensors = st.load_checkpoint(str(m))
    tensors["lm_head.weight"] = tensors.pop("embed_out.weight")
    os.remove(m / "model.safetensors")
    st.save(str(m / "model.safetensors"), tensors, metadata={"format": "pt"})
    _, got, _ = check_parity(m, tokens_for(m, [9], seed=44), tmp_path / "out")
    assert "embed_out" in got and "lm_head" not in got


# EleutherAI/pythia-160m's config.json (transformers 4.24 layout).
# EleutherAI/pythia-160m's config.json (huggingface.co/EleutherAI/pythia-160m/blob/main/config.json,
# transformers 4.24.0; torch_dtype float16 there, init-model's --dtype here).
PYTHIA_160M_CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu", "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "model_type": "gpt_neox",
    "num_attention_heads": 12, "num_hidden_layers": 12, "rotary_emb_base": 10000, "rotary_pct": 0.25,
    "tie_word_embeddings": False, "use_cache": True, "use_parallel_residual": True,
    "vocab_size": 50304,
}


def test_init_model_pythia_160m_preset_config(actcap_bin, tmp_path):
    """`init-model --arch gpt_neox --preset pythia-160m --config-only` describes pythia-160m."""
    out = tmp_path / "p"
    H.actcap("init-model", "--arch", "gpt_neox", "--preset", "pythia-160m", "--seed", 0,
             "--config-only", "--out", out, check=True)
    assert not (out / "model.safetensors").exists(), "--config-only wrote weights"
    cfg = H.load_config(out)
    bad = {k: (cfg.get(k), v) for k, v in PYTHIA_160M_CONFIG.items()
           if k not in ("use_cache",) and cfg.get(k) != v}
    assert not bad, f"(init-model, pythia-160m): {bad}"
    c, r = reference.Config(cfg), reference.Config(PYTHIA_160M_CONFIG)
    assert (c.rope, c.parallel, c.attention_bias) == (r.rope, r.parallel, r.attention_bias)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)


def _one_line_exit_2(model, tmp_path):
    p = H.actcap("run", model, "--tokens", "1,2,3", "--capture", "**", "--out", tmp_path / "o")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("actcap: error: "), (
        p.returncode, p.stderr)
    return lines[0]


NEOX_BAD_CONFIGS = {
    "rotary_pct_odd": (dict(rotary_pct=0.1), "rotary_pct"),
    "rotary_pct_zero": (dict(rotary_pct=0.0), "rotary_pct"),
    "heads_not_dividing": (dict(num_attention_heads=5), "num_attention_heads"),
    "parallel_not_bool": (dict(use_parallel_residual="yes"), "use_parallel_residual"),
    "unknown_act": (dict(hidden_act="gelu_erf"), "hidden_act"),
}


# ---------------------------------------------------------------------------------------------
# GPT-J: interleaved rotary pairs on part of each head, one norm for both sublayers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rotary_dim", [2, 16])
def test_parity_gptj_rotary_dim(models, tmp_path, rotary_dim):
    """The tiny preset rotates 8 of 16 features; one pair and the whole head match too, and the
    rotated width changes the output."""
    src = models("gptj")
    assert H.load_config(src)["rotary_dim"] == 8
    m = with_config(src, tmp_path / "m", rotary_dim=rotary_dim)
    seqs = tokens_for(src, [14, 6], seed=61)
    assert ref_differs(src, m, seqs), f"rotary_dim {rotary_dim} changed nothing"
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


def test_parity_gptj_one_head_null_rotary_dim(actcap_bin, tmp_path):
    """rotary_dim null with one head: transformers rotates the whole head (its n_embd-wide tables
    fit it); so does actcap."""
    cfg = synth.tiny_config("gptj", n_head=1, rotary_dim=None)
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=4)
    full = tmp_path / "full"
    synth.write_checkpoint(str(full), synth.tiny_config("gptj", n_head=1, rotary_dim=32), seed=4)
    seqs = [[5, 9, 200, 17, 3, 3, 81]]
    _, got, _ = check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)
    _, got_full, _ = check_parity(full, seqs, tmp_path / "out_full", rel_tol=1e-5)
    assert np.array_equal(got["lm_head"], got_full["lm_head"])


GPTJ_BAD_CONFIGS = {
    "rotary_dim_odd": (dict(rotary_dim=5), "rotary_dim"),
    "rotary_dim_zero": (dict(rotary_dim=0), "rotary_dim"),
    "rotary_dim_wider_than_head": (dict(rotary_dim=18), "rotary_dim"),
    "rotary_dim_null_many_heads": (dict(rotary_dim="null"), "rotary_dim"),
    "heads_not_dividing": (dict(n_head=5), "n_head"),
    "unknown_act": (dict(activation_function="gelu_erf"), "activation_function"),
    "n_inner_zero": (dict(n_inner=0), "n_inner"),
}


def test_init_model_gpt_j_6b_preset_config(actcap_bin, tmp_path):
    """`init-model --arch gptj --preset gpt-j-6b --config-only`: GPTJConfig's defaults, which are
    EleutherAI/gpt-j-6B's sizes, as the reference resolves a config with no size fields."""
    out = tmp_path / "g"
    H.actcap("init-model", "--arch", "gptj", "--preset", "gpt-j-6b", "--seed", 0, "--config-only",
             "--out", out, check=True)
    cfg = H.load_config(out)
    assert cfg["model_type"] == "gptj" and cfg["architectures"] == ["GPTJForCausalLM"]
    c, r = reference.Config(cfg), reference.Config({"model_type": "gptj"})
    assert (c.hidden, c.layers, c.heads, c.inner, c.rotary_dim, c.n_positions, c.vocab_size, c.tie) == \
        (r.hidden, r.layers, r.heads, r.inner, r.rotary_dim, r.n_positions, r.vocab_size, r.tie) == \
        (4096, 28, 16, 16384, 64, 2048, 50400, False)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)


# ---------------------------------------------------------------------------------------------
# config.json naming a size twice: the attribute_map alias wins, as transformers sets it last
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,field,alias", [("gpt2", "n_head", "num_attention_heads"),
                                              ("gptj", "n_head", "num_attention_heads"),
                                              ("gpt_neo", "num_heads", "num_attention_heads"),
                                              ("olmoe", "num_experts", "num_local_experts")])
def test_parity_config_alias_wins(models, tmp_path, arch, field, alias):
    """A config.json with a field and its attribute_map alias set to different values is the model
    of the alias's value (test_transformers_parity checks that transformers reads it so). Head
    counts change no tensor's shape, so reading the field would be silently another model; OLMoE's
    expert count names the tensors (num_experts is doubled: only the alias's count loads)."""
    src = models(arch)
    n = H.load_config(src)[field]
    m = with_config(src, tmp_path / "m", **{field: 2 * n, alias: n} if arch == "olmoe" else
                    {field: n, alias: n // 2})
    seqs = tokens_for(src, [11, 5], seed=89)
    if arch != "olmoe":
        assert ref_differs(src, m, seqs), f"{alias} changed nothing"
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


# ---------------------------------------------------------------------------------------------
# GPT-Neo: global and local (windowed) layers, unscaled scores, learned positions
# ---------------------------------------------------------------------------------------------

def test_parity_gpt_neo_local_layers_and_window(models, tmp_path):
    """The tiny preset alternates global and local layers with an 8-key window, shorter than the
    sequence: the window changes the output and matches; so does a 3-key window with other types (a
    count of 0 adds no layer, as in transformers).
    With only attention_types or only attention_layers (which transformers sets over the
    expansion) the model is the same; a window as long as the sequence makes a local layer global,
    bit for bit."""
    src = models("gpt_neo")
    cfg = H.load_config(src)
    assert cfg["window_size"] == 8 and cfg["attention_layers"] == ["global", "local"] * 2
    seqs = tokens_for(src, [14, 6], seed=83)
    _, a, _ = check_parity(src, seqs, tmp_path / "o_src", rel_tol=1e-5)
    for only in (dict(attention_layers=None), dict(attention_types=None)):
        m = with_config(src, tmp_path / f"only_{len(only)}_{list(only)[0]}", **only)
        _, b, _ = check_parity(m, seqs, tmp_path / f"o_{m.name}", rel_tol=1e-5)
        assert all(np.array_equal(a[k], b[k]) for k in a), only
    all_global = with_config(src, tmp_path / "global", attention_layers=None,
                             attention_types=[[["global"], 4]])
    assert ref_differs(src, all_global, seqs), "the local layers' window changed nothing"
    wide = with_config(src, tmp_path / "wide", window_size=14)
    _, g, _ = check_parity(all_global, seqs, tmp_path / "o_global", rel_tol=1e-5)
    _, w, _ = check_parity(wide, seqs, tmp_path / "o_wide", rel_tol=1e-5)
    assert all(np.array_equal(g[k], w[k]) for k in g)
    narrow = with_config(src, tmp_path / "narrow", window_size=3, attention_layers=None,
                         attention_types=[[["global"], 0], [["local"], 1], [["local", "global"], 1],
                                          [["local"], 1]])
    assert ref_differs(src, narrow, seqs)
    check_parity(narrow, seqs, tmp_path / "o_narrow", rel_tol=1e-5)


GPT_NEO_BAD_CONFIGS = {
    "types_too_few_layers": (dict(attention_layers=None, attention_types=[[["global", "local"], 1]]),
                             "attention_types"),
    "types_unknown": (dict(attention_layers=None, attention_types=[[["global", "sliding"], 2]]),
                      "sliding"),
    "types_malformed": (dict(attention_layers=None, attention_types=[["global", 4]]), "attention_types"),
    "types_negative_count": (dict(attention_layers=None, attention_types=[[["global"], -1], [["local"], 4]]),
                             "attention_types"),
    "types_huge_count": (dict(attention_layers=None, attention_types=[[["global", "local"], 10 ** 12]]),
                         "attention_types"),
    "layers_disagree": (dict(attention_layers=["global"] * 4), "attention_layers"),
    "window_zero": (dict(window_size=0), "window_size"),
    "heads_not_dividing": (dict(num_heads=5), "num_heads"),
    "unknown_act": (dict(activation_function="gelu_erf"), "activation_function"),
    "intermediate_zero": (dict(intermediate_size=0), "intermediate_size"),
}


# EleutherAI/gpt-neo-125M's and roneneldan/TinyStories-33M's config.json, as public repositories
# quote them (the fields that describe the model; no network to the Hub here).
GPT_NEO_125M_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPTNeoForCausalLM"],
    "attention_layers": ["global", "local"] * 6, "attention_types": [[["global", "local"], 6]],
    "bos_token_id": 50256, "eos_token_id": 50256, "hidden_size": 768, "intermediate_size": None,
    "layer_norm_epsilon": 1e-05, "max_position_embeddings": 2048, "model_type": "gpt_neo",
    "num_heads": 12, "num_layers": 12, "vocab_size": 50257, "window_size": 256,
}
TINYSTORIES_33M_CONFIG = dict(GPT_NEO_125M_CONFIG, num_heads=16, num_layers=4,
                              attention_layers=["global", "local"] * 2,
                              attention_types=[[["global", "local"], 2]])


@pytest.mark.parametrize("preset,want", [("gpt-neo-125m", GPT_NEO_125M_CONFIG),
                                         ("tinystories-33m", TINYSTORIES_33M_CONFIG)])
def test_init_model_gpt_neo_preset_configs(actcap_bin, tmp_path, preset, want):
    """`init-model --arch gpt_neo --preset P --config-only` describes the released model: every
    field above equal, and the reference resolves both to the same model (tied, local odd layers)."""
    out = tmp_path / "g"
    H.actcap("init-model", "--arch", "gpt_neo", "--preset", preset, "--seed", 0, "--config-only",
             "--out", out, check=True)
    cfg = H.load_config(out)
    bad = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
    assert not bad, f"(init-model, {preset}): {bad}"
    c, r = reference.Config(cfg), reference.Config(want)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)
    assert c.windows == r.windows == [None, 256] * (c.layers // 2) and c.tie and c.inner == 3072


# ---------------------------------------------------------------------------------------------
# OPT: pre- or post-norm layers, narrower embeddings, positions at an offset
# ---------------------------------------------------------------------------------------------

OPT_FORMS = {
    # the synth model: pre-norm, 24-wide embeddings projected in and out of 32, tied
    "pre-norm-projected": {},
    # opt-350m's form: post-norm, no final LayerNorm; here without biases or LayerNorm weights
    "post-norm-plain": dict(do_layer_norm_before=False, word_embed_proj_dim=None, enable_bias=False,
                            layer_norm_elementwise_affine=False, tie_word_embeddings=False),
    "post-norm-projected": dict(do_layer_norm_before=False),
    "no-final-norm-gelu": dict(_remove_final_layer_norm=True, word_embed_proj_dim=None,
                               activation_function="gelu"),
}


@pytest.mark.parametrize("form", list(OPT_FORMS))
def test_parity_opt_layer_forms(actcap_bin, tmp_path, form):
    """Each form of OPT's layers and embeddings (checkpoints written from Python, so each holds
    exactly the tensors its form has) matches the reference on a padded batch."""
    cfg = synth.tiny_config("opt", **OPT_FORMS[form])
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=7)
    check_parity(m, tokens_for(m, [13, 5, 9], seed=97), tmp_path / "out", rel_tol=1e-5)


def test_parity_opt_hub_names_without_model_prefix(actcap_bin, tmp_path):
    """The Hub's OPT files were saved from OPTModel: `decoder.layers.0...` without `model.`. They
    load, and capture exactly what the prefixed names do."""
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), synth.tiny_config("opt", tie_word_embeddings=False), seed=8)
    hub = H.copy_model(m, tmp_path / "hub")
    path = os.path.join(hub, "model.safetensors")
    tensors, _ = st.load(path)
    renamed = {(k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}
    assert any(k.startswith("decoder.layers.") for k in renamed)
    st.save(path, renamed)
    seqs = tokens_for(m, [10, 4], seed=98)
    _, a, _ = check_parity(m, seqs, tmp_path / "o_m", rel_tol=1e-5)
    _, b, _ = check_parity(hub, seqs, tmp_path / "o_hub", rel_tol=1e-5)
    assert all(np.array_equal(a[k], b[k]) for k in a)


OPT_BAD_CONFIGS = {
    "heads_not_dividing": (dict(num_attention_heads=5), "num_attention_heads"),
    "ffn_dim_zero": (dict(ffn_dim=0), "ffn_dim"),
    "proj_dim_zero": (dict(word_embed_proj_dim=0), "word_embed_proj_dim"),
    "norm_before_not_bool": (dict(do_layer_norm_before="yes"), "do_layer_norm_before"),
    "unknown_act": (dict(activation_function="gelu_erf"), "activation_function"),
}


# facebook/opt-125m's and opt-350m's config.json, as public repositories quote them (the fields
# that describe the model).
OPT_125M_CONFIG = {
    "activation_function": "relu", "architectures": ["OPTForCausalLM"], "bos_token_id": 2,
    "do_layer_norm_before": True, "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768,
    "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 1, "vocab_size": 50272, "word_embed_proj_dim": 768,
}
OPT_350M_CONFIG = dict(OPT_125M_CONFIG, do_layer_norm_before=False, ffn_dim=4096, hidden_size=1024,
                       num_attention_heads=16, num_hidden_layers=24, word_embed_proj_dim=512)


@pytest.mark.parametrize("preset,want", [("opt-125m", OPT_125M_CONFIG), ("opt-350m", OPT_350M_CONFIG)])
def test_init_model_opt_preset_configs(actcap_bin, tmp_path, preset, want):
    """`init-model --arch opt --preset P --config-only` describes the released model: every field
    above equal, and the reference resolves both to the same model."""
    out = tmp_path / "o"
    H.actcap("init-model", "--arch", "opt", "--preset", preset, "--seed", 0, "--config-only",
             "--out", out, check=True)
    cfg = H.load_config(out)
    bad = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
    assert not bad, f"(init-model, {preset}): {bad}"
    c, r = reference.Config(cfg), reference.Config(want)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)
    assert (c.pre_norm, c.final_norm, c.proj_dim, c.tie) == (r.pre_norm, r.final_norm, r.proj_dim, r.tie)


# ---------------------------------------------------------------------------------------------
# Phi (1, 1.5, 2): biased q/k/v/dense, partial rotary, one norm for both sublayers
# ---------------------------------------------------------------------------------------------

def test_parity_phi_rotary_factor_where_each_transformers_puts_it(models, tmp_path):
    """partial_rotary_factor at the top level (Phi-2's config.json), inside rope_parameters
    (transformers 5), or absent (PhiConfig's 0.5): the same model where the factors agree, and the
    factor changes the output."""
    src = models("phi")
    cfg = H.load_config(src)
    assert cfg["partial_rotary_factor"] == 0.5
    seqs = tokens_for(src, [13, 4], seed=71)
    v5 = with_config(src, tmp_path / "v5", partial_rotary_factor=None, rope_scaling=None,
                     rope_parameters=dict(rope_type="default", rope_theta=cfg["rope_theta"],
                                          partial_rotary_factor=0.5))
    absent = with_config(src, tmp_path / "absent", partial_rotary_factor=None)
    quarter = with_config(src, tmp_path / "quarter", partial_rotary_factor=0.25)
    assert ref_differs(src, quarter, seqs), "partial_rotary_factor changed nothing"
    _, a, _ = check_parity(src, seqs, tmp_path / "o_src", rel_tol=1e-5)
    for m in (v5, absent):
        _, b, _ = check_parity(m, seqs, tmp_path / f"o_{m.name}", rel_tol=1e-5)
        assert all(np.array_equal(a[k], b[k]) for k in a), m.name
    check_parity(quarter, seqs, tmp_path / "o_quarter", rel_tol=1e-5)


PHI_BAD_CONFIGS = {
    "qk_layernorm": (dict(qk_layernorm=True), "qk_layernorm"),
    "rotary_factor_odd": (dict(partial_rotary_factor=0.2), "partial_rotary_factor"),  # 3 of 16
    "rotary_factor_above_one": (dict(partial_rotary_factor=1.5), "partial_rotary_factor"),
    "kv_heads_not_dividing": (dict(num_key_value_heads=3), "num_key_value_heads"),
    "unknown_act": (dict(hidden_act="gelu_erf"), "hidden_act"),
}


# microsoft/phi-2's config.json (transformers 4.37.0 layout; torch_dtype float16 there), as public
# repositories quote it (no network to the Hub here): the architecture fields.
PHI_2_CONFIG = {
    "architectures": ["PhiForCausalLM"], "bos_token_id": 50256, "eos_token_id": 50256,
    "hidden_act": "gelu_new", "hidden_size": 2560, "intermediate_size": 10240,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "model_type": "phi",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "partial_rotary_factor": 0.4, "qk_layernorm": False, "rope_scaling": None, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "vocab_size": 51200,
}


def test_init_model_phi_2_preset_config(actcap_bin, tmp_path):
    """`init-model --arch phi --preset phi-2 --config-only` describes microsoft/phi-2: every field
    above equal, and the reference resolves both to the same model (32 of each head's 80 features
    rotated)."""
    out = tmp_path / "p"
    H.actcap("init-model", "--arch", "phi", "--preset", "phi-2", "--seed", 0, "--config-only",
             "--out", out, check=True)
    cfg = H.load_config(out)
    bad = {k: (cfg.get(k), v) for k, v in PHI_2_CONFIG.items() if cfg.get(k) != v}
    assert not bad, f"(init-model, phi-2): {bad}"
    c, r = reference.Config(cfg), reference.Config(PHI_2_CONFIG)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)
    assert c.rope == r.rope and reference._rope_dim(c.rope, c.head_dim) == 32 and c.head_dim == 80


# ---------------------------------------------------------------------------------------------
# Phi-3: fused qkv_proj / gate_up_proj, sliding window, longrope around the switch, partial rotary
# ---------------------------------------------------------------------------------------------

def test_parity_phi3_sliding_window(models, tmp_path):
    """The tiny preset's window (8) is shorter than the sequence: it changes the output, on every
    layer, and matches; GQA (2 kv heads for 4) through the fused qkv_proj rows."""
    src = models("phi3")
    cfg = H.load_config(src)
    assert cfg["sliding_window"] == 8 and cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    nowin = with_config(src, tmp_path / "nowin", sliding_window=None)
    nowin_cfg = H.load_config(nowin)
    nowin_cfg["sliding_window"] = None
    H.save_config(nowin, nowin_cfg)
    seqs = tokens_for(src, [20, 5], seed=50)
    assert ref_differs(src, nowin, seqs), "the sliding window has no effect"
    check_parity(src, seqs, tmp_path / "o1", rel_tol=1e-5)
    check_parity(nowin, seqs, tmp_path / "o2", rel_tol=1e-5)


PHI3_SHORT = [1.0, 1.05, 1.2, 1.5]
PHI3_LONG = [1.3, 2.5, 6.0, 13.0]


@pytest.mark.parametrize("regime,lengths", [pytest.param("below", [16, 9], id="below"),
                                            pytest.param("above", [17, 6], id="above"),
                                            pytest.param("far_above", [40, 12], id="far_above")])
@pytest.mark.parametrize("legacy", ["longrope", "su", "yarn"])
def test_parity_phi3_longrope(models, tmp_path, regime, lengths, legacy):
    """Phi-3's layout: original_max_position_embeddings 16 at the top level, max 64, rope_scaling
    with short/long factors only (factor 4, attention factor sqrt(1 + ln 4 / ln 16)), and
    partial_rotary_factor 0.5 (head_dim 16: 8 rotary dims, 4 factors). A batch up to 16 positions
    uses short_factor, a longer one long_factor for all its sequences. `su` and `yarn` are the
    legacy names Phi3Config reads as longrope."""
    src = models("phi3")
    m = with_config(src, tmp_path / "m", max_position_embeddings=64, original_max_position_embeddings=16,
                    partial_rotary_factor=0.5, sliding_window=None,
                    rope_scaling={"type": legacy, "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG})
    cfg = H.load_config(m)
    cfg["sliding_window"] = None
    H.save_config(m, cfg)
    seqs = tokens_for(m, lengths, seed=51)
    T = max(lengths)
    if legacy == "longrope":
        assert ref_differs(m, src, seqs), "longrope has no effect"
        if regime != "below":  # the long factors reach the short sequence of the batch
            a = reference.run(str(m), seqs[1:])[0]
            b = reference.run(str(m), seqs[1:], rope_seq_len=T)[0]
            assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a if a[k].dtype == np.float32) > 1e-4
    worst = {}
    check_parity(m, seqs, tmp_path / "out", rope_seq_len=T, rel_tol=1e-5, worst=worst)
    report(f"phi3 longrope {legacy} {regime}", worst)


def test_parity_phi3_v4_and_v5_configs_identical(models, tmp_path):
    """The same longrope model as transformers 4.x (top-level rope_theta, partial_rotary_factor,
    rope_scaling) and 5.x (rope_parameters holding all of them, dtype) writes it: identical shards."""
    src = models("phi3")
    v4 = with_config(src, tmp_path / "v4", max_position_embeddings=64, original_max_position_embeddings=16,
                     partial_rotary_factor=0.5, rope_theta=2000.0,
                     rope_scaling={"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG})
    cfg = H.load_config(v4)
    for k in ("rope_theta", "rope_scaling", "partial_rotary_factor", "original_max_position_embeddings",
              "torch_dtype"):
        cfg.pop(k, None)
    cfg["dtype"] = "float32"
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 2000.0, "partial_rotary_factor": 0.5,
                              "original_max_position_embeddings": 16, "short_factor": PHI3_SHORT,
                              "long_factor": PHI3_LONG}
    v5 = H.copy_model(src, tmp_path / "v5")
    H.save_config(v5, cfg)
    seqs = tokens_for(src, [30], seed=52)
    _, a, _ = check_parity(v4, seqs, tmp_path / "o4")
    _, b, _ = check_parity(v5, seqs, tmp_path / "o5")
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_parity_phi3_python_written_defaults(actcap_bin, tmp_path):
    """A synth.py checkpoint leaving out num_key_value_heads, original_max_position_embeddings and
    rms_norm_eps (Phi3Config's defaults: num_attention_heads, 4096, 1e-5)."""
    cfg = synth.tiny_config("phi3")
    for k in ("num_key_value_heads", "original_max_position_embeddings", "rms_norm_eps"):
        del cfg[k]
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=24, dtype="f16")
    check_parity(m, tokens_for(m, [10, 3], seed=53), tmp_path / "out")


# microsoft/Phi-3-mini-4k-instruct's config.json (transformers 4.40 layout).
# microsoft/Phi-3-mini-4k-instruct's config.json as first released (904 bytes, transformers 4.39.3;
# quoted whole by a duplicate of the repository and by fine-tunes' configs). Left out: auto_map,
# pad_token_id 32000 (actcap keeps no pad id), torch_dtype (bfloat16 there), use_cache.
PHI3_MINI_CONFIG = {
    "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0,
    "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
    "vocab_size": 32064,
}


def test_init_model_phi3_mini_preset_config(actcap_bin, tmp_path):
    out = tmp_path / "p"
    H.actcap("init-model", "--arch", "phi3", "--preset", "phi-3-mini", "--seed", 0, "--config-only",
             "--out", out, check=True)
    assert not (out / "model.safetensors").exists(), "--config-only wrote weights"
    cfg = H.load_config(out)
    bad = {k: (cfg.get(k), v) for k, v in PHI3_MINI_CONFIG.items() if cfg.get(k) != v}
    assert not bad, f"(init-model, Phi-3-mini): {bad}"
    c, r = reference.Config(cfg), reference.Config(PHI3_MINI_CONFIG)
    assert (c.rope, c.windows) == (r.rope, r.windows)
    assert reference.expected_shapes(c) == reference.expected_shapes(r)


PHI3_BAD_CONFIGS = {
    "rope_llama3": (dict(rope_scaling={"rope_type": "llama3", "factor": 2.0}), "rope"),
    "short_factor_length": (dict(rope_scaling={"type": "longrope", "short_factor": [1.0, 1.0],
                                               "long_factor": PHI3_LONG}, partial_rotary_factor=0.5),
                            "short_factor"),
    "long_factor_missing": (dict(rope_scaling={"type": "su", "short_factor": PHI3_SHORT},
                                 partial_rotary_factor=0.5), "long_factor"),
    "partial_odd": (dict(partial_rotary_factor=0.1), "partial_rotary_factor"),
    "kv_heads": (dict(num_key_value_heads=3), "num_key_value_heads"),
}


# Per architecture: a config.json change (None removes a field, "null" writes null) and a word
# the one-line error must hold.
OLMO3_BAD_CONFIGS = {
    "types_too_few": (dict(layer_types=["full_attention"] * 3), "layer_types"),
    "types_unknown": (dict(layer_types=["sliding_attention"] * 3 + ["chunked_attention"]), "chunked_attention"),
    "types_not_list": (dict(layer_types="full_attention"), "layer_types"),
    "window_null": (dict(sliding_window="null"), "sliding_window"),
    "window_null_no_sliding_layer": (dict(sliding_window="null", layer_types=["full_attention"] * 4),
                                     "sliding_window"),
    "window_zero": (dict(sliding_window=0), "sliding_window"),
    "heads_not_dividing": (dict(num_key_value_heads=3), "num_key_value_heads"),
}


SMOLLM3_BAD_CONFIGS = {
    "no_rope_too_few": (dict(no_rope_layers=[1, 1, 0]), "no_rope_layers"),
    "no_rope_value": (dict(no_rope_layers=[1, 2, 1, 0]), "no_rope_layers"),
    "no_rope_not_list": (dict(no_rope_layers=1), "no_rope_layers"),
    "interval_zero": (dict(no_rope_layer_interval=0), "no_rope_layer_interval"),
    "sliding_layer_null_window": (dict(layer_types=["sliding_attention"] + ["full_attention"] * 3), "sliding_window"),
    "types_unknown": (dict(layer_types=["chunked_attention"] * 4), "chunked_attention"),
    "kv_default_not_dividing": (dict(num_attention_heads=2, num_key_value_heads=None), "SmolLM3Config"),
}


ARCH_BAD_CONFIGS = {"gpt_neox": NEOX_BAD_CONFIGS, "gptj": GPTJ_BAD_CONFIGS, "gpt_neo": GPT_NEO_BAD_CONFIGS,
                    "opt": OPT_BAD_CONFIGS, "phi": PHI_BAD_CONFIGS, "phi3": PHI3_BAD_CONFIGS,
                    "olmo3": OLMO3_BAD_CONFIGS, "smollm3": SMOLLM3_BAD_CONFIGS}


@pytest.mark.parametrize("arch,case", [(a, c) for a, cases in ARCH_BAD_CONFIGS.items() for c in cases])
def test_arch_bad_config_is_one_line_exit_2(models, tmp_path, arch, case):
    changes, needle = ARCH_BAD_CONFIGS[arch][case]
    m = with_config(models(arch), tmp_path / "m",
                    **{k: v for k, v in changes.items() if not (isinstance(v, str) and v == "null")})
    nulls = [k for k, v in changes.items() if isinstance(v, str) and v == "null"]
    if nulls:
        cfg = H.load_config(m)
        cfg.update(dict.fromkeys(nulls))
        H.save_config(m, cfg)
    assert needle in _one_line_exit_2(m, tmp_path)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "deepseek_v2"])
def test_moe_stacked_experts_layout_runs_the_same_model(models, tmp_path, arch):
    """transformers 5's own layout (save_pretrained(save_original_format=False)): the router under
    `mlp.gate`, each layer's experts stacked as `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows,
    then up rows) and `mlp.experts.down_proj` [E, H, I]. The same weights rewritten so give every
    hook point bit for bit what the Hub layout gives."""
    src = models(arch)
    tensors, meta = st.load(str(src / "model.safetensors"))
    block = "block_sparse_moe" if arch == "mixtral" else "mlp"
    names = ("w1", "w3", "w2") if arch == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    cfg = reference.Config(reference.load_config(str(src)))
    stacked = {}
    for i in range(cfg.layers):
        if not cfg.sparse[i]:
            continue
        p = f"model.layers.{i}.{block}"
        e = lambda j, n: tensors.pop(f"{p}.experts.{j}.{n}.weight")  # noqa: E731
        gate_up = [np.concatenate([e(j, names[0]), e(j, names[1])]) for j in range(cfg.experts)]
        stacked[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(gate_up)
        stacked[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack(
            [e(j, names[2]) for j in range(cfg.experts)])
        stacked[f"model.layers.{i}.mlp.gate.weight"] = tensors.pop(f"{p}.gate.weight")
    assert stacked and not any(".experts." in k for k in tensors)
    m = H.copy_model(src, tmp_path / "stacked")
    st.save(str(m / "model.safetensors"), {**tensors, **stacked}, metadata=meta)
    seqs = tokens_for(src, [9, 5], seed=61)
    _, a, _ = H.run_capture(src, tmp_path / "hub", seqs)
    _, b, _ = H.run_capture(m, tmp_path / "v5", seqs)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a), \
        [k for k in a if not np.array_equal(a[k], b[k])][:5]


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3: latent attention, grouped sigmoid routing, shared experts
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", sorted(synth.DEEPSEEK_V3_VARIANTS))
def test_deepseek_v3_variants_match_the_reference(actcap_bin, tmp_path, variant):
    """synth.py's DeepSeek-V3 checkpoints (the Hub's layout, values narrower than queries, routing
    biases that change the chosen experts): q_proj or the q bottleneck, interleaved or rotate-half
    RoPE, YaRN whose mscale_all_dim scales the softmax, biases, unnormalised weights, every expert
    of the kept groups chosen, one group. Every point of a two-sequence batch."""
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), synth.tiny_config("deepseek_v3", **synth.DEEPSEEK_V3_VARIANTS[variant]),
                           seed=11)
    check_parity(m, tokens_for(m, [11, 6], seed=12), tmp_path / "out", rel_tol=1e-5)


# synth.py's DeepSeek-V2 variants actcap runs (the other two it refuses: a zero-width shared MLP,
# and more experts per token than the kept groups hold)
DEEPSEEK_V2_RUN = sorted(set(synth.DEEPSEEK_V2_VARIANTS) - {"no_shared", "group_k_over_kept"})


@pytest.mark.parametrize("variant", DEEPSEEK_V2_RUN)
def test_deepseek_v2_variants_match_the_reference(actcap_bin, tmp_path, variant):
    """synth.py's DeepSeek-V2 checkpoints (V2-Lite's plain q_proj and greedy routing, V2's q
    bottleneck and group-limited routing, YaRN with the softmax's mscale, biases): every point of
    a two-sequence batch within 1e-5 (the complex RoPE's last-bit rounding is checked against
    transformers itself, test_transformers_parity.py)."""
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), synth.tiny_config("deepseek_v2", **synth.DEEPSEEK_V2_VARIANTS[variant]),
                           seed=11)
    check_parity(m, tokens_for(m, [11, 6], seed=12), tmp_path / "out", rel_tol=1e-5)


@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_deepseek_mscale_all_dim_of_any_scaled_rope_scales_the_softmax(actcap_bin, tmp_path, arch):
    """transformers reads mscale_all_dim from the rope dict whatever its type: a linear RoPE's too
    multiplies the softmax scale by mscale(factor, mscale_all_dim) ** 2 (the reference's outputs
    move with it, so a reader of YaRN's field alone fails the parity)."""
    rope = {"type": "linear", "factor": 2.0, "mscale_all_dim": 1.0}
    m, plain = tmp_path / "m", tmp_path / "plain"
    synth.write_checkpoint(str(m), synth.tiny_config(arch, rope_scaling=rope), seed=11)
    synth.write_checkpoint(str(plain), synth.tiny_config(arch, rope_scaling=dict(rope, mscale_all_dim=0.0)),
                           seed=11)
    seqs = tokens_for(m, [9, 5], seed=15)
    assert ref_differs(m, plain, seqs)
    check_parity(m, seqs, tmp_path / "out", rel_tol=1e-5)


def test_deepseek_v3_features_bite(actcap_bin, tmp_path):
    """The variants above are not the tiny model under other names: the reference's outputs move
    with the interleaved rotation, the softmax's mscale and the routing bias."""
    seqs = [[5, 9, 2, 77, 31, 8, 150, 3]]
    base = tmp_path / "base"
    synth.write_checkpoint(str(base), synth.tiny_config("deepseek_v3"), seed=11)
    for name, changes in [("rotate_half", dict(rope_interleave=False)),
                          ("no_mscale", dict(rope_scaling=dict(synth.DEEPSEEK_V3_YARN, mscale_all_dim=0.0)))]:
        a, b = tmp_path / f"{name}-a", tmp_path / f"{name}-b"
        if name == "no_mscale":
            synth.write_checkpoint(str(a), synth.tiny_config("deepseek_v3", **synth.DEEPSEEK_V3_VARIANTS["yarn"]),
                                   seed=11)
            synth.write_checkpoint(str(b), synth.tiny_config("deepseek_v3", **changes), seed=11)
        else:
            a = base
            synth.write_checkpoint(str(b), synth.tiny_config("deepseek_v3", **changes), seed=11)
        assert ref_differs(a, b, seqs), name
    tensors, meta = st.load(str(base / "model.safetensors"))
    zeroed = H.copy_model(base, tmp_path / "nobias")
    st.save(str(zeroed / "model.safetensors"),
            {k: (np.zeros_like(v) if k.endswith("e_score_correction_bias") else v) for k, v in tensors.items()},
            metadata=meta)
    assert ref_differs(base, zeroed, seqs), "e_score_correction_bias"


def test_deepseek_v3_multi_token_prediction_layer_is_not_run(actcap_bin, tmp_path):
    """The Hub's checkpoints store the multi-token-prediction module as one more layer
    (model.layers.<num_hidden_layers>.*, num_nextn_predict_layers of them): not run, not reported,
    as transformers ignores it; without num_nextn_predict_layers the same tensors are reported as
    unused (a warning), and the model still equals the reference."""
    m = tmp_path / "m"
    cfg = synth.tiny_config("deepseek_v3", num_nextn_predict_layers=1)
    synth.write_checkpoint(str(m), cfg, seed=11)
    tensors, meta = st.load(str(m / "model.safetensors"))
    last = cfg["num_hidden_layers"] - 1
    extra = {k.replace(f"model.layers.{last}.", f"model.layers.{last + 1}."): v
             for k, v in tensors.items() if k.startswith(f"model.layers.{last}.")}
    st.save(str(m / "model.safetensors"), {**tensors, **extra}, metadata=meta)
    seqs = tokens_for(m, [7], seed=13)
    p = H.actcap("run", m, "--tokens", H.tokens_arg(seqs), "--capture", "lm_head", "--out", tmp_path / "o1")
    assert p.returncode == 0 and "does not use" not in p.stderr, p.stderr
    check_parity(m, seqs, tmp_path / "o2")
    H.save_config(m, dict(cfg, num_nextn_predict_layers=0))
    p = H.actcap("run", m, "--tokens", H.tokens_arg(seqs), "--capture", "lm_head", "--out", tmp_path / "o3")
    assert p.returncode == 0 and "does not use" in p.stderr and f"model.layers.{last + 1}." in p.stderr, p.stderr


def test_deepseek_v3_router_is_float32_under_bf16_compute(models, tmp_path):
    """transformers' DeepseekV3TopkRouter computes its logits in float32 whatever the model's
    dtype: under --compute-dtype bf16 the router points are float32 (and equal the float32 logits of
    the bf16 inputs), every other point bfloat16."""
    m = models("deepseek_v3")
    H.actcap("run", m, "--tokens", H.tokens_arg(tokens_for(m, [9], seed=14)), "--capture", "**",
             "--out", tmp_path / "out", "--compute-dtype", "bf16", check=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    dtypes = {k: v["dtype"] for k, v in manifest["points"].items()}
    routers = [k for k in dtypes if k.endswith(".mlp.gate")]
    assert routers and all(dtypes[k] == "F32" for k in routers), {k: dtypes[k] for k in routers}
    assert {v for k, v in dtypes.items() if k not in routers and v != "I64"} == {"BF16"}


# ---------------------------------------------------------------------------------------------
# gpt-oss: attention sinks, clamped experts with biases, YaRN by default, MXFP4 experts
# ---------------------------------------------------------------------------------------------

def test_gpt_oss_mxfp4_experts_equal_the_reference_and_the_unquantized_twin(actcap_bin, tmp_path):
    """The released checkpoints' layout: each layer's experts as MXFP4 `*_blocks` / `*_scales`
    (uint8), decoded as they run. Every point equals the reference (which decodes at load, as
    transformers), and the same model written unquantized (the decoded float32 matrices, in
    transformers' [in, out] layout) gives the same captures, bit for bit: the decoded matrix is
    laid out as the stored one, so the GEMMs are the same."""
    cfg = synth.tiny_config("gpt_oss_mxfp4")
    m = tmp_path / "mxfp4"
    w = synth.write_checkpoint(str(m), cfg, seed=5)
    assert any(k.endswith("_blocks") for k in w) and any(k.endswith("_scales") for k in w)
    seqs = tokens_for(m, [13, 6], seed=8)
    check_parity(m, seqs, tmp_path / "out")
    twin = tmp_path / "twin"
    synth.write_unquantized_twin(str(m), str(twin), w)
    _, a, _ = H.run_capture(m, tmp_path / "a", seqs)
    _, b, _ = H.run_capture(twin, tmp_path / "b", seqs)
    assert set(a) == set(b)
    assert not [k for k in a if not np.array_equal(a[k], b[k])]


# FP8 checkpoints (quantization_config "fp8"): the Hub's DeepSeek-V3 layout (F32 scales), the Qwen3
# FP8 releases' (BF16 scales), one scale per matrix (weight_block_size null), and each dtype the
# weights decode to. The blocks leave partial ones at the edges of most matrices.
FP8_CASES = {
    "deepseek_v3": dict(block=(16, 12), scale_dtype="F32", dtype="bfloat16"),
    "deepseek_v2": dict(block=(8, 24), scale_dtype="F32", dtype="float16"),
    "qwen3": dict(block=(24, 40), scale_dtype="BF16", dtype="bfloat16"),
    "llama": dict(block=None, scale_dtype="F32", dtype="float32"),
}


@pytest.mark.parametrize("arch", sorted(FP8_CASES))
def test_fp8_checkpoint_equals_its_decoded_twin_and_the_reference(actcap_bin, tmp_path, arch):
    """Each F8_E4M3 weight times its block's scale, the product in float32 rounded to config.json's
    dtype, decoded at load: every capture equals, bit for bit, that of the twin checkpoint holding
    the weights as numpy decodes them (synth.fp8_decode, from the format alone), and the
    reference's on the twin. One matrix holds every finite code."""
    fp8, twin = tmp_path / "fp8", tmp_path / "twin"
    quantized = synth.write_fp8_checkpoint(str(fp8), str(twin), synth.tiny_config(arch), seed=4,
                                           every_code="model.layers.0.mlp.down_proj.weight", **FP8_CASES[arch])
    assert "model.layers.0.mlp.down_proj.weight" in quantized and len(quantized) > 8
    assert st.dtypes(str(fp8 / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"] == "F8_E4M3"
    seqs = tokens_for(twin, [11, 5], seed=9)
    _, a, _ = H.run_capture(fp8, tmp_path / "a", seqs)
    _, b, _ = H.run_capture(twin, tmp_path / "b", seqs)
    assert set(a) == set(b)
    assert not [k for k in a if not np.array_equal(a[k], b[k])]
    check_parity(fp8, seqs, tmp_path / "out", ref_dir=twin)


@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_fp8_weights_stay_packed_and_decode_as_they_run(actcap_bin, tmp_path, arch):
    """Under weights dtype keep (the default) the linear layers and experts hold the FP8 codes, one
    byte a value beside float32 block scales, and decode each matrix just before its GEMM; under
    f32 every weight is decoded at load. Both capture the twin's values bit for bit, and so does
    bf16 compute (the codes decoded straight to bf16, through the checkpoint's dtype). The plan
    counts the packed bytes: the twin's weights less two bytes a quantized value, plus one and
    the scales."""
    fp8, twin = tmp_path / "fp8", tmp_path / "twin"
    quantized = synth.write_fp8_checkpoint(str(fp8), str(twin), synth.tiny_config(arch), seed=6,
                                           **FP8_CASES[arch])
    seqs = tokens_for(twin, [9, 4], seed=3)
    for i, extra in enumerate((("--weights-dtype", "f32"), ("--compute-dtype", "bf16"))):
        _, a, _ = H.run_capture(fp8, tmp_path / f"a{i}", seqs, extra=extra)
        _, b, _ = H.run_capture(twin, tmp_path / f"b{i}", seqs, extra=extra)
        assert set(a) == set(b)
        assert not [k for k in a if not np.array_equal(a[k], b[k])], extra

    def weights(m, dtype):
        out = H.actcap("plan", m, "--weights-dtype", dtype, "--json", check=True).stdout
        return sum(d["weights"] for d in json.loads(out)["devices"])

    header, _ = st.read_raw(str(fp8 / "model.safetensors"))
    values = sum(int(np.prod(header[k]["shape"])) for k in quantized)
    scales = sum(int(np.prod(header[k + "_scale_inv"]["shape"])) for k in quantized)
    assert weights(fp8, "keep") == weights(twin, "keep") - 2 * values + values + 4 * scales
    assert weights(fp8, "f32") == weights(twin, "f32")


def test_fp8_decoding_bites(actcap_bin, tmp_path):
    """The twin test would catch a decoder that ignored the scales' blocks: the same codes under
    one scale per matrix capture other values."""
    fp8, twin = tmp_path / "fp8", tmp_path / "twin"
    synth.write_fp8_checkpoint(str(fp8), str(twin), synth.tiny_config("llama"), seed=4, block=(8, 8))
    seqs = tokens_for(twin, [7], seed=1)
    _, a, _ = H.run_capture(fp8, tmp_path / "a", seqs, capture=("model.norm",))
    cfg = H.load_config(fp8)
    cfg["quantization_config"]["weight_block_size"] = None
    H.save_config(fp8, cfg)
    raw, data = st.read_raw(str(fp8 / "model.safetensors"))
    for k in [k for k in raw if k.endswith("_scale_inv")]:  # each matrix's first scale, as [1, 1]
        b = raw[k]["data_offsets"][0]
        raw[k] = dict(raw[k], shape=[1, 1], data_offsets=[b, b + 4])
    st.write_raw(str(fp8 / "model.safetensors"), *_compacted(raw, data))
    _, c, _ = H.run_capture(fp8, tmp_path / "c", seqs, capture=("model.norm",))
    assert not np.array_equal(a["model.norm"], c["model.norm"])


def _compacted(header, data):
    """A safetensors header and data section with the bytes no entry covers dropped (entries
    shortened in place): the data section stays without holes."""
    out, pos, new = [], 0, {}
    for k, v in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                       key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = v["data_offsets"]
        out.append(data[b:e])
        new[k] = dict(v, data_offsets=[pos, pos + e - b])
        pos += e - b
    if "__metadata__" in header:
        new["__metadata__"] = header["__metadata__"]
    return new, b"".join(out)


def _fp8_edit(m, header=None, config=None):
    """Edits an FP8 checkpoint: `header(h)` changes its safetensors header in place (dtype names,
    tensor names), `config(c)` its config.json."""
    if header:
        h, data = st.read_raw(str(m / "model.safetensors"))
        header(h)
        st.write_raw(str(m / "model.safetensors"), h, data)
    if config:
        c = H.load_config(m)
        config(c)
        H.save_config(m, c)


Q = "model.layers.0.self_attn.q_proj.weight"
FP8_BAD = {
    "scales_missing": (dict(header=lambda h: h.update({Q + "_other": h.pop(Q + "_scale_inv")})),
                       f"its block scales {Q}_scale_inv are missing"),
    "scales_shape": (dict(config=lambda c: c["quantization_config"].update(weight_block_size=[32, 16])),
                     "weight_block_size [32, 16] over model.layers.0.mlp.down_proj.weight's [32, 80] implies [1, 5]"),
    "scales_not_float": (dict(header=lambda h: h[Q + "_scale_inv"].update(dtype="I32")),
                         "block scales must be F32, BF16 or F16"),
    "no_quantization_config": (dict(config=lambda c: c.pop("quantization_config")),
                               "has no quantization_config"),
    "e5m2": (dict(header=lambda h: h[Q].update(dtype="F8_E5M2")), "is F8_E5M2"),
    "not_a_matrix": (dict(header=lambda h: h[Q].update(shape=[h[Q]["shape"][0], h[Q]["shape"][1] // 2, 2])),
                     "FP8 weights must be matrices [out, in]"),
    "static_activations": (dict(config=lambda c: c["quantization_config"].update(activation_scheme="static")),
                           "activation_scheme"),
    "fmt": (dict(config=lambda c: c["quantization_config"].update(fmt="e5m2")), "\"fmt\""),
    "block_zero": (dict(config=lambda c: c["quantization_config"].update(weight_block_size=[0, 128])),
                   "weight_block_size"),
    "block_one_number": (dict(config=lambda c: c["quantization_config"].update(weight_block_size=[128])),
                         "weight_block_size"),
    "other_method": (dict(config=lambda c: c["quantization_config"].update(quant_method="gptq")),
                     "\"quant_method\": \"gptq\" is not supported"),
    "dtype": (dict(config=lambda c: c.update(torch_dtype="int8")), "dtype \"int8\""),
}


@pytest.mark.parametrize("case", sorted(FP8_BAD))
def test_bad_fp8_checkpoint_is_one_line_exit_2(actcap_bin, tmp_path, case):
    m = tmp_path / "fp8"
    synth.write_fp8_checkpoint(str(m), str(tmp_path / "twin"), synth.tiny_config("llama"), seed=2, block=(16, 16))
    edits, needle = FP8_BAD[case]
    _fp8_edit(m, **edits)
    line = _one_line_exit_2(m, tmp_path)
    assert needle in line, line


def test_fp8_config_over_float_weights_is_one_line_exit_2(actcap_bin, tmp_path):
    """A converted copy that kept quantization_config: its weights are not FP8."""
    twin = tmp_path / "twin"
    synth.write_fp8_checkpoint(str(tmp_path / "fp8"), str(twin), synth.tiny_config("llama"), seed=2)
    c = H.load_config(twin)
    c["quantization_config"] = dict(synth.FP8_QUANTIZATION_CONFIG)
    H.save_config(twin, c)
    assert "no tensor" in _one_line_exit_2(twin, tmp_path)


# compressed-tensors FP8 checkpoints (llm-compressor's schemes, as RedHatAI's FP8 releases and the
# FP8-Block Kimi/DeepSeek conversions ship): <weight>_scale per tensor, channel, group or block, and
# static input scales, which actcap leaves (activations are not quantized).
COMPRESSED_CASES = {
    "llama_tensor": ("llama", dict(compressed="tensor", scale_dtype="F32", dtype="bfloat16")),
    "qwen3_channel": ("qwen3", dict(compressed="channel", scale_dtype="BF16", dtype="bfloat16")),
    "llama_group": ("llama", dict(compressed="group", block=(1, 16), scale_dtype="F32", dtype="float16")),
    "deepseek_v3_block": ("deepseek_v3", dict(compressed="block", block=(16, 12), scale_dtype="F32",
                                              dtype="bfloat16")),
}


@pytest.mark.parametrize("case", sorted(COMPRESSED_CASES))
def test_compressed_tensors_fp8_equals_its_decoded_twin_and_the_reference(actcap_bin, tmp_path, case):
    """Each F8_E4M3 weight times its scale (one per matrix, output channel, group of inputs or
    block), rounded once to config.json's dtype: every capture equals the decoded twin's bit for bit,
    and the reference's on the twin; the input scales are neither used nor reported as unused."""
    arch, kw = COMPRESSED_CASES[case]
    fp8, twin = tmp_path / "fp8", tmp_path / "twin"
    quantized = synth.write_fp8_checkpoint(str(fp8), str(twin), synth.tiny_config(arch), seed=5,
                                           every_code="model.layers.0.mlp.down_proj.weight", **kw)
    assert len(quantized) > 8
    names = st.dtypes(str(fp8 / "model.safetensors"))
    assert names["model.layers.0.mlp.down_proj.weight"] == "F8_E4M3"
    assert "model.layers.0.mlp.down_proj.weight_scale" in names and "model.layers.0.mlp.down_proj.input_scale" in names
    seqs = tokens_for(twin, [10, 6], seed=2)
    p = H.actcap("run", fp8, "--tokens", H.tokens_arg(seqs), "--capture", "**", "**:input", "--out", tmp_path / "a",
                 check=True)
    assert "ignoring" not in p.stderr, p.stderr
    _, a, _ = H.read_capture(tmp_path / "a")
    _, b, _ = H.run_capture(twin, tmp_path / "b", seqs)
    assert set(a) == set(b)
    assert not [k for k in a if not np.array_equal(a[k], b[k])]
    check_parity(fp8, seqs, tmp_path / "out", ref_dir=twin)


def _ct_weights(c, **kw):
    c["quantization_config"]["config_groups"]["group_0"]["weights"].update(kw)


COMPRESSED_BAD = {
    "format": (lambda c: c["quantization_config"].update(format="pack-quantized"),
               "\"format\": \"pack-quantized\" is not supported"),
    "int8": (lambda c: _ct_weights(c, type="int"), "is not an 8-bit float scheme"),
    "four_bits": (lambda c: _ct_weights(c, num_bits=4), "is not an 8-bit float scheme"),
    "asymmetric": (lambda c: _ct_weights(c, symmetric=False), "asymmetric"),
    "dynamic_weights": (lambda c: _ct_weights(c, dynamic=True), "asymmetric, dynamic"),
    "strategy": (lambda c: _ct_weights(c, strategy="tensor_group"), "strategy \"tensor_group\" is not supported"),
    "scales_shape": (lambda c: _ct_weights(c, strategy="channel"), "but strategy channel over"),
    "sparsity": (lambda c: c["quantization_config"].update(sparsity_config={"format": "sparse-24-bitmask"}),
                 "sparsity_config"),
    "no_groups": (lambda c: c["quantization_config"].update(config_groups={}), "config_groups"),
    "two_schemes": (lambda c: c["quantization_config"]["config_groups"].update(
        group_1=dict(c["quantization_config"]["config_groups"]["group_0"],
                     weights=dict(c["quantization_config"]["config_groups"]["group_0"]["weights"],
                                  strategy="channel"))), "different weight strategies"),
}


@pytest.mark.parametrize("case", sorted(COMPRESSED_BAD))
def test_bad_compressed_tensors_checkpoint_is_one_line_exit_2(actcap_bin, tmp_path, case):
    m = tmp_path / "fp8"
    synth.write_fp8_checkpoint(str(m), str(tmp_path / "twin"), synth.tiny_config("llama"), seed=2,
                               compressed="tensor")
    edit, needle = COMPRESSED_BAD[case]
    _fp8_edit(m, config=edit)
    line = _one_line_exit_2(m, tmp_path)
    assert needle in line, line


def test_gpt_oss_without_rope_fields_is_yarn_by_default(actcap_bin, tmp_path):
    """GptOssConfig's rope_parameters default is YaRN (factor 32 over 4096 positions,
    rope_theta 150000), not plain RoPE: a config.json with no rope field runs that."""
    cfg = synth.tiny_config("gpt_oss")
    for k in ("rope_scaling", "rope_parameters", "rope_theta"):
        cfg.pop(k, None)
    cfg["max_position_embeddings"] = 131072
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=3)
    rope = reference.Config(reference.load_config(str(m))).rope
    assert rope["rope_type"] == "yarn" and rope["factor"] == 32.0, rope
    check_parity(m, tokens_for(m, [10], seed=4), tmp_path / "out")


def test_gpt_oss_attention_patterns_drop_the_sink(actcap_bin, tmp_path):
    """`:probs` are the probabilities that multiply the values: the sink's share dropped, so a
    row sums to less than 1; `:scores` are the masked scores without the sink."""
    cfg = synth.tiny_config("gpt_oss")
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=9)
    seq = tokens_for(m, [9], seed=3)[0]
    ref = reference.run(str(m), [seq], patterns=True)[0]
    names = [f"model.layers.{i}.self_attn" for i in range(cfg["num_hidden_layers"])]
    capture = [f"{n}:{kind}" for n in names for kind in ("scores", "probs")]
    _, tensors, _ = H.run_capture(m, tmp_path / "o", [seq], capture=capture)
    for n in names:
        probs, want = tensors[f"{n}:probs"], ref[f"{n}:probs"]
        assert np.abs(probs - want).max() <= 1e-5, n
        assert (probs.sum(-1) < 1 - 1e-2).all(), f"{n}: a row without the sink's share"
        got, want = tensors[f"{n}:scores"], ref[f"{n}:scores"]
        finite = np.isfinite(want)
        assert np.array_equal(finite, np.isfinite(got)), n
        assert np.abs(got[finite] - want[finite]).max() <= 1e-5, n


GPT_OSS_BAD_CONFIGS = {
    "other_quantization": (dict(quantization_config={"quant_method": "gptq", "bits": 4}),
                           "quantization_config"),
    "sliding_window_null": (dict(sliding_window=None, layer_types=["sliding_attention", "full_attention",
                                                                   "sliding_attention"]), "sliding_window"),
    # transformers' mask builder refuses a null window even when no layer slides
    "sliding_window_null_no_sliding_layer": (dict(sliding_window=None, layer_types=["full_attention"] * 3),
                                             "sliding_window"),
    "swiglu_limit": (dict(swiglu_limit=8.0), "swiglu_limit"),
    "no_experts": (dict(num_local_experts=0, num_experts=0), "experts"),
}


@pytest.mark.parametrize("case", list(GPT_OSS_BAD_CONFIGS))
def test_gpt_oss_bad_config_is_one_line_exit_2(actcap_bin, tmp_path, case):
    changes, needle = GPT_OSS_BAD_CONFIGS[case]
    cfg = synth.tiny_config("gpt_oss")
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), cfg, seed=1)
    c = H.load_config(m)
    c.update(changes)
    H.save_config(m, c)
    assert needle in _one_line_exit_2(m, tmp_path)


def test_gpt_oss_mxfp4_blocks_without_quantization_config_are_one_line_exit_2(actcap_bin, tmp_path):
    """transformers decodes MXFP4 blocks only under quantization_config.quant_method "mxfp4"."""
    m = tmp_path / "m"
    synth.write_checkpoint(str(m), synth.tiny_config("gpt_oss_mxfp4"), seed=2)
    c = H.load_config(m)
    c.pop("quantization_config")
    H.save_config(m, c)
    line = _one_line_exit_2(m, tmp_path)
    assert "MXFP4" in line and "quantization_config" in line, line


def test_gpt_oss_mxfp4_blocks_of_the_wrong_dtype_are_one_line_exit_2(actcap_bin, tmp_path):
    cfg = synth.tiny_config("gpt_oss_mxfp4")
    m = tmp_path / "m"
    w = synth.write_checkpoint(str(m), cfg, seed=2)
    key = next(k for k in w if k.endswith("gate_up_proj_blocks"))
    w[key] = w[key].astype(np.int16)
    st.save(str(m / "model.safetensors"), w, metadata={"format": "pt"})
    line = _one_line_exit_2(m, tmp_path)
    assert key in line and ("Byte" in line or "uint8" in line.lower()), line
