"""Self-tests of the Python reference (reference.py) and the safetensors helper (st.py).

These need no actcap binary. They check the reference against independent formulations
(torch.nn.MultiheadAttention for GPT-2, F.multi_head_attention_forward + complex-number RoPE + repeat_kv
for the Llama family, complex-number RoPE, Meta's llama3 frequency scaling loop, float64
norms, a dense float64 mixture of every expert for the MoE blocks), structural identities of the
hook points (residual stream wiring, GQA head order, sliding window locality, causality, a
one-expert MoE model equal to its dense family) and checkpoint-format equivalences (prefix, tying,
sharding, dtypes).
"""
import json
import math
import os
import types

import numpy as np
import pytest
import torch

import reference
import st
import synth

ARCHS = ["gpt2", "llama", "mistral", "qwen2", "qwen3"]
MOE = ["mixtral", "qwen3_moe", "qwen3_moe_step2", "qwen2_moe"]  # synth.TINY keys (qwen3_moe_step2 is a qwen3_moe)


def _ckpt(tmp_path, arch, name="m", seed=0, **overrides):
    d = tmp_path / name
    synth.write_checkpoint(str(d), synth.tiny_config(arch, **overrides), seed=seed)
    return d


def _maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# ---------------------------------------------------------------------------------------------
# st.py
# ---------------------------------------------------------------------------------------------

def test_st_roundtrip_and_header_padding(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "a.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "b.f16": rng.standard_normal((7,)).astype(np.float16),
        "c.i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "d.bool": np.array([[True, False]]),
        "e.scalar": np.array(-1e4, dtype=np.float32),
        "f.empty": np.zeros((0, 4), dtype=np.float32),
        "g.bf16": rng.standard_normal((4, 2)).astype(np.float32),
    }
    p = tmp_path / "x.safetensors"
    st.save(str(p), tensors, metadata={"format": "pt"}, dtype_names={"g.bf16": "BF16"})
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt"}
    assert header["g.bf16"]["dtype"] == "BF16" and header["e.scalar"]["shape"] == []
    back, meta = st.load(str(p))
    assert meta == {"format": "pt"}
    for k, v in tensors.items():
        if k == "g.bf16":
            assert back[k].dtype == np.float32
            assert _maxdiff(back[k], v) <= 2 ** -8 * np.max(np.abs(v))
        else:
            assert back[k].dtype == v.dtype and back[k].shape == v.shape and np.array_equal(back[k], v)
    assert st.dtypes(str(p))["b.f16"] == "F16"


def test_bf16_bits():
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0000, 0x3E80], dtype=np.uint16)
    assert st.bf16_bits_to_f32(bits).tolist() == [1.0, -2.0, float("inf"), 0.0, 0.25]
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -7, -3.0], dtype=np.float32)
    # ties round to even: 1 + 2^-8 -> 1.0 ; 1 + 3*2^-8 -> 1 + 2^-6
    assert st.f32_to_bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC040]


def test_st_validation_rejects_overlap(tmp_path):
    p = tmp_path / "bad.safetensors"
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    st.write_raw(str(p), header, b"\0" * 12)
    with pytest.raises(st.SafetensorsError):
        st.load(str(p))


# ---------------------------------------------------------------------------------------------
# point catalogue and shapes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS + ["gemma", "olmo"])
def test_point_names_and_shapes(tmp_path, arch):
    d = _ckpt(tmp_path, arch)
    c = reference.Config(reference.load_config(str(d)))
    pts = reference.points(str(d))
    H, V, I = c.hidden, c.vocab_size, c.inner
    if arch == "gpt2":
        per_layer = {"": [H], ".ln_1": [H], ".attn": [H], ".attn.c_attn": [3 * H], ".attn.c_proj": [H],
                     ".ln_2": [H], ".mlp": [H], ".mlp.c_fc": [I], ".mlp.act": [I], ".mlp.c_proj": [H]}
        inputs = {"": [H], ".ln_1": [H], ".attn": [H], ".attn.c_attn": [H], ".attn.c_proj": [H],
                  ".ln_2": [H], ".mlp": [H], ".mlp.c_fc": [H], ".mlp.act": [I], ".mlp.c_proj": [I]}
        want = {"transformer.wte": ([H], "F32"), "transformer.wte:input": ([], "I64"),
                "transformer.wpe": ([H], "F32"), "transformer.wpe:input": ([], "I64"),
                "transformer.ln_f": ([H], "F32"), "transformer.ln_f:input": ([H], "F32"),
                "lm_head": ([V], "F32"), "lm_head:input": ([H], "F32")}
        prefix = "transformer.h."
    else:
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        per_layer = {"": [H], ".input_layernorm": [H], ".self_attn": [H], ".self_attn.q_proj": [q],
                     ".self_attn.k_proj": [kv], ".self_attn.v_proj": [kv], ".self_attn.o_proj": [H],
                     ".post_attention_layernorm": [H], ".mlp": [H], ".mlp.gate_proj": [I],
                     ".mlp.up_proj": [I], ".mlp.down_proj": [H], ".mlp.act_fn": [I]}
        inputs = {"": [H], ".input_layernorm": [H], ".self_attn": [H], ".self_attn.q_proj": [H],
                  ".self_attn.k_proj": [H], ".self_attn.v_proj": [H], ".self_attn.o_proj": [q],
                  ".post_attention_layernorm": [H], ".mlp": [H], ".mlp.gate_proj": [H],
                  ".mlp.up_proj": [H], ".mlp.down_proj": [I], ".mlp.act_fn": [I]}
        want = {"model.embed_tokens": ([H], "F32"), "model.embed_tokens:input": ([], "I64"),
                "model.norm": ([H], "F32"), "model.norm:input": ([H], "F32"),
                "lm_head": ([V], "F32"), "lm_head:input": ([H], "F32")}
        if arch == "qwen3":  # [heads, head_dim] per token, input and output
            for nm, n in (("q_norm", c.heads), ("k_norm", c.kv_heads)):
                per_layer[f".self_attn.{nm}"] = inputs[f".self_attn.{nm}"] = [n, c.head_dim]
        prefix = "model.layers."
    for i in range(c.layers):
        for suf, shape in per_layer.items():
            want[f"{prefix}{i}{suf}"] = (shape, "F32")
        for suf, shape in inputs.items():
            want[f"{prefix}{i}{suf}:input"] = (shape, "F32")
    assert dict(pts) == want


# The MLP activations of the synth.TINY configs, written out here (not reference.ACT)
TINY_ACT = {"silu": torch.nn.functional.silu,
            "gelu_pytorch_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}


@pytest.mark.parametrize("arch", ARCHS + ["gemma", "olmo"])
def test_residual_wiring(tmp_path, arch):
    """Hook inputs/outputs chain exactly as in HF's modules (Gemma 1 and OLMo 1: Llama's pre-norm
    layer, two norms, no sublayer norms)."""
    d = _ckpt(tmp_path, arch)
    c = reference.Config(reference.load_config(str(d)))
    r = reference.run(str(d), [[5, 17, 2, 99, 3, 3, 250]])[0]
    eq = np.array_equal
    if arch == "gpt2":
        assert eq(r["transformer.h.0:input"], r["transformer.wte"] + r["transformer.wpe"])
        assert eq(r["transformer.wpe:input"], np.arange(7))
        for i in range(c.layers):
            p = f"transformer.h.{i}"
            if i:
                assert eq(r[p + ":input"], r[f"transformer.h.{i - 1}"])
            assert eq(r[p + ".ln_1:input"], r[p + ":input"])
            assert eq(r[p + ".attn:input"], r[p + ".ln_1"])
            assert eq(r[p + ".attn.c_attn:input"], r[p + ".ln_1"])
            assert eq(r[p + ".attn"], r[p + ".attn.c_proj"])
            assert eq(r[p + ".ln_2:input"], r[p + ".attn"] + r[p + ":input"])
            assert eq(r[p + ".mlp:input"], r[p + ".ln_2"])
            assert eq(r[p + ".mlp.act:input"], r[p + ".mlp.c_fc"])
            assert eq(r[p + ".mlp.c_proj:input"], r[p + ".mlp.act"])
            assert eq(r[p + ".mlp"], r[p + ".mlp.c_proj"])
            assert eq(r[p], r[p + ".ln_2:input"] + r[p + ".mlp"])
        last = f"transformer.h.{c.layers - 1}"
        assert eq(r["transformer.ln_f:input"], r[last])
        assert eq(r["lm_head:input"], r["transformer.ln_f"])
        w = st.load_checkpoint(str(d))
        assert _maxdiff(r["lm_head"], r["transformer.ln_f"] @ w["transformer.wte.weight"].T) < 1e-5
    else:
        for i in range(c.layers):
            p = f"model.layers.{i}"
            prev = r[f"model.layers.{i - 1}"] if i else r["model.embed_tokens"]
            assert eq(r[p + ":input"], prev)
            assert eq(r[p + ".input_layernorm:input"], prev)
            for proj in ("q_proj", "k_proj", "v_proj"):
                assert eq(r[f"{p}.self_attn.{proj}:input"], r[p + ".input_layernorm"])
            assert eq(r[p + ".self_attn:input"], r[p + ".input_layernorm"])
            if arch == "qwen3":  # q_proj / k_proj output viewed [T, heads, head_dim]
                assert eq(r[p + ".self_attn.q_norm:input"], r[p + ".self_attn.q_proj"].reshape(7, c.heads, -1))
                assert eq(r[p + ".self_attn.k_norm:input"], r[p + ".self_attn.k_proj"].reshape(7, c.kv_heads, -1))
            assert eq(r[p + ".self_attn"], r[p + ".self_attn.o_proj"])
            assert eq(r[p + ".post_attention_layernorm:input"], prev + r[p + ".self_attn"])
            assert eq(r[p + ".mlp:input"], r[p + ".post_attention_layernorm"])
            assert eq(r[p + ".mlp.act_fn:input"], r[p + ".mlp.gate_proj"])
            assert _maxdiff(r[p + ".mlp.act_fn"], TINY_ACT[c.act](
                torch.from_numpy(r[p + ".mlp.gate_proj"])).numpy()) == 0
            assert eq(r[p + ".mlp.down_proj:input"], r[p + ".mlp.act_fn"] * r[p + ".mlp.up_proj"])
            assert eq(r[p + ".mlp"], r[p + ".mlp.down_proj"])
            assert eq(r[p], r[p + ".post_attention_layernorm:input"] + r[p + ".mlp"])
        assert eq(r["model.norm:input"], r[f"model.layers.{c.layers - 1}"])
        assert eq(r["lm_head:input"], r["model.norm"])


# ---------------------------------------------------------------------------------------------
# components against independent formulations
# ---------------------------------------------------------------------------------------------

# GPT-2's attention options against torch's MultiheadAttention, which always scales by
# head_dim ** -0.5: the query rows of the in-projection carry the rest of GPT2Attention's factor
# (sqrt(head_dim) without scale_attn_weights, 1 / (layer_idx + 1) with
# scale_attn_by_inverse_layer_idx). reorder_and_upcast_attn takes the reference's other path
# (_upcast_and_reordered_attn), which must agree with the same formulation.
# Checked by mutating reference.py temporarily: dividing by layer_idx (or max(layer_idx, 1))
# instead of layer_idx + 1 in either path, and dropping the division in the reordered path, each
# fail the options that use them.
@pytest.mark.parametrize("options", [
    {},
    {"scale_attn_by_inverse_layer_idx": True},
    {"reorder_and_upcast_attn": True},
    {"scale_attn_by_inverse_layer_idx": True, "reorder_and_upcast_attn": True},
    {"scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True, "reorder_and_upcast_attn": True},
], ids=["plain", "by_layer", "reorder", "by_layer_reorder", "unscaled_by_layer_reorder"])
def test_gpt2_attention_matches_torch_multihead_attention(tmp_path, options):
    d = _ckpt(tmp_path, "gpt2", n_layer=3, **options)
    c = reference.Config(reference.load_config(str(d)))
    w = st.load_checkpoint(str(d))
    r = reference.run(str(d), [[1, 2, 3, 4, 5, 6, 7, 8, 9]])[0]
    T = 9
    for i in range(c.layers):
        p = f"transformer.h.{i}.attn"
        mha = torch.nn.MultiheadAttention(c.hidden, c.heads, bias=True, batch_first=True)
        q_scale = 1.0 if options.get("scale_attn_weights", True) else math.sqrt(c.head_dim)
        if options.get("scale_attn_by_inverse_layer_idx"):
            q_scale /= i + 1
        with torch.no_grad():
            in_w = torch.from_numpy(w[p + ".c_attn.weight"].T.copy())
            in_b = torch.from_numpy(w[p + ".c_attn.bias"].copy())
            in_w[: c.hidden] *= q_scale
            in_b[: c.hidden] *= q_scale
            mha.in_proj_weight.copy_(in_w)
            mha.in_proj_bias.copy_(in_b)
            mha.out_proj.weight.copy_(torch.from_numpy(w[p + ".c_proj.weight"].T.copy()))
            mha.out_proj.bias.copy_(torch.from_numpy(w[p + ".c_proj.bias"]))
            x = torch.from_numpy(r[p + ":input"])[None]
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True = not allowed
            y, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
        assert _maxdiff(y[0].numpy(), r[p]) < 2e-6


# Llama-family attention (Llama / Mistral / Qwen2) against an independent formulation written from
# HF modeling_llama.py's eager path, in float64: q/k/v projections (+ bias where the arch has one),
# RoPE on q and k only -- as the complex rotation of the pairs (i, i + d/2) that HF's rotate_half
# computes, with inv_freq computed here from the config (Meta's llama3 loop, `linear` division) --,
# repeat_kv written as "query head h reads kv head h // groups" (np.repeat), and the softmax attention
# itself done by torch's F.multi_head_attention_forward (which applies the head_dim ** -0.5 scale
# and splits/merges heads itself) under a causal / sliding-window boolean mask, then o_proj.
#
# Checked by mutating tests/python/reference.py temporarily (in a copy) and running this test:
#   - scaling = hd ** -0.5 -> hidden ** -0.5 (wrong scale): all 6 cases fail
#   - repeat_kv expand(nkv, groups) -> kh/vh.repeat(groups, 1, 1) (tile: head h reads kv h % nkv): 6 fail
#   - apply_rope also applied to vh (RoPE on v): 6 fail
#   - apply_rope on kh dropped (RoPE on q only): 6 fail
#   - rope_inv_freq ignores rope_type (llama3 / linear scaling dropped): the 2 scaling cases fail
#   - rope_inv_freq ignores rope_theta (always 10000): the 3 cases with another theta fail
#   - sliding window dropped from the mask: the mistral case fails
#   - biases dropped from the projections: the 2 cases with biases fail
# The `power` part of the test repeats the same errors on the independent side and requires each to
# move the result far outside the tolerance, so none of these cases could pass by accident.

def _inv_freq64(cfg, hd):
    theta = float(cfg.get("rope_theta", 10000.0))
    freqs = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind is None:
        return freqs
    if kind == "linear":
        return freqs / rs["factor"]
    assert kind == "llama3", kind
    old = rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
    out = []
    for f in freqs:  # Meta's llama-models apply_scaling
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(f)
        elif wl > lo_wl:
            out.append(f / rs["factor"])
        else:
            sm = (old / wl - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
            out.append((1 - sm) * f / rs["factor"] + sm * f)
    return np.array(out)


def _rope64(t, cfg, hd):
    """t [T, heads, hd] rotated as complex pairs (i, i + hd/2) at positions 0..T-1, float64."""
    rot = np.exp(1j * np.arange(t.shape[0])[:, None] * _inv_freq64(cfg, hd)[None, :])[:, None, :]
    z = (t[..., : hd // 2] + 1j * t[..., hd // 2:]) * rot
    return np.concatenate([z.real, z.imag], axis=-1)


def _llama_attention_independent(x, w, p, cfg, window, wrong=None):
    """Returns (o_proj input [T, nh*hd], attention output [T, hidden]) in float64.

    wrong: None, or one deliberate error ("scale", "tile", "rope_v", "no_rope_k", "no_scaling",
    "theta", "no_window", and for Qwen3 "no_qk_norm", "qk_norm_after_rope", "qk_norm_flat" (over
    all heads at once)) used to show that the comparison can tell it apart.

    Qwen3 (checkpoint has q_norm / k_norm weights): RMSNorm over head_dim of each head of q and k,
    in float64, before RoPE."""
    T, hidden = x.shape
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or hidden // nh
    groups = nh // nkv
    x = x.astype(np.float64)

    def proj(name):
        y = x @ w[f"{p}.{name}.weight"].astype(np.float64).T
        b = w.get(f"{p}.{name}.bias")
        return y if b is None else y + b

    q = proj("q_proj").reshape(T, nh, hd)
    k = proj("k_proj").reshape(T, nkv, hd)
    v = proj("v_proj").reshape(T, nkv, hd)
    qk_norm = f"{p}.q_norm.weight" in w and wrong != "no_qk_norm"
    eps = float(cfg.get("rms_norm_eps", 1e-6))

    def headnorm(t, name):
        g = w[f"{p}.{name}.weight"].astype(np.float64)
        if wrong == "qk_norm_flat":
            flat = t.reshape(T, -1)
            return (flat / np.sqrt((flat ** 2).mean(-1, keepdims=True) + eps)).reshape(t.shape) * g
        return t / np.sqrt((t ** 2).mean(-1, keepdims=True) + eps) * g

    if qk_norm and wrong != "qk_norm_after_rope":
        q, k = headnorm(q, "q_norm"), headnorm(k, "k_norm")
    rcfg = dict(cfg)
    if wrong == "no_scaling":
        rcfg.pop("rope_scaling", None)
    if wrong == "theta":
        rcfg["rope_theta"] = 10000.0 if float(cfg.get("rope_theta", 10000.0)) != 10000.0 else 500.0
    def rope(t):
        return _rope64(t, rcfg, hd)

    q = rope(q)
    if wrong != "no_rope_k":
        k = rope(k)
    if qk_norm and wrong == "qk_norm_after_rope":
        q, k = headnorm(q, "q_norm"), headnorm(k, "k_norm")
    if wrong == "rope_v":
        v = rope(v)
    if wrong == "tile":
        k, v = np.tile(k, (1, groups, 1)), np.tile(v, (1, groups, 1))
    else:
        k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    if wrong == "scale":
        q = q * math.sqrt(hd) / math.sqrt(hidden)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    banned = j > i
    if window is not None and wrong != "no_window":
        banned |= j <= i - window
    E = nh * hd
    eye = torch.eye(E, dtype=torch.float64)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a.reshape(T, 1, E)))  # noqa: E731
    o, _ = torch.nn.functional.multi_head_attention_forward(
        t(q), t(k), t(v), E, nh, None, None, None, None, False, 0.0, eye, torch.zeros(E, dtype=torch.float64),
        training=False, need_weights=False, attn_mask=torch.from_numpy(banned),
        use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye)
    o = o[:, 0].numpy()
    a = o @ w[f"{p}.o_proj.weight"].astype(np.float64).T
    if f"{p}.o_proj.bias" in w:
        a = a + w[f"{p}.o_proj.bias"]
    return o, a


LLAMA_ATTENTION_CASES = {
    # GQA with 4 query heads per kv head, and a non-default rope_theta
    "llama-gqa4-theta500": ("llama", dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                                          rope_theta=500.0)),
    # llama3 RoPE scaling; theta 100 and head_dim 8 put the four frequencies' wavelengths (6.3, 19.9,
    # 62.8, 198.7) in all three regimes: < 32 kept, 32..128 smoothed, > 128 divided by factor
    "llama-llama3-scaling": ("llama", dict(rope_theta=100.0, rope_scaling=dict(
        rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=128))),
    "llama-linear-scaling": ("llama", dict(rope_theta=1000.0, rope_scaling={"type": "linear", "factor": 3.0})),
    # explicit head_dim (nh * hd != hidden) and Llama's optional q/k/v/o biases
    "llama-head-dim-bias": ("llama", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=16, attention_bias=True)),
    "qwen2-qkv-bias": ("qwen2", {}),
    "mistral-window5": ("mistral", dict(sliding_window=5)),
    # Qwen3: q_norm / k_norm per head before RoPE, head_dim 16 != 32 / 4, theta 1e6
    "qwen3-qk-norm": ("qwen3", {}),
    # Qwen3's attention_bias: q, k, v and o biases; windows from layer_types
    "qwen3-bias-layer-types": ("qwen3", dict(attention_bias=True, use_sliding_window=True, sliding_window=5,
                                             layer_types=["sliding_attention", "full_attention"])),
}


@pytest.mark.parametrize("case", list(LLAMA_ATTENTION_CASES))
def test_llama_attention_matches_independent_formulation(tmp_path, case):
    arch, overrides = LLAMA_ATTENTION_CASES[case]
    d = _ckpt(tmp_path, arch, seed=4, **overrides)
    cfg = reference.load_config(str(d))
    c = reference.Config(cfg)
    assert c.kv_heads < c.heads  # every case is GQA
    cfg.setdefault("num_key_value_heads", c.heads)
    w = st.load_checkpoint(str(d))
    seq = [int(t) for t in np.random.default_rng(1).integers(0, c.vocab_size, 24)]
    r = reference.run(str(d), [seq])[0]
    tol = 2e-6  # observed: <= 5e-8 (float32 reference against float64)
    for i in range(c.layers):
        p = f"model.layers.{i}.self_attn"
        o, a = _llama_attention_independent(r[p + ":input"], w, p, cfg, c.windows[i])
        assert _maxdiff(o, r[p + ".o_proj:input"]) < tol, (p, _maxdiff(o, r[p + ".o_proj:input"]))
        assert _maxdiff(a, r[p]) < tol, (p, _maxdiff(a, r[p]))
    # power: each error the comparison is meant to catch moves layer 0's result far outside tol here
    p = "model.layers.0.self_attn"
    wrongs = ["scale", "tile", "rope_v", "no_rope_k", "theta"] + (["no_scaling"] if cfg.get("rope_scaling") else []) + (
        ["no_window"] if c.windows[0] is not None else []) + (
        ["no_qk_norm", "qk_norm_after_rope", "qk_norm_flat"] if arch == "qwen3" else [])
    for wrong in wrongs:
        o, _ = _llama_attention_independent(r[p + ":input"], w, p, cfg, c.windows[0], wrong=wrong)
        assert _maxdiff(o, r[p + ".o_proj:input"]) > 100 * tol, wrong


def test_norms_against_float64(tmp_path):
    for arch in ("gpt2", "llama"):
        d = _ckpt(tmp_path, arch, name=arch)
        c = reference.Config(reference.load_config(str(d)))
        w = st.load_checkpoint(str(d))
        r = reference.run(str(d), [[3, 1, 4, 1, 5, 9, 2, 6]])[0]
        if arch == "gpt2":
            x = r["transformer.h.1.ln_2:input"].astype(np.float64)
            g, b = w["transformer.h.1.ln_2.weight"], w["transformer.h.1.ln_2.bias"]
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
            y = (x - mu) / np.sqrt(var + c.eps) * g + b
            assert _maxdiff(y, r["transformer.h.1.ln_2"]) < 5e-6
        else:
            x = r["model.layers.1.post_attention_layernorm:input"].astype(np.float64)
            g = w["model.layers.1.post_attention_layernorm.weight"]
            y = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + c.eps) * g
            assert _maxdiff(y, r["model.layers.1.post_attention_layernorm"]) < 5e-6


def test_gelu_new_is_tanh_gelu():
    x = torch.linspace(-6, 6, 1001)
    assert float((reference.ACT["gelu_new"](x) - torch.nn.functional.gelu(x, approximate="tanh")).abs().max()) < 1e-6


def test_rope_matches_complex_formulation():
    """HF rotate_half RoPE == complex rotation of pairs (i, i + d/2) by pos * inv_freq[i]."""
    hd, T = 16, 12
    rope = reference.Config._rope({"rope_theta": 500.0})
    cos, sin = reference.rope_cos_sin(rope, hd, T)
    x = torch.randn(3, T, hd, generator=torch.Generator().manual_seed(0))
    got = reference.apply_rope(x, cos, sin).double().numpy()
    inv = 1.0 / (500.0 ** (np.arange(0, hd, 2) / hd))
    xn = x.double().numpy()
    z = xn[..., : hd // 2] + 1j * xn[..., hd // 2:]
    z = z * np.exp(1j * np.arange(T)[:, None] * inv[None, :])
    want = np.concatenate([z.real, z.imag], axis=-1)
    assert _maxdiff(got, want) < 1e-5


def test_rope_scores_depend_on_relative_position():
    hd = 8
    rope = reference.Config._rope({"rope_theta": 10000.0})
    cos, sin = reference.rope_cos_sin(rope, hd, 20)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, hd, generator=g), torch.randn(1, 1, hd, generator=g)
    qs = reference.apply_rope(q.expand(1, 20, hd), cos, sin)[0]
    ks = reference.apply_rope(k.expand(1, 20, hd), cos, sin)[0]
    s = (qs @ ks.T).double().numpy()
    for delta in range(0, 6):
        diag = np.array([s[m + delta, m] for m in range(20 - delta)])
        assert np.ptp(diag) < 1e-4


def test_llama3_inv_freq_matches_meta_reference():
    """Meta's llama-models apply_scaling loop, in float64."""
    params = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    hd, theta = 128, 500000.0
    rope = reference.Config._rope({"rope_theta": theta, "rope_scaling": dict(params, rope_type="llama3")})
    got = reference.rope_inv_freq(rope, hd).double().numpy()
    freqs = 1.0 / (theta ** (np.arange(0, hd, 2)[: hd // 2].astype(np.float64) / hd))
    lo_wl = params["original_max_position_embeddings"] / params["low_freq_factor"]
    hi_wl = params["original_max_position_embeddings"] / params["high_freq_factor"]
    want = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            want.append(f)
        elif wl > lo_wl:
            want.append(f / params["factor"])
        else:
            sm = (params["original_max_position_embeddings"] / wl - params["low_freq_factor"]) / (
                params["high_freq_factor"] - params["low_freq_factor"])
            want.append((1 - sm) * f / params["factor"] + sm * f)
    want = np.array(want)
    assert np.max(np.abs(got - want) / want) < 1e-5
    # and all three regimes are exercised
    wl = 2 * math.pi / freqs
    assert (wl < hi_wl).any() and (wl > lo_wl).any() and ((wl >= hi_wl) & (wl <= lo_wl)).any()


# The new RoPE types against independent float64 formulations (the papers' definitions, written
# per dimension), not against the reference's own float32 code path. Tolerances are relative,
# 1e-6: float32 rounding of the reference's tables.
#
# Checked by mutating reference.py temporarily: yarn's beta_fast / beta_slow swapped (both yarn
# cases fail), dynamic recomputed from seq_len - 1 (the dynamic test), longrope's long factors
# from seq_len >= original (the longrope test), mscale / mscale_all_dim ignored (the attention
# factor forms), cos / sin not multiplied by the attention factor (both yarn cases), the top-level
# original_max_position_embeddings ignored (the longrope test).

def _rope(cfg_rope, max_pos=64, **top):
    return reference.Config._rope(dict(top, model_type="llama", max_position_embeddings=max_pos,
                                       rope_scaling=cfg_rope))


def _rel(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.abs(want)))


def test_dynamic_ntk_matches_formula_and_only_grows_past_the_context():
    """Dynamic NTK (bloc97 / emozilla): a forward of T > L positions uses the base
    theta * (s T / L - (s - 1)) ** (d / (d - 2)), so the lowest frequency is divided by exactly
    s T / L - (s - 1) and the highest is kept; T <= L keeps the default table."""
    hd, theta, L, s = 16, 10000.0, 32, 2.0
    rope = _rope({"type": "dynamic", "factor": s}, max_pos=L, rope_theta=theta)
    default = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    for T in (1, 20, L):
        assert _rel(reference.rope_inv_freq(rope, hd, seq_len=T), default) < 1e-6
    for T in (L + 1, 48, 64):
        stretch = s * T / L - (s - 1)
        base = theta * stretch ** (hd / (hd - 2))
        got = reference.rope_inv_freq(rope, hd, seq_len=T).double().numpy()
        assert _rel(got, base ** -(np.arange(0, hd, 2) / hd)) < 1e-6
        assert abs(got[0] - 1.0) < 1e-7 and _rel(got[-1], default[-1] / stretch) < 1e-6
    # the init-time table (no forward yet) is the default one
    assert _rel(reference.rope_inv_freq(rope, hd), default) < 1e-6


def _yarn64(hd, theta, s, L, beta_fast=32.0, beta_slow=1.0, truncate=True):
    """YaRN's NTK-by-parts, per dimension in float64: the ramp runs over the dimension index
    between the dims whose wavelength fits beta_fast and beta_slow times into L."""
    theta_i = theta ** -(np.arange(0, hd, 2, dtype=np.float64) / hd)

    def dim_for(rotations):  # the dim index i (continuous) whose frequency turns `rotations` times in L
        return hd * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, hd - 1)
    if lo == hi:
        hi += 0.001
    out = []
    for i, f in enumerate(theta_i):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: keep f, 1: f / s
        out.append(f / s * ramp + f * (1 - ramp))
    return np.array(out)


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_matches_ntk_by_parts(truncate):
    hd, theta, s, L = 16, 100.0, 4.0, 64
    rope = _rope({"type": "yarn", "factor": s, "original_max_position_embeddings": L,
                  "truncate": truncate, "beta_fast": 4, "beta_slow": 0.5}, max_pos=256, rope_theta=theta)
    inv, af = reference.rope_parameters(rope, hd, seq_len=200)
    want = _yarn64(hd, theta, s, L, beta_fast=4, beta_slow=0.5, truncate=truncate)
    assert _rel(inv, want) < 1e-6
    # high frequencies (many rotations within L) kept, low ones interpolated, some in between
    theta_i = theta ** -(np.arange(0, hd, 2) / hd)
    rotations = L * theta_i / (2 * math.pi)
    kept, divided = rotations >= 4, rotations <= 0.5
    assert kept.any() and divided.any() and (~kept & ~divided).any()
    assert _rel(inv.numpy()[kept], theta_i[kept]) < 1e-6
    assert _rel(inv.numpy()[divided], theta_i[divided] / s) < 1e-6
    assert abs(af - (0.1 * math.log(s) + 1)) < 1e-12
    # the attention factor multiplies cos and sin (and so every q.k score by af ** 2)
    cos, sin = reference.rope_cos_sin(rope, hd, 5)
    ang = np.arange(5)[:, None] * np.concatenate([want, want])[None, :]
    assert np.max(np.abs(cos.double().numpy() - af * np.cos(ang))) < 1e-6
    assert np.max(np.abs(sin.double().numpy() - af * np.sin(ang))) < 1e-6


def test_yarn_attention_factor_forms():
    """Given attention_factor wins; mscale / mscale_all_dim (DeepSeek) give the ratio of the two
    0.1 m ln(s) + 1 terms; either one missing or 0 falls back to 0.1 ln(s) + 1; no factor: the
    ratio max_position_embeddings / original."""
    s = 40.0

    def af(**kw):
        rp = dict({"type": "yarn", "factor": s, "original_max_position_embeddings": 16}, **kw)
        return reference.rope_parameters(_rope(rp), 16)[1]

    assert af(attention_factor=0.8) == 0.8
    assert abs(af(mscale=0.707, mscale_all_dim=1.0)
               - (0.1 * 0.707 * math.log(s) + 1) / (0.1 * math.log(s) + 1)) < 1e-12
    assert abs(af(mscale=0.707) - (0.1 * math.log(s) + 1)) < 1e-12
    assert abs(af(mscale=0.707, mscale_all_dim=0) - (0.1 * math.log(s) + 1)) < 1e-12
    implicit = reference.rope_parameters(
        reference.Config._rope({"model_type": "llama", "max_position_embeddings": 64,
                                "rope_parameters": {"rope_type": "yarn", "factor": None,
                                                    "original_max_position_embeddings": 16}}), 16)[1]
    assert abs(implicit - (0.1 * math.log(4.0) + 1)) < 1e-12


def test_longrope_factors_switch_at_the_original_context():
    """LongRoPE (Phi-3): inv_freq_i = 1 / (f_i theta ** (2i / d)) with the short factors up to
    original_max_position_embeddings and the long ones beyond; attention factor
    sqrt(1 + ln(s) / ln(L)) with s = max_position_embeddings / L (Phi-3 keeps L at the top level)."""
    hd, theta, L, M = 16, 10000.0, 16, 64
    short = [1.0 + 0.1 * i for i in range(hd // 2)]
    long = [1.5 + 0.7 * i for i in range(hd // 2)]
    rope = _rope({"type": "longrope", "short_factor": short, "long_factor": long},
                 max_pos=M, original_max_position_embeddings=L, rope_theta=theta)
    base = theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    for T, f in ((1, short), (L, short), (L + 1, long), (M, long)):
        inv, af = reference.rope_parameters(rope, hd, seq_len=T)
        assert _rel(inv, 1.0 / (np.array(f) * base)) < 1e-6, T
        assert abs(af - math.sqrt(1 + math.log(M / L) / math.log(L))) < 1e-12
    given = _rope({"type": "longrope", "short_factor": short, "long_factor": long,
                   "attention_factor": 1.3}, max_pos=M, original_max_position_embeddings=L)
    assert reference.rope_parameters(given, hd, seq_len=40)[1] == 1.3
    # top-level original_max_position_embeddings wins over the rope dict's (HF's Phi-3 exception)
    both = _rope({"type": "longrope", "short_factor": short, "long_factor": long,
                  "original_max_position_embeddings": 32}, max_pos=M,
                 original_max_position_embeddings=L)
    assert both["original_max_position_embeddings"] == L


def test_partial_rotary_factor_is_refused_for_the_llama_family():
    with pytest.raises(reference.ReferenceError, match="partial_rotary_factor"):
        reference.Config._rope({"model_type": "llama", "partial_rotary_factor": 0.5})


def test_rope_config_forms_agree():
    v4 = reference.Config._rope({"rope_theta": 1234.0})
    v5 = reference.Config._rope({"rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}})
    assert v4 == v5
    lin = reference.Config._rope({"rope_theta": 1234.0, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert torch.equal(reference.rope_inv_freq(lin, 16), reference.rope_inv_freq(v4, 16) / 2.0)
    assert reference.Config._rope({})["rope_theta"] == 10000.0


# ---------------------------------------------------------------------------------------------
# masking: causality, sliding window, GQA
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS + ["olmo", "olmo-clip", "olmo2", "olmo3", "gemma", "gemma2", "gemma3_text"] + MOE
                         + ["olmoe", "olmoe-clip", "deepseek_v3"])
def test_causality(tmp_path, arch):
    if arch.endswith("-clip"):  # clip_qkv small enough to bite
        arch, extra = arch[:-5], dict(clip_qkv=0.2)
    else:
        extra = {}
    d = _ckpt(tmp_path, arch, **extra)
    a, b = reference.run(str(d), [[7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [7, 8, 9, 10, 11, 12, 200, 14, 15, 16]])
    for k in a:
        assert np.allclose(a[k][:6], b[k][:6], rtol=0, atol=1e-6), k
    assert not np.allclose(a["lm_head"][6:], b["lm_head"][6:], atol=1e-4)


def test_mistral_sliding_window_locality(tmp_path):
    """Layer 0 attention at query i sees keys j with i - W < j <= i only."""
    W = 4
    d = _ckpt(tmp_path, "mistral", sliding_window=W)
    base = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    j = 3
    alt = list(base)
    alt[j] = 300
    a, b = reference.run(str(d), [base, alt])
    diff = np.abs(a["model.layers.0.self_attn"] - b["model.layers.0.self_attn"]).max(-1)
    for i in range(len(base)):
        if j <= i < j + W:
            assert diff[i] > 1e-6, i
        else:
            assert diff[i] == 0, i


def test_mistral_large_window_equals_llama(tmp_path):
    d_m = _ckpt(tmp_path, "mistral", name="m", sliding_window=64)
    d_l = tmp_path / "l"
    os.makedirs(d_l)
    cfg = reference.load_config(str(d_m))
    cfg.update(model_type="llama")
    cfg.pop("sliding_window")
    with open(d_l / "config.json", "w") as f:
        json.dump(cfg, f)
    os.link(d_m / "model.safetensors", d_l / "model.safetensors")
    seq = list(range(1, 30))
    a, b = reference.run(str(d_m), [seq])[0], reference.run(str(d_l), [seq])[0]
    assert all(np.array_equal(a[k], b[k]) for k in a)
    small = _ckpt(tmp_path, "mistral", name="s", sliding_window=8)
    c = reference.run(str(small), [seq])[0]
    assert not np.allclose(c["lm_head"][-1], b["lm_head"][-1], atol=1e-4)


def test_qwen2_zero_biases_equal_llama(tmp_path):
    d_q = _ckpt(tmp_path, "qwen2", name="q")
    w = st.load_checkpoint(str(d_q))
    d_l = tmp_path / "l"
    os.makedirs(d_l)
    cfg = reference.load_config(str(d_q))
    cfg.update(model_type="llama")
    with open(d_l / "config.json", "w") as f:
        json.dump(cfg, f)
    st.save(str(d_l / "model.safetensors"), {k: v for k, v in w.items() if not k.endswith(".bias")})
    for k in w:
        if k.endswith(".bias"):
            w[k] = np.zeros_like(w[k])
    st.save(str(d_q / "model.safetensors"), w)
    seq = [4, 8, 15, 16, 23, 42]
    a, b = reference.run(str(d_q), [seq])[0], reference.run(str(d_l), [seq])[0]
    assert all(_maxdiff(a[k], b[k]) < 1e-6 for k in a)


def test_qwen2_sliding_window_layers(tmp_path):
    cfg = synth.tiny_config("qwen2", num_hidden_layers=4, use_sliding_window=True, sliding_window=4,
                            max_window_layers=2)
    assert reference.Config(cfg).windows == [None, None, 4, 4]
    cfg["use_sliding_window"] = False
    assert reference.Config(cfg).windows == [None] * 4
    cfg.update(use_sliding_window=True, layer_types=["sliding_attention", "full_attention"] * 2)
    assert reference.Config(cfg).windows == [4, None, 4, None]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_layer_types_rules(arch):
    """Qwen2Config / Qwen3Config: no window unless use_sliding_window; then layers >=
    max_window_layers (default 28) slide with sliding_window (default 4096) unless layer_types
    says otherwise; layer_types overrides max_window_layers; a sliding layer without a window,
    unknown types and a wrong length are refused (HF cannot run them)."""
    cfg = synth.tiny_config(arch, num_hidden_layers=4, use_sliding_window=True, sliding_window=4,
                            max_window_layers=2)
    W = lambda **kw: reference.Config(dict(cfg, **kw)).windows  # noqa: E731
    assert W() == [None, None, 4, 4]
    assert W(max_window_layers=0) == [4] * 4
    assert W(max_window_layers=4) == [None] * 4
    assert W(use_sliding_window=False) == [None] * 4
    assert W(layer_types=["sliding_attention", "full_attention"] * 2) == [4, None, 4, None]
    assert W(layer_types=["full_attention"] * 4, max_window_layers=0) == [None] * 4
    assert W(use_sliding_window=False, layer_types=["full_attention"] * 4) == [None] * 4
    cfg.pop("max_window_layers")
    assert W() == [None] * 4  # default 28
    cfg.pop("sliding_window")
    assert W(max_window_layers=3) == [None, None, None, 4096]  # default window 4096
    for bad, msg in [(dict(use_sliding_window=False, layer_types=["sliding_attention"] * 4), "no sliding window"),
                     (dict(sliding_window=None, layer_types=["sliding_attention"] * 4), "no sliding window"),
                     (dict(layer_types=["full_attention"] * 3), "4 layer types"),
                     (dict(layer_types=["full_attention"] * 3 + ["chunked_attention"]), "chunked_attention")]:
        with pytest.raises(reference.ReferenceError, match=msg):
            W(**bad)


def test_qwen3_config_defaults():
    """Qwen3Config's defaults for absent fields; head_dim 128, not hidden_size / heads."""
    c = reference.Config({"model_type": "qwen3"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        151936, 4096, 22016, 32, 32, 32, 128)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.mlp_bias) == ("silu", 1e-6, False, False, False)
    assert c.rope["rope_type"] == "default" and c.rope["rope_theta"] == 10000.0
    assert c.rope["max_position_embeddings"] == 32768
    assert c.windows == [None] * 32
    cfg = synth.tiny_config("qwen3", hidden_size=64, num_attention_heads=4)
    del cfg["head_dim"]
    c = reference.Config(cfg)
    assert c.head_dim == 128  # not 64 / 4
    c = reference.Config({"model_type": "qwen3", "num_attention_heads": 8, "num_key_value_heads": None})
    assert c.kv_heads == 8  # null -> num_attention_heads (absent -> 32)
    with pytest.raises(reference.ReferenceError, match="head_dim"):
        reference.Config({"model_type": "qwen3", "head_dim": None})


def test_qwen3_attention_bias_covers_o_proj():
    """Qwen3Attention: bias=config.attention_bias on q, k, v AND o (Qwen2: q/k/v always, o never)."""
    for bias in (False, True):
        shapes = reference.expected_shapes(synth.tiny_config("qwen3", attention_bias=bias))
        for nm in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert (f"model.layers.0.self_attn.{nm}.bias" in shapes) == bias, (nm, bias)
        assert shapes["model.layers.1.self_attn.q_norm.weight"] == [16]
        assert shapes["model.layers.1.self_attn.k_norm.weight"] == [16]
        assert not any(".mlp." in k and k.endswith(".bias") for k in shapes)
    q2 = reference.expected_shapes(synth.tiny_config("qwen2", attention_bias=False))
    assert "model.layers.0.self_attn.q_proj.bias" in q2 and "model.layers.0.self_attn.o_proj.bias" not in q2


@pytest.mark.parametrize("unit", [True, False], ids=["unit_weights", "weights"])
def test_qwen3_qk_norm_matches_manual_rmsnorm(tmp_path, unit):
    """q_norm / k_norm = weight * x / sqrt(mean(x^2 over head_dim) + eps), per token and head, on
    q_proj / k_proj output viewed [T, heads, head_dim] (float64 here)."""
    d = _ckpt(tmp_path, "qwen3", seed=5, rms_norm_eps=1e-3)
    c = reference.Config(reference.load_config(str(d)))
    w = st.load_checkpoint(str(d))
    if unit:
        for k in w:
            if k.endswith(("q_norm.weight", "k_norm.weight")):
                w[k] = np.ones_like(w[k])
        st.save(str(d / "model.safetensors"), w)
    else:
        assert not np.allclose(w["model.layers.0.self_attn.q_norm.weight"], 1.0)
    T = 9
    r = reference.run(str(d), [[int(t) for t in np.random.default_rng(2).integers(0, c.vocab_size, T)]])[0]
    for i in range(c.layers):
        for nm, proj, n in (("q_norm", "q_proj", c.heads), ("k_norm", "k_proj", c.kv_heads)):
            p = f"model.layers.{i}.self_attn."
            x = r[p + proj].astype(np.float64).reshape(T, n, c.head_dim)
            want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-3) * w[p + nm + ".weight"].astype(np.float64)
            assert r[p + nm].shape == (T, n, c.head_dim)
            assert _maxdiff(r[p + nm], want) < 1e-5, (p + nm, _maxdiff(r[p + nm], want))
            if unit:  # unit RMS per head
                assert np.allclose((r[p + nm].astype(np.float64) ** 2).mean(-1),
                                   (x ** 2).mean(-1) / ((x ** 2).mean(-1) + 1e-3), atol=1e-5)


def test_qwen3_v4_and_v5_configs_agree(tmp_path):
    """The same Qwen3 model as transformers 4.x writes it (rope_theta + rope_scaling yarn,
    use_sliding_window + max_window_layers, torch_dtype) and as 5.x does (rope_parameters,
    layer_types, dtype) gives identical outputs; so do llama3 RoPE and the v4 `type` key."""
    for name, rope in (("yarn", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
                       ("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32})):
        v4 = synth.tiny_config("qwen3", num_hidden_layers=3, rope_theta=100.0, rope_scaling=rope,
                               use_sliding_window=True, sliding_window=5, max_window_layers=1)
        d4 = tmp_path / f"{name}-v4"
        synth.write_checkpoint(str(d4), v4, seed=6)
        v5 = synth.to_v5(reference.load_config(str(d4)))
        assert "torch_dtype" not in v5 and v5["dtype"] == "float32" and "rope_theta" not in v5
        assert v5["rope_parameters"]["rope_theta"] == 100.0 and "rope_scaling" not in v5
        assert v5["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
        v5["max_window_layers"] = 28  # ignored: layer_types decides
        d5 = tmp_path / f"{name}-v5"
        os.makedirs(d5)
        with open(d5 / "config.json", "w") as f:
            json.dump(v5, f)
        os.link(d4 / "model.safetensors", d5 / "model.safetensors")
        r4 = {k: v for k, v in reference.Config(v4).rope.items() if k != "type"}
        assert reference.Config(v5).rope == r4
        assert reference.Config(v5).windows == [None, 5, 5]
        _same_run(d4, d5, seq=list(range(3, 30)))
        # and the scaling / windows matter
        plain = tmp_path / f"{name}-plain"
        synth.write_checkpoint(str(plain), dict(v4, rope_scaling=None, use_sliding_window=False), seed=6)
        a, b = reference.run(str(d4), [list(range(3, 30))])[0], reference.run(str(plain), [list(range(3, 30))])[0]
        assert _maxdiff(a["lm_head"], b["lm_head"]) > 1e-4


def test_qwen3_0_6b_config():
    """Qwen/Qwen3-0.6B's real config.json: 596,049,920 parameters (tied), head_dim 128 though
    1024 / 16 = 64, no window (use_sliding_window false, sliding_window null)."""
    cfg = synth.QWEN3_0_6B_CONFIG
    c = reference.Config(cfg)
    assert (c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab_size) == (
        1024, 3072, 28, 16, 8, 128, 151936)
    assert c.tie and c.windows == [None] * 28 and not c.attention_bias
    assert c.rope == {"rope_type": "default", "rope_theta": 1e6, "max_position_embeddings": 40960,
                      "partial_rotary_factor": 1.0}
    shapes = reference.expected_shapes(cfg)
    del shapes["lm_head.weight"]
    assert sum(int(np.prod(s)) for s in shapes.values()) == 596049920
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == [2048, 1024]
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == [1024, 2048]
    assert reference.Config(synth.to_v5(cfg)).__dict__.keys() == c.__dict__.keys()
    v5 = reference.Config(synth.to_v5(cfg))
    assert (v5.rope, v5.windows, v5.head_dim) == (c.rope, c.windows, c.head_dim)


def _same_run_as(tmp_path, d, cfg):
    """Checkpoint d's weights under config `cfg` (written to tmp_path/v5) run as d does."""
    d5 = tmp_path / "v5"
    os.makedirs(d5)
    with open(d5 / "config.json", "w") as f:
        json.dump(cfg, f)
    os.link(d / "model.safetensors", d5 / "model.safetensors")
    _same_run(d, d5)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gemma", "olmo", "olmo3"])
def test_v5_config_forms_agree(tmp_path, arch):
    """rope_parameters / dtype / layer_types (synth.to_v5) give the same outputs as the 4.x form."""
    extra = dict(use_sliding_window=True, sliding_window=3, max_window_layers=1) if arch == "qwen2" else {}
    if arch == "olmo":
        extra = dict(clip_qkv=0.25, attention_bias=True)
    if arch == "olmo3":
        extra = dict(rope_scaling=synth.OLMO3_YARN, max_position_embeddings=512)
    d = _ckpt(tmp_path, arch, rope_theta=500.0, **extra)
    v5 = synth.to_v5(reference.load_config(str(d)))
    if arch == "qwen2":
        assert v5["layer_types"] == ["full_attention", "sliding_attention"]
    if arch == "olmo3":
        assert v5["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
        assert v5["rope_parameters"] == dict(synth.OLMO3_YARN, rope_theta=500.0)
    _same_run_as(tmp_path, d, v5)


def test_gqa_equals_expanded_mha(tmp_path):
    """repeat_kv order: query head h uses kv head h // (heads / kv_heads)."""
    d = _ckpt(tmp_path, "llama", name="gqa")
    cfg = reference.load_config(str(d))
    c = reference.Config(cfg)
    groups = c.heads // c.kv_heads
    w = st.load_checkpoint(str(d))
    for i in range(c.layers):
        for p in ("k_proj", "v_proj"):
            k = f"model.layers.{i}.self_attn.{p}.weight"
            w[k] = np.repeat(w[k].reshape(c.kv_heads, c.head_dim, c.hidden), groups, axis=0).reshape(-1, c.hidden)
    d2 = tmp_path / "mha"
    os.makedirs(d2)
    with open(d2 / "config.json", "w") as f:
        json.dump(dict(cfg, num_key_value_heads=c.heads), f)
    st.save(str(d2 / "model.safetensors"), w)
    seq = [9, 8, 7, 6, 5, 4, 3, 2, 1]
    a, b = reference.run(str(d), [seq])[0], reference.run(str(d2), [seq])[0]
    for k in a:
        if "k_proj" in k and not k.endswith(":input") or "v_proj" in k and not k.endswith(":input"):
            continue
        assert _maxdiff(a[k], b[k]) < 1e-6, k


def test_explicit_head_dim(tmp_path):
    d = _ckpt(tmp_path, "llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    r = reference.run(str(d), [[1, 2, 3]])[0]
    assert r["model.layers.0.self_attn.q_proj"].shape == (3, 64)
    assert r["model.layers.0.self_attn.k_proj"].shape == (3, 32)
    assert r["model.layers.0.self_attn.o_proj:input"].shape == (3, 64)
    assert r["model.layers.0.self_attn.o_proj"].shape == (3, 32)


# ---------------------------------------------------------------------------------------------
# checkpoint format equivalences
# ---------------------------------------------------------------------------------------------

def _with_tensors(tmp_path, d, name, tensors):
    """Checkpoint tmp_path / name: d's config.json with `tensors` as its weights."""
    d2 = tmp_path / name
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    st.save(str(d2 / "model.safetensors"), tensors)
    return d2


def _same_run(d1, d2, seq=(3, 1, 4, 1, 5, 9, 2, 6, 5, 3)):
    a, b = reference.run(str(d1), [list(seq)])[0], reference.run(str(d2), [list(seq)])[0]
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_gpt2_unprefixed_with_buffers_equivalent(tmp_path):
    d = _ckpt(tmp_path, "gpt2")
    c = reference.Config(reference.load_config(str(d)))
    w = st.load_checkpoint(str(d))
    d2 = tmp_path / "np"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    w2 = {k.replace("transformer.", "", 1): v for k, v in w.items()}
    P = c.n_positions
    for i in range(c.layers):
        w2[f"h.{i}.attn.bias"] = np.tril(np.ones((P, P), bool)).reshape(1, 1, P, P)
        w2[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    st.save(str(d2 / "model.safetensors"), w2)
    _same_run(d, d2)


def test_tied_under_lm_head_equivalent(tmp_path):
    d = _ckpt(tmp_path, "llama", tie_word_embeddings=True)
    w = st.load_checkpoint(str(d))
    assert "lm_head.weight" not in w
    d2 = tmp_path / "lm"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    w["lm_head.weight"] = w.pop("model.embed_tokens.weight")
    st.save(str(d2 / "model.safetensors"), w)
    _same_run(d, d2)


def test_untied_uses_lm_head(tmp_path):
    d = _ckpt(tmp_path, "llama", tie_word_embeddings=False)
    w = st.load_checkpoint(str(d))
    r = reference.run(str(d), [[1, 2, 3]])[0]
    assert _maxdiff(r["lm_head"], r["model.norm"] @ w["lm_head.weight"].T) < 1e-5
    assert _maxdiff(r["lm_head"], r["model.norm"] @ w["model.embed_tokens.weight"].T) > 1e-3


def test_sharded_and_inv_freq_equivalent(tmp_path):
    d = _ckpt(tmp_path, "llama")
    w = st.load_checkpoint(str(d))
    d2 = tmp_path / "sh"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    w["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    st.save_sharded(str(d2), w, n_shards=2)
    assert not (d2 / "model.safetensors").exists()
    _same_run(d, d2)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_checkpoint_equals_f32_of_rounded_weights(tmp_path, dtype):
    cfg = synth.tiny_config("qwen2")
    d = tmp_path / "h"
    w = synth.write_checkpoint(str(d), cfg, seed=3, dtype=dtype)
    d2 = tmp_path / "f"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    up = {k: (v.astype(np.float32) if dtype == "f16" else st.bf16_bits_to_f32(v)) for k, v in w.items()}
    st.save(str(d2 / "model.safetensors"), up)
    _same_run(d, d2)


# ---------------------------------------------------------------------------------------------
# OLMo 2 and Gemma 2
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["olmo2", "olmo3", "gemma2", "gemma3_text"])
def test_sublayer_norm_wiring(tmp_path, arch):
    """Olmo2DecoderLayer / Olmo3DecoderLayer / Gemma2DecoderLayer: the norms act on the sublayer
    outputs before the residual add (Gemma 2 also before each sublayer); OLMo 2's and 3's q_norm /
    k_norm see the whole projection."""
    d = _ckpt(tmp_path, arch)
    c = reference.Config(reference.load_config(str(d)))
    r = reference.run(str(d), [[5, 17, 2, 99, 3, 3, 250]])[0]
    eq = np.array_equal
    for i in range(c.layers):
        p = f"model.layers.{i}"
        prev = r[f"model.layers.{i - 1}"] if i else r["model.embed_tokens"]
        assert eq(r[p + ":input"], prev)
        gemma = arch in ("gemma2", "gemma3_text")
        attn_in = r[p + ".input_layernorm"] if gemma else prev
        if gemma:
            assert eq(r[p + ".input_layernorm:input"], prev)
        else:
            assert p + ".input_layernorm" not in r
            assert eq(r[p + ".self_attn.q_norm:input"], r[p + ".self_attn.q_proj"])
            assert r[p + ".self_attn.k_norm"].shape == (7, c.kv_heads * c.head_dim)
        assert eq(r[p + ".self_attn:input"], attn_in)
        assert eq(r[p + ".post_attention_layernorm:input"], r[p + ".self_attn"])
        h = prev + r[p + ".post_attention_layernorm"]
        mlp_in = r[p + ".pre_feedforward_layernorm"] if gemma else h
        if gemma:
            assert eq(r[p + ".pre_feedforward_layernorm:input"], h)
        assert eq(r[p + ".mlp:input"], mlp_in)
        assert eq(r[p + ".post_feedforward_layernorm:input"], r[p + ".mlp"])
        assert eq(r[p], h + r[p + ".post_feedforward_layernorm"])
    assert eq(r["lm_head:input"], r["model.norm"])


@pytest.mark.parametrize("arch", ["gemma", "gemma2"])
def test_gemma_norm_is_one_plus_w_in_float32(tmp_path, arch):
    """GemmaRMSNorm / Gemma2RMSNorm with w = 0 is a plain RMS normalisation (the weight is an
    offset from one)."""
    d = _ckpt(tmp_path, arch)
    w = st.load_checkpoint(str(d))
    for k in w:
        if k.endswith("norm.weight"):
            w[k] = np.zeros_like(w[k])
    st.save(str(d / "model.safetensors"), w, metadata={"format": "pt"})
    r = reference.run(str(d), [[5, 17, 2, 99]])[0]
    x = r["model.norm:input"].astype(np.float64)
    want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)
    assert _maxdiff(r["model.norm"], want) < 1e-5


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text"])
def test_gemma_sliding_window_on_even_layers(tmp_path, arch):
    """Layer 0 (sliding, window 4) at query i sees keys i - 4 < j <= i; layer 1 is global (Gemma 2:
    the even layers slide; the tiny Gemma 3's sliding_window_pattern is 2)."""
    W = 4
    d = _ckpt(tmp_path, arch, sliding_window=W)
    base = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    j = 3
    alt = list(base)
    alt[j] = 300
    a, b = reference.run(str(d), [base, alt])
    diff = np.abs(a["model.layers.0.self_attn"] - b["model.layers.0.self_attn"]).max(-1)
    for i in range(len(base)):
        assert (diff[i] > 1e-6) == (j <= i < j + W), i
    # layer 1 (global) sees position j from every later query
    d1 = np.abs(a["model.layers.1.self_attn"] - b["model.layers.1.self_attn"]).max(-1)
    assert (d1[j:] > 1e-6).all()


def test_gemma2_softcaps_bound_scores_and_logits(tmp_path):
    d = _ckpt(tmp_path, "gemma2", final_logit_softcapping=0.5)
    m = reference.Model(str(d))
    lm = m.forward([1, 2, 3, 4, 5])["lm_head"]
    capped = m.final_logits([1, 2, 3, 4, 5])
    assert np.abs(lm).max() > 1.0 and np.abs(capped).max() <= 0.5
    assert _maxdiff(capped, np.tanh(lm.astype(np.float64) / 0.5) * 0.5) < 1e-6


def test_gemma2_config_defaults():
    c = reference.Config({"model_type": "gemma2"})
    assert (c.hidden, c.heads, c.kv_heads, c.head_dim, c.layers) == (2304, 8, 4, 256, 26)
    assert (c.attn_softcap, c.final_softcap, c.query_pre_attn_scalar, c.tie) == (50.0, 30.0, 256.0, True)
    assert c.windows[:3] == [4096, None, 4096] and c.act == "gelu_pytorch_tanh"


def test_olmo2_config_defaults():
    c = reference.Config({"model_type": "olmo2", "num_attention_heads": 8})
    assert (c.hidden, c.heads, c.kv_heads, c.head_dim, c.eps, c.tie) == (4096, 8, 8, 512, 1e-5, False)


# ---------------------------------------------------------------------------------------------
# Gemma 1 (modeling_gemma.py: GemmaModel, GemmaDecoderLayer, GemmaAttention, GemmaMLP)
# ---------------------------------------------------------------------------------------------

def _gelu_tanh64(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf64(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _gemma1_layer64(x, w, p, cfg, wrong=None):
    """One GemmaDecoderLayer in float64 on rows x [T, H], from the written tensors `w` and the
    config.json dict `cfg` (the tiny configs give head_dim, num_key_value_heads and the activation
    fields explicitly). Returns the dict of points self_attn, mlp:input, mlp and the layer output.

    norm(v) = v / sqrt(mean(v^2) + eps) * (1 + g); h = x + o_proj(attn(norm_in(x)));
    out = h + down(gelu_tanh(gate(norm_post(h))) * up(norm_post(h))); attention: q / k / v
    projections (+ biases), RoPE as a complex rotation of the pairs (i, i + hd/2) (_inv_freq64),
    kv head h // groups for query head h, softmax(q k^T / sqrt(head_dim)) over keys j <= i.

    wrong: one deliberate error, to show that the comparison tells it apart:
      "norm_w"       Llama's norm (times g, not 1 + g);
      "scale_hidden" the scale from hidden_size / num_attention_heads (8), not head_dim (16);
      "sandwich"     Gemma 2's wiring: post_attention_layernorm on the attention output before the
                     residual add, the MLP on h itself."""
    x = np.asarray(x, np.float64)
    T, H = x.shape
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]

    def norm(v, name):
        g = w[f"{p}.{name}.weight"].astype(np.float64)
        return v / np.sqrt((v ** 2).mean(-1, keepdims=True) + eps) * (g if wrong == "norm_w" else 1.0 + g)

    def lin(v, name):
        y = v @ w[f"{name}.weight"].astype(np.float64).T
        b = w.get(f"{name}.bias")
        return y if b is None else y + b

    A = p + ".self_attn"
    xn = norm(x, "input_layernorm")
    scale = (H // nh if wrong == "scale_hidden" else hd) ** -0.5
    o = _attention64(lin(xn, A + ".q_proj"), lin(xn, A + ".k_proj"), lin(xn, A + ".v_proj"), cfg, hd,
                     scale=scale)
    a = lin(o, A + ".o_proj")
    if wrong == "sandwich":
        h = x + norm(a, "post_attention_layernorm")
        m_in = h
    else:
        h = x + a
        m_in = norm(h, "post_attention_layernorm")
    M = p + ".mlp"
    ga = _gelu_tanh64(lin(m_in, M + ".gate_proj"))
    m = lin(ga * lin(m_in, M + ".up_proj"), M + ".down_proj")
    return {A: a, M + ":input": m_in, M + ".act_fn": ga, M: m, p: h + m}


GEMMA1_CASES = {
    # the tiny config: GQA (4 heads, 2 kv heads), head_dim 16 != 32 / 4, tied, plain RoPE
    "gqa": {},
    # q / k / v / o biases, linear RoPE scaling and another theta
    "bias-linear-rope": dict(attention_bias=True, rope_theta=1000.0, rope_scaling={"type": "linear", "factor": 3.0}),
    # one kv head (gemma-2b's MQA), llama3 scaling over all three regimes (see LLAMA_ATTENTION_CASES),
    # untied head, a larger eps
    "mqa-llama3-untied": dict(num_key_value_heads=1, rope_theta=100.0, tie_word_embeddings=False,
                              rms_norm_eps=1e-3, rope_scaling=dict(rope_type="llama3", factor=4.0,
                                                                   low_freq_factor=1.0, high_freq_factor=4.0,
                                                                   original_max_position_embeddings=128)),
}
GEMMA1_GATE_GAIN = 40.0  # gate_proj weights scaled up: gate values O(3), where the two gelus differ


@pytest.mark.parametrize("case", list(GEMMA1_CASES))
def test_gemma1_model_matches_float64_formula(tmp_path, case):
    """The whole Gemma 1 model against _gemma1_layer64 chained in float64 from the embedding
    (E[ids] * sqrt(hidden_size)) to the logits (norm(h) @ lm_head^T, uncapped): every layer's
    self_attn, mlp input, mlp.act_fn, mlp and output, model.norm and lm_head within 1e-5 relative.
    Then each listed mistake, made on layer 0's float64 side, must move a point far outside the
    tolerance; and act_fn must be the tanh gelu, not the erf one (a tighter, absolute tolerance).
    (Checked the other way round too, by mutating a copy of reference.py's _gemma1: the norm as
    w * x, the scale from hidden / heads, Gemma 2's sandwich wiring and the embedding unscaled each
    fail every case; o_proj without its bias fails bias-linear-rope.)"""
    d = tmp_path / "m"
    cfg = synth.tiny_config("gemma", **GEMMA1_CASES[case])
    w = synth.write_checkpoint(str(d), cfg, seed=5)
    for i in range(cfg["num_hidden_layers"]):
        w[f"model.layers.{i}.mlp.gate_proj.weight"] *= np.float32(GEMMA1_GATE_GAIN)
    st.save(str(d / "model.safetensors"), w, metadata={"format": "pt"})
    cfg = reference.load_config(str(d))
    c = reference.Config(cfg)
    assert c.arch == "gemma" and c.tie == cfg["tie_word_embeddings"]
    seq = [int(t) for t in np.random.default_rng(2).integers(0, c.vocab_size, 20)]
    r = reference.run(str(d), [seq])[0]

    def tol(name):
        return 1e-5 * max(1.0, float(np.abs(r[name]).max()))

    emb = w["model.embed_tokens.weight"].astype(np.float64)
    h = emb[seq] * math.sqrt(c.hidden)
    assert _maxdiff(r["model.embed_tokens"], h) < tol("model.embed_tokens")
    assert np.array_equal(r["model.embed_tokens:input"], np.array(seq))
    for i in range(c.layers):
        p = f"model.layers.{i}"
        want = _gemma1_layer64(h, w, p, cfg)
        for name, v in want.items():
            assert _maxdiff(r[name], v) < tol(name), (name, _maxdiff(r[name], v))
        h = want[p]
    g = w["model.norm.weight"].astype(np.float64)
    hn = h / np.sqrt((h ** 2).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * (1 + g)
    assert _maxdiff(r["model.norm"], hn) < tol("model.norm")
    head = emb if c.tie else w["lm_head.weight"].astype(np.float64)
    assert _maxdiff(r["lm_head"], hn @ head.T) < tol("lm_head")
    # power: on layer 0, from the reference's own layer input
    p = "model.layers.0"
    x0 = r[p + ":input"]
    # the gelus differ where it matters: the gate values reach the region |x| ~ 1..3
    assert np.abs(r[p + ".mlp.gate_proj"]).max() > 2.0
    for wrong in ("norm_w", "scale_hidden", "sandwich"):
        got = _gemma1_layer64(x0, w, p, cfg, wrong=wrong)
        worst = max(_maxdiff(r[n], v) / tol(n) for n, v in got.items())
        assert worst > 100, (wrong, worst)  # measured: >= 178 (scale_hidden), >= 9e4 (the others)
    # the two gelus are at most 4.7e-4 apart, under the tolerance above: act_fn on its own input,
    # with an absolute tolerance (measured <= 3.3e-7, gate values up to ~16) the erf gelu misses
    for i in range(c.layers):
        A = f"model.layers.{i}.mlp.act_fn"
        g = r[A + ":input"].astype(np.float64)
        assert _maxdiff(r[A], _gelu_tanh64(g)) < 2e-6, A
        assert _maxdiff(r[A], _gelu_erf64(g)) > 1e-4, A


def test_gemma_activation_rule(tmp_path):
    """Our rule (reference.Config._gemma's docstring): hidden_activation when non-null, else
    hidden_act, else gelu_pytorch_tanh; and the MLP runs what it picks (checked on act_fn against
    both gelus in float64, with gate values large enough for them to differ)."""
    def act(**fields):
        return reference.Config(dict(model_type="gemma", **fields)).act

    assert act(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh") == "gelu_pytorch_tanh"
    assert act(hidden_act="gelu_pytorch_tanh", hidden_activation="silu") == "silu"
    assert act(hidden_act="gelu") == "gelu"
    assert act(hidden_act="relu", hidden_activation=None) == "relu"
    assert act() == "gelu_pytorch_tanh"
    assert act(hidden_activation=None) == "gelu_pytorch_tanh"
    assert act(hidden_activation="gelu") == "gelu"
    assert reference.Config(synth.GEMMA_2B_CONFIG).act == "gelu_pytorch_tanh"  # not its legacy "gelu"
    with pytest.raises(reference.ReferenceError):  # the name is kept; running it is refused
        reference._act(act(hidden_act="gelu", hidden_activation="no_such_activation"))
    seq = [5, 17, 2, 99, 3, 3, 250, 8]
    for name, fields, want, other in (
            ("legacy", dict(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh"), _gelu_tanh64, _gelu_erf64),
            ("act-only", dict(hidden_act="gelu", hidden_activation=None), _gelu_erf64, _gelu_tanh64),
            ("absent", dict(hidden_act=None, hidden_activation=None), _gelu_tanh64, _gelu_erf64)):
        cfg = synth.tiny_config("gemma", **fields)
        cfg = {k: v for k, v in cfg.items() if v is not None or k not in ("hidden_act", "hidden_activation")}
        d = tmp_path / name
        w = synth.write_checkpoint(str(d), cfg, seed=1)
        w["model.layers.0.mlp.gate_proj.weight"] *= np.float32(GEMMA1_GATE_GAIN)
        st.save(str(d / "model.safetensors"), w, metadata={"format": "pt"})
        r = reference.run(str(d), [seq])[0]
        g = r["model.layers.0.mlp.act_fn:input"].astype(np.float64)
        assert np.abs(g).max() > 2.0
        # measured: 3.3e-7 against the right gelu, 4.7e-4 against the other
        assert _maxdiff(r["model.layers.0.mlp.act_fn"], want(g)) < 2e-6, name
        assert _maxdiff(r["model.layers.0.mlp.act_fn"], other(g)) > 1e-4, name


def test_gemma_config_defaults_and_refusals():
    """GemmaConfig's defaults (gemma-7b's sizes): head_dim 256 and num_key_value_heads 16 are fixed
    defaults, never derived from hidden_size / num_attention_heads; tied; rope theta 10000 over 8192
    positions. Nulls in non-Optional fields, use_bidirectional_attention true and a null rope_theta
    are refused; every rope type reads as for Llama."""
    c = reference.Config({"model_type": "gemma"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        256000, 3072, 24576, 28, 16, 16, 256)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.mlp_bias) == ("gelu_pytorch_tanh", 1e-6, True, False, False)
    assert (c.rope["rope_type"], c.rope["rope_theta"], c.rope["max_position_embeddings"]) == ("default", 10000.0, 8192)
    assert c.windows == [None] * 28 and getattr(c, "final_softcap", None) is None
    small = reference.Config({"model_type": "gemma", "hidden_size": 32, "num_attention_heads": 16})
    assert (small.head_dim, small.kv_heads) == (256, 16)  # not 32 // 16, not num_attention_heads
    with pytest.raises(reference.ReferenceError):  # 8 heads with the default 16 kv heads
        reference.Config({"model_type": "gemma", "num_attention_heads": 8})
    for k in ("num_key_value_heads", "head_dim", "hidden_size", "rms_norm_eps", "tie_word_embeddings",
              "attention_bias", "max_position_embeddings", "rope_theta"):
        with pytest.raises(reference.ReferenceError):
            reference.Config({"model_type": "gemma", k: None})
    with pytest.raises(reference.ReferenceError):
        reference.Config({"model_type": "gemma", "head_dim": 15})
    with pytest.raises(reference.ReferenceError):
        reference.Config({"model_type": "gemma", "use_bidirectional_attention": True})
    for ok in (None, False):
        reference.Config({"model_type": "gemma", "use_bidirectional_attention": ok})
    with pytest.raises(reference.ReferenceError):
        reference.Config({"model_type": "gemma", "partial_rotary_factor": 0.5})
    v5 = reference.Config({"model_type": "gemma", "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                                      "rope_theta": 500.0}})
    assert (v5.rope["rope_type"], v5.rope["rope_theta"], v5.rope["original_max_position_embeddings"]) == (
        "yarn", 500.0, 8192)
    assert reference.Config({"model_type": "gemma", "rope_theta": None,
                             "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}}).rope["rope_theta"] == 5.0


def test_gemma_2b_and_7b_parameter_counts():
    """google/gemma-2b's config.json (synth.GEMMA_2B_CONFIG) and GemmaConfig's defaults (gemma-7b's
    sizes): the tensors expected_shapes lists, the tied head counted once, add up to the parameter
    counts transformers 5.12.1's GemmaForCausalLM reports for them (built on the meta device)."""
    counts = {}
    for name, cfg in (("2b", synth.GEMMA_2B_CONFIG), ("7b", {"model_type": "gemma"})):
        c = reference.Config(cfg)
        shapes = reference.expected_shapes(c)
        counts[name] = sum(int(np.prod(s)) for k, s in shapes.items() if not (c.tie and k == "lm_head.weight"))
    assert counts == {"2b": 2_506_172_416, "7b": 8_537_680_896}
    c = reference.Config(synth.GEMMA_2B_CONFIG)
    assert (c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim, c.tie) == (2048, 16384, 18, 8, 1, 256, True)
    shapes = reference.expected_shapes(c)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == [256, 2048]
    assert not any("feedforward" in k or "q_norm" in k or k.endswith(".bias") for k in shapes)


def test_gemma1_embedding_head_and_bias_layout(tmp_path):
    """model.embed_tokens is the embedding times float32(sqrt(hidden_size)) (HF's own module output);
    the tied head may be stored under either name; attention_bias adds q, k, v AND o biases."""
    d = _ckpt(tmp_path, "gemma")
    w = st.load_checkpoint(str(d))
    assert "lm_head.weight" not in w
    ids = [5, 17, 2, 99, 3]
    r = reference.run(str(d), [ids])[0]
    assert np.array_equal(r["model.embed_tokens"], w["model.embed_tokens.weight"][ids] * np.float32(32 ** 0.5))
    d2 = tmp_path / "lm"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    w["lm_head.weight"] = w.pop("model.embed_tokens.weight")
    st.save(str(d2 / "model.safetensors"), w)
    _same_run(d, d2)
    shapes = reference.expected_shapes(synth.tiny_config("gemma", attention_bias=True))
    assert [k for k in shapes if k.startswith("model.layers.0.") and k.endswith(".bias")] == [
        f"model.layers.0.self_attn.{n}.bias" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]


# ---------------------------------------------------------------------------------------------
# OLMo 1 (modeling_olmo.py: OlmoModel, OlmoDecoderLayer, OlmoAttention, OlmoLayerNorm) and the
# clip_qkv clamp of OLMo and OLMoE (modeling_olmoe.py: OlmoeAttention)
# ---------------------------------------------------------------------------------------------

def _attention64(q, k, v, cfg, hd, window=None, scale=None):
    """Eager causal attention in float64 on projections q [T, nh * hd], k / v [T, nkv * hd] (already
    clamped, normed, ...): RoPE as a complex rotation of the pairs (i, i + hd/2) (_rope64 of the
    4.x-form config dict `cfg`), kv head h // groups for query head h, softmax(q k^T * scale) with
    scale 1 / sqrt(hd) unless given, over keys j <= i (with a window W: i - W < j <= i). Returns the
    context [T, nh * hd] (o_proj's input)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    T = q.shape[0]
    nh, nkv = q.shape[1] // hd, k.shape[1] // hd
    q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
    q, k = _rope64(q, cfg, hd), _rope64(k, cfg, hd)
    kv_of = np.arange(nh) // (nh // nkv)
    s = np.einsum("ihd,jhd->hij", q, k[:, kv_of]) * (hd ** -0.5 if scale is None else scale)
    allowed = np.tril(np.ones((T, T), bool))
    if window is not None:
        allowed &= np.arange(T)[None, :] > np.arange(T)[:, None] - window
    s = np.where(allowed[None], s, -np.inf)
    pr = np.exp(s - s.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", pr, v[:, kv_of]).reshape(T, nh * hd)


OLMO_NORM_GAIN = np.random.default_rng(11).standard_normal(32) * 0.1 + 1.0  # the "norm_weight" mistake


def _olmo_norm64(v, wrong=None):
    """OlmoLayerNorm in float64: (v - mean) / sqrt(var + 1e-5), no weight, no bias. wrong:
    "rms" (RMSNorm: no centring), "eps6" (eps 1e-6), "norm_weight" (a parametric LayerNorm, times
    OLMO_NORM_GAIN)."""
    v = np.asarray(v, np.float64)
    eps = 1e-6 if wrong == "eps6" else 1e-5
    c = v if wrong == "rms" else v - v.mean(-1, keepdims=True)
    out = c / np.sqrt((c ** 2).mean(-1, keepdims=True) + eps)
    return out * OLMO_NORM_GAIN[: v.shape[-1]] if wrong == "norm_weight" else out


def _olmo_layer64(x, w, p, cfg, wrong=None):
    """One OlmoDecoderLayer in float64 on rows x [T, H], from the written tensors `w` and the
    config.json dict `cfg` (synth's tiny form: num_key_value_heads explicit). Returns a dict of
    points: input_layernorm, q/k/v_proj (UNclamped, as HF's hooks see them), o_proj:input,
    self_attn, post_attention_layernorm, mlp.act_fn, mlp and the layer output.

    h = x + o_proj(attn(ln(x))); out = h + down(act(gate(ln(h))) * up(ln(h))), ln = _olmo_norm64,
    act silu or the exact (erf) gelu as hidden_act says; with clip_qkv the attention runs on clip(q),
    clip(k), clip(v).

    wrong: one deliberate error: the norm mistakes of _olmo_norm64 ("rms", "eps6", "norm_weight");
    with clip_qkv also "no_clip" (the clamp omitted), "clip_point" (the q_proj point reported
    clamped) and "clip_qk_only" (v left unclamped)."""
    x = np.asarray(x, np.float64)
    H = x.shape[1]
    nh = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or H // nh
    clip = cfg.get("clip_qkv")
    act = {"silu": _silu64, "gelu": _gelu_erf64}[cfg["hidden_act"]]

    def lin(v, name):
        y = v @ w[f"{name}.weight"].astype(np.float64).T
        b = w.get(f"{name}.bias")
        return y if b is None else y + b

    def clamp(t):
        return t if clip is None or wrong == "no_clip" else np.clip(t, -clip, clip)

    A, M = p + ".self_attn", p + ".mlp"
    xn = _olmo_norm64(x, wrong)
    q, k, v = (lin(xn, f"{A}.{nm}") for nm in ("q_proj", "k_proj", "v_proj"))
    o = _attention64(clamp(q), clamp(k), v if wrong == "clip_qk_only" else clamp(v), cfg, hd)
    a = lin(o, A + ".o_proj")
    h = x + a
    hn = _olmo_norm64(h, wrong)
    ga = act(lin(hn, M + ".gate_proj"))
    m = lin(ga * lin(hn, M + ".up_proj"), M + ".down_proj")
    return {p + ".input_layernorm": xn, A + ".q_proj": clamp(q) if wrong == "clip_point" else q,
            A + ".k_proj": k, A + ".v_proj": v, A + ".o_proj:input": o, A: a,
            p + ".post_attention_layernorm": hn, M + ".act_fn": ga, M: m, p: h + m}


OLMO_CASES = {
    # the tiny config: GQA (4 heads, 2 kv heads), head_dim 8 = 32 / 4, untied, plain RoPE
    "gqa": {},
    # q / k / v / o biases, clip_qkv biting (|q|, |k| reach ~1.5, |v| ~0.5), linear RoPE and another theta
    "bias-clip-linear-rope": dict(attention_bias=True, clip_qkv=0.25, rope_theta=1000.0,
                                  rope_scaling={"type": "linear", "factor": 3.0}),
    # MHA, tied head, llama3 scaling over its three regimes (see LLAMA_ATTENTION_CASES), a clip that
    # bites q / k often and v only at its few largest values (|v| <= ~0.35)
    "mha-tied-llama3-clip": dict(num_key_value_heads=4, tie_word_embeddings=True, clip_qkv=0.3, rope_theta=100.0,
                                 rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, original_max_position_embeddings=128)),
    # an explicit head_dim 16 != 32 / 4 (OlmoAttention's getattr reads it), gelu MLP
    "head-dim16-gelu": dict(head_dim=16, hidden_act="gelu"),
}
OLMO_EMB_GAIN = 0.02  # embedding rows ~ N(0, 0.01): residual-stream variances ~1e-4, where eps 1e-5 matters


@pytest.mark.parametrize("case", list(OLMO_CASES))
def test_olmo_model_matches_float64_formula(tmp_path, case):
    """The whole OLMo 1 model against _olmo_layer64 chained in float64 from the embedding to the
    logits (norm(h) @ lm_head^T): every layer's input_layernorm, unclamped q / k / v_proj, o_proj
    input, self_attn, post_attention_layernorm, mlp.act_fn, mlp and output, model.norm and lm_head
    within 1e-5 relative. Then each listed mistake, made on layer 0's float64 side, must move a point
    far outside the tolerance: a LayerNorm with a weight, RMSNorm, eps 1e-6, and with clip_qkv the
    clamp omitted, the q_proj point clamped, v unclamped.
    (Checked the other way round too, by mutating a copy of reference.py's _olmo: RMSNorm, eps
    1e-6, the clamp omitted, the clamp applied in place to the recorded projections, v unclamped:
    each fails the cases it concerns.)"""
    d = tmp_path / "m"
    cfg = synth.tiny_config("olmo", **OLMO_CASES[case])
    w = synth.write_checkpoint(str(d), cfg, seed=5)
    assert not any("norm" in k for k in w)  # OlmoLayerNorm: no tensors
    w["model.embed_tokens.weight"] *= np.float32(OLMO_EMB_GAIN)
    st.save(str(d / "model.safetensors"), w, metadata={"format": "pt"})
    cfg = reference.load_config(str(d))
    c = reference.Config(cfg)
    assert c.arch == "olmo" and c.tie == cfg["tie_word_embeddings"] and c.clip_qkv == cfg["clip_qkv"]
    seq = [int(t) for t in np.random.default_rng(2).integers(0, c.vocab_size, 20)]
    r = reference.run(str(d), [seq])[0]

    def tol(name):
        return 1e-5 * max(1.0, float(np.abs(r[name]).max()))

    emb = w["model.embed_tokens.weight"].astype(np.float64)
    h = emb[seq]
    assert np.array_equal(r["model.embed_tokens"], w["model.embed_tokens.weight"][seq])
    for i in range(c.layers):
        p = f"model.layers.{i}"
        want = _olmo_layer64(h, w, p, cfg)
        for name, v in want.items():
            assert _maxdiff(r[name], v) < tol(name), (name, _maxdiff(r[name], v))
        h = want[p]
    hn = _olmo_norm64(h)
    assert _maxdiff(r["model.norm"], hn) < tol("model.norm")
    head = emb if c.tie else w["lm_head.weight"].astype(np.float64)
    assert _maxdiff(r["lm_head"], hn @ head.T) < tol("lm_head")
    # the residual stream is small enough for eps to matter (variance ~1e-4 against eps 1e-5)
    assert r["model.layers.0.input_layernorm:input"].var(-1).max() < 1e-3
    # power: on layer 0, from the reference's own layer input
    p = "model.layers.0"
    x0 = r[p + ":input"]
    wrongs = ["norm_weight", "rms", "eps6"]
    if c.clip_qkv is not None:
        A = p + ".self_attn"
        # the clamp bites q, k and v somewhere, and the points keep the unclamped values
        for nm in ("q_proj", "k_proj", "v_proj"):
            assert np.abs(r[f"{A}.{nm}"]).max() > c.clip_qkv, nm
        wrongs += ["no_clip", "clip_point", "clip_qk_only"]
    for wrong in wrongs:
        got = _olmo_layer64(x0, w, p, cfg, wrong=wrong)
        worst = max(_maxdiff(r[n], v) / tol(n) for n, v in got.items())
        assert worst > 100, (wrong, worst)  # measured: >= 5228 (the correct formula: <= 0.026)


def test_olmo_layernorm_is_parameter_free(tmp_path):
    """OlmoLayerNorm: no tensors in expected_shapes (so none written); each norm's output is
    (x - mean) / sqrt(var + 1e-5) of its input row; norm tensors stored anyway are ignored (as
    transformers 5.12 does: its load report lists them as UNEXPECTED and the logits do not move)."""
    cfg = synth.tiny_config("olmo", attention_bias=True)
    shapes = reference.expected_shapes(cfg)
    assert not any("norm" in k for k in shapes)
    assert [k for k in shapes if k.startswith("model.layers.0.") and k.endswith(".bias")] == [
        f"model.layers.0.self_attn.{n}.bias" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    assert not any(".mlp." in k and k.endswith(".bias") for k in reference.expected_shapes(dict(cfg, mlp_bias=True)))
    d = _ckpt(tmp_path, "olmo", attention_bias=True)
    r = reference.run(str(d), [[5, 17, 2, 99, 3, 3, 250]])[0]
    for name in ["model.norm"] + [f"model.layers.{i}.{n}" for i in range(3)
                                  for n in ("input_layernorm", "post_attention_layernorm")]:
        x = r[name + ":input"].astype(np.float64)
        var = x.var(-1, keepdims=True)
        assert _maxdiff(r[name], (x - x.mean(-1, keepdims=True)) / np.sqrt(var + 1e-5)) < 1e-5, name
    w = st.load_checkpoint(str(d))
    for i in range(3):
        for nm in ("input_layernorm", "post_attention_layernorm"):
            w[f"model.layers.{i}.{nm}.weight"] = np.full(32, 3.0, np.float32)
            w[f"model.layers.{i}.{nm}.bias"] = np.ones(32, np.float32)
    w["model.norm.weight"] = np.full(32, 3.0, np.float32)
    d2 = tmp_path / "stray"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    st.save(str(d2 / "model.safetensors"), w)
    _same_run(d, d2)


def test_olmo_clip_qkv_points_and_effect(tmp_path):
    """clip_qkv: the q / k / v_proj points are the unclamped projections (HF clamps in place after
    the hooks ran), the attention uses the clamped ones: with a biting clip the logits move; with a
    clip no value reaches, every point equals the unclipped model's; the patterns come from the
    clamped q / k."""
    seq = [int(t) for t in np.random.default_rng(4).integers(0, 384, 16)]
    base = reference.run(str(_ckpt(tmp_path, "olmo", name="none")), [seq], patterns=True)[0]
    big = reference.run(str(_ckpt(tmp_path, "olmo", name="big", clip_qkv=1e6)), [seq], patterns=True)[0]
    small = reference.run(str(_ckpt(tmp_path, "olmo", name="small", clip_qkv=0.2)), [seq], patterns=True)[0]
    assert set(base) == set(big) == set(small)
    for k in base:
        assert np.array_equal(base[k], big[k]), k
    for i in range(3):
        A = f"model.layers.{i}.self_attn"
        if i == 0:  # same input: the projection points are the unclipped model's, beyond the clip
            for nm in ("q_proj", "k_proj", "v_proj"):
                assert np.array_equal(small[f"{A}.{nm}"], base[f"{A}.{nm}"])
                assert np.abs(small[f"{A}.{nm}"]).max() > 0.2
            q = np.clip(small[A + ".q_proj"], -0.2, 0.2).reshape(16, 4, 8)
            k = np.clip(small[A + ".k_proj"], -0.2, 0.2).reshape(16, 2, 8)
            # position 0: RoPE is the identity, so the first score row is q0 . k0 / sqrt(8)
            s00 = (q[0] * k[0][np.arange(4) // 2]).sum(-1) / math.sqrt(8)
            assert _maxdiff(small[A + ":scores"][0, :, 0], s00) < 1e-6
    assert _maxdiff(small["lm_head"], base["lm_head"]) > 1e-3


def test_olmo_config_defaults_and_refusals():
    """OlmoConfig's defaults (OLMo-7B's sizes); num_key_value_heads null -> num_attention_heads;
    head_dim from config.json when given (null refused), else hidden // heads floored as HF; eps
    fixed 1e-5 whatever rms_norm_eps / layer_norm_eps say; clip_qkv null or a positive number;
    nulls in non-Optional fields refused; RoPE read as Llama's."""
    c = reference.Config({"model_type": "olmo"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        50304, 4096, 11008, 32, 32, 32, 128)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.mlp_bias, c.clip_qkv) == ("silu", 1e-5, False, False, False, None)
    assert c.rope == {"rope_type": "default", "rope_theta": 10000.0, "max_position_embeddings": 2048,
                      "partial_rotary_factor": 1.0}
    assert c.windows == [None] * 32

    def C(**kw):
        return reference.Config(dict(model_type="olmo", **kw))

    assert C(num_attention_heads=8, num_key_value_heads=None).kv_heads == 8
    assert C(hidden_size=32, num_attention_heads=4, head_dim=16).head_dim == 16
    assert C(hidden_size=40, num_attention_heads=5, num_key_value_heads=5).head_dim == 8
    assert C(hidden_size=40, num_attention_heads=6, num_key_value_heads=3).head_dim == 6  # floored, as HF
    assert C(rms_norm_eps=1e-6, layer_norm_eps=1e-6).eps == 1e-5
    assert C(clip_qkv=8.0).clip_qkv == 8.0 and C(clip_qkv=8).clip_qkv == 8.0 and C(clip_qkv=None).clip_qkv is None
    assert C(clip_qkv=0.05).clip_qkv == 0.05
    for bad in (0, 0.0, -1.0, True, False, "8", float("nan"), float("inf"), [1.0]):
        with pytest.raises(reference.ReferenceError):
            C(clip_qkv=bad)
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "hidden_act", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "rope_theta",
              "head_dim"):
        with pytest.raises(reference.ReferenceError):
            C(**{k: None})
    for kw in (dict(num_key_value_heads=3), dict(head_dim=15), dict(partial_rotary_factor=0.5),
               dict(rope_scaling={"rope_type": "no_such_rope"})):
        with pytest.raises(reference.ReferenceError):
            C(**kw)
    assert C(rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 5.0}).rope["rope_theta"] == 5.0
    v5 = C(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0})
    assert (v5.rope["rope_type"], v5.rope["rope_theta"], v5.rope["original_max_position_embeddings"]) == (
        "yarn", 500.0, 2048)
    # OLMoE's clip_qkv reads the same way
    base = synth.tiny_config("olmoe")
    assert reference.Config(dict(base, clip_qkv=8.0)).clip_qkv == 8.0
    assert reference.Config(base).clip_qkv is None
    for bad in (0.0, -8.0, True, "8"):
        with pytest.raises(reference.ReferenceError):
            reference.Config(dict(base, clip_qkv=bad))


def test_olmo_parameter_counts():
    """The tensors expected_shapes lists (the tied head counted once) add up to the parameter counts
    transformers 5.12.1's OlmoForCausalLM reports on the meta device for an OLMo-1B-like config
    (hidden 2048, 16 layers, tied) and OlmoConfig's defaults (OLMo-7B: hidden 4096, 32 layers,
    untied)."""
    cfgs = {"1b": dict(model_type="olmo", vocab_size=50304, hidden_size=2048, intermediate_size=8192,
                       num_hidden_layers=16, num_attention_heads=16, tie_word_embeddings=True,
                       max_position_embeddings=2048),
            "7b": dict(model_type="olmo", vocab_size=50304, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=32, num_attention_heads=32, tie_word_embeddings=False,
                       max_position_embeddings=2048)}
    counts = {}
    for name, cfg in cfgs.items():
        c = reference.Config(cfg)
        shapes = reference.expected_shapes(c)
        counts[name] = sum(int(np.prod(s)) for k, s in shapes.items() if not (c.tie and k == "lm_head.weight"))
    assert counts == {"1b": 1_176_764_416, "7b": 6_888_095_744}
    assert reference.expected_shapes(reference.Config({"model_type": "olmo"})) == reference.expected_shapes(
        reference.Config(cfgs["7b"]))


def _rms64(v, g, eps):
    v = np.asarray(v, np.float64)
    return v / np.sqrt((v ** 2).mean(-1, keepdims=True) + eps) * g.astype(np.float64)


@pytest.mark.parametrize("attention_bias", [False, True])
def test_olmoe_clip_qkv_after_the_norms(tmp_path, attention_bias):
    """OlmoeAttention with clip_qkv: q = clip(q_norm(q_proj(x))), k = clip(k_norm(k_proj(x))),
    v = clip(v_proj(x)), the clamp AFTER the whole-projection norms. The q_norm / k_norm / v_proj
    points are unclamped (HF clamps them in place after the hooks ran); o_proj's input is the
    float64 attention of the clamped values. Mistakes that must fail: no clamp, the clamp before
    the norms (on q_proj / k_proj), v unclamped. (Checked by mutating a copy of reference.py's
    _llama too: the clamp omitted, the clamp in place on the recorded points, the clamp of q before
    q_norm: each fails both parametrizations.)"""
    clip = 0.2
    d = _ckpt(tmp_path, "olmoe", seed=3, clip_qkv=clip, attention_bias=attention_bias)
    cfg = reference.load_config(str(d))
    c = reference.Config(cfg)
    assert c.clip_qkv == clip
    w = st.load_checkpoint(str(d))
    T = 14
    seq = [int(t) for t in np.random.default_rng(6).integers(0, c.vocab_size, T)]
    r = reference.run(str(d), [seq])[0]
    noclip = reference.run(str(_ckpt(tmp_path, "olmoe", name="n", seed=3, attention_bias=attention_bias)), [seq])[0]
    assert _maxdiff(r["lm_head"], noclip["lm_head"]) > 1e-3  # the clamp bites
    tol = 2e-6
    for i in range(c.layers):
        A = f"model.layers.{i}.self_attn"
        assert np.array_equal(r[A + ".q_norm:input"], r[A + ".q_proj"])
        assert np.array_equal(r[A + ".k_norm:input"], r[A + ".k_proj"])
        qn = _rms64(r[A + ".q_proj"], w[A + ".q_norm.weight"], c.eps)
        kn = _rms64(r[A + ".k_proj"], w[A + ".k_norm.weight"], c.eps)
        assert _maxdiff(r[A + ".q_norm"], qn) < 1e-5 and _maxdiff(r[A + ".k_norm"], kn) < 1e-5
        for nm in ("q_norm", "k_norm", "v_proj"):  # unclamped points, beyond the clip
            assert np.abs(r[f"{A}.{nm}"]).max() > clip, (A, nm)
        q, k, v = (r[f"{A}.{nm}"] for nm in ("q_norm", "k_norm", "v_proj"))
        o = _attention64(np.clip(q, -clip, clip), np.clip(k, -clip, clip), np.clip(v, -clip, clip), cfg, c.head_dim)
        assert _maxdiff(r[A + ".o_proj:input"], o) < tol, (A, _maxdiff(r[A + ".o_proj:input"], o))
        if i:
            continue
        wrong = {
            "no_clip": (q, k, v),
            "clip_before_norms": (_rms64(np.clip(r[A + ".q_proj"], -clip, clip), w[A + ".q_norm.weight"], c.eps),
                                  _rms64(np.clip(r[A + ".k_proj"], -clip, clip), w[A + ".k_norm.weight"], c.eps),
                                  np.clip(v, -clip, clip)),
            "v_unclamped": (np.clip(q, -clip, clip), np.clip(k, -clip, clip), v),
        }
        for name, (wq, wk, wv) in wrong.items():
            assert _maxdiff(r[A + ".o_proj:input"], _attention64(wq, wk, wv, cfg, c.head_dim)) > 100 * tol, name


# ---------------------------------------------------------------------------------------------
# OLMo 3 (modeling_olmo3.py / modular_olmo3.py: Olmo3Model, Olmo3DecoderLayer, Olmo3Attention,
# Olmo3RotaryEmbedding = Gemma2RotaryEmbedding; configuration_olmo3.py: Olmo3Config)
# ---------------------------------------------------------------------------------------------

def _olmo3_types64(cfg):
    """layer_types of a config dict as Olmo3Config.__post_init__ fills them: the given list, else
    "full_attention" on the layers i with (i + 1) % 4 == 0 and "sliding_attention" elsewhere."""
    n = cfg.get("num_hidden_layers", 32)
    return cfg.get("layer_types") or ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
                                      for i in range(n)]


def _rope_af64(cfg, hd, theta=10000.0):
    """(inv_freq [hd / 2], attention factor) in float64 from a 4.x-form config dict whose rotary
    module is Llama's (OLMo 3, SmolLM3): theta from the dict, `theta` (the config class's default)
    when absent; default, linear and llama3 tables as _inv_freq64, or YaRN's NTK-by-parts (_yarn64)
    with its attention factor (the given one, else 0.1 ln(factor) + 1)."""
    cfg = dict(cfg, rope_theta=float(cfg.get("rope_theta") or theta))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) != "yarn":
        return _inv_freq64(cfg, hd), 1.0
    s = rs["factor"]
    inv = _yarn64(hd, cfg["rope_theta"], s, rs["original_max_position_embeddings"], rs.get("beta_fast", 32),
                  rs.get("beta_slow", 1), rs.get("truncate", True))
    return inv, rs.get("attention_factor", 0.1 * math.log(s) + 1)


def _lin64(w, v, name):
    """v @ name.weight^T (+ name.bias where the checkpoint has one), in float64."""
    y = v @ w[f"{name}.weight"].astype(np.float64).T
    b = w.get(f"{name}.bias")
    return y if b is None else y + b


def _check_chain64(r, w, c, cfg, seq, layer):
    """The whole model against `layer(i, h)` (the float64 points of layer i on input rows h, the
    layer output under model.layers.i) chained from the embedding: every point within 1e-5 relative,
    then model.norm and lm_head (tied or not). Returns tol(name), the bound each point had."""
    def tol(name):
        return 1e-5 * max(1.0, float(np.abs(r[name]).max()))

    emb = w["model.embed_tokens.weight"].astype(np.float64)
    assert np.array_equal(r["model.embed_tokens"], w["model.embed_tokens.weight"][seq])
    h = emb[seq]
    for i in range(c.layers):
        want = layer(i, h)
        for name, v in want.items():
            assert _maxdiff(r[name], v) < tol(name), (name, _maxdiff(r[name], v))
        h = want[f"model.layers.{i}"]
    hn = _rms64(h, w["model.norm.weight"], cfg["rms_norm_eps"])
    assert _maxdiff(r["model.norm"], hn) < tol("model.norm")
    head = emb if cfg["tie_word_embeddings"] else w["lm_head.weight"].astype(np.float64)
    assert _maxdiff(r["lm_head"], hn @ head.T) < tol("lm_head")
    return tol


def _rotary_attention64(q, k, v, hd, inv, af, window):
    """Eager attention in float64 on q [T, nh * hd], k / v [T, nkv * hd]: q and k each rotated as
    the complex pairs (i, i + hd / 2) by position * inv and multiplied by af (HF multiplies cos and
    sin by it), query head h reads kv head h // (nh / nkv), softmax(q k^T / sqrt(hd)) over the keys
    j <= i (with a window W: also j > i - W). Returns (context [T, nh * hd], probs [T, nh, T])."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    T = q.shape[0]
    nh, nkv = q.shape[1] // hd, k.shape[1] // hd
    rot = np.exp(1j * np.arange(T)[:, None] * inv[None, :])[:, None, :]

    def rope(t, n):
        t = t.reshape(T, n, hd)
        z = (t[..., : hd // 2] + 1j * t[..., hd // 2:]) * rot
        return af * np.concatenate([z.real, z.imag], axis=-1)

    q, k, v = rope(q, nh), rope(k, nkv), v.reshape(T, nkv, hd)
    kv_of = np.arange(nh) // (nh // nkv)
    s = np.einsum("ihd,jhd->hij", q, k[:, kv_of]) / math.sqrt(hd)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    s = np.where(allowed[None], s, -np.inf)
    pr = np.exp(s - s.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", pr, v[:, kv_of]).reshape(T, nh * hd), pr.transpose(1, 0, 2)


def _olmo3_layer64(x, w, p, cfg, window, wrong=None):
    """One Olmo3DecoderLayer in float64 on rows x [T, H], from the written tensors `w` and the 4.x-form
    config.json dict `cfg` (synth's tiny form: num_key_value_heads explicit, silu):
      q = q_norm(q_proj(x)), k = k_norm(k_proj(x)) (RMSNorms with weights over the WHOLE projections,
      eps rms_norm_eps), v = v_proj(x) (biases with attention_bias); a = o_proj(attention) with the
      layer's window (None: full);
      h = x + post_attention_layernorm(a); m = down(silu(gate(h)) * up(h));
      out = h + post_feedforward_layernorm(m).
    Returns a dict of points (and A:probs, [T, heads, T]).

    wrong: one deliberate error: "no_window" (a sliding layer run full), "window_plus_one" (keys
    i - W <= j <= i, one more than HF's kv_idx > q_idx - W), "window_on_full" (a full layer given
    the window 4), "qk_norm_per_head" (q_norm / k_norm over each head, as Qwen3 / Gemma 3),
    "no_attention_factor" (YaRN's cos / sin factor dropped), "no_yarn" (the unscaled frequencies)."""
    x = np.asarray(x, np.float64)
    H = x.shape[1]
    hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    eps = cfg["rms_norm_eps"]
    A, M = p + ".self_attn", p + ".mlp"

    def lin(v, name):
        return _lin64(w, v, name)

    def qk_norm(t, name):
        g = w[f"{A}.{name}.weight"]
        if wrong != "qk_norm_per_head":
            return _rms64(t, g, eps)
        n = t.shape[1] // hd
        return _rms64(t.reshape(-1, n, hd), g.reshape(n, hd), eps).reshape(t.shape)

    inv, af = _rope_af64(cfg, hd)
    if wrong == "no_attention_factor":
        af = 1.0
    if wrong == "no_yarn":
        inv = _rope_af64(dict(cfg, rope_scaling=None), hd)[0]
    if wrong == "no_window":
        window = None
    elif wrong == "window_plus_one":
        window += 1
    elif wrong == "window_on_full":
        window = 4
    q, k, v = (lin(x, f"{A}.{nm}") for nm in ("q_proj", "k_proj", "v_proj"))
    qn, kn = qk_norm(q, "q_norm"), qk_norm(k, "k_norm")
    o, probs = _rotary_attention64(qn, kn, v, hd, inv, af, window)
    a = lin(o, A + ".o_proj")
    an = _rms64(a, w[p + ".post_attention_layernorm.weight"], eps)
    h = x + an
    ga = _silu64(lin(h, M + ".gate_proj"))
    m = lin(ga * lin(h, M + ".up_proj"), M + ".down_proj")
    mn = _rms64(m, w[p + ".post_feedforward_layernorm.weight"], eps)
    return {A + ".q_norm": qn, A + ".k_norm": kn, A + ".o_proj:input": o, A + ":probs": probs, A: a,
            p + ".post_attention_layernorm": an, M + ".act_fn": ga, M: m, p + ".post_feedforward_layernorm": mn,
            p: h + mn}


@pytest.mark.parametrize("variant", list(synth.OLMO3_VARIANTS))
def test_olmo3_model_matches_float64_formula(tmp_path, variant):
    """The whole OLMo 3 model against _olmo3_layer64 chained in float64 from the embedding to the
    logits, for every synth.OLMO3_VARIANTS config (the default layer types, an explicit list, YaRN,
    q / k / v / o biases, a tied head): every layer's q_norm, k_norm, o_proj input, attention
    probabilities, self_attn, post_attention_layernorm, mlp.act_fn, mlp, post_feedforward_layernorm
    and output, model.norm and lm_head within 1e-5 relative. The windows come from the config
    dict here (_olmo3_types64), not from reference.Config. Then, on the first sliding and the first
    full layer (from the reference's own layer input), each listed mistake must move a point far
    outside the tolerance: the window dropped or one key wider, a window on a full layer, q / k
    norms per head, and with YaRN the attention factor or the scaled frequencies dropped.
    (Checked the other way round too, by mutating a copy of reference.py: the sliding mask one key
    wider (kj >= qi - W in _attend), the default layer_types rule shifted (i % 4), YaRN left off
    the sliding layers: each fails the variants it concerns.)"""
    d = tmp_path / "m"
    cfg = synth.tiny_config("olmo3", **synth.OLMO3_VARIANTS[variant])
    w = synth.write_checkpoint(str(d), cfg, seed=7)
    c = reference.Config(reference.load_config(str(d)))
    assert c.arch == "olmo3" and c.tie == cfg["tie_word_embeddings"]
    types = _olmo3_types64(cfg)
    windows = [cfg["sliding_window"] if t == "sliding_attention" else None for t in types]
    assert None in windows and any(windows)  # both kinds of layer occur
    T = 20
    assert T > 2 * max(x for x in windows if x)  # the windows bite
    seq = [int(t) for t in np.random.default_rng(3).integers(0, c.vocab_size, T)]
    r = reference.run(str(d), [seq], patterns=True)[0]
    tol = _check_chain64(r, w, c, cfg, seq,
                         lambda i, h: _olmo3_layer64(h, w, f"model.layers.{i}", cfg, windows[i]))
    # power
    yarn = (cfg.get("rope_scaling") or {}).get("rope_type") == "yarn"
    for kind in ("sliding_attention", "full_attention"):
        i = types.index(kind)
        p = f"model.layers.{i}"
        wrongs = ["qk_norm_per_head"] + (["no_attention_factor", "no_yarn"] if yarn else [])
        wrongs += ["no_window", "window_plus_one"] if windows[i] else ["window_on_full"]
        for wrong in wrongs:
            got = _olmo3_layer64(r[p + ":input"], w, p, cfg, windows[i], wrong=wrong)
            worst = max(_maxdiff(r[n], v) / tol(n) for n, v in got.items())
            assert worst > 100, (p, wrong, worst)  # measured: >= 15878 (the correct formula: <= 0.067)


def test_olmo3_windows_follow_layer_types(tmp_path):
    """Per layer, from the attention patterns: a "sliding_attention" layer's query i puts weight on
    exactly the keys i - W < j <= i (W = sliding_window), a "full_attention" layer's on every key
    j <= i; by default layers 0, 1, 2 slide and 3 is full, an explicit layer_types list decides
    otherwise. Changing token j moves layer 0's attention output at the queries that see it only.
    A window as long as the sequence is the same model as all layers full, which is exactly OLMo 2
    with the same tensors; the tiny window changes the logits."""
    T, W = 14, 4
    seq = [int(t) for t in np.random.default_rng(8).integers(0, 384, T)]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    for name, types, sw in (("d", None, W), ("e", ["full_attention", "sliding_attention", "full_attention",
                                                   "sliding_attention"], 3)):
        extra = {} if types is None else dict(layer_types=types)
        r = reference.run(str(_ckpt(tmp_path, "olmo3", name=name, sliding_window=sw, **extra)), [seq],
                          patterns=True)[0]
        types = types or ["sliding_attention"] * 3 + ["full_attention"]
        for n, t in enumerate(types):
            pr = r[f"model.layers.{n}.self_attn:probs"]  # [T, heads, T]
            seen = (j <= i) & ((j > i - sw) if t == "sliding_attention" else True)
            assert (pr[:, :, :][~np.broadcast_to(seen[:, None, :], pr.shape)] == 0).all(), (name, n)
            assert (pr[np.broadcast_to(seen[:, None, :], pr.shape)] > 0).all(), (name, n)
            assert np.allclose(pr.sum(-1), 1.0, atol=1e-6)
    # locality of layer 0 (sliding in the default types, full in the explicit list)
    alt = list(seq)
    alt[3] = 300
    first_full = dict(layer_types=["full_attention"] + ["sliding_attention"] * 3)
    for name, extra, sliding in (("ld", {}, True), ("le", first_full, False)):
        a, b = reference.run(str(_ckpt(tmp_path, "olmo3", name=name, **extra)), [seq, alt])
        diff = np.abs(a["model.layers.0.self_attn"] - b["model.layers.0.self_attn"]).max(-1)
        for q in range(T):
            assert (diff[q] > 1e-6) == (3 <= q < (3 + W if sliding else T)), (name, q)
    # a window >= T is no window; all full == OLMo 2 with the same tensors, exactly
    big = _ckpt(tmp_path, "olmo3", name="big", sliding_window=T)
    full = _ckpt(tmp_path, "olmo3", name="full", layer_types=["full_attention"] * 4)
    small = reference.run(str(_ckpt(tmp_path, "olmo3", name="small")), [seq])[0]
    o2 = tmp_path / "olmo2"
    os.makedirs(o2)
    cfg2 = {k: v for k, v in reference.load_config(str(full)).items()
            if k not in ("layer_types", "sliding_window")}
    with open(o2 / "config.json", "w") as f:
        json.dump(dict(cfg2, model_type="olmo2", architectures=["Olmo2ForCausalLM"]), f)
    os.link(full / "model.safetensors", o2 / "model.safetensors")
    _same_run(big, full, seq)
    _same_run(full, o2, seq)
    assert _maxdiff(small["lm_head"], reference.run(str(full), [seq])[0]["lm_head"]) > 1e-3


# The YaRN parameters of the released Olmo-3 7B / 32B as they were quoted to us (not read from the
# Hub here): factor 8 over 8192 original positions, theta 5e5, beta_fast 32, beta_slow 1, attention
# factor 1.2079441541679836 (= 0.1 ln 8 + 1).
OLMO3_RELEASE_YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                      "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1}


def test_olmo3_yarn_rope_on_every_layer(tmp_path):
    """One Olmo3RotaryEmbedding for the whole model: a YaRN rope_scaling changes the sliding layer 0
    as well (unlike Gemma 3, whose local layers keep their own unscaled table); at position 0 (no
    rotation) each head's score is attention_factor ** 2 * q_norm . k_norm / sqrt(head_dim) (HF scales
    cos and sin, so q and k, by the factor). The released YaRN block (OLMO3_RELEASE_YARN, head_dim 128)
    resolves to its attention factor and to _yarn64's float64 frequencies, in the 4.x and 5.x forms."""
    seq = [int(t) for t in np.random.default_rng(9).integers(0, 384, 16)]
    plain = reference.run(str(_ckpt(tmp_path, "olmo3", name="p")), [seq])[0]
    yarn = reference.run(str(_ckpt(tmp_path, "olmo3", name="y", rope_scaling=synth.OLMO3_YARN,
                                   max_position_embeddings=512)), [seq], patterns=True)[0]
    A = "model.layers.0.self_attn"
    assert _maxdiff(plain[A], yarn[A]) > 1e-3
    af = synth.OLMO3_YARN["attention_factor"]
    q, k = yarn[A + ".q_norm"].reshape(16, 4, 8), yarn[A + ".k_norm"].reshape(16, 2, 8)
    s00 = af ** 2 * (q[0].astype(np.float64) * k[0][np.arange(4) // 2]).sum(-1) / math.sqrt(8)
    assert _maxdiff(yarn[A + ":scores"][0, :, 0], s00) < 1e-5
    rel = dict(model_type="olmo3", rope_theta=500000.0, max_position_embeddings=65536,
               rope_scaling=OLMO3_RELEASE_YARN)
    for cfg in (rel, synth.to_v5(rel)):
        c = reference.Config(cfg)
        assert c.head_dim == 128
        assert (c.rope["rope_type"], c.rope["factor"], c.rope["rope_theta"]) == ("yarn", 8.0, 5e5)
        assert c.rope["original_max_position_embeddings"] == 8192
        inv, got_af = reference.rope_parameters(c.rope, c.head_dim, seq_len=100)
        assert got_af == 1.2079441541679836 and abs(got_af - (0.1 * math.log(8) + 1)) < 1e-15
        assert _rel(inv, _yarn64(128, 5e5, 8.0, 8192)) < 1e-6


def test_olmo3_config_defaults_and_refusals():
    """Olmo3Config's defaults (OLMo 2's 7B sizes, eps 1e-5, untied, sliding_window 4096, every 4th
    layer full); num_key_value_heads null -> num_attention_heads; head_dim from config.json when
    given, else hidden // heads floored. Refused, as transformers 5.12 cannot build or run them: a
    layer_types list of the wrong length or with another type (chunked_attention passes HF's
    validation but Olmo3Model has no mask for it), a null sliding_window even when no layer slides
    (Olmo3Model builds its sliding mask on every forward), a window < 1 on a sliding layer, a
    non-integer window, rope parameters keyed by layer type (HF ignores them), a null rope_theta,
    nulls in non-Optional fields. A window < 1 is fine when no layer slides (HF runs it)."""
    c = reference.Config({"model_type": "olmo3"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        50304, 4096, 11008, 32, 32, 32, 128)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.mlp_bias) == ("silu", 1e-5, False, False, False)
    assert c.rope == {"rope_type": "default", "rope_theta": 10000.0, "max_position_embeddings": 2048,
                      "partial_rotary_factor": 1.0}
    assert c.layer_types == (["sliding_attention"] * 3 + ["full_attention"]) * 8
    assert c.windows == ([4096] * 3 + [None]) * 8

    def C(**kw):
        return reference.Config(dict(model_type="olmo3", **kw))

    assert C(num_hidden_layers=6).windows == [4096, 4096, 4096, None, 4096, 4096]
    assert C(num_hidden_layers=6, layer_types=None, sliding_window=5).windows == [5, 5, 5, None, 5, 5]
    assert C(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"],
             sliding_window=7).windows == [None, 7]
    for sw in (0, -2):  # never used: HF runs it
        assert C(num_hidden_layers=2, layer_types=["full_attention"] * 2, sliding_window=sw).windows == [None, None]
    assert C(num_attention_heads=8, num_key_value_heads=None).kv_heads == 8
    assert C(hidden_size=32, num_attention_heads=4, head_dim=16).head_dim == 16
    assert C(hidden_size=40, num_attention_heads=6, num_key_value_heads=3).head_dim == 6  # floored, as HF
    assert C(rms_norm_eps=1e-6).eps == 1e-6
    assert C(rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 5.0}).rope["rope_theta"] == 5.0
    assert C(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5.0}).rope["factor"] == 2.0
    refused = [
        (dict(num_hidden_layers=2, layer_types=["full_attention"] * 3), "2 layer types"),
        (dict(num_hidden_layers=2, layer_types=["full_attention", "chunked_attention"]), "chunked_attention"),
        (dict(num_hidden_layers=2, layer_types=["full_attention", "bogus"]), "bogus"),
        (dict(num_hidden_layers=2, layer_types="full_attention"), "layer types"),
        (dict(sliding_window=None), "sliding_window is null"),
        (dict(num_hidden_layers=2, layer_types=["full_attention"] * 2, sliding_window=None), "sliding_window is null"),
        (dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=0), ">= 1"),
        (dict(sliding_window=4.0), "integer"),
        (dict(sliding_window=True), "integer"),
        (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), "layer type"),
        (dict(rope_theta=None), "rope_theta"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": None}), "rope_theta"),
        (dict(num_key_value_heads=3), "divisible"),
        (dict(head_dim=None), "head_dim"),
        (dict(head_dim=15), "head_dim"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
        (dict(rope_scaling={"rope_type": "no_such_rope"}), "rope_type"),
        (dict(hidden_act="no_such_act"), "activation"),
    ] + [(({k: None}), "null") for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "hidden_act", "max_position_embeddings",
                                         "tie_word_embeddings", "attention_bias", "rms_norm_eps")]
    for kw, msg in refused:
        with pytest.raises(reference.ReferenceError, match=msg):
            C(**kw)


def test_olmo3_parameter_counts():
    """The tensors expected_shapes lists (the tied head counted once) add up to the parameter counts
    transformers 5.12.1's Olmo3ForCausalLM reports on the meta device for Olmo3Config's defaults
    and for a GQA variant with biases, a tied head and head_dim 96 (!= 4096 / 32); same names as
    OLMo 2's."""
    cfgs = {"defaults": {}, "gqa-bias-tied-hd96": dict(num_key_value_heads=8, attention_bias=True,
                                                        tie_word_embeddings=True, head_dim=96)}
    counts = {}
    for name, kw in cfgs.items():
        c = reference.Config(dict(model_type="olmo3", **kw))
        shapes = reference.expected_shapes(c)
        counts[name] = sum(int(np.prod(s)) for k, s in shapes.items() if not (c.tie and k == "lm_head.weight"))
        assert shapes == reference.expected_shapes(reference.Config(dict(model_type="olmo2", **kw)))
    assert counts == {"defaults": 6_888_624_128, "gqa-bias-tied-hd96": 5_541_867_520}


# ---------------------------------------------------------------------------------------------
# SmolLM3 (modeling_smollm3.py / modular_smollm3.py: SmolLM3Model, SmolLM3Attention (use_rope per layer),
# SmolLM3RotaryEmbedding = Qwen2's; configuration_smollm3.py: SmolLM3Config)
# ---------------------------------------------------------------------------------------------

def _smollm3_rope_layers64(cfg):
    """SmolLM3Config.__post_init__'s no_rope_layers from a config dict: the given list (its first
    num_hidden_layers entries), else 1 (RoPE) on layer i iff (i + 1) % no_rope_layer_interval != 0."""
    n = cfg.get("num_hidden_layers", 36)
    nrl = cfg.get("no_rope_layers")
    if nrl is None:
        k = cfg.get("no_rope_layer_interval", 4)
        nrl = [int((i + 1) % k != 0) for i in range(n)]
    return [bool(x) for x in nrl[:n]]


def _smollm3_windows64(cfg):
    """Per layer: sliding_window on "sliding_attention" layers (the given layer_types, else the NoPE
    layers when use_sliding_window and sliding_window is set), None on full ones."""
    rope = _smollm3_rope_layers64(cfg)
    sw = cfg.get("sliding_window")
    types = cfg.get("layer_types") or [
        "sliding_attention" if cfg.get("use_sliding_window") and sw is not None and not r else "full_attention"
        for r in rope]
    return [sw if t == "sliding_attention" else None for t in types]


def _smollm3_layer64(x, w, p, cfg, use_rope, window, wrong=None):
    """One SmolLM3DecoderLayer in float64 on rows x [T, H] (Llama's pre-norm layer): x1 =
    input_layernorm(x); q / k / v projections (biases with attention_bias); q and k rotated only when
    use_rope (a NoPE layer leaves them as projected); eager attention (_rotary_attention64, window None:
    causal); h = x + o_proj(...); out = h + down(silu(gate(n)) * up(n)), n = post_attention_layernorm(h)
    (MLP biases with mlp_bias). wrong: "rope_on_nope" (a NoPE layer rotated), "no_rope" (a RoPE layer
    left unrotated), "no_window" (a sliding layer run full), "window_on_full" (a full layer given
    window 3)."""
    x = np.asarray(x, np.float64)
    H = x.shape[1]
    hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    eps = cfg["rms_norm_eps"]
    A, M = p + ".self_attn", p + ".mlp"

    def lin(v, name):
        return _lin64(w, v, name)

    if wrong == "rope_on_nope":
        use_rope = True
    elif wrong == "no_rope":
        use_rope = False
    elif wrong == "no_window":
        window = None
    elif wrong == "window_on_full":
        window = 3
    inv, af = _rope_af64(cfg, hd, theta=2000000.0)
    if not use_rope:
        inv, af = np.zeros_like(inv), 1.0  # rotation by angle 0, no factor: q and k as projected
    x1 = _rms64(x, w[p + ".input_layernorm.weight"], eps)
    q, k, v = (lin(x1, f"{A}.{nm}") for nm in ("q_proj", "k_proj", "v_proj"))
    o, probs = _rotary_attention64(q, k, v, hd, inv, af, window)
    a = lin(o, A + ".o_proj")
    h = x + a
    n = _rms64(h, w[p + ".post_attention_layernorm.weight"], eps)
    ga = _silu64(lin(n, M + ".gate_proj"))
    m = lin(ga * lin(n, M + ".up_proj"), M + ".down_proj")
    return {p + ".input_layernorm": x1, A + ".q_proj": q, A + ".k_proj": k, A + ".v_proj": v,
            A + ".o_proj:input": o, A + ":probs": probs, A: a, p + ".post_attention_layernorm": n,
            M + ".act_fn": ga, M: m, p: h + m}


@pytest.mark.parametrize("variant", list(synth.SMOLLM3_VARIANTS))
def test_smollm3_model_matches_float64_formula(tmp_path, variant):
    """The whole SmolLM3 model against _smollm3_layer64 chained in float64 from the embedding to the
    logits, for every synth.SMOLLM3_VARIANTS config (default NoPE pattern, an explicit no_rope_layers,
    windows by the default rule and by explicit layer_types, biases, llama3 and YaRN): every layer's
    norms, projections, o_proj input, attention probabilities, self_attn, mlp.act_fn, mlp and output,
    model.norm and lm_head within 1e-5 relative. NoPE layers and windows come from the config dict here
    (_smollm3_rope_layers64 / _smollm3_windows64), not from reference.Config. Then, on the first NoPE,
    the first RoPE and (where any) the first sliding layer, from the reference's own layer input, each
    listed mistake must move a point far outside the tolerance: rope on a NoPE layer, no rope on a
    RoPE layer, the window dropped, a window on a full layer."""
    d = tmp_path / "m"
    cfg = synth.tiny_config("smollm3", **synth.SMOLLM3_VARIANTS[variant])
    w = synth.write_checkpoint(str(d), cfg, seed=11)
    c = reference.Config(reference.load_config(str(d)))
    assert c.arch == "smollm3" and c.tie == cfg["tie_word_embeddings"]
    rope = _smollm3_rope_layers64(cfg)
    windows = _smollm3_windows64(cfg)
    assert True in rope and False in rope  # both kinds of layer occur
    T = 20
    assert all(T > 2 * x for x in windows if x)  # the windows bite
    seq = [int(t) for t in np.random.default_rng(4).integers(0, c.vocab_size, T)]
    r = reference.run(str(d), [seq], patterns=True)[0]
    tol = _check_chain64(r, w, c, cfg, seq,
                         lambda i, h: _smollm3_layer64(h, w, f"model.layers.{i}", cfg, rope[i], windows[i]))
    # power
    checks = [(rope.index(False), "rope_on_nope"), (rope.index(True), "no_rope")]
    if any(windows):
        i = next(n for n, x in enumerate(windows) if x)
        checks.append((i, "no_window"))
    checks.append((windows.index(None), "window_on_full"))
    for i, wrong in checks:
        p = f"model.layers.{i}"
        got = _smollm3_layer64(r[p + ":input"], w, p, cfg, rope[i], windows[i], wrong=wrong)
        worst = max(_maxdiff(r[n], v) / tol(n) for n, v in got.items())
        assert worst > 100, (p, wrong, worst)


def test_smollm3_nope_layers_are_unrotated(tmp_path):
    """From the attention patterns: on a NoPE layer every score is q_proj . k_proj / sqrt(head_dim) of
    the recorded projections (GQA: query head h reads kv head h // 2), at every distance; on a RoPE
    layer that holds on the diagonal only (equal positions, equal rotations). Layer 0's attention output
    at the last query is unchanged by permuting the earlier tokens when layer 0 is NoPE (no position
    information at all), and changed when it rotates. The default pattern puts NoPE on layer 3 only."""
    T = 12
    seq = [int(t) for t in np.random.default_rng(6).integers(0, 384, T)]
    r = reference.run(str(_ckpt(tmp_path, "smollm3", name="d")), [seq], patterns=True)[0]
    for i in range(4):
        A = f"model.layers.{i}.self_attn"
        q = r[A + ".q_proj"].reshape(T, 4, 8).astype(np.float64)
        k = r[A + ".k_proj"].reshape(T, 2, 8).astype(np.float64)[:, np.arange(4) // 2]
        plain = np.einsum("ihd,jhd->ihj", q, k) / math.sqrt(8)
        sc = r[A + ":scores"]
        low = np.tril(np.ones((T, T), bool))
        diag = np.eye(T, dtype=bool)
        assert _maxdiff(sc[:, :, :][np.broadcast_to(diag[:, None], sc.shape)],
                        plain[np.broadcast_to(diag[:, None], sc.shape)]) < 1e-5
        off = _maxdiff(sc[np.broadcast_to(low[:, None], sc.shape)], plain[np.broadcast_to(low[:, None], sc.shape)])
        if i == 3:
            assert off < 1e-5, (i, off)
        else:
            assert off > 1e-2, (i, off)
    perm = seq[:T - 1][::-1] + seq[T - 1:]
    for name, nrl, invariant in (("n0", [0, 1, 1, 1], True), ("r0", [1, 1, 1, 1], False)):
        d = _ckpt(tmp_path, "smollm3", name=name, no_rope_layers=nrl)
        a, b = reference.run(str(d), [seq, perm])
        diff = _maxdiff(a["model.layers.0.self_attn"][-1], b["model.layers.0.self_attn"][-1])
        assert (diff < 1e-5) if invariant else (diff > 1e-3), (name, diff)


def test_smollm3_windows(tmp_path):
    """From the attention patterns: a "sliding_attention" layer's query i weighs exactly the keys
    i - W < j <= i, a full layer every j <= i. Default rule (use_sliding_window + sliding_window): the
    NoPE layers slide, the others are full; an explicit layer_types list decides otherwise;
    use_sliding_window with a null window, or a window without use_sliding_window, is all full (the
    same run as the plain model)."""
    T = 14
    seq = [int(t) for t in np.random.default_rng(8).integers(0, 384, T)]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    cases = (("s", dict(use_sliding_window=True, sliding_window=3), [None, None, None, 3]),
             ("t", dict(use_sliding_window=True, sliding_window=4,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
              [4, None, 4, None]),
             ("k", dict(use_sliding_window=True, sliding_window=5, no_rope_layer_interval=2), [None, 5, None, 5]))
    for name, extra, want in cases:
        d = _ckpt(tmp_path, "smollm3", name=name, **extra)
        assert reference.Config(reference.load_config(str(d))).windows == want
        r = reference.run(str(d), [seq], patterns=True)[0]
        for n, W in enumerate(want):
            pr = r[f"model.layers.{n}.self_attn:probs"]
            seen = np.broadcast_to(((j <= i) & ((j > i - W) if W else True))[:, None, :], pr.shape)
            assert (pr[~seen] == 0).all() and (pr[seen] > 0).all(), (name, n)
    plain = _ckpt(tmp_path, "smollm3", name="plain")
    for name, extra in (("un", dict(use_sliding_window=True, sliding_window=None)),
                        ("off", dict(use_sliding_window=False, sliding_window=3))):
        d = _ckpt(tmp_path, "smollm3", name=name, **extra)
        assert reference.Config(reference.load_config(str(d))).windows == [None] * 4
        _same_run(d, plain)


def test_smollm3_config_defaults_and_refusals():
    """SmolLM3Config's defaults (SmolLM3-3B's sizes: 36 layers, 16 heads, 4 kv heads when absent (null:
    16), head_dim 128, theta 2e6, tied, eps 1e-6, max positions 32768, no windows; NoPE every 4th layer:
    3, 7, ..., 35); no_rope_layers longer than the model (tail ignored, as HF); head_dim from config.json.
    Refused: no_rope_layers shorter than num_hidden_layers (HF: IndexError) or with entries other than
    0 / 1, no_rope_layer_interval 0 (ZeroDivisionError), layer_types of the wrong length or with another
    type, a sliding layer with use_sliding_window false (eager / SDPA slide it, flash would not), with a
    null or < 1 window (HF's sliding mask raises), a null theta or head_dim, nulls in non-Optional
    fields."""
    c = reference.Config({"model_type": "smollm3"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        128256, 2048, 11008, 36, 16, 4, 128)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.mlp_bias) == ("silu", 1e-6, True, False, False)
    assert c.rope == {"rope_type": "default", "rope_theta": 2000000.0, "max_position_embeddings": 32768,
                      "partial_rotary_factor": 1.0}
    assert c.rope_layers == [True, True, True, False] * 9
    assert [i for i, x in enumerate(c.rope_layers) if not x] == [3, 7, 11, 15, 19, 23, 27, 31, 35]
    assert c.windows == [None] * 36 and c.layer_types == ["full_attention"] * 36

    def C(**kw):
        return reference.Config(dict(model_type="smollm3", **kw))

    assert C(num_key_value_heads=None).kv_heads == 16
    assert C(num_attention_heads=8).kv_heads == 4
    assert C(num_hidden_layers=6, no_rope_layer_interval=3).rope_layers == [True, True, False] * 2
    assert C(num_hidden_layers=3, no_rope_layer_interval=1).rope_layers == [False] * 3
    assert C(num_hidden_layers=4, no_rope_layers=[1, 0, 1, 0, 0, 0]).rope_layers == [True, False, True, False]
    assert C(num_hidden_layers=4, use_sliding_window=True, sliding_window=7).windows == [None, None, None, 7]
    assert C(num_hidden_layers=4, use_sliding_window=True, sliding_window=None).windows == [None] * 4
    assert C(num_hidden_layers=4, use_sliding_window=True, sliding_window=0,
             layer_types=["full_attention"] * 4).windows == [None] * 4  # never used: HF runs it
    assert C(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16).head_dim == 16
    assert C(rope_theta=5.0).rope["rope_theta"] == 5.0
    assert C(rope_parameters={"rope_type": "linear", "factor": 2.0}).rope["rope_theta"] == 2000000.0
    assert C(rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=3.0).rope["rope_theta"] == 3.0
    refused = [
        (dict(num_hidden_layers=4, no_rope_layers=[1, 0]), "at least 4"),
        (dict(num_hidden_layers=2, no_rope_layers=[1, 2]), "0 or 1"),
        (dict(num_hidden_layers=2, no_rope_layers=[1, -1]), "0 or 1"),
        (dict(num_hidden_layers=2, no_rope_layers=[True, False]), "0 or 1"),
        (dict(num_hidden_layers=2, no_rope_layers=[1.0, 0]), "0 or 1"),
        (dict(num_hidden_layers=2, no_rope_layers="10"), "at least"),
        (dict(no_rope_layer_interval=0), "interval"),
        (dict(no_rope_layer_interval=None), "null"),
        (dict(num_hidden_layers=2, layer_types=["full_attention"] * 3), "2 layer types"),
        (dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=4,
              layer_types=["full_attention", "chunked_attention"]), "chunked_attention"),
        (dict(num_hidden_layers=2, layer_types="full_attention"), "layer types"),
        (dict(num_hidden_layers=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
         "use_sliding_window false"),
        (dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=None,
              layer_types=["sliding_attention", "full_attention"]), ">= 1"),
        (dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=0), ">= 1"),
        (dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=2.0), ">= 1"),
        (dict(rope_theta=None), "rope_theta"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": None}), "rope_theta"),
        (dict(num_key_value_heads=3), "divisible"),
        (dict(head_dim=None), "head_dim"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
        (dict(hidden_act="no_such_act"), "activation"),
    ] + [(({k: None}), "null") for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "hidden_act", "max_position_embeddings",
                                         "tie_word_embeddings", "attention_bias", "mlp_bias", "rms_norm_eps",
                                         "use_sliding_window")]
    for kw, msg in refused:
        with pytest.raises(reference.ReferenceError, match=msg):
            C(**kw)


# ---------------------------------------------------------------------------------------------
# Gemma 3
# ---------------------------------------------------------------------------------------------

def test_gemma3_config_defaults_and_pattern():
    """Gemma3TextConfig's defaults; layer i is global iff (i + 1) % sliding_window_pattern == 0;
    RoPE: global rope_theta 1e6 (scaled by rope_scaling), local rope_local_base_freq 1e4 unscaled;
    no soft-caps by default."""
    c = reference.Config({"model_type": "gemma3_text"})
    assert (c.vocab_size, c.hidden, c.heads, c.kv_heads, c.head_dim, c.layers) == (262208, 2304, 8, 4, 256, 26)
    assert (c.attn_softcap, c.final_softcap, c.query_pre_attn_scalar, c.tie) == (None, None, 256.0, True)
    assert [i for i, w in enumerate(c.windows) if w is None] == [5, 11, 17, 23] and c.windows[0] == 4096
    assert (c.rope["rope_theta"], c.local_rope["rope_theta"]) == (1e6, 1e4)
    assert c.rope["max_position_embeddings"] == 131072
    s = reference.Config({"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                          "sliding_window_pattern": 2, "num_hidden_layers": 4})
    assert (s.rope["rope_type"], s.rope["factor"], s.local_rope["rope_type"]) == ("linear", 8.0, "default")
    assert s.windows == [4096, None, 4096, None]


def test_gemma3_v4_and_v5_rope_agree():
    v4 = {"model_type": "gemma3_text", "rope_theta": 500.0, "rope_local_base_freq": 50.0,
          "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    v5 = synth.gemma3_to_v5(v4)
    a, b = reference.Config(v4), reference.Config(v5)
    assert (a.rope, a.local_rope, a.windows) == (b.rope, b.local_rope, b.windows)
    with pytest.raises(reference.ReferenceError):  # 4.x and 5.x read a legacy `type` differently
        reference.Config({"model_type": "gemma3_text", "rope_scaling": {"type": "linear", "factor": 4.0}})


def test_gemma3_wiring(tmp_path):
    """q_norm / k_norm take q_proj / k_proj viewed per head and normalise each head with (1 + w);
    the attention runs after all three projections; embed_tokens is the scaled embedding."""
    d = _ckpt(tmp_path, "gemma3_text")
    c = reference.Config(reference.load_config(str(d)))
    w = st.load_checkpoint(str(d))
    ids = [5, 17, 2, 99, 3]
    r = reference.run(str(d), [ids])[0]
    assert np.array_equal(r["model.embed_tokens"], w["model.embed_tokens.weight"][ids] * np.float32(32 ** 0.5))
    p = "model.layers.1.self_attn"
    q = r[p + ".q_proj"].reshape(5, c.heads, c.head_dim).astype(np.float64)
    assert np.array_equal(r[p + ".q_norm:input"], r[p + ".q_proj"].reshape(5, c.heads, c.head_dim))
    want = q / np.sqrt((q ** 2).mean(-1, keepdims=True) + 1e-6) * (1 + w[p + ".q_norm.weight"])
    assert _maxdiff(r[p + ".q_norm"], want) < 1e-5
    assert r[p + ".k_norm"].shape == (5, c.kv_heads, c.head_dim)
    order = [k for k in r if k.startswith(p + ".") and not k.endswith(":input")]
    assert order == [p + "." + n for n in ("q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "o_proj")]


def test_gemma3_local_and_global_rope(tmp_path):
    """rope_local_base_freq changes the local layer 0 (and what follows it); rope_scaling changes
    the global layer 1, never layer 0."""
    base = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    a = reference.run(str(_ckpt(tmp_path, "gemma3_text")), [base])[0]
    local = reference.run(str(_ckpt(tmp_path, "gemma3_text", name="l", rope_local_base_freq=77.0)), [base])[0]
    scaled = reference.run(str(_ckpt(tmp_path, "gemma3_text", name="s", rope_scaling={"rope_type": "linear",
                                                                                        "factor": 8.0})), [base])[0]
    assert _maxdiff(local["model.layers.0.self_attn"], a["model.layers.0.self_attn"]) > 1e-4
    assert np.array_equal(scaled["model.layers.0.self_attn"], a["model.layers.0.self_attn"])
    assert _maxdiff(scaled["model.layers.1.self_attn"], a["model.layers.1.self_attn"]) > 1e-4


@pytest.mark.parametrize("layout", ["new", "old"])
def test_gemma3_multimodal_names(tmp_path, layout):
    """A Gemma3ForConditionalGeneration checkpoint in either key layout runs the text model under
    model.language_model.* / lm_head, equal to the text-only model with the same weights; without
    a cap (its forward applies none)."""
    cfg = synth.tiny_config("gemma3_text", final_logit_softcapping=0.5)
    synth.write_checkpoint(str(tmp_path / "t"), cfg, seed=3)
    synth.write_checkpoint(str(tmp_path / "m"), synth.gemma3_multimodal(cfg, layout=layout), seed=3)
    t, m = reference.Model(str(tmp_path / "t")), reference.Model(str(tmp_path / "m"))
    assert m.cfg.final_softcap is None and t.cfg.final_softcap == 0.5
    a, b = t.forward([4, 5, 6]), m.forward([4, 5, 6])
    assert set(b) == {k.replace("model.", "model.language_model.", 1) for k in a}
    for k in a:
        assert np.array_equal(a[k], b[k.replace("model.", "model.language_model.", 1)]), k
    assert np.array_equal(m.final_logits([4, 5, 6]), b["lm_head"])


# ---------------------------------------------------------------------------------------------
# Mixtral and Qwen3-MoE
# ---------------------------------------------------------------------------------------------

def _silu64(x):
    return x / (1.0 + np.exp(-x))


def _moe_names(c):
    """(stored block prefix format, gate / down / up tensor names) of a sparse layer."""
    if c.arch == "mixtral":
        return "model.layers.{}.block_sparse_moe", ("w1", "w2", "w3")
    return "model.layers.{}.mlp", ("gate_proj", "down_proj", "up_proj")


def _moe_independent(x, w, blk, names, c, wrong=None):
    """The sparse MoE block in float64, written as a DENSE mixture: every expert runs on every
    token, and the [T, E] mixing matrix holds the routing weight of the k experts with the largest
    softmax probabilities (0 elsewhere), renormalised to sum 1 where the architecture does
    (Mixtral always, Qwen3-MoE with norm_topk_prob). Returns (router logits, mixing matrix,
    output).

    Qwen2-MoE adds its shared expert term sigmoid(x @ shared_expert_gate^T) * shared_expert(x)
    (_qwen2_shared64) to the output.

    wrong: one deliberate error, to show the comparison can tell it apart: "flip_norm" (the other
    renormalisation rule), "swap_gate_up" (act on up, times gate), "shift_experts" (expert e runs
    expert (e + 1) % E's weights), "top_k_minus_1" (one expert fewer)."""
    g_name, d_name, u_name = names
    x = x.astype(np.float64)
    logits = x @ w[blk + ".gate.weight"].astype(np.float64).T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    k = c.top_k - (wrong == "top_k_minus_1")
    norm = c.norm_topk != (wrong == "flip_norm")
    mix = np.zeros_like(p)
    for t in range(x.shape[0]):
        chosen = np.argsort(-p[t], kind="stable")[:k]
        mix[t, chosen] = p[t, chosen] / (p[t, chosen].sum() if norm else 1.0)
    out = np.zeros_like(x)
    for e in range(c.experts):
        src = (e + 1) % c.experts if wrong == "shift_experts" else e
        W = {n: w[f"{blk}.experts.{src}.{n}.weight"].astype(np.float64) for n in names}
        g, u = x @ W[g_name].T, x @ W[u_name].T
        if wrong == "swap_gate_up":
            g, u = u, g
        out += mix[:, e:e + 1] * ((_silu64(g) * u) @ W[d_name].T)
    if c.arch == "qwen2_moe":
        out += _qwen2_shared64(x, w, blk)[2]
    return logits, mix, out


def _qwen2_shared64(x, w, blk, swap=False, gate_x=None):
    """Qwen2-MoE's shared expert in float64 on rows x [T, H]: s = down(silu(gate_proj x) *
    up_proj x) (swap: silu on up_proj, times gate_proj), z = gate_x @ shared_expert_gate^T ([T, 1];
    gate_x defaults to x); returns (s, z, sigmoid(z) * s)."""
    x = np.asarray(x, np.float64)
    W = {n: w[f"{blk}.shared_expert.{n}.weight"].astype(np.float64) for n in ("gate_proj", "up_proj", "down_proj")}
    g, u = x @ W["gate_proj"].T, x @ W["up_proj"].T
    if swap:
        g, u = u, g
    s = (_silu64(g) * u) @ W["down_proj"].T
    z = np.asarray(x if gate_x is None else gate_x, np.float64) @ w[blk + ".shared_expert_gate.weight"].astype(np.float64).T
    return s, z, s / (1.0 + np.exp(-z))


def _moe_points(c):
    """The exact point catalogue of a Mixtral / Qwen3-MoE config: name -> (per-token shape, dtype)."""
    H, V = c.hidden, c.vocab_size
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    want = {"model.embed_tokens": ([H], "F32"), "model.embed_tokens:input": ([], "I64"),
            "model.norm": ([H], "F32"), "model.norm:input": ([H], "F32"),
            "lm_head": ([V], "F32"), "lm_head:input": ([H], "F32")}
    for i in range(c.layers):
        p = f"model.layers.{i}"
        out = {"": [H], ".input_layernorm": [H], ".self_attn": [H], ".self_attn.q_proj": [q],
               ".self_attn.k_proj": [kv], ".self_attn.v_proj": [kv], ".self_attn.o_proj": [H],
               ".post_attention_layernorm": [H], ".mlp": [H]}
        inp = {"": [H], ".input_layernorm": [H], ".self_attn": [H], ".self_attn.q_proj": [H],
               ".self_attn.k_proj": [H], ".self_attn.v_proj": [H], ".self_attn.o_proj": [q],
               ".post_attention_layernorm": [H], ".mlp": [H]}
        if c.arch == "qwen3_moe":
            for nm, n in (("q_norm", c.heads), ("k_norm", c.kv_heads)):
                out[f".self_attn.{nm}"] = inp[f".self_attn.{nm}"] = [n, c.head_dim]
        if c.sparse[i]:
            out[".mlp.gate"], inp[".mlp.gate"] = [c.experts], [H]
            if c.arch == "qwen2_moe":  # the shared expert and its gate (a logit per token)
                S = c.shared_inner
                out.update({".mlp.shared_expert": [H], ".mlp.shared_expert.gate_proj": [S],
                            ".mlp.shared_expert.up_proj": [S], ".mlp.shared_expert.act_fn": [S],
                            ".mlp.shared_expert.down_proj": [H], ".mlp.shared_expert_gate": [1]})
                inp.update({".mlp.shared_expert": [H], ".mlp.shared_expert.gate_proj": [H],
                            ".mlp.shared_expert.up_proj": [H], ".mlp.shared_expert.act_fn": [S],
                            ".mlp.shared_expert.down_proj": [S], ".mlp.shared_expert_gate": [H]})
        else:
            I = c.inner
            out.update({".mlp.gate_proj": [I], ".mlp.up_proj": [I], ".mlp.act_fn": [I], ".mlp.down_proj": [H]})
            inp.update({".mlp.gate_proj": [H], ".mlp.up_proj": [H], ".mlp.act_fn": [I], ".mlp.down_proj": [I]})
        for suf, shape in out.items():
            want[p + suf] = (shape, "F32")
        for suf, shape in inp.items():
            want[p + suf + ":input"] = (shape, "F32")
    return want


@pytest.mark.parametrize("arch", MOE)
def test_moe_point_names_and_shapes(tmp_path, arch):
    """Sparse layers: .mlp and .mlp.gate (router logits [E]), no expert points (Qwen2-MoE: also the
    shared expert, its children and shared_expert_gate [1]); Qwen3-MoE's / Qwen2-MoE's dense layers:
    the Qwen3 MLP points with intermediate_size; q_norm / k_norm per head (Qwen3-MoE only)."""
    d = _ckpt(tmp_path, arch)
    c = reference.Config(reference.load_config(str(d)))
    assert dict(reference.points(str(d))) == _moe_points(c)
    assert c.sparse == {"mixtral": [True, True], "qwen3_moe": [True, False, True],
                        "qwen3_moe_step2": [False, True, False, True], "qwen2_moe": [True, False, True]}[arch]


@pytest.mark.parametrize("arch", MOE)
def test_moe_residual_wiring(tmp_path, arch):
    """The router and the block see post_attention_layernorm's output; the layer adds the block's
    output to the residual; attention as Mistral / Qwen3; dense layers as Qwen3's MLP."""
    d = _ckpt(tmp_path, arch)
    c = reference.Config(reference.load_config(str(d)))
    T = 9
    r = reference.run(str(d), [list(range(40, 40 + T))])[0]
    eq = np.array_equal
    for i in range(c.layers):
        p = f"model.layers.{i}"
        prev = r[f"model.layers.{i - 1}"] if i else r["model.embed_tokens"]
        assert eq(r[p + ":input"], prev) and eq(r[p + ".input_layernorm:input"], prev)
        assert eq(r[p + ".self_attn:input"], r[p + ".input_layernorm"])
        assert eq(r[p + ".self_attn"], r[p + ".self_attn.o_proj"])
        if c.arch == "qwen3_moe":
            assert eq(r[p + ".self_attn.q_norm:input"], r[p + ".self_attn.q_proj"].reshape(T, c.heads, -1))
            assert eq(r[p + ".self_attn.k_norm:input"], r[p + ".self_attn.k_proj"].reshape(T, c.kv_heads, -1))
        else:
            assert p + ".self_attn.q_norm" not in r
        assert eq(r[p + ".post_attention_layernorm:input"], prev + r[p + ".self_attn"])
        assert eq(r[p + ".mlp:input"], r[p + ".post_attention_layernorm"])
        if c.sparse[i]:
            assert eq(r[p + ".mlp.gate:input"], r[p + ".post_attention_layernorm"])
            assert r[p + ".mlp.gate"].dtype == np.float32 and r[p + ".mlp.gate"].shape == (T, c.experts)
            assert p + ".mlp.gate_proj" not in r
            if c.arch == "qwen2_moe":  # the shared expert: a gated MLP on the block's input
                S = p + ".mlp.shared_expert"
                for n in ("", ".gate_proj", ".up_proj"):
                    assert eq(r[S + n + ":input"], r[p + ".post_attention_layernorm"]), n
                assert eq(r[p + ".mlp.shared_expert_gate:input"], r[p + ".post_attention_layernorm"])
                assert r[p + ".mlp.shared_expert_gate"].shape == (T, 1)
                assert eq(r[S + ".act_fn:input"], r[S + ".gate_proj"])
                assert eq(r[S + ".down_proj:input"], r[S + ".act_fn"] * r[S + ".up_proj"])
                assert eq(r[S], r[S + ".down_proj"])
            else:
                assert p + ".mlp.shared_expert" not in r
        else:
            assert eq(r[p + ".mlp.act_fn:input"], r[p + ".mlp.gate_proj"])
            assert eq(r[p + ".mlp.down_proj:input"], r[p + ".mlp.act_fn"] * r[p + ".mlp.up_proj"])
            assert eq(r[p + ".mlp"], r[p + ".mlp.down_proj"])
            assert p + ".mlp.gate" not in r
        assert eq(r[p], r[p + ".post_attention_layernorm:input"] + r[p + ".mlp"])
    assert eq(r["model.norm:input"], r[f"model.layers.{c.layers - 1}"])
    assert eq(r["lm_head:input"], r["model.norm"])


MOE_CASES = {
    "mixtral": ("mixtral", {}),
    # 8 experts, top-3: three terms per token, so the combination order matters in float32
    "mixtral-8x3-window": ("mixtral", dict(num_local_experts=8, num_experts_per_tok=3, sliding_window=5)),
    "qwen3_moe-norm": ("qwen3_moe", {}),
    "qwen3_moe-no-norm": ("qwen3_moe", dict(norm_topk_prob=False)),
    "qwen3_moe_step2-top3-no-norm": ("qwen3_moe_step2", {}),
    # with the shared expert (_moe_independent adds it); top-2 of 4, not renormalised
    "qwen2_moe": ("qwen2_moe", {}),
    # renormalised, decoder_sparse_step 2 (layers 1 and 3 sparse), 6 experts top-3
    "qwen2_moe-norm-step2-top3": ("qwen2_moe", dict(num_hidden_layers=4, norm_topk_prob=True, decoder_sparse_step=2,
                                                    mlp_only_layers=None, num_experts=6, num_experts_per_tok=3)),
}


# Checked by mutating tests/python/reference.py temporarily: Mixtral without the renormalisation
# (the mixtral cases fail), Qwen3-MoE renormalising regardless of norm_topk_prob (the no-norm cases
# fail), w1 / w3 (gate_proj / up_proj) swapped (all fail), expert e reading expert e + 1's tensors
# (all fail), the router's softmax over tokens instead of experts (all fail). Not caught here (a
# float64 tolerance cannot see it): the float32 summation order of the experts, which decides
# bit-identity with HF; that was checked against transformers 5.12.1 itself.
@pytest.mark.parametrize("case", list(MOE_CASES))
def test_moe_block_matches_dense_mixture(tmp_path, case):
    arch, overrides = MOE_CASES[case]
    d = _ckpt(tmp_path, arch, seed=7, **overrides)
    c = reference.Config(reference.load_config(str(d)))
    w = st.load_checkpoint(str(d))
    blk_fmt, names = _moe_names(c)
    seq = [int(t) for t in np.random.default_rng(3).integers(0, c.vocab_size, 32)]
    r = reference.run(str(d), [seq])[0]
    tol = 1e-7  # the blocks' outputs are O(1e-3) (weights N(0, 0.02)); observed <= 2e-9
    sparse = [i for i in range(c.layers) if c.sparse[i]]
    assert sparse
    for i in sparse:
        p = f"model.layers.{i}.mlp"
        logits, mix, out = _moe_independent(r[p + ":input"], w, blk_fmt.format(i), names, c)
        assert _maxdiff(r[p + ".gate"], logits) < 1e-5
        assert _maxdiff(r[p], out) < tol, (p, _maxdiff(r[p], out))
        assert np.abs(out).max() > 1e-4  # the blocks do contribute
        assert ((mix > 0).sum(-1) == c.top_k).all()
        assert np.allclose(mix.sum(-1), 1.0) == c.norm_topk or c.top_k == c.experts
    # power: each error moves the first sparse layer's output far outside tol
    i = sparse[0]
    p = f"model.layers.{i}.mlp"
    for wrong in ("flip_norm", "swap_gate_up", "shift_experts", "top_k_minus_1"):
        _, _, out = _moe_independent(r[p + ":input"], w, blk_fmt.format(i), names, c, wrong=wrong)
        assert _maxdiff(r[p], out) > 100 * tol, wrong


@pytest.mark.parametrize("arch", MOE)
def test_moe_router_topk_rule(tmp_path, arch):
    """Model.routing: the experts are the k largest router logits, largest first (torch.topk);
    their weights are the softmax probabilities of those experts, divided by their sum for Mixtral
    (always) and Qwen3-MoE with norm_topk_prob, left as they are otherwise (sum < 1)."""
    d = _ckpt(tmp_path, arch, seed=2)
    m = reference.Model(str(d))
    c = m.cfg
    seq = list(range(100, 130))
    routes = m.routing(seq)
    r = m.forward(seq)
    assert list(routes) == [i for i in range(c.layers) if c.sparse[i]]
    for i, ro in routes.items():
        logits = r[f"model.layers.{i}.mlp.gate"].astype(np.float64)
        assert np.array_equal(ro["logits"], r[f"model.layers.{i}.mlp.gate"])
        want = np.argsort(-logits, axis=-1, kind="stable")[:, :c.top_k]
        assert np.array_equal(ro["experts"], want)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        sel = np.take_along_axis(p, want, axis=-1)
        if c.norm_topk:
            sel = sel / sel.sum(-1, keepdims=True)
            assert np.allclose(ro["weights"].sum(-1), 1.0, atol=1e-6)
        else:
            assert (ro["weights"].sum(-1) < 1 - 1e-3).all()
        assert ro["weights"].dtype == np.float32 and _maxdiff(ro["weights"], sel) < 1e-6


@pytest.mark.parametrize("arch", MOE)
def test_synth_routers_have_no_near_ties(tmp_path, arch):
    """synth's router weights (N(0, ROUTER_STD)) keep the k-th and (k+1)-th largest router logits
    apart (>= 5e-5, against float32 rounding of ~1e-6 between implementations) for these seeds and
    sequences, and Model.routing's margin is that gap."""
    for seed in range(4):
        d = _ckpt(tmp_path, arch, name=f"s{seed}", seed=seed)
        m = reference.Model(str(d))
        for seq in ([5, 17, 2, 99, 3, 3, 250], list(range(3, 30)),
                    [int(t) for t in np.random.default_rng(1).integers(0, 384, 24)]):
            for i, ro in m.routing(seq).items():
                srt = np.sort(ro["logits"], axis=-1)[:, ::-1]
                assert np.array_equal(ro["margin"], srt[:, m.cfg.top_k - 1] - srt[:, m.cfg.top_k])
                assert ro["margin"].min() >= 5e-5, (seed, i, seq, ro["margin"].min())
                assert len({tuple(sorted(e)) for e in ro["experts"].tolist()}) > 1  # routing varies


@pytest.mark.parametrize("layers,step,mlp_only,experts,want", [
    (4, 1, None, 8, [True] * 4),              # Qwen3-30B-A3B's form: every layer sparse
    (4, 2, [], 8, [False, True, False, True]),  # (i + 1) % 2 == 0
    (4, 2, [3], 8, [False, True, False, False]),
    (6, 3, [0, 9], 8, [False, False, True, False, False, True]),  # out-of-range entries ignored
    (4, 1, [1], 0, [False] * 4),             # num_experts 0: all dense
    (3, 0, [0, 1, 2], 8, [False] * 3),       # step 0 never evaluated (HF short-circuits too)
    (4, -2, [], 8, [False, True, False, True]),  # Python's % as HF's: (i + 1) % -2 == 0 for odd i
])
def test_qwen3_moe_sparse_layer_selection(tmp_path, layers, step, mlp_only, experts, want):
    """Qwen3MoeDecoderLayer: sparse iff i not in mlp_only_layers and num_experts > 0 and
    (i + 1) % decoder_sparse_step == 0; a dense layer is Qwen3MoeMLP(intermediate_size). The
    checkpoint layout and the points follow the choice."""
    cfg = synth.tiny_config("qwen3_moe", num_hidden_layers=layers, decoder_sparse_step=step,
                            mlp_only_layers=mlp_only, num_experts=experts)
    if experts == 0:
        cfg["num_experts_per_tok"] = 0  # unused without experts
    c = reference.Config(cfg)
    assert c.sparse == want
    shapes = reference.expected_shapes(cfg)
    for i in range(layers):
        p = f"model.layers.{i}.mlp."
        assert (p + "gate.weight" in shapes) == want[i]
        assert (p + "experts.0.gate_proj.weight" in shapes) == want[i]
        assert (p + "gate_proj.weight" in shapes) != want[i]
        if want[i]:
            assert shapes[p + "gate.weight"] == [experts, 32]
            assert shapes[p + f"experts.{experts - 1}.down_proj.weight"] == [32, 24]
            assert p + f"experts.{experts}.down_proj.weight" not in shapes
        else:
            assert shapes[p + "gate_proj.weight"] == [80, 32] and shapes[p + "down_proj.weight"] == [32, 80]
    d = tmp_path / "m"
    synth.write_checkpoint(str(d), cfg, seed=1)
    pts = reference.points(str(d))
    assert [f"model.layers.{i}.mlp.gate" in pts for i in range(layers)] == want
    r = reference.run(str(d), [[1, 2, 3, 4, 5]])[0]
    w = st.load_checkpoint(str(d))
    for i in range(layers):
        if not want[i]:  # dense: down(silu(gate x) * up x), float64
            p = f"model.layers.{i}.mlp"
            x = r[p + ":input"].astype(np.float64)
            W = {n: w[f"{p}.{n}.weight"].astype(np.float64) for n in ("gate_proj", "up_proj", "down_proj")}
            dense = (_silu64(x @ W["gate_proj"].T) * (x @ W["up_proj"].T)) @ W["down_proj"].T
            assert _maxdiff(r[p], dense) < 1e-7


def test_qwen3_moe_step0_refused():
    with pytest.raises(reference.ReferenceError, match="decoder_sparse_step"):
        reference.Config(synth.tiny_config("qwen3_moe", decoder_sparse_step=0))


@pytest.mark.parametrize("arch,dense", [("mixtral", "mistral"), ("qwen3_moe", "qwen3")])
def test_single_expert_equals_dense_model(tmp_path, arch, dense):
    """One expert, top-1: the routing weight is 1 (renormalised, or the softmax of a single
    logit), so the MoE model is Mistral / Qwen3 with that expert as its MLP: every shared point
    agrees (the attention paths are the same code as the dense families'; the gate / up product
    differs by float32 rounding only, HF's fused gate_up_proj)."""
    moe = synth.tiny_config(arch, num_experts_per_tok=1, sliding_window=5,
                            **({"num_local_experts": 1} if arch == "mixtral" else
                               dict(num_experts=1, mlp_only_layers=[], norm_topk_prob=False,
                                    use_sliding_window=True, attention_bias=True)))
    d = tmp_path / "moe"
    w = synth.write_checkpoint(str(d), moe, seed=5)
    c = reference.Config(moe)
    assert all(c.sparse) and c.windows == [5] * c.layers
    dcfg = {k: v for k, v in moe.items() if k not in ("num_local_experts", "num_experts", "num_experts_per_tok",
                                                       "mlp_only_layers", "norm_topk_prob", "decoder_sparse_step",
                                                       "moe_intermediate_size")}
    dcfg.update(model_type=dense, architectures=[dense.capitalize() + "ForCausalLM"])
    if dense == "qwen3":
        dcfg.update(intermediate_size=moe["moe_intermediate_size"], max_window_layers=0)
    blk_fmt, (g, dn, u) = _moe_names(c)
    wd = {}
    for k, v in w.items():
        for i in range(c.layers):
            blk = blk_fmt.format(i)
            if k.startswith(blk + ".experts.0."):
                leaf = k.split(".")[-2]
                k = f"model.layers.{i}.mlp." + {g: "gate_proj", dn: "down_proj", u: "up_proj"}[leaf] + ".weight"
        if not k.endswith(".gate.weight"):
            wd[k] = v
    dd = tmp_path / "dense"
    os.makedirs(dd)
    with open(dd / "config.json", "w") as f:
        json.dump(dcfg, f)
    st.save(str(dd / "model.safetensors"), wd)
    assert reference.Config(dcfg).windows == c.windows
    seq = list(range(7, 27))
    a, b = reference.run(str(d), [seq])[0], reference.run(str(dd), [seq])[0]
    shared = [k for k in a if k in b]
    assert len(shared) == len(a) - 2 * c.layers  # all but .mlp.gate / .mlp.gate:input
    for k in shared:
        assert _maxdiff(a[k], b[k]) < 1e-6, k
    assert _maxdiff(a["lm_head"], b["lm_head"]) < 1e-5


def test_mixtral_config_defaults_and_rules():
    """MixtralConfig (transformers 5.x): its defaults (rope_theta 1e6, rms_norm_eps 1e-5,
    num_key_value_heads 8, 8 experts top-2, 131072 positions, no window); head_dim absent or null
    -> hidden // heads; sliding_window on every layer; never any bias; top-k always renormalised."""
    c = reference.Config({"model_type": "mixtral"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        32000, 4096, 14336, 32, 32, 8, 128)
    assert (c.eps, c.tie, c.attention_bias, c.experts, c.top_k, c.moe_inner, c.norm_topk) == (
        1e-5, False, False, 8, 2, 14336, True)
    assert c.rope == {"rope_type": "default", "rope_theta": 1e6, "max_position_embeddings": 131072,
                      "partial_rotary_factor": 1.0}
    assert c.windows == [None] * 32 and c.sparse == [True] * 32
    base = synth.tiny_config("mixtral")
    M = lambda **kw: reference.Config(dict(base, **kw))  # noqa: E731
    assert M(head_dim=None).head_dim == 8 and M(head_dim=16).head_dim == 16
    assert M(hidden_size=40, num_attention_heads=6, num_key_value_heads=3).head_dim == 6  # floored, as HF
    assert M(sliding_window=7).windows == [7, 7]
    assert M(attention_bias=True, norm_topk_prob=False).attention_bias is False  # not Mixtral fields
    assert M(norm_topk_prob=False).norm_topk is True
    v5 = reference.Config({"model_type": "mixtral",
                           "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}})
    assert v5.rope["rope_theta"] == 5.0
    # num_experts is an alias (attribute_map); with both keys MixtralConfig keeps num_experts
    assert M().experts == 4 and M(num_experts=6).experts == 6  # beside num_local_experts 4
    del base["num_local_experts"]
    assert M(num_experts=6).experts == 6 and M().experts == 8


def test_qwen3_moe_config_defaults_and_rules():
    """Qwen3MoeConfig (transformers 5.x): its defaults; head_dim from config.json, else
    hidden // heads (64 here, not Qwen3's 128); the window (default 4096) only with
    use_sliding_window, on every layer (no max_window_layers / layer_types); num_local_experts
    wins over num_experts."""
    c = reference.Config({"model_type": "qwen3_moe"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        151936, 2048, 6144, 24, 32, 4, 64)
    assert (c.eps, c.tie, c.attention_bias, c.experts, c.top_k, c.moe_inner, c.norm_topk) == (
        1e-6, False, False, 128, 8, 768, False)
    assert c.rope == {"rope_type": "default", "rope_theta": 10000.0, "max_position_embeddings": 32768,
                      "partial_rotary_factor": 1.0}
    assert c.windows == [None] * 24 and c.sparse == [True] * 24
    w = reference.Config({"model_type": "qwen3_moe", "use_sliding_window": True, "max_window_layers": 20})
    assert w.windows == [4096] * 24
    base = synth.tiny_config("qwen3_moe")
    Q = lambda **kw: reference.Config(dict(base, **kw))  # noqa: E731
    assert Q(use_sliding_window=True, sliding_window=6).windows == [6] * 3
    assert Q(use_sliding_window=False, sliding_window=6).windows == [None] * 3
    assert Q(use_sliding_window=True, sliding_window=None).windows == [None] * 3
    assert Q(layer_types=["sliding_attention"] * 3).windows == [None] * 3  # not read by Qwen3-MoE
    no_hd = dict(base)
    del no_hd["head_dim"]
    assert reference.Config(no_hd).head_dim == 8
    assert Q(num_local_experts=5).experts == 5  # over num_experts 8
    assert Q(mlp_only_layers=None).sparse == [True] * 3
    assert Q(attention_bias=True).attention_bias


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_moe_configs_refused(arch):
    """What transformers 5.12 cannot build or run: nulls in non-Optional fields (strict config
    validation), kv heads not dividing the heads, an odd head_dim (RoPE), top-k outside
    1..num_experts (torch.topk), a null num_experts; Qwen3-MoE's null head_dim."""
    base = synth.tiny_config(arch)
    bad = [dict(num_key_value_heads=None), dict(num_experts_per_tok=None), dict(rms_norm_eps=None),
           dict(num_key_value_heads=3), dict(hidden_size=36, head_dim=None), dict(num_experts_per_tok=9),
           dict(num_experts_per_tok=0), dict(rope_theta=None), dict(max_position_embeddings=None)]
    if arch == "qwen3_moe":
        bad += [dict(head_dim=None), dict(head_dim=9), dict(norm_topk_prob=None), dict(decoder_sparse_step=None),
                dict(moe_intermediate_size=None), dict(num_experts=None), dict(mlp_only_layers=3),
                dict(use_sliding_window=True, sliding_window=0)]
    else:
        bad += [dict(num_local_experts=None), dict(num_local_experts=0), dict(sliding_window=0)]
    for kw in bad:
        with pytest.raises(reference.ReferenceError):
            reference.Config(dict(base, **kw))


@pytest.mark.parametrize("arch", MOE)
def test_moe_v4_and_v5_configs_agree(tmp_path, arch):
    """The same model's config.json as transformers 5 writes it (synth.to_v5: rope_parameters,
    dtype, Qwen3-MoE's num_local_experts) runs identically."""
    d = _ckpt(tmp_path, arch, rope_theta=500.0)
    v5 = synth.to_v5(reference.load_config(str(d)))
    assert "rope_theta" not in v5 and v5["rope_parameters"]["rope_theta"] == 500.0
    if arch.startswith("qwen3_moe"):
        assert "num_experts" not in v5 and v5["num_local_experts"] == reference.Config(v5).experts
    if arch == "qwen2_moe":  # as Qwen2MoeConfig saves it
        assert v5["num_experts"] == 4 and v5["sliding_window"] == 0 and v5["qkv_bias"] is True
        assert v5["layer_types"] == ["full_attention"] * 3
    _same_run_as(tmp_path, d, v5)


def test_moe_bf16_checkpoint_and_tying(tmp_path):
    """bf16 expert / router tensors are upcast exactly; a tied Qwen3-MoE stores no lm_head."""
    cfg = synth.tiny_config("qwen3_moe_step2")
    d = tmp_path / "h"
    w = synth.write_checkpoint(str(d), cfg, seed=3, dtype="bf16")
    assert "lm_head.weight" not in w and "model.layers.1.mlp.experts.5.up_proj.weight" in w
    d2 = tmp_path / "f"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    st.save(str(d2 / "model.safetensors"), {k: st.bf16_bits_to_f32(v) for k, v in w.items()})
    _same_run(d, d2)
    r = reference.run(str(d), [[1, 2, 3]])[0]
    emb = st.bf16_bits_to_f32(w["model.embed_tokens.weight"])
    assert _maxdiff(r["lm_head"], r["model.norm"] @ emb.T) < 1e-5


# ---------------------------------------------------------------------------------------------
# Qwen2-MoE (modeling_qwen2_moe.py / configuration_qwen2_moe.py, transformers 5.12.1): the shared
# expert, q / k / v biases, its own sliding-window rule, independently in float64
# ---------------------------------------------------------------------------------------------

def _qwen2_moe_layout64(cfg):
    """(windows, sparse) per layer from a 4.x-form config.json dict with every field present,
    written from Qwen2MoeConfig.__post_init__ / Qwen2MoeDecoderLayer: without layer_types, layer i
    slides (window sliding_window) iff use_sliding_window and i is even and i < max_window_layers;
    sparse iff i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0."""
    L = cfg["num_hidden_layers"]
    use = cfg["use_sliding_window"]
    windows = [cfg["sliding_window"] if use and i % 2 == 0 and i < cfg["max_window_layers"] else None
               for i in range(L)]
    mlp_only = cfg["mlp_only_layers"] or []
    sparse = [i not in mlp_only and cfg["num_experts"] > 0 and (i + 1) % cfg["decoder_sparse_step"] == 0
              for i in range(L)]
    return windows, sparse


QWEN2_MOE_BLOCK_WRONGS = ("flip_norm", "no_shared_sigmoid", "shared_gate_minus", "shared_ungated", "no_shared",
                          "shared_weighted", "shared_gate_on_residual", "shared_swap_gate_up", "gate_point_sigmoid")


def _qwen2_moe_block64(x, w, M, c, wrong=None, residual=None):
    """Qwen2MoeSparseMoeBlock in float64 on rows x [T, H]: the routed experts as _moe_independent's
    dense mixture plus sigmoid(z) * s, s = shared_expert(x), z = x @ shared_expert_gate^T. Returns
    its points: .gate (router logits), .shared_expert (s), .shared_expert_gate (the logit z) and the
    block's output.

    wrong: one deliberate error (QWEN2_MOE_BLOCK_WRONGS): "flip_norm" (norm_topk_prob read the
    other way), "no_shared_sigmoid" (z * s), "shared_gate_minus" (sigmoid(-z) * s, i.e. (1 -
    sigmoid(z)) s), "shared_ungated" (+ s), "no_shared" (the shared expert left out),
    "shared_weighted" (the gated shared term added inside the routed mixture, so scaled by the sum
    of the k routing weights: no change when they are renormalised), "shared_gate_on_residual" (z
    from the un-normalised residual stream `residual` instead of the block's input),
    "shared_swap_gate_up" (silu on the shared expert's up_proj), "gate_point_sigmoid" (the
    .shared_expert_gate point reported after the sigmoid)."""
    names = ("gate_proj", "down_proj", "up_proj")
    logits, mix, full = _moe_independent(x, w, M, names, c, wrong="flip_norm" if wrong == "flip_norm" else None)
    routed = full - _qwen2_shared64(x, w, M)[2]
    s, z, term = _qwen2_shared64(x, w, M, swap=wrong == "shared_swap_gate_up",
                                 gate_x=residual if wrong == "shared_gate_on_residual" else None)
    gated = {"no_shared_sigmoid": z * s, "shared_gate_minus": s / (1.0 + np.exp(z)), "shared_ungated": s,
             "no_shared": 0.0 * s, "shared_weighted": mix.sum(-1, keepdims=True) * term}.get(wrong, term)
    return {M + ".gate": logits, M + ".shared_expert": s,
            M + ".shared_expert_gate": 1.0 / (1.0 + np.exp(-z)) if wrong == "gate_point_sigmoid" else z,
            M: routed + gated}


def _qwen2_moe_routing64(cfg):
    """What _moe_independent reads of a config, taken from the config.json dict itself (not from the
    reference's Config): num_experts, num_experts_per_tok, norm_topk_prob (default false)."""
    return types.SimpleNamespace(arch="qwen2_moe", experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                                 norm_topk=bool(cfg.get("norm_topk_prob", False)))


def _qwen2_moe_layer64(x, w, p, cfg, window, sparse, wrong=None):
    """One Qwen2MoeDecoderLayer in float64 on rows x [T, H] (4.x-form `cfg` with the routing fields
    present). Returns its points: input_layernorm, q / k / v_proj,
    o_proj:input, self_attn, post_attention_layernorm, the block's points (sparse) or mlp.act_fn and
    mlp (dense), and the layer output.

    h = x + o_proj(attn(rms(x))), q / k / v with their biases when stored, o_proj without; the
    attention within `window` (i - W < j <= i) when not None; out = h + mlp(rms(h)).
    wrong: _qwen2_moe_block64's, or "no_qkv_bias" (biases dropped), "no_window" (causal only),
    "window_plus_1" (one key more: i - W <= j)."""
    x = np.asarray(x, np.float64)
    nh = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or x.shape[1] // nh
    eps = cfg["rms_norm_eps"]
    A, M = p + ".self_attn", p + ".mlp"

    def lin(v, name):
        y = v @ w[f"{name}.weight"].astype(np.float64).T
        b = w.get(f"{name}.bias")
        return y if b is None or wrong == "no_qkv_bias" else y + b

    xn = _rms64(x, w[p + ".input_layernorm.weight"], eps)
    q, k, v = (lin(xn, f"{A}.{nm}") for nm in ("q_proj", "k_proj", "v_proj"))
    win = None if wrong == "no_window" else window + 1 if wrong == "window_plus_1" and window else window
    o = _attention64(q, k, v, cfg, hd, window=win)
    a = lin(o, A + ".o_proj")
    h = x + a
    hn = _rms64(h, w[p + ".post_attention_layernorm.weight"], eps)
    pts = {p + ".input_layernorm": xn, A + ".q_proj": q, A + ".k_proj": k, A + ".v_proj": v, A + ".o_proj:input": o,
           A: a, p + ".post_attention_layernorm": hn}
    if sparse:
        pts.update(_qwen2_moe_block64(hn, w, M, _qwen2_moe_routing64(cfg), wrong=wrong, residual=h))
    else:
        g = hn @ w[M + ".gate_proj.weight"].astype(np.float64).T
        u = hn @ w[M + ".up_proj.weight"].astype(np.float64).T
        pts[M + ".act_fn"] = _silu64(g)
        pts[M] = (_silu64(g) * u) @ w[M + ".down_proj.weight"].astype(np.float64).T
    pts[p] = h + pts[M]
    return pts


QWEN2_MOE_CASES = {
    # synth's tiny model: q / k / v biases (qkv_bias's default), top-2 of 4 not renormalised, layer 1
    # dense (mlp_only_layers), no window
    "tiny": {},
    # renormalised top-3 of 6, decoder_sparse_step 2 (layers 1 and 3 sparse), windows of 3 on the
    # even layers below max_window_layers 3 (0 and 2: Qwen2's rule would give layer 3), linear RoPE
    "norm-step2-window": dict(num_hidden_layers=4, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=None,
                              num_experts=6, num_experts_per_tok=3, use_sliding_window=True, sliding_window=3,
                              max_window_layers=3, rope_scaling={"type": "linear", "factor": 2.0}),
    # no q / k / v biases, head_dim 16 != 32 / 4, MHA, tied, every layer sparse, window 5 on layer 0
    "nobias-head16-tied-window": dict(qkv_bias=False, head_dim=16, num_key_value_heads=4, tie_word_embeddings=True,
                                      mlp_only_layers=[], use_sliding_window=True, sliding_window=5,
                                      max_window_layers=1),
}


@pytest.mark.parametrize("case", list(QWEN2_MOE_CASES))
def test_qwen2_moe_model_matches_float64_formula(tmp_path, case):
    """The whole Qwen2-MoE model against _qwen2_moe_layer64 chained in float64 from the embedding to
    the logits: every layer's norms, q / k / v_proj (biases), o_proj input, self_attn, the sparse
    block's .gate / .shared_expert / .shared_expert_gate (the logit) / .mlp, the dense layers' MLP,
    the layer outputs, model.norm and lm_head, within 1e-5 relative; the layout (windows, sparse
    layers) from the config by the rule written out in _qwen2_moe_layout64. Then each listed
    mistake, made on the float64 side from the reference's own layer input, must move some point of
    that layer far outside the tolerance.
    The routing fields come from the config.json dict (_qwen2_moe_routing64), not from the
    reference's Config.
    (Checked the other way round too, by mutating a copy of reference.py: the sigmoid dropped,
    sigmoid(-z), the shared expert ungated, left out or with gate_proj / up_proj swapped,
    norm_topk_prob ignored or always applied, the .shared_expert_gate point recorded after the
    sigmoid, Qwen2's window rule, every layer below max_window_layers sliding, q / k / v biases
    dropped, an o_proj bias, mlp_only_layers ignored: each fails a case here or one of the other
    qwen2_moe tests. Not caught by a float64 tolerance: the float32 order of the routed sum (slot
    order, HF's default grouped_mm experts, against ascending expert order, its eager experts); that
    was checked against transformers 5.12.1 itself.)"""
    d = tmp_path / "m"
    cfg = synth.tiny_config("qwen2_moe", **QWEN2_MOE_CASES[case])
    w = synth.write_checkpoint(str(d), cfg, seed=4)
    c = reference.Config(reference.load_config(str(d)))
    windows, sparse = _qwen2_moe_layout64(cfg)
    assert c.windows == windows and c.sparse == sparse and any(sparse)
    assert c.attention_bias == cfg.get("qkv_bias", True) == any(k.endswith(".bias") for k in w)
    assert not any(k.endswith("o_proj.bias") for k in reference.expected_shapes(c))
    T = 20
    seq = [int(t) for t in np.random.default_rng(8).integers(0, c.vocab_size, T)]
    r = reference.run(str(d), [seq])[0]

    def tol(name):
        return 1e-5 * max(1.0, float(np.abs(r[name]).max()))

    emb = w["model.embed_tokens.weight"].astype(np.float64)
    h = emb[seq]
    for i in range(c.layers):
        p = f"model.layers.{i}"
        want = _qwen2_moe_layer64(h, w, p, cfg, windows[i], sparse[i])
        for name, v in want.items():
            assert _maxdiff(r[name], v) < tol(name), (name, _maxdiff(r[name], v))
        h = want[p]
    hn = _rms64(h, w["model.norm.weight"], cfg["rms_norm_eps"])
    assert _maxdiff(r["model.norm"], hn) < tol("model.norm")
    head = emb if cfg["tie_word_embeddings"] else w["lm_head.weight"].astype(np.float64)
    assert _maxdiff(r["lm_head"], hn @ head.T) < tol("lm_head")
    # the shared gate spreads (sigmoid well inside (0, 1)) and the shared term is of the routed size
    i = sparse.index(True)
    M = f"model.layers.{i}.mlp"
    z = r[M + ".shared_expert_gate"]
    assert z.min() < -0.5 and z.max() > 0.5
    # power: on the first sparse layer (block mistakes) and the first sliding layer (window mistakes),
    # from the reference's own layer input; block points are O(1e-3), so an absolute bound there
    wrongs = list(QWEN2_MOE_BLOCK_WRONGS)
    if cfg["norm_topk_prob"]:
        wrongs.remove("shared_weighted")  # the k weights sum to 1: the same output
    if cfg.get("qkv_bias", True):
        wrongs.append("no_qkv_bias")
    layers = {wr: i for wr in wrongs}
    if any(windows):
        j = next(n for n, win in enumerate(windows) if win)
        layers.update(no_window=j, window_plus_1=j)
    for wrong, n in layers.items():
        p = f"model.layers.{n}"
        right = _qwen2_moe_layer64(r[p + ":input"], w, p, cfg, windows[n], sparse[n])
        got = _qwen2_moe_layer64(r[p + ":input"], w, p, cfg, windows[n], sparse[n], wrong=wrong)
        base = max(_maxdiff(r[k], v) for k, v in right.items())
        worst = max(_maxdiff(r[k], v) for k, v in got.items())
        # base: float32 roundoff of the O(1) residual points, up to 1.04e-6 with OpenBLAS 0.3.21 on
        # an AMD EPYC (below 1e-6 on the machines before it)
        assert base < 5e-6 and worst > 1e-4, (wrong, base, worst)


def test_qwen2_moe_window_rule(tmp_path):
    """Qwen2MoeConfig.__post_init__: sliding_window = sliding_window (default 4096) if
    use_sliding_window else 0; without layer_types, layer i slides iff (i + 1) % 2 and i <
    max_window_layers (default 28) and use_sliding_window: the even layers below max_window_layers
    (Qwen2's rule would slide the layers >= max_window_layers); an explicit layer_types (what
    transformers 5 saves) overrides. Refused: use_sliding_window with a null window (HF builds the
    sliding mask on every forward, which raises), sliding layers with a window < 1 (0 when
    use_sliding_window is false), other layer types, a wrong length. Then the locality: a token
    outside layer 0's window does not reach it, it does reach the full layer 1."""
    cfg = synth.tiny_config("qwen2_moe", num_hidden_layers=6, use_sliding_window=True, sliding_window=4,
                            max_window_layers=4)
    W = lambda **kw: reference.Config(dict(cfg, **kw)).windows  # noqa: E731
    assert W() == [4, None, 4, None, None, None]
    assert W(max_window_layers=5) == [4, None, 4, None, 4, None]
    assert W(max_window_layers=0) == [None] * 6
    assert W(max_window_layers=28) == [4, None, 4, None, 4, None]
    assert W(use_sliding_window=False) == [None] * 6
    assert W(layer_types=["full_attention", "sliding_attention"] * 3) == [None, 4, None, 4, None, 4]
    assert W(use_sliding_window=False, layer_types=["full_attention"] * 6) == [None] * 6
    no_mwl = {k: v for k, v in cfg.items() if k not in ("max_window_layers", "sliding_window")}
    assert reference.Config(no_mwl).windows == [4096, None, 4096, None, 4096, None]  # defaults 28 and 4096
    assert reference.Config(dict(no_mwl, use_sliding_window=False)).windows == [None] * 6
    assert reference.Config({"model_type": "qwen2_moe", "use_sliding_window": True}).windows == \
        [4096 if i % 2 == 0 else None for i in range(24)]
    for bad, msg in [(dict(sliding_window=None), "null sliding_window"),
                     (dict(sliding_window=None, max_window_layers=0), "null sliding_window"),
                     (dict(use_sliding_window=False, layer_types=["sliding_attention"] * 6), "sliding_window 0"),
                     (dict(sliding_window=0), "sliding_window 0"),
                     (dict(max_window_layers=None), "null"),
                     (dict(use_sliding_window=None), "null"),
                     (dict(layer_types=["full_attention"] * 5), "6 layer types"),
                     (dict(layer_types=["full_attention"] * 5 + ["chunked_attention"]), "chunked_attention")]:
        with pytest.raises(reference.ReferenceError, match=msg):
            W(**bad)
    # locality: window 4 on layer 0, full layer 1
    d = _ckpt(tmp_path, "qwen2_moe", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert reference.Config(reference.load_config(str(d))).windows == [4, None, None]
    base = list(range(40, 54))
    j = 3
    alt = list(base)
    alt[j] = 300
    a, b = reference.run(str(d), [base, alt])
    A0 = "model.layers.0.self_attn"
    for i in range(len(base)):
        same = np.array_equal(a[A0][i], b[A0][i])
        assert same == (i < j or i >= j + 4), i  # keys i - 3 .. i
    assert not np.allclose(a["model.layers.1.self_attn"][j + 4:], b["model.layers.1.self_attn"][j + 4:], atol=1e-6)


def test_qwen2_moe_config_defaults_and_refusals():
    """Qwen2MoeConfig's defaults (Qwen1.5-MoE-A2.7B's sizes); qkv_bias (not attention_bias) gives q /
    k / v biases, never o_proj's; head_dim from config.json else hidden // heads; num_experts only
    (num_local_experts is not an alias); the sparse-layer rule; what transformers cannot build or
    run is refused."""
    c = reference.Config({"model_type": "qwen2_moe"})
    assert (c.vocab_size, c.hidden, c.inner, c.layers, c.heads, c.kv_heads, c.head_dim) == (
        151936, 2048, 5632, 24, 16, 16, 128)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.mlp_bias) == ("silu", 1e-6, False, True, False)
    assert (c.experts, c.top_k, c.moe_inner, c.shared_inner, c.norm_topk) == (60, 4, 1408, 5632, False)
    assert c.rope == {"rope_type": "default", "rope_theta": 10000.0, "max_position_embeddings": 32768,
                      "partial_rotary_factor": 1.0}
    assert c.windows == [None] * 24 and c.sparse == [True] * 24
    base = synth.tiny_config("qwen2_moe")
    Q = lambda **kw: reference.Config(dict(base, **kw))  # noqa: E731
    assert Q().attention_bias and not Q(qkv_bias=False).attention_bias
    assert Q(attention_bias=False).attention_bias and not Q(qkv_bias=False, attention_bias=True).attention_bias
    shapes = reference.expected_shapes(Q())
    assert [k for k in shapes if k.startswith("model.layers.0.") and k.endswith(".bias")] == [
        f"model.layers.0.self_attn.{n}_proj.bias" for n in "qkv"]
    assert not any(k.endswith(".bias") for k in reference.expected_shapes(Q(qkv_bias=False)))
    assert Q(head_dim=16).head_dim == 16 and Q().head_dim == 8
    assert Q(hidden_size=40, num_attention_heads=6, num_key_value_heads=3).head_dim == 6  # floored, as HF
    assert Q(num_local_experts=7).experts == 4  # an unread extra key
    assert Q(mlp_only_layers=None).sparse == [True] * 3
    assert Q(mlp_only_layers=[0, 2, 9]).sparse == [False, True, False]
    assert Q(decoder_sparse_step=2, mlp_only_layers=[]).sparse == [False, True, False]
    assert Q(num_experts=0).sparse == [False] * 3
    assert Q(decoder_sparse_step=0, mlp_only_layers=[0, 1, 2]).sparse == [False] * 3  # never evaluated
    assert reference.Config({"model_type": "qwen2_moe", "rope_parameters": {"rope_type": "default",
                                                                             "rope_theta": 1e6}}).rope["rope_theta"] == 1e6
    # the shapes of one sparse layer: the Hub's per-expert names, the shared expert and its gate
    s = reference.expected_shapes(Q())
    m = "model.layers.0.mlp."
    assert {k[len(m):]: v for k, v in s.items() if k.startswith(m)} == {
        "gate.weight": [4, 32], **{f"experts.{e}.{n}.weight": ([32, 24] if n == "down_proj" else [24, 32])
                                   for e in range(4) for n in ("gate_proj", "down_proj", "up_proj")},
        "shared_expert.gate_proj.weight": [40, 32], "shared_expert.up_proj.weight": [40, 32],
        "shared_expert.down_proj.weight": [32, 40], "shared_expert_gate.weight": [1, 32]}
    assert {k: v for k, v in s.items() if k.startswith("model.layers.1.mlp.")} == {
        "model.layers.1.mlp.gate_proj.weight": [64, 32], "model.layers.1.mlp.up_proj.weight": [64, 32],
        "model.layers.1.mlp.down_proj.weight": [32, 64]}
    bad = [dict(num_key_value_heads=None), dict(num_key_value_heads=3), dict(head_dim=None), dict(head_dim=9),
           dict(hidden_size=36, num_attention_heads=4), dict(num_experts_per_tok=None), dict(num_experts_per_tok=0),
           dict(num_experts_per_tok=5), dict(num_experts=None), dict(norm_topk_prob=None), dict(qkv_bias=None),
           dict(decoder_sparse_step=None), dict(decoder_sparse_step=0), dict(moe_intermediate_size=None),
           dict(shared_expert_intermediate_size=None), dict(rms_norm_eps=None), dict(rope_theta=None),
           dict(max_position_embeddings=None), dict(mlp_only_layers=1), dict(hidden_act="gelu_foo"),
           dict(partial_rotary_factor=0.5)]
    for kw in bad:
        with pytest.raises(reference.ReferenceError):
            reference.Config(dict(base, **kw))


def test_qwen2_moe_parameter_counts():
    """Qwen/Qwen1.5-MoE-A2.7B's and Qwen/Qwen2-57B-A14B's sizes: the tensors expected_shapes lists
    add up to the parameter counts transformers 5.12.1's Qwen2MoeForCausalLM reports for them on
    the meta device; without the unchosen experts, the "A2.7B" and "A14B" active counts."""
    cfgs = {"A2.7B": dict(model_type="qwen2_moe", vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                          num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, num_experts=60,
                          num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                          max_position_embeddings=8192, tie_word_embeddings=False),
            "57B-A14B": dict(model_type="qwen2_moe", vocab_size=151936, hidden_size=3584, intermediate_size=18944,
                             num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, num_experts=64,
                             num_experts_per_tok=8, moe_intermediate_size=2560, shared_expert_intermediate_size=20480,
                             max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=False)}
    counts, active = {}, {}
    for name, cfg in cfgs.items():
        c = reference.Config(cfg)
        assert c.head_dim == 128 and all(c.sparse) and not c.tie
        shapes = reference.expected_shapes(c)
        counts[name] = sum(int(np.prod(s)) for s in shapes.values())
        active[name] = counts[name] - c.layers * (c.experts - c.top_k) * 3 * c.moe_inner * c.hidden
    assert counts == {"A2.7B": 14_315_784_192, "57B-A14B": 57_408_658_944}
    assert active == {"A2.7B": 2_689_173_504, "57B-A14B": 14_249_270_784}
    assert reference.Config(cfgs["57B-A14B"]).rope["rope_theta"] == 1e6
    assert reference.expected_shapes(reference.Config({"model_type": "qwen2_moe"})) == reference.expected_shapes(
        reference.Config(dict(cfgs["A2.7B"], max_position_embeddings=32768)))


def test_qwen2_moe_stray_biases_ignored(tmp_path):
    """An o_proj bias (Qwen2MoeAttention's o_proj has none) or q / k / v biases under qkv_bias false
    in the checkpoint are unexpected keys transformers drops (checked against 5.12.1: the logits do
    not move); the reference ignores them too."""
    d = _ckpt(tmp_path, "qwen2_moe", qkv_bias=False)
    w = st.load_checkpoint(str(d))
    d2 = tmp_path / "b"
    os.makedirs(d2)
    (d2 / "config.json").write_bytes((d / "config.json").read_bytes())
    for i in range(3):
        for nm, n in (("q_proj", 32), ("k_proj", 16), ("v_proj", 16), ("o_proj", 32)):
            w[f"model.layers.{i}.self_attn.{nm}.bias"] = np.full(n, 0.7, np.float32)
    st.save(str(d2 / "model.safetensors"), w)
    _same_run(d, d2)


# ---------------------------------------------------------------------------------------------
# gpt-oss's block, independently in float64 (modeling_gpt_oss.py: GptOssTopKRouter, GptOssExperts)
# ---------------------------------------------------------------------------------------------

def _gpt_oss_block(x, w, p, c, wrong=None):
    """Router logits and the block's output for rows x [T, H] from the written tensors `w` (float,
    MXFP4 pairs already unpacked by synth.mxfp4_unpacked, not by the reference)."""
    x = np.asarray(x, np.float64)
    logits = x @ w[p + ".router.weight"].T.astype(np.float64) + w[p + ".router.bias"]
    k = c.top_k
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        order = np.argsort(-logits[t], kind="stable")[:k]
        if wrong == "softmax_all":
            e = np.exp(logits[t] - logits[t].max())
            weights = (e / e.sum())[order]
        else:
            e = np.exp(logits[t][order] - logits[t][order].max())
            weights = e / e.sum()
        for e_idx, wt in zip(order, weights):
            gu = x[t] @ w[p + ".experts.gate_up_proj"][e_idx] + w[p + ".experts.gate_up_proj_bias"][e_idx]
            if wrong == "halves":
                gate, up = gu[:gu.size // 2], gu[gu.size // 2:]
            else:
                gate, up = gu[0::2], gu[1::2]
            if wrong != "no_clamp":
                gate, up = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
            h = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
            y = h @ w[p + ".experts.down_proj"][e_idx] + w[p + ".experts.down_proj_bias"][e_idx]
            out[t] += wt * y
    return logits, out


@pytest.mark.parametrize("arch", ["gpt_oss", "gpt_oss_mxfp4"])
def test_gpt_oss_block_matches_independent_mixture(tmp_path, arch):
    """Each layer's .mlp and .mlp.router against the formula above; the clamps must bite (synth's
    gate_up biases are large) and each listed mistake must move the output far outside the
    tolerance."""
    d = tmp_path / "m"
    w = synth.mxfp4_unpacked(synth.write_checkpoint(str(d), synth.tiny_config(arch), seed=7))
    c = reference.Config(reference.load_config(str(d)))
    seq = [int(t) for t in np.random.default_rng(3).integers(0, c.vocab_size, 24)]
    r = reference.run(str(d), [seq])[0]
    tol = 1e-5 * max(1.0, max(float(np.abs(r[f"model.layers.{i}.mlp"]).max()) for i in range(c.layers)))
    for i in range(c.layers):
        p = f"model.layers.{i}.mlp"
        logits, out = _gpt_oss_block(r[p + ":input"], w, p, c)
        assert _maxdiff(r[p + ".router"], logits) < 1e-5
        assert _maxdiff(r[p], out) < tol, (p, _maxdiff(r[p], out))
    p = "model.layers.0.mlp"
    for wrong in ("softmax_all", "halves", "no_clamp"):
        _, out = _gpt_oss_block(r[p + ":input"], w, p, c, wrong=wrong)
        assert _maxdiff(r[p], out) > 100 * tol, wrong


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3 (modeling_deepseek_v3.py / configuration_deepseek_v3.py, transformers 5.12.1): MLA,
# interleaved RoPE, sigmoid group-limited routing with a correction bias, shared experts,
# independently in float64 from the config.json dict
# ---------------------------------------------------------------------------------------------

def _dsv3_mscale64(s, m):
    return 0.1 * m * math.log(s) + 1.0 if s > 1 else 1.0


def _dsv3_rope_params64(cfg):
    """(inv_freq [d/2], attention factor on cos / sin, softmax scale) of a 4.x-form config dict:
    d = qk_rope_head_dim; plain RoPE or YaRN (_yarn64); scale (qk_nope + qk_rope) ** -0.5, for YaRN
    times mscale(factor, mscale_all_dim) ** 2; the cos / sin factor mscale(factor, mscale) /
    mscale(factor, mscale_all_dim) (both given), else mscale(factor, 1)."""
    d = cfg["qk_rope_head_dim"]
    theta = float(cfg.get("rope_theta", 10000.0))
    scale = (cfg["qk_nope_head_dim"] + d) ** -0.5
    rs = cfg.get("rope_scaling") or {}
    if not rs:
        return theta ** -(np.arange(0, d, 2, dtype=np.float64) / d), 1.0, scale
    assert rs["type"] == "yarn"
    s, L = rs["factor"], rs["original_max_position_embeddings"]
    inv = _yarn64(d, theta, s, L, rs.get("beta_fast", 32), rs.get("beta_slow", 1))
    m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
    af = _dsv3_mscale64(s, m) / _dsv3_mscale64(s, m_all) if m and m_all else _dsv3_mscale64(s, 1)
    if m_all:
        scale *= _dsv3_mscale64(s, m_all) ** 2
    return inv, af, scale


def _dsv3_rot64(t, inv, af, interleave, sign=1, layout="concat"):
    """t [T, n, d] rotated at positions 0..T-1 as complex numbers on the pairs (2i, 2i + 1)
    (interleave) or (i, i + d/2), by sign * angle, times af; returned as [real parts, imaginary
    parts] (layout "concat": any layout serves when q and k share it, only dot products of two such
    vectors are taken) or interleaved [re_0, im_0, re_1, ...] (layout "interleaved", DeepSeek-V2's)."""
    z = t[..., 0::2] + 1j * t[..., 1::2] if interleave else t[..., : t.shape[-1] // 2] + 1j * t[..., t.shape[-1] // 2:]
    z = z * np.exp(1j * sign * np.arange(t.shape[0])[:, None, None] * inv[None, None, :]) * af
    if layout == "interleaved":
        return np.stack([z.real, z.imag], axis=-1).reshape(t.shape)
    return np.concatenate([z.real, z.imag], axis=-1)


DSV3_ATTENTION_WRONGS = ("scale_rope_dim", "scale_v_dim", "rope_pairs", "q_rot_first", "k_rot_first",
                         "kv_split_global", "no_kv_norm", "k_rot_per_head_zero")


def _dsv3_attention64(x, w, A, cfg, wrong=None):
    """DeepseekV3Attention in float64 on normalised rows x [T, H]: returns its points (the
    projections, the two LoRA norms, o_proj:input, :scores (causal, -inf above the diagonal) and the
    output). Written from the modeling code: q from q_proj or q_b_proj(rms(q_a_proj x)) (eps 1e-6),
    heads [nope | rope]; kv_a_proj_with_mqa x = [c (kv_lora_rank) | k_rot (qk_rope, one for all
    heads)]; kv_b_proj(rms(c)) per head [k_nope | v]; scores = (q_nope k_nope + rot(q_rot) rot(k_rot))
    * scale; biases on q_a_proj, kv_a_proj_with_mqa, o_proj when attention_bias.
    wrong: "lora_eps" (the LoRA norms with rms_norm_eps), "scale_rope_dim" (qk_rope ** -0.5, HF's
    config.head_dim), "scale_v_dim" (v_head_dim ** -0.5), "no_mscale" (YaRN's scale factor left out),
    "no_attention_factor" (cos / sin unscaled), "rope_pairs" (the other RoPE pairing),
    "q_rot_first" (each q head split [rope | nope]), "k_rot_first" (k_rot from the first qk_rope
    columns of kv_a_proj_with_mqa), "kv_split_global" (kv_b_proj split [all heads' k_nope | all
    heads' v] instead of per head), "no_kv_norm" (kv_a_layernorm skipped), "k_rot_per_head_zero"
    (no rotary key: the position part of the keys dropped).
    DeepseekV2Attention (cfg model_type deepseek_v2) likewise with _dsv2_rope_params64, the pairs (2i, 2i + 1) always and the rotated pairs kept interleaved; its own
    wrongs: "rope_conj" (rotation by minus the angle), "rope_layout_mismatch"
    (q's rotated pairs interleaved but k's laid out [reals | imaginaries])."""
    x = np.asarray(x, np.float64)
    T = x.shape[0]
    nh, nope, rope, vd = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    r_kv, eps = cfg["kv_lora_rank"], (cfg["rms_norm_eps"] if wrong == "lora_eps" else 1e-6)
    v2 = cfg["model_type"] == "deepseek_v2"  # _dsv2_rope_params64, and its wrongs (see there)
    inv, af, scale = (_dsv2_rope_params64 if v2 else _dsv3_rope_params64)(cfg)
    af = 1.0 if wrong == "no_attention_factor" else af
    if wrong in ("scale_rope_dim", "scale_v_dim", "no_mscale"):
        scale = {"scale_rope_dim": rope, "scale_v_dim": vd, "no_mscale": nope + rope}[wrong] ** -0.5
    interleave = (True if v2 else cfg["rope_interleave"]) != (wrong == "rope_pairs")
    sign = -1 if wrong == "rope_conj" else 1
    q_layout = "interleaved" if v2 else "concat"
    k_layout = "concat" if wrong == "rope_layout_mismatch" else q_layout

    def lin(v, name):
        y = v @ w[f"{A}.{name}.weight"].astype(np.float64).T
        b = w.get(f"{A}.{name}.bias")
        return y if b is None else y + b

    pts = {}
    if cfg["q_lora_rank"] is None:
        q = pts[A + ".q_proj"] = lin(x, "q_proj")
    else:
        qa = pts[A + ".q_a_proj"] = lin(x, "q_a_proj")
        qn = pts[A + ".q_a_layernorm"] = _rms64(qa, w[A + ".q_a_layernorm.weight"], eps)
        q = pts[A + ".q_b_proj"] = lin(qn, "q_b_proj")
    ckv = pts[A + ".kv_a_proj_with_mqa"] = lin(x, "kv_a_proj_with_mqa")
    if wrong == "k_rot_first":
        k_rot, c = ckv[:, :rope], ckv[:, rope:]
    else:
        c, k_rot = ckv[:, :r_kv], ckv[:, r_kv:]
    cn = pts[A + ".kv_a_layernorm"] = c if wrong == "no_kv_norm" else _rms64(c, w[A + ".kv_a_layernorm.weight"], eps)
    kv = pts[A + ".kv_b_proj"] = lin(cn, "kv_b_proj")
    if wrong == "kv_split_global":
        k_nope, v = kv[:, :nh * nope].reshape(T, nh, nope), kv[:, nh * nope:].reshape(T, nh, vd)
    else:
        kv = kv.reshape(T, nh, nope + vd)
        k_nope, v = kv[..., :nope], kv[..., nope:]
    q = q.reshape(T, nh, nope + rope)
    q_nope, q_rot = (q[..., rope:], q[..., :rope]) if wrong == "q_rot_first" else (q[..., :nope], q[..., nope:])
    qr = _dsv3_rot64(q_rot, inv, af, interleave, sign, q_layout)  # [T, nh, rope]
    kr = _dsv3_rot64(k_rot[:, None, :], inv, af, interleave, sign, k_layout)[:, 0]  # [T, rope], shared by the heads
    s = np.einsum("ihd,jhd->hij", q_nope, k_nope)
    if wrong != "k_rot_per_head_zero":
        s = s + np.einsum("ihd,jd->hij", qr, kr)
    s = s * scale
    causal = np.tril(np.ones((T, T), bool))
    s = np.where(causal[None], s, -np.inf)
    pts[A + ":scores"] = s.transpose(1, 0, 2)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = pts[A + ".o_proj:input"] = np.einsum("hij,jhd->ihd", p, v).reshape(T, nh * vd)
    pts[A] = lin(o, "o_proj")
    return pts


DSV3_MOE_WRONGS = ("no_bias", "biased_weights", "group_max", "group_unbiased", "no_groups", "flip_norm",
                   "no_scaling", "softmax_scores", "no_shared", "shared_scaled", "gate_point_sigmoid")


def _dsv3_routing64(logits, bias, cfg, wrong=None):
    """The [T, E] mixing matrix of DeepseekV3MoE.route_tokens_to_experts in float64 from router
    logits: s = sigmoid(logits) (softmax_scores: softmax), c = s + bias; group score = the sum of
    the two largest c of the group; the topk_group best of n_group groups kept; the
    num_experts_per_tok largest c among the kept experts chosen; weights s (not c) at them,
    divided by their sum when norm_topk_prob, times routed_scaling_factor.
    wrong: "no_bias" (choice on s), "biased_weights" (weights from c), "group_max" (group score =
    its largest c), "group_unbiased" (group scores from s), "no_groups" (every group kept),
    "flip_norm", "no_scaling"."""
    E, G, kg, k = cfg["n_routed_experts"], cfg["n_group"], cfg["topk_group"], cfg["num_experts_per_tok"]
    if wrong == "softmax_scores":
        s = np.exp(logits - logits.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
    else:
        s = 1.0 / (1.0 + np.exp(-logits))
    c = s if wrong == "no_bias" else s + bias
    gsrc = s if wrong == "group_unbiased" else c
    mix = np.zeros_like(s)
    for t in range(s.shape[0]):
        per = np.sort(gsrc[t].reshape(G, E // G), axis=-1)[:, ::-1]
        gscore = per[:, 0] if wrong == "group_max" else per[:, 0] + per[:, 1]
        kept = np.arange(G) if wrong == "no_groups" else np.argsort(-gscore, kind="stable")[:kg]
        cand = np.concatenate([np.arange(g * (E // G), (g + 1) * (E // G)) for g in kept])
        chosen = cand[np.argsort(-c[t, cand], kind="stable")[:k]]
        wt = (c if wrong == "biased_weights" else s)[t, chosen]
        if cfg["norm_topk_prob"] != (wrong == "flip_norm"):
            wt = wt / wt.sum()
        mix[t, chosen] = wt * (1.0 if wrong == "no_scaling" else cfg["routed_scaling_factor"])
    return mix


def _dsv3_mlp64(x, w, m, inner=None):
    """A gated MLP down(silu(gate x) * up x) in float64; returns (act_fn output, output)."""
    W = {n: w[f"{m}.{n}.weight"].astype(np.float64) for n in ("gate_proj", "up_proj", "down_proj")}
    g = _silu64(x @ W["gate_proj"].T)
    return g, (g * (x @ W["up_proj"].T)) @ W["down_proj"].T


def _dsv3_moe64(x, w, M, cfg, wrong=None):
    """DeepseekV3MoE in float64 as a DENSE mixture (every expert on every token, weighted by
    _dsv3_routing64's matrix) plus the shared experts; returns its points and the mixing matrix.
    wrong: _dsv3_routing64's, or "no_shared", "shared_scaled" (the shared experts times
    routed_scaling_factor), "gate_point_sigmoid" (.mlp.gate reported after the sigmoid)."""
    x = np.asarray(x, np.float64)
    logits = x @ w[M + ".gate.weight"].astype(np.float64).T
    mix = _dsv3_routing64(logits, w[M + ".gate.e_score_correction_bias"].astype(np.float64), cfg, wrong)
    routed = np.zeros_like(x)
    for e in range(cfg["n_routed_experts"]):
        routed += mix[:, e:e + 1] * _dsv3_mlp64(x, w, f"{M}.experts.{e}")[1]
    shared = _dsv3_mlp64(x, w, M + ".shared_experts")[1]
    term = {"no_shared": 0.0, "shared_scaled": cfg["routed_scaling_factor"]}.get(wrong, 1.0) * shared
    pts = {M + ".gate": 1.0 / (1.0 + np.exp(-logits)) if wrong == "gate_point_sigmoid" else logits,
           M + ".shared_experts": shared, M: routed + term}
    return pts, mix


def _dsv3_layer64(x, w, p, cfg, sparse, wrong=None):
    """One DeepseekV3DecoderLayer in float64 on rows x [T, H]: h = x + attn(rms(x)); out = h +
    mlp(rms(h)) (rms_norm_eps), the mlp dense (intermediate_size) or _dsv3_moe64. Returns its points
    (and the mixing matrix of a sparse layer, else None)."""
    x = np.asarray(x, np.float64)
    eps = cfg["rms_norm_eps"]
    xn = _rms64(x, w[p + ".input_layernorm.weight"], eps)
    pts = {p + ".input_layernorm": xn}
    pts.update(_dsv3_attention64(xn, w, p + ".self_attn", cfg, wrong))
    h = x + pts[p + ".self_attn"]
    hn = pts[p + ".post_attention_layernorm"] = _rms64(h, w[p + ".post_attention_layernorm.weight"], eps)
    mix = None
    if sparse:
        moe, mix = _dsv3_moe64(hn, w, p + ".mlp", cfg, wrong)
        pts.update(moe)
    else:
        pts[p + ".mlp.act_fn"], pts[p + ".mlp"] = _dsv3_mlp64(hn, w, p + ".mlp")
    pts[p] = h + pts[p + ".mlp"]
    return pts, mix


def _dsv3_diff(got, want):
    """max |got - want| over the finite entries (masked scores are -inf on both sides)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    return float(np.max(np.abs(got[fin] - want[fin]))) if fin.any() else 0.0


def _check_deepseek_model64(tmp_path, cfg, layer64, diff, wrongs, zero_weight_slots):
    """The DeepSeek formula tests' driver: cfg's checkpoint (synth, seed 4) run by the reference on
    20 tokens against layer64 (_dsv3_layer64 / _dsv2_layer64) chained in float64 from the embedding
    to the logits, every point within 1e-5 of its largest magnitude (by diff); each sparse layer's
    chosen experts (Model.routing, as sets; with zero_weight_slots those of non-zero weight) are the
    float64 rule's, with its weights, and no token is within 1e-5 of a tie; model.norm and lm_head.
    Then each mistake of wrongs(c, sparse layers) -> {wrong: layers}, made on the float64 side from
    the reference's own layer inputs, must move some point of those layers by more than 10
    tolerances (so by > 1e-4)."""
    d = tmp_path / "m"
    w = synth.write_checkpoint(str(d), cfg, seed=4)
    c = reference.Config(reference.load_config(str(d)))
    sparse = [i >= cfg["first_k_dense_replace"] for i in range(cfg["num_hidden_layers"])]
    assert c.sparse == sparse and any(sparse)
    T = 20
    seq = [int(t) for t in np.random.default_rng(8).integers(0, c.vocab_size, T)]
    m = reference.Model(str(d))
    r = m.forward(seq, patterns=True)
    routes = m.routing(seq)

    def tol(name):
        fin = r[name][np.isfinite(r[name])]
        return 1e-5 * max(1.0, float(np.abs(fin).max()) if fin.size else 0.0)

    emb = w["model.embed_tokens.weight"].astype(np.float64)
    h = emb[seq]
    for i in range(c.layers):
        p = f"model.layers.{i}"
        want, mix = layer64(h, w, p, cfg, sparse[i])
        for name, v in want.items():
            assert diff(r[name], v) < tol(name), (name, diff(r[name], v))
        if sparse[i]:
            ro = routes[i]
            for t in range(T):
                chosen = ro["experts"][t]
                if zero_weight_slots:  # a slot beyond the kept experts takes a masked one, weight 0
                    chosen = chosen[ro["weights"][t] != 0]
                assert sorted(chosen) == sorted(np.nonzero(mix[t])[0]), (i, t)
                assert np.abs(ro["weights"][t] - mix[t, ro["experts"][t]]).max() < 1e-5
            assert ro["margin"].min() > 1e-5  # no near-tie the float32 rounding could flip
        h = want[p]
    hn = _rms64(h, w["model.norm.weight"], cfg["rms_norm_eps"])
    assert _maxdiff(r["model.norm"], hn) < tol("model.norm")
    head = emb if cfg["tie_word_embeddings"] else w["lm_head.weight"].astype(np.float64)
    assert _maxdiff(r["lm_head"], hn @ head.T) < tol("lm_head")
    for wrong, layers in wrongs(c, [i for i in range(c.layers) if sparse[i]]).items():
        worst = 0.0
        for n in layers:
            p = f"model.layers.{n}"
            right, _ = layer64(r[p + ":input"], w, p, cfg, sparse[n])
            got, _ = layer64(r[p + ":input"], w, p, cfg, sparse[n], wrong=wrong)
            assert all(diff(r[k], v) < tol(k) for k, v in right.items())
            worst = max(worst, max(diff(r[k], v) / tol(k) for k, v in got.items()))
        assert worst > 10, (wrong, worst)


DSV3_CASES = {
    # synth's tiny model: q LoRA, interleaved RoPE, v_head_dim 6 != 12, layer 0 dense, top-3 of the 4
    # experts in the 2 best of 4 groups, renormalised, times 2.5, 2 shared experts
    "tiny": {},
    # plain q_proj (Moonlight), rotate-half RoPE, q_a / kv_a / o_proj biases
    "q_proj-rotate_half-bias": dict(q_lora_rank=None, rope_interleave=False, attention_bias=True),
    # YaRN with mscale != mscale_all_dim, weights not renormalised, rms_norm_eps 1e-2 (so the LoRA
    # norms' fixed 1e-6 shows), 4 layers with 2 dense
    "yarn-no_norm-eps": dict(rope_scaling=synth.DEEPSEEK_V3_YARN, norm_topk_prob=False, rms_norm_eps=1e-2,
                             num_hidden_layers=4, first_k_dense_replace=2),
    # one group (Moonlight / Kimi-K2's routing), tied, every layer sparse
    "one_group-tied-all_sparse": dict(n_group=1, topk_group=1, num_experts_per_tok=2, tie_word_embeddings=True,
                                      first_k_dense_replace=0),
    # k = every expert of the kept groups: only the group choice selects
    "all_kept": dict(num_experts_per_tok=4),
}


@pytest.mark.parametrize("case", list(DSV3_CASES))
def test_deepseek_v3_model_matches_float64_formula(tmp_path, case):
    """The whole DeepSeek-V3 model against _dsv3_layer64 chained in float64 from the embedding to the
    logits: every layer's norms, the MLA projections and LoRA norms, the attention scores, o_proj's
    input, self_attn, the dense MLP's act_fn / mlp, the sparse block's .mlp.gate (float32 logits),
    .mlp.shared_experts and .mlp, the layer outputs, model.norm and lm_head, within 1e-5 relative;
    the experts the reference chose (Model.routing, as sets) are the float64 rule's, and so are
    their weights. Then each listed mistake, made on the float64 side from the reference's own
    layer input, must move some point of that layer far outside the tolerance.
    (Not caught by a float64 tolerance: the float32 order of the routed sum and of the weights'
    denominator (torch.topk(sorted=False)'s slot order, HF's grouped_mm experts); checked against
    transformers 5.12.1 itself: bit-identical on every point for a single sequence.)"""
    cfg = synth.tiny_config("deepseek_v3", **DSV3_CASES[case])

    def wrongs(c, sparse_layers):
        out = {wr: [0] for wr in DSV3_ATTENTION_WRONGS}
        out.update({wr: sparse_layers for wr in DSV3_MOE_WRONGS})
        if cfg["rms_norm_eps"] != 1e-6 and cfg["q_lora_rank"] is not None:
            out["lora_eps"] = [0]
        if cfg["rope_scaling"]:
            out.update(no_mscale=[0], no_attention_factor=[0])
        if cfg["n_group"] == cfg["topk_group"]:  # every group kept: the group rule cannot show
            for wr in ("group_max", "group_unbiased", "no_groups"):
                del out[wr]
        return out

    _check_deepseek_model64(tmp_path, cfg, _dsv3_layer64, _dsv3_diff, wrongs, zero_weight_slots=False)


def test_deepseek_v3_routing_rule(tmp_path):
    """Model.routing on synth's tiny model: every chosen expert lies in the topk_group groups of
    largest (top-2-sum) biased score; the weights are the UNbiased sigmoid scores, renormalised,
    times routed_scaling_factor (so they sum to 2.5); synth's e_score_correction_bias changes the
    chosen set of a good share of the tokens (so a reader that ignores it fails the formula test)."""
    d = _ckpt(tmp_path, "deepseek_v3")
    m = reference.Model(str(d))
    c = m.cfg
    seq = [int(t) for t in np.random.default_rng(5).integers(0, c.vocab_size, 32)]
    routes = m.routing(seq)
    assert list(routes) == [1, 2]
    changed = 0
    for i, ro in routes.items():
        bias = m.w[f"model.layers.{i}.mlp.gate.e_score_correction_bias"].double().numpy()
        s = 1.0 / (1.0 + np.exp(-ro["logits"].astype(np.float64)))
        for t in range(len(seq)):
            sc = (s[t] + bias).reshape(c.n_group, -1)
            kept = np.argsort(-np.sort(sc, -1)[:, -2:].sum(-1))[:c.topk_group]
            assert set(ro["experts"][t] // 2) <= set(kept)
            want = s[t, ro["experts"][t]] / s[t, ro["experts"][t]].sum() * 2.5
            assert np.abs(ro["weights"][t] - want).max() < 1e-6
            plain = _dsv3_routing64(ro["logits"][t:t + 1].astype(np.float64), bias, synth.TINY["deepseek_v3"],
                                    wrong="no_bias")
            changed += sorted(np.nonzero(plain[0])[0]) != sorted(ro["experts"][t])
        assert abs(ro["weights"].sum(-1) - 2.5).max() < 1e-5
    assert 0.1 < changed / (2 * len(seq)) < 0.9, changed


@pytest.mark.parametrize("variant", list(synth.DEEPSEEK_V3_VARIANTS))
def test_deepseek_v3_synth_routing_has_no_near_ties(tmp_path, variant):
    """synth's DeepSeek-V3 routers (weights N(0, ROUTER_STD), correction bias N(0, 0.15)) keep every
    choice apart (>= 2e-5 in biased-score units, against float32 rounding of ~1e-7 between
    implementations) for these seeds and sequences; Model.routing's margin is the smaller of the
    k-th minus (k+1)-th biased score among the kept groups' experts (inf when they are all chosen)
    and the topk_group-th minus the (topk_group+1)-th group score (inf when every group is kept)."""
    for seed in range(4):
        d = _ckpt(tmp_path, "deepseek_v3", name=f"s{seed}", seed=seed, **synth.DEEPSEEK_V3_VARIANTS[variant])
        m = reference.Model(str(d))
        c = m.cfg
        for seq in ([5, 17, 2, 99, 3, 3, 250], list(range(3, 30)),
                    [int(t) for t in np.random.default_rng(1).integers(0, 384, 24)]):
            for i, ro in m.routing(seq).items():
                bias = m.w[f"model.layers.{i}.mlp.gate.e_score_correction_bias"].numpy()
                sc = 1.0 / (1.0 + np.exp(-ro["logits"].astype(np.float64))) + bias
                for t in range(len(seq)):
                    groups = sc[t].reshape(c.n_group, -1)
                    gs = np.sort(groups, -1)[:, -2:].sum(-1)
                    g = np.sort(gs)[::-1]
                    cand = np.sort(groups[np.argsort(-gs)[:c.topk_group]].ravel())[::-1]
                    gaps = [g[c.topk_group - 1] - g[c.topk_group]] if c.topk_group < c.n_group else []
                    gaps += [cand[c.top_k - 1] - cand[c.top_k]] if c.top_k < cand.size else []
                    assert np.isclose(ro["margin"][t], min(gaps, default=np.inf), rtol=0, atol=1e-6)
                assert ro["margin"].min() >= 2e-5, (seed, i, seq, ro["margin"].min())
                assert len({tuple(sorted(e)) for e in ro["experts"].tolist()}) > 1  # routing varies


def _dsv3_points(c):
    """The exact point catalogue (in order) of a DeepSeek-V3 config: name -> (per-token shape, dtype)."""
    H, V, nh = c.hidden, c.vocab_size, c.heads
    want = [("model.embed_tokens:input", []), ("model.embed_tokens", [H])]

    def mod(name, inp, out):
        want.extend([(name + ":input", inp), (name, out)])

    for i in range(c.layers):
        p = f"model.layers.{i}"
        A = p + ".self_attn"
        mod(p + ".input_layernorm", [H], [H])
        if c.q_lora_rank is None:
            mod(A + ".q_proj", [H], [nh * c.qk_head_dim])
        else:
            mod(A + ".q_a_proj", [H], [c.q_lora_rank])
            mod(A + ".q_a_layernorm", [c.q_lora_rank], [c.q_lora_rank])
            mod(A + ".q_b_proj", [c.q_lora_rank], [nh * c.qk_head_dim])
        mod(A + ".kv_a_proj_with_mqa", [H], [c.kv_lora_rank + c.qk_rope])
        mod(A + ".kv_a_layernorm", [c.kv_lora_rank], [c.kv_lora_rank])
        mod(A + ".kv_b_proj", [c.kv_lora_rank], [nh * (c.qk_nope + c.v_head_dim)])
        mod(A + ".o_proj", [nh * c.v_head_dim], [H])
        mod(A, [H], [H])
        mod(p + ".post_attention_layernorm", [H], [H])
        M = p + ".mlp"
        if c.sparse[i]:
            mod(M + ".gate", [H], [c.experts])
            M2, I = M + ".shared_experts", c.shared_inner
        else:
            M2, I = M, c.inner
        mod(M2 + ".gate_proj", [H], [I])
        mod(M2 + ".act_fn", [I], [I])
        mod(M2 + ".up_proj", [H], [I])
        mod(M2 + ".down_proj", [I], [H])
        if c.sparse[i]:
            mod(M2, [H], [H])
        mod(M, [H], [H])
        mod(p, [H], [H])
    mod("model.norm", [H], [H])
    mod("lm_head", [H], [V])
    return [(k, (s, "I64" if k == "model.embed_tokens:input" else "F32")) for k, s in want]


@pytest.mark.parametrize("variant", ["tiny", "q_proj"])
def test_deepseek_v3_point_names_order_and_shapes(tmp_path, variant):
    """The points in the order HF's forward completes the modules (checked against transformers'
    own hooks: q_a_proj, q_a_layernorm, q_b_proj, then kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj;
    gate_proj, act_fn, up_proj, down_proj; the router before the shared experts), with
    v_head_dim (6) apart from qk_head_dim (12) in kv_b_proj and o_proj's input."""
    d = _ckpt(tmp_path, "deepseek_v3", **synth.DEEPSEEK_V3_VARIANTS[variant])
    c = reference.Config(reference.load_config(str(d)))
    assert list(reference.points(str(d)).items()) == _dsv3_points(c)


def test_deepseek_v3_config_defaults_and_refusals():
    """DeepseekV3Config's defaults (DeepSeek-V3's sizes) and what transformers cannot build or run."""
    c = reference.Config({"model_type": "deepseek_v3"})
    assert (c.vocab_size, c.hidden, c.inner, c.moe_inner, c.layers, c.heads, c.kv_heads) == (
        129280, 7168, 18432, 2048, 61, 128, 128)
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope, c.qk_rope, c.v_head_dim, c.qk_head_dim, c.head_dim) == (
        1536, 512, 128, 64, 128, 192, 64)
    assert (c.experts, c.n_group, c.topk_group, c.top_k, c.shared_inner, c.routed_scale, c.norm_topk) == (
        256, 8, 4, 8, 2048, 2.5, True)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.rope_interleave) == ("silu", 1e-6, False, False, True)
    assert c.sparse == [False] * 3 + [True] * 58 and c.attn_scale == 192 ** -0.5
    assert c.rope == {"rope_type": "default", "rope_theta": 10000.0, "max_position_embeddings": 4096,
                      "partial_rotary_factor": 1.0}
    base = synth.tiny_config("deepseek_v3")
    D = lambda **kw: reference.Config(dict(base, **kw))  # noqa: E731
    # nulls HF reads as something
    assert D(num_key_value_heads=None).kv_heads == 4 and D(q_lora_rank=None).q_lora_rank is None
    assert not D(norm_topk_prob=None).norm_topk and not D(rope_interleave=None).rope_interleave
    assert D(n_group=None, first_k_dense_replace=3).n_group is None  # no sparse layer: never read
    # num_local_experts (attribute_map) wins; head_dim / qk_head_dim keys that agree are fine
    assert D(num_local_experts=16, n_routed_experts=5).experts == 16
    assert D(head_dim=4, qk_head_dim=12).head_dim == 4
    assert D(first_k_dense_replace=-1).sparse == [True] * 3 and D(first_k_dense_replace=9).sparse == [False] * 3
    assert D(partial_rotary_factor=0.5).rope["partial_rotary_factor"] == 1.0  # unread by the default table
    # YaRN: the softmax scale takes mscale(factor, mscale_all_dim) ** 2, for any non-default type
    y = D(rope_scaling=synth.DEEPSEEK_V3_YARN)
    assert abs(y.attn_scale - 12 ** -0.5 * (0.1 * math.log(4.0) + 1) ** 2) < 1e-15
    assert D(rope_scaling=dict(synth.DEEPSEEK_V3_YARN, mscale_all_dim=0)).attn_scale == 12 ** -0.5
    lin = D(rope_scaling={"type": "linear", "factor": 2.0, "mscale_all_dim": 1.0})
    assert abs(lin.attn_scale - 12 ** -0.5 * (0.1 * math.log(2.0) + 1) ** 2) < 1e-15
    v3 = reference.Config({"model_type": "deepseek_v3", "max_position_embeddings": 163840, "rope_theta": 10000,
                           "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"}})
    assert abs(v3.attn_scale - 192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2) < 1e-15
    assert reference.rope_parameters(v3.rope, v3.qk_rope)[1] == 1.0  # mscale == mscale_all_dim
    # shapes of a dense and a sparse layer (the Hub's names), v_head_dim in kv_b_proj / o_proj
    s = reference.expected_shapes(reference.Config(base))
    assert {k: v for k, v in s.items() if k.startswith("model.layers.0.")} == {
        "model.layers.0.input_layernorm.weight": [32], "model.layers.0.self_attn.q_a_proj.weight": [16, 32],
        "model.layers.0.self_attn.q_a_layernorm.weight": [16], "model.layers.0.self_attn.q_b_proj.weight": [48, 16],
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": [20, 32],
        "model.layers.0.self_attn.kv_a_layernorm.weight": [16], "model.layers.0.self_attn.kv_b_proj.weight": [56, 16],
        "model.layers.0.self_attn.o_proj.weight": [32, 24], "model.layers.0.post_attention_layernorm.weight": [32],
        "model.layers.0.mlp.gate_proj.weight": [48, 32], "model.layers.0.mlp.up_proj.weight": [48, 32],
        "model.layers.0.mlp.down_proj.weight": [32, 48]}
    m = "model.layers.1.mlp."
    assert {k[len(m):]: v for k, v in s.items() if k.startswith(m)} == {
        "gate.weight": [8, 32], "gate.e_score_correction_bias": [8],
        **{f"experts.{e}.{n}.weight": ([32, 12] if n == "down_proj" else [12, 32])
           for e in range(8) for n in ("gate_proj", "up_proj", "down_proj")},
        "shared_experts.gate_proj.weight": [24, 32], "shared_experts.up_proj.weight": [24, 32],
        "shared_experts.down_proj.weight": [32, 24]}
    sb = reference.expected_shapes(D(attention_bias=True))
    assert [k for k in sb if k.startswith("model.layers.0.") and k.endswith(".bias")] == [
        f"model.layers.0.self_attn.{n}.bias" for n in ("q_a_proj", "kv_a_proj_with_mqa", "o_proj")]
    assert "model.layers.0.self_attn.q_proj.weight" in reference.expected_shapes(D(q_lora_rank=None))
    bad = [dict(num_key_value_heads=2), dict(num_key_value_heads=8), {"num_key_value_heads": "absent"},
           dict(head_dim=8), dict(head_dim=None), dict(qk_head_dim=10), dict(v_head_dim=None),
           dict(first_k_dense_replace=None), dict(n_group=None), dict(topk_group=None), dict(num_experts_per_tok=None),
           dict(n_group=3), dict(n_group=8, topk_group=4), dict(topk_group=5), dict(topk_group=0),
           dict(num_experts_per_tok=5), dict(num_experts_per_tok=0), dict(num_local_experts=None),
           dict(kv_lora_rank=None), dict(qk_rope_head_dim=None), dict(qk_rope_head_dim=3), dict(q_lora_rank=0),
           dict(routed_scaling_factor=None), dict(rms_norm_eps=None), dict(attention_bias=None),
           dict(n_shared_experts=None), dict(hidden_act="gelu_foo"), dict(rope_theta=None),
           dict(rope_scaling={"type": "yarn", "original_max_position_embeddings": 32}),
           dict(rope_scaling=dict(synth.DEEPSEEK_V3_YARN, partial_rotary_factor=0.5)),
           dict(quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})]
    for kw in bad:
        cfg = dict(base, **kw)
        if kw == {"num_key_value_heads": "absent"}:
            del cfg["num_key_value_heads"]  # absent: 128 (a field default), not num_attention_heads
        with pytest.raises(reference.ReferenceError):
            reference.Config(cfg)


def test_deepseek_v3_parameter_counts():
    """DeepSeek-V3's, Moonlight-16B-A3B's and Kimi-K2's sizes (their config.json values): the
    tensors expected_shapes lists (the MTP layer not included) add up to the state_dict sizes
    transformers 5.12.1's DeepseekV3ForCausalLM has for them on the meta device (parameters plus
    the e_score_correction_bias buffers): 671B, 16B and 1.03T; without the unchosen routed experts,
    the "37B", "A3B" and "32B" active counts."""
    common = dict(model_type="deepseek_v3", kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128,
                  qk_nope_head_dim=128, norm_topk_prob=True, tie_word_embeddings=False)
    yarn = dict(beta_fast=32, beta_slow=1, factor=40, mscale=1.0, mscale_all_dim=1.0,
                original_max_position_embeddings=4096, type="yarn")
    cfgs = {"DeepSeek-V3": dict(common, vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                                moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                                num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
                                routed_scaling_factor=2.5, q_lora_rank=1536, n_group=8, topk_group=4,
                                num_experts_per_tok=8, first_k_dense_replace=3, max_position_embeddings=163840,
                                rms_norm_eps=1e-6, rope_theta=10000, rope_scaling=yarn),
            "Moonlight-16B-A3B": dict(common, vocab_size=163840, hidden_size=2048, intermediate_size=11264,
                                      moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
                                      num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64,
                                      routed_scaling_factor=2.446, q_lora_rank=None, n_group=1, topk_group=1,
                                      num_experts_per_tok=6, first_k_dense_replace=1, max_position_embeddings=8192,
                                      rms_norm_eps=1e-5, rope_theta=50000.0, rope_scaling=None),
            "Kimi-K2": dict(common, vocab_size=163840, hidden_size=7168, intermediate_size=18432,
                            moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=64,
                            num_key_value_heads=64, n_shared_experts=1, n_routed_experts=384,
                            routed_scaling_factor=2.827, q_lora_rank=1536, n_group=1, topk_group=1,
                            num_experts_per_tok=8, first_k_dense_replace=1, max_position_embeddings=131072,
                            rms_norm_eps=1e-6, rope_theta=50000.0,
                            rope_scaling=dict(yarn, factor=32.0, beta_fast=1.0, beta_slow=1.0))}
    counts, active = {}, {}
    for name, cfg in cfgs.items():
        c = reference.Config(cfg)
        shapes = reference.expected_shapes(c)
        counts[name] = sum(int(np.prod(s)) for s in shapes.values())
        active[name] = counts[name] - sum(c.sparse) * (c.experts - c.top_k) * 3 * c.moe_inner * c.hidden
    assert counts == {"DeepSeek-V3": 671_026_419_200, "Moonlight-16B-A3B": 15_960_110_208,
                      "Kimi-K2": 1_026_408_232_448}
    assert active == {"DeepSeek-V3": 37_552_297_472, "Moonlight-16B-A3B": 2_914_776_192,
                      "Kimi-K2": 32_861_500_928}
    assert reference.expected_shapes(reference.Config({"model_type": "deepseek_v3"})) == reference.expected_shapes(
        reference.Config(dict(cfgs["DeepSeek-V3"], max_position_embeddings=4096, rope_scaling=None)))


def test_deepseek_v3_checkpoint_layouts(tmp_path):
    """Equivalent checkpoints run the same: transformers 5's stacked experts (gate_up_proj [E, 2I, H],
    down_proj [E, H, I]); the MTP layer's tensors (layer num_hidden_layers, incl. its embed_tokens /
    enorm / hnorm / eh_proj / shared_head) and biases of projections that have none are ignored (as
    transformers 5.12.1 drops them: checked, logits unchanged); a v5 config.json (rope_parameters).
    Refused: a layer holding both expert layouts, a stacked tensor of the wrong shape."""
    cfg = synth.tiny_config("deepseek_v3", rope_scaling=synth.DEEPSEEK_V3_YARN)
    d = tmp_path / "hub"
    w = synth.write_checkpoint(str(d), cfg, seed=2)
    ds = tmp_path / "stacked"
    ws = synth.write_checkpoint(str(ds), cfg, seed=2, stacked_experts=True)
    assert "model.layers.1.mlp.experts.gate_up_proj" in ws and not any(".experts.0." in k for k in ws)
    assert list(ws["model.layers.1.mlp.experts.gate_up_proj"].shape) == [8, 24, 32]
    _same_run(d, ds)
    # MTP layer and stray biases
    dm = tmp_path / "mtp"
    os.makedirs(dm)
    (dm / "config.json").write_bytes((d / "config.json").read_bytes())
    wm = dict(w)
    for k, v in w.items():
        if k.startswith("model.layers.2."):
            wm[k.replace("model.layers.2.", "model.layers.3.")] = v * 3.0
    for k in ("embed_tokens.weight", "shared_head.head.weight"):
        wm["model.layers.3." + k] = w["model.embed_tokens.weight"]
    for k in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        wm["model.layers.3." + k] = np.ones(32, np.float32)
    wm["model.layers.3.eh_proj.weight"] = np.ones((32, 64), np.float32)
    for nm, n in (("q_b_proj", 48), ("kv_b_proj", 56), ("o_proj", 32), ("q_a_proj", 16)):
        wm[f"model.layers.0.self_attn.{nm}.bias"] = np.full(n, 0.5, np.float32)
    st.save(str(dm / "model.safetensors"), wm)
    _same_run(d, dm)
    # v5 config form
    dv = tmp_path / "v5"
    os.makedirs(dv)
    (dv / "config.json").write_text(json.dumps(synth.to_v5(cfg)))
    os.symlink(d / "model.safetensors", dv / "model.safetensors")
    rope = lambda c: {k: v for k, v in c.rope.items() if k != "type"}  # noqa: E731 (4.x's key, kept)
    assert rope(reference.Config(reference.load_config(str(dv)))) == rope(reference.Config(cfg))
    _same_run(d, dv)
    # both layouts in one layer; a mis-shaped stacked tensor
    for name, extra in (("both", {"model.layers.1.mlp.experts.0.gate_proj.weight": w[
                            "model.layers.1.mlp.experts.0.gate_proj.weight"]}),
                        ("shape", {"model.layers.2.mlp.experts.down_proj": np.zeros((8, 12, 32), np.float32)})):
        db = tmp_path / name
        os.makedirs(db)
        (db / "config.json").write_bytes((d / "config.json").read_bytes())
        st.save(str(db / "model.safetensors"), dict(ws, **extra))
        with pytest.raises(reference.ReferenceError):
            reference.Model(str(db))


def test_deepseek_v3_interleaved_rope_is_a_column_permutation(tmp_path):
    """rope_interleave pairs the rotary dims (2i, 2i + 1); rotate-half pairs (i, i + d/2). So an
    interleaved model equals the rotate-half model whose rotary columns of q (each head's last
    qk_rope_head_dim rows of q_b_proj) and of k_rot (the last rows of kv_a_proj_with_mqa) are
    permuted evens-then-odds: same scores, same outputs; without the permutation they differ."""
    cfg = synth.tiny_config("deepseek_v3")
    d = tmp_path / "inter"
    w = synth.write_checkpoint(str(d), cfg, seed=3)
    c = reference.Config(cfg)
    perm = np.concatenate([np.arange(0, c.qk_rope, 2), np.arange(1, c.qk_rope, 2)])
    wp = dict(w)
    for i in range(c.layers):
        A = f"model.layers.{i}.self_attn."
        q = w[A + "q_b_proj.weight"].reshape(c.heads, c.qk_head_dim, -1).copy()
        q[:, c.qk_nope:] = q[:, c.qk_nope + perm]
        wp[A + "q_b_proj.weight"] = q.reshape(c.heads * c.qk_head_dim, -1)
        kv = w[A + "kv_a_proj_with_mqa.weight"].copy()
        kv[c.kv_lora_rank:] = kv[c.kv_lora_rank + perm]
        wp[A + "kv_a_proj_with_mqa.weight"] = kv
    seq = list(range(30, 48))
    for name, tensors in (("perm", wp), ("plain", w)):
        dd = tmp_path / name
        os.makedirs(dd)
        (dd / "config.json").write_text(json.dumps(dict(cfg, rope_interleave=False)))
        st.save(str(dd / "model.safetensors"), tensors)
    a, b, p = (reference.run(str(x), [seq], patterns=True)[0] for x in (d, tmp_path / "perm", tmp_path / "plain"))
    A = "model.layers.2.self_attn"
    assert _dsv3_diff(a[A + ":scores"], b[A + ":scores"]) < 1e-5 and _maxdiff(a["lm_head"], b["lm_head"]) < 1e-5
    assert _dsv3_diff(a[A + ":scores"], p[A + ":scores"]) > 1e-3


# ---------------------------------------------------------------------------------------------
# DeepSeek-V2 (modeling_deepseek_v2.py / configuration_deepseek_v2.py, transformers 5.12.1): MLA as
# DeepSeek-V3's, but complex-number RoPE on interleaved pairs, no YaRN factor on the softmax scale,
# softmax routing (greedy or group-limited by the groups' largest probability, no renormalisation),
# shared experts always run; independently in float64 from the config.json dict
# ---------------------------------------------------------------------------------------------

def _dsv2_rope_params64(cfg):
    """(inv_freq [d/2], attention factor on cos / sin, softmax scale) of a 4.x-form DeepSeek-V2 config
    dict: as _dsv3_rope_params64, the scale with YaRN's mscale(factor, mscale_all_dim) ** 2 too
    (DeepSeek's own V2 code, transformers from PR 47435 on; 5.12.1 leaves it out)."""
    return _dsv3_rope_params64(cfg)


DSV2_ATTENTION_WRONGS = ("scale_rope_dim", "scale_v_dim", "rope_pairs", "rope_conj", "rope_layout_mismatch",
                         "q_rot_first", "k_rot_first", "kv_split_global", "no_kv_norm", "k_rot_per_head_zero")
DSV2_MOE_WRONGS = ("sigmoid_scores", "softmax_after_topk", "renormalise", "no_scaling", "no_shared", "shared_scaled",
                   "gate_point_probs")
DSV2_GROUP_WRONGS = ("group_top2_sum", "no_groups")


def _dsv2_routing64(logits, cfg, wrong=None):
    """The [T, E] mixing matrix of DeepseekV2Moe.route_tokens_to_experts in float64 from router
    logits: p = softmax(logits); greedy: the num_experts_per_tok largest p; group_limited_greedy:
    group score = the LARGEST p of each of n_group groups of consecutive experts, the topk_group best
    groups kept, the other experts' p replaced by 0.0, then the k largest (masked ones of weight 0
    when k exceeds the kept experts); weights = p at them times routed_scaling_factor (never
    renormalised).
    wrong: "sigmoid_scores", "softmax_after_topk" (Mixtral's: softmax of the k largest logits),
    "renormalise" (divided by their sum), "no_scaling", "group_top2_sum" (group score = the sum of its
    two largest p, DeepSeek-V3's), "no_groups" (every group kept), "mask_neg_inf" (the other groups'
    experts at -inf instead of 0.0: the extra slots of k > kept get weight -inf)."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    if wrong == "sigmoid_scores":
        p = 1.0 / (1.0 + np.exp(-logits))
    else:
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
    grouped = cfg["topk_method"] == "group_limited_greedy" and wrong != "no_groups"
    mix = np.zeros_like(p)
    for t in range(p.shape[0]):
        cand = p[t].copy()
        if grouped:
            G = cfg["n_group"]
            per = p[t].reshape(G, E // G)
            gscore = np.sort(per, -1)[:, -2:].sum(-1) if wrong == "group_top2_sum" else per.max(-1)
            kept = np.argsort(-gscore, kind="stable")[:cfg["topk_group"]]
            out = np.ones(G, bool)
            out[kept] = False
            cand.reshape(G, E // G)[out] = -np.inf if wrong == "mask_neg_inf" else 0.0
        chosen = np.argsort(-cand, kind="stable")[:k]
        wt = cand[chosen]
        if wrong == "softmax_after_topk":
            z = np.exp(logits[t, chosen] - logits[t, chosen].max())
            wt = z / z.sum()
        if wrong == "renormalise":
            wt = wt / wt.sum()
        mix[t, chosen] = wt * (1.0 if wrong == "no_scaling" else cfg["routed_scaling_factor"])
    return mix


def _dsv2_mlp64(x, w, m, wrong=None):
    """DeepseekV2MLP down(silu(gate x + b) * (up x + b)) + b in float64, the biases where the
    checkpoint has them (mlp_bias; wrong "no_mlp_bias" leaves them out); returns (act_fn output,
    output)."""
    def lin(v, n):
        y = v @ w[f"{m}.{n}.weight"].astype(np.float64).T
        b = w.get(f"{m}.{n}.bias")
        return y if b is None or wrong == "no_mlp_bias" else y + b

    g = _silu64(lin(x, "gate_proj"))
    return g, lin(g * lin(x, "up_proj"), "down_proj")


def _dsv2_moe64(x, w, M, cfg, wrong=None):
    """DeepseekV2Moe in float64 as a DENSE mixture (every routed expert on every token, weighted by
    _dsv2_routing64's matrix) plus the shared experts (a zero-width MLP when n_shared_experts is 0:
    0, or down_proj's bias); returns its points and the mixing matrix.
    wrong: _dsv2_routing64's, or "no_shared", "shared_scaled" (times routed_scaling_factor),
    "gate_point_probs" (.mlp.gate reported after the softmax), "no_mlp_bias"."""
    x = np.asarray(x, np.float64)
    logits = x @ w[M + ".gate.weight"].astype(np.float64).T
    mix = _dsv2_routing64(logits, cfg, wrong)
    routed = np.zeros_like(x)
    for e in range(cfg["n_routed_experts"]):
        if np.any(mix[:, e] != 0):
            routed = routed + mix[:, e:e + 1] * _dsv3_mlp64(x, w, f"{M}.experts.{e}")[1]
    shared = _dsv2_mlp64(x, w, M + ".shared_experts", wrong)[1]
    term = {"no_shared": 0.0, "shared_scaled": cfg["routed_scaling_factor"]}.get(wrong, 1.0) * shared
    p = np.exp(logits - logits.max(-1, keepdims=True))
    pts = {M + ".gate": p / p.sum(-1, keepdims=True) if wrong == "gate_point_probs" else logits,
           M + ".shared_experts": shared, M: routed + term}
    return pts, mix


def _dsv2_layer64(x, w, p, cfg, sparse, wrong=None):
    """One DeepseekV2DecoderLayer in float64 on rows x [T, H] (as _dsv3_layer64, with _dsv2_moe64 and
    the dense MLP's mlp_bias biases). Returns its points (and the mixing matrix of a sparse layer)."""
    x = np.asarray(x, np.float64)
    eps = cfg["rms_norm_eps"]
    xn = _rms64(x, w[p + ".input_layernorm.weight"], eps)
    pts = {p + ".input_layernorm": xn}
    pts.update(_dsv3_attention64(xn, w, p + ".self_attn", cfg, wrong))
    h = x + pts[p + ".self_attn"]
    hn = pts[p + ".post_attention_layernorm"] = _rms64(h, w[p + ".post_attention_layernorm.weight"], eps)
    mix = None
    if sparse:
        moe, mix = _dsv2_moe64(hn, w, p + ".mlp", cfg, wrong)
        pts.update(moe)
    else:
        pts[p + ".mlp.act_fn"], pts[p + ".mlp"] = _dsv2_mlp64(hn, w, p + ".mlp", wrong)
    pts[p] = h + pts[p + ".mlp"]
    return pts, mix


def _dsv2_diff(got, want):
    """_dsv3_diff, but inf where the two disagree on which entries are finite or either has a NaN (a
    mistake that sends weights to -inf)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if np.isnan(got).any() or np.isnan(want).any() or not np.array_equal(np.isinf(got), np.isinf(want)):
        return math.inf
    return _dsv3_diff(got, want)


DSV2_CASES = {
    # synth's tiny model (DeepSeek-V2-Lite's form): plain q_proj, greedy top-3 of 8, times 1.5, 2 shared
    "tiny": {},
    # q LoRA, V2-Lite's YaRN (mscale == mscale_all_dim: cos / sin unscaled, the softmax scale plain),
    # rms_norm_eps 1e-2 (so the LoRA norms' fixed 1e-6 shows)
    "q_lora-yarn-eps": dict(q_lora_rank=16, rope_scaling=synth.DEEPSEEK_V2_YARN, rms_norm_eps=1e-2),
    # DeepSeek-V2's group-limited routing, YaRN with mscale != mscale_all_dim, every bias
    "group-yarn_mscale-biases": dict(synth.DEEPSEEK_V2_VARIANTS["group_limited"],
                                     rope_scaling=synth.DEEPSEEK_V2_VARIANTS["yarn_mscale"]["rope_scaling"],
                                     attention_bias=True, mlp_bias=True),
    # one group of 2 kept, k 3: a weight-0 slot per token
    "k_over_kept": dict(synth.DEEPSEEK_V2_VARIANTS["group_k_over_kept"]),
    # zero-width shared experts (their output is down_proj's bias), 4 layers with 2 dense
    "no_shared-mlp_bias": dict(n_shared_experts=0, mlp_bias=True, num_hidden_layers=4, first_k_dense_replace=2),
}


@pytest.mark.parametrize("case", list(DSV2_CASES))
def test_deepseek_v2_model_matches_float64_formula(tmp_path, case):
    """The whole DeepSeek-V2 model against _dsv2_layer64 chained in float64 from the embedding to the
    logits: every layer's norms, the MLA projections and LoRA norms, the attention scores, o_proj's
    input, self_attn, the dense MLP's act_fn / mlp, the sparse block's .mlp.gate (float32 logits),
    .mlp.shared_experts and .mlp, the layer outputs, model.norm and lm_head, within 1e-5 relative;
    the experts of non-zero weight the reference chose (Model.routing, as sets) are the float64
    rule's, and so are their weights. Then each listed mistake, made on the float64 side from the
    reference's own layer input, must move some point of that layer far outside the tolerance.
    (Not caught by a float64 tolerance, checked against transformers 5.12.1 itself instead, where
    every point is bit-identical for a single sequence: the RoPE's rounding (torch's complex product
    with fused multiply-adds, apply_rope_complex) and its interleaved output order (q and k alike),
    cos / sin from torch.polar, the float32 order of the routed sum (torch.topk(sorted=False)'s slot
    order) and adding the shared experts after it.)"""
    cfg = synth.tiny_config("deepseek_v2", **DSV2_CASES[case])

    def wrongs(c, sparse_layers):
        out = {wr: [0] for wr in DSV2_ATTENTION_WRONGS}
        out.update({wr: sparse_layers for wr in DSV2_MOE_WRONGS})
        if cfg["topk_method"] == "group_limited_greedy":
            out.update({wr: sparse_layers for wr in DSV2_GROUP_WRONGS})
            if cfg["num_experts_per_tok"] > cfg["topk_group"] * cfg["n_routed_experts"] // cfg["n_group"]:
                out["mask_neg_inf"] = sparse_layers
        if cfg["rms_norm_eps"] != 1e-6:
            out["lora_eps"] = [0]
        if cfg["rope_scaling"]:
            out["no_mscale"] = [0]  # transformers 5.12.1's DeepseekV2Attention
            rs = cfg["rope_scaling"]
            if rs["mscale"] != rs["mscale_all_dim"]:
                out["no_attention_factor"] = [0]
        if cfg["n_shared_experts"] == 0 and not cfg.get("mlp_bias"):
            del out["no_shared"], out["shared_scaled"]  # a zero term either way
        if cfg.get("mlp_bias"):
            out["no_mlp_bias"] = list(range(c.layers))
        return out

    _check_deepseek_model64(tmp_path, cfg, _dsv2_layer64, _dsv2_diff, wrongs, zero_weight_slots=True)


def test_deepseek_v2_routing_rule(tmp_path):
    """Model.routing on synth's tiny model (greedy) and its group_limited variant: the weights are the
    chosen experts' softmax probabilities times 1.5 (not renormalised: their sum varies, below 1.5);
    greedy picks the 3 most probable; group_limited_greedy only experts of the 2 groups with the
    largest single probability, and that changes the chosen set of a good share of the tokens (so a
    reader that ignores the groups, or scores them by a top-2 sum, fails the formula test)."""
    seq = [int(t) for t in np.random.default_rng(5).integers(0, 384, 32)]
    for variant in ("tiny", "group_limited"):
        d = _ckpt(tmp_path, "deepseek_v2", name=variant, **synth.DEEPSEEK_V2_VARIANTS[variant])
        m = reference.Model(str(d))
        routes = m.routing(seq)
        assert list(routes) == [1, 2]
        changed = 0
        for i, ro in routes.items():
            lg = ro["logits"].astype(np.float64)
            p = np.exp(lg - lg.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            for t in range(len(seq)):
                e = ro["experts"][t]
                assert np.abs(ro["weights"][t] - 1.5 * p[t, e]).max() < 1e-6
                greedy = set(np.argsort(-p[t])[:3].tolist())
                if variant == "tiny":
                    assert set(e.tolist()) == greedy
                else:
                    kept = np.argsort(-p[t].reshape(4, 2).max(-1))[:2]
                    assert set((e // 2).tolist()) <= set(kept.tolist())
                    changed += set(e.tolist()) != greedy
            s = ro["weights"].sum(-1)
            assert s.max() < 1.5 and s.max() - s.min() > 0.1
        if variant == "group_limited":
            assert 0.1 < changed / (2 * len(seq)) < 0.9, changed


@pytest.mark.parametrize("variant", list(synth.DEEPSEEK_V2_VARIANTS))
def test_deepseek_v2_synth_routing_has_no_near_ties(tmp_path, variant):
    """synth's DeepSeek-V2 routers (weights N(0, ROUTER_STD)) keep every choice apart (>= 1e-5 in
    probability units, against float32 rounding of ~1e-7 between implementations) for these seeds and
    sequences; Model.routing's margin is the smaller of the k-th minus (k+1)-th probability among the
    candidates (the kept groups' experts; inf when k covers them all) and the topk_group-th minus the
    (topk_group+1)-th group score (inf when every group is kept, or the routing is greedy)."""
    for seed in range(4):
        d = _ckpt(tmp_path, "deepseek_v2", name=f"s{seed}", seed=seed, **synth.DEEPSEEK_V2_VARIANTS[variant])
        m = reference.Model(str(d))
        c = m.cfg
        for seq in ([5, 17, 2, 99, 3, 3, 250], list(range(3, 30)),
                    [int(t) for t in np.random.default_rng(1).integers(0, 384, 24)]):
            for i, ro in m.routing(seq).items():
                lg = ro["logits"].astype(np.float64)
                p = np.exp(lg - lg.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
                for t in range(len(seq)):
                    if c.topk_method == "greedy":
                        gaps, cand = [], np.sort(p[t])[::-1]
                    else:
                        groups = p[t].reshape(c.n_group, -1)
                        gs = np.sort(groups.max(-1))[::-1]
                        gaps = [gs[c.topk_group - 1] - gs[c.topk_group]] if c.topk_group < c.n_group else []
                        cand = np.sort(groups[np.argsort(-groups.max(-1))[:c.topk_group]].ravel())[::-1]
                    gaps += [cand[c.top_k - 1] - cand[c.top_k]] if c.top_k < cand.size else []
                    assert np.isclose(ro["margin"][t], min(gaps, default=np.inf), rtol=0, atol=1e-6)
                assert ro["margin"].min() >= 1e-5, (seed, i, seq, ro["margin"].min())
                assert len({tuple(sorted(e)) for e in ro["experts"].tolist()}) > 1  # routing varies


@pytest.mark.parametrize("variant", ["tiny", "q_lora", "no_shared", "mlp_bias"])
def test_deepseek_v2_point_names_order_and_shapes(tmp_path, variant):
    """DeepSeek-V3's point catalogue (_dsv3_points), in the order HF's forward completes the modules
    (checked against transformers' own hooks; .mlp.gate, which HF never calls, where DeepseekV2Moe
    computes its logits: before the shared experts); n_shared_experts 0 gives zero-width shared
    expert points ([0] per token, as HF's hooks record them)."""
    d = _ckpt(tmp_path, "deepseek_v2", **synth.DEEPSEEK_V2_VARIANTS[variant])
    c = reference.Config(reference.load_config(str(d)))
    assert list(reference.points(str(d)).items()) == _dsv3_points(c)


def test_deepseek_v2_config_defaults_and_refusals():
    """DeepseekV2Config's defaults and what transformers 5.12.1 cannot build or run (checked there:
    strict-validation errors for nulls in non-Optional fields, the shape errors of repeat_kv,
    topk_method values route_tokens_to_experts does not know, a null num_experts_per_tok / n_group)."""
    D0 = reference.DEEPSEEK_V2_DEFAULTS
    assert D0["num_experts_per_tok"] is None and D0["first_k_dense_replace"] == 0
    with pytest.raises(reference.ReferenceError):  # the defaults cannot route (k null, every layer sparse)
        reference.Config({"model_type": "deepseek_v2"})
    c = reference.Config({"model_type": "deepseek_v2", "num_experts_per_tok": 6})
    assert (c.vocab_size, c.hidden, c.inner, c.moe_inner, c.layers, c.heads, c.kv_heads) == (
        32000, 4096, 11008, 1407, 32, 32, 32)
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope, c.qk_rope, c.v_head_dim, c.qk_head_dim, c.head_dim) == (
        1536, 512, 128, 64, 128, 192, 64)
    assert (c.experts, c.top_k, c.shared_inner, c.routed_scale, c.norm_topk, c.topk_method, c.n_group) == (
        64, 6, 2814, 1.0, False, "greedy", None)
    assert (c.act, c.eps, c.tie, c.attention_bias, c.mlp_bias, c.rope_style) == (
        "silu", 1e-6, False, False, False, "complex")
    assert c.sparse == [True] * 32 and c.attn_scale == 192 ** -0.5
    assert c.rope == {"rope_type": "default", "rope_theta": 10000.0, "max_position_embeddings": 2048,
                      "partial_rotary_factor": 1.0}
    assert reference.Config({"model_type": "deepseek_v2", "first_k_dense_replace": 32}).top_k is None
    base = synth.tiny_config("deepseek_v2")
    D = lambda **kw: reference.Config(dict(base, **kw))  # noqa: E731
    absent = dict(base)
    del absent["num_key_value_heads"]
    assert reference.Config(absent).kv_heads == 4 and D(num_key_value_heads=None).kv_heads == 4
    # keys transformers ignores
    assert D(head_dim=99, qk_head_dim=99).head_dim == 4 and D(qk_head_dim=99).qk_head_dim == 12
    assert D(num_local_experts=16).experts == 8 and not D(norm_topk_prob=True).norm_topk
    assert D(moe_layer_freq=2, scoring_func="sigmoid").sparse == [False, True, True]
    assert D(topk_method="noaux_tc", first_k_dense_replace=3).sparse == [False] * 3  # no sparse layer: unread
    assert D(n_group=None, topk_group=None).top_k == 3  # greedy never reads them
    assert D(first_k_dense_replace=-1).sparse == [True] * 3
    assert D(n_shared_experts=0).shared_inner == 0
    assert D(routed_scaling_factor=16).routed_scale == 16.0  # an integer read as its float (as 4.x)
    assert D(partial_rotary_factor=0.5).rope["partial_rotary_factor"] == 1.0  # unread by the default table
    # YaRN: mscale(factor, mscale_all_dim) ** 2 on the softmax scale (PR 47435; not in transformers
    # 5.12.1), mscale / mscale_all_dim on cos / sin
    for rs in (synth.DEEPSEEK_V2_YARN, synth.DEEPSEEK_V2_VARIANTS["yarn_mscale"]["rope_scaling"]):
        y = D(rope_scaling=rs)
        m = 0.1 * rs["mscale_all_dim"] * math.log(4) + 1
        assert y.attn_scale == 12 ** -0.5 * m * m
        assert D(rope_scaling=dict(rs, mscale_all_dim=0)).attn_scale == 12 ** -0.5
        want = (0.1 * 0.707 * math.log(4) + 1) / (0.1 * rs["mscale_all_dim"] * math.log(4) + 1)
        assert abs(reference.rope_parameters(y.rope, y.qk_rope)[1] - want) < 1e-15
    g = D(**synth.DEEPSEEK_V2_VARIANTS["group_limited"])
    assert (g.topk_method, g.n_group, g.topk_group, g.top_k) == ("group_limited_greedy", 4, 2, 3)
    assert D(topk_method="group_limited_greedy", n_group=8, topk_group=1, num_experts_per_tok=8).top_k == 8
    # shapes: a dense and a sparse layer, no correction bias, mlp_bias / attention_bias biases
    s = reference.expected_shapes(reference.Config(base))
    assert {k: v for k, v in s.items() if k.startswith("model.layers.0.")} == {
        "model.layers.0.input_layernorm.weight": [32], "model.layers.0.self_attn.q_proj.weight": [48, 32],
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": [20, 32],
        "model.layers.0.self_attn.kv_a_layernorm.weight": [16], "model.layers.0.self_attn.kv_b_proj.weight": [56, 16],
        "model.layers.0.self_attn.o_proj.weight": [32, 24], "model.layers.0.post_attention_layernorm.weight": [32],
        "model.layers.0.mlp.gate_proj.weight": [48, 32], "model.layers.0.mlp.up_proj.weight": [48, 32],
        "model.layers.0.mlp.down_proj.weight": [32, 48]}
    m = "model.layers.1.mlp."
    assert {k[len(m):]: v for k, v in s.items() if k.startswith(m)} == {
        "gate.weight": [8, 32],
        **{f"experts.{e}.{n}.weight": ([32, 12] if n == "down_proj" else [12, 32])
           for e in range(8) for n in ("gate_proj", "up_proj", "down_proj")},
        "shared_experts.gate_proj.weight": [24, 32], "shared_experts.up_proj.weight": [24, 32],
        "shared_experts.down_proj.weight": [32, 24]}
    sb = reference.expected_shapes(D(attention_bias=True, mlp_bias=True, q_lora_rank=16))
    assert [k for k in sb if k.endswith(".bias") and ".layers.0." in k] == [
        f"model.layers.0.self_attn.{n}.bias" for n in ("q_a_proj", "kv_a_proj_with_mqa", "o_proj")] + [
        f"model.layers.0.mlp.{n}.bias" for n in ("gate_proj", "up_proj", "down_proj")]
    assert [k for k in sb if k.endswith(".bias") and ".layers.1.mlp" in k] == [
        f"model.layers.1.mlp.shared_experts.{n}.bias" for n in ("gate_proj", "up_proj", "down_proj")]
    s0 = reference.expected_shapes(D(n_shared_experts=0))
    assert s0["model.layers.1.mlp.shared_experts.gate_proj.weight"] == [0, 32]
    assert s0["model.layers.1.mlp.shared_experts.down_proj.weight"] == [32, 0]
    bad = [dict(num_key_value_heads=2), dict(num_key_value_heads=8), dict(hidden_size=30),
           dict(n_shared_experts=None), dict(n_shared_experts=-1), dict(first_k_dense_replace=None),
           dict(v_head_dim=None), dict(kv_lora_rank=None), dict(qk_rope_head_dim=None), dict(qk_rope_head_dim=3),
           dict(qk_rope_head_dim=0), dict(qk_nope_head_dim=None), dict(q_lora_rank=0),
           dict(topk_method=None), dict(topk_method="noaux_tc"), dict(num_experts_per_tok=None),
           dict(num_experts_per_tok=0), dict(num_experts_per_tok=9), dict(n_routed_experts=None),
           dict(topk_method="group_limited_greedy", n_group=None, topk_group=2),
           dict(topk_method="group_limited_greedy", n_group=4, topk_group=None),
           dict(topk_method="group_limited_greedy", n_group=3, topk_group=1),
           dict(topk_method="group_limited_greedy", n_group=4, topk_group=0),
           dict(topk_method="group_limited_greedy", n_group=4, topk_group=5),
           dict(routed_scaling_factor=None), dict(rms_norm_eps=None), dict(attention_bias=None), dict(mlp_bias=None),
           dict(tie_word_embeddings=None), dict(moe_intermediate_size=None), dict(intermediate_size=None),
           dict(max_position_embeddings=None), dict(hidden_act="gelu_foo"), dict(rope_theta=None),
           dict(rope_scaling={"type": "yarn", "original_max_position_embeddings": 32}),
           dict(rope_scaling={"type": "linear"}),
           dict(rope_scaling=dict(synth.DEEPSEEK_V2_YARN, partial_rotary_factor=0.5)),
           dict(quantization_config={"quant_method": "fp8"})]
    for kw in bad:
        with pytest.raises(reference.ReferenceError):
            D(**kw)


def test_deepseek_v2_parameter_counts():
    """DeepSeek-V2-Lite's (= DeepSeek-Coder-V2-Lite's) and DeepSeek-V2's (= Coder-V2's) sizes (their
    config.json values): the tensors expected_shapes lists add up to the state_dict sizes
    transformers 5.12.1's DeepseekV2ForCausalLM has for them on the meta device: 15.7B and 236B;
    without the unchosen routed experts, 2.66B and 21.4B active (the model cards' "2.4B" and "21B"
    leave out the embeddings)."""
    yarn = dict(beta_fast=32, beta_slow=1, factor=40, mscale=0.707, mscale_all_dim=0.707,
                original_max_position_embeddings=4096, type="yarn")
    common = dict(model_type="deepseek_v2", kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128,
                  qk_nope_head_dim=128, tie_word_embeddings=False, max_position_embeddings=163840, rms_norm_eps=1e-6,
                  rope_theta=10000, rope_scaling=yarn, n_shared_experts=2, vocab_size=102400, first_k_dense_replace=1,
                  norm_topk_prob=False, scoring_func="softmax", moe_layer_freq=1)
    cfgs = {"DeepSeek-V2-Lite": dict(common, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                                     num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
                                     q_lora_rank=None, n_routed_experts=64, num_experts_per_tok=6, n_group=1,
                                     topk_group=1, topk_method="greedy", routed_scaling_factor=1.0),
            "DeepSeek-V2": dict(common, hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536,
                                num_hidden_layers=60, num_attention_heads=128, num_key_value_heads=128,
                                q_lora_rank=1536, n_routed_experts=160, num_experts_per_tok=6, n_group=8,
                                topk_group=3, topk_method="group_limited_greedy", routed_scaling_factor=16.0)}
    counts, active = {}, {}
    for name, cfg in cfgs.items():
        c = reference.Config(cfg)
        shapes = reference.expected_shapes(c)
        counts[name] = sum(int(np.prod(s)) for s in shapes.values())
        active[name] = counts[name] - sum(c.sparse) * (c.experts - c.top_k) * 3 * c.moe_inner * c.hidden
    assert counts == {"DeepSeek-V2-Lite": 15_706_484_224, "DeepSeek-V2": 235_741_434_880}
    assert active == {"DeepSeek-V2-Lite": 2_661_150_208, "DeepSeek-V2": 21_375_800_320}


def test_deepseek_v2_checkpoint_layouts(tmp_path):
    """Equivalent checkpoints run the same: transformers 5's stacked experts; tensors transformers
    5.12.1 drops as unexpected keys (a layer num_hidden_layers, biases of projections that have none,
    a DeepSeek-V3-style e_score_correction_bias, MLP biases without mlp_bias: checked there, logits
    unchanged); a v5 config.json (rope_parameters); n_shared_experts 0 with its empty tensors left
    out. Refused: both expert layouts in one layer, a stacked tensor of the wrong shape, a missing
    non-empty tensor."""
    cfg = synth.tiny_config("deepseek_v2", rope_scaling=synth.DEEPSEEK_V2_YARN, q_lora_rank=16)
    d = tmp_path / "hub"
    w = synth.write_checkpoint(str(d), cfg, seed=2)
    ds = tmp_path / "stacked"
    ws = synth.write_checkpoint(str(ds), cfg, seed=2, stacked_experts=True)
    assert list(ws["model.layers.1.mlp.experts.gate_up_proj"].shape) == [8, 24, 32]
    _same_run(d, ds)
    dm = tmp_path / "stray"
    os.makedirs(dm)
    (dm / "config.json").write_bytes((d / "config.json").read_bytes())
    wm = dict(w)
    for k, v in w.items():
        if k.startswith("model.layers.2."):
            wm[k.replace("model.layers.2.", "model.layers.3.")] = v * 3.0
    for nm, n in (("q_b_proj", 48), ("kv_b_proj", 56), ("o_proj", 32), ("q_a_proj", 16)):
        wm[f"model.layers.0.self_attn.{nm}.bias"] = np.full(n, 0.5, np.float32)
    wm["model.layers.1.mlp.gate.e_score_correction_bias"] = np.full(8, 0.5, np.float32)
    wm["model.layers.0.mlp.down_proj.bias"] = np.full(32, 0.5, np.float32)
    wm["model.layers.1.mlp.shared_experts.up_proj.bias"] = np.full(24, 0.5, np.float32)
    st.save(str(dm / "model.safetensors"), wm)
    _same_run(d, dm)
    dv = tmp_path / "v5"
    os.makedirs(dv)
    (dv / "config.json").write_text(json.dumps(synth.to_v5(cfg)))
    os.symlink(d / "model.safetensors", dv / "model.safetensors")
    rope = lambda c: {k: v for k, v in c.rope.items() if k != "type"}  # noqa: E731 (4.x's key, kept)
    assert rope(reference.Config(reference.load_config(str(dv)))) == rope(reference.Config(cfg))
    _same_run(d, dv)
    cfg0 = synth.tiny_config("deepseek_v2", n_shared_experts=0, mlp_bias=True)
    d0 = tmp_path / "zero"
    w0 = synth.write_checkpoint(str(d0), cfg0, seed=2)
    assert w0["model.layers.1.mlp.shared_experts.gate_proj.weight"].shape == (0, 32)
    de = tmp_path / "zero_absent"
    os.makedirs(de)
    (de / "config.json").write_bytes((d0 / "config.json").read_bytes())
    st.save(str(de / "model.safetensors"), {k: v for k, v in w0.items() if v.size})
    _same_run(d0, de)
    r = reference.run(str(de), [[3, 1, 4]])[0]
    assert r["model.layers.1.mlp.shared_experts"].shape == (3, 32)
    assert np.array_equal(r["model.layers.1.mlp.shared_experts"],
                          np.broadcast_to(w0["model.layers.1.mlp.shared_experts.down_proj.bias"], (3, 32)))
    for name, tensors in (
            ("both", dict(ws, **{"model.layers.1.mlp.experts.0.gate_proj.weight":
                                 w["model.layers.1.mlp.experts.0.gate_proj.weight"]})),
            ("shape", dict(ws, **{"model.layers.2.mlp.experts.down_proj": np.zeros((8, 12, 32), np.float32)})),
            ("lacks", {k: v for k, v in w0.items() if k != "model.layers.1.mlp.shared_experts.down_proj.bias"})):
        db = tmp_path / name
        os.makedirs(db)
        (db / "config.json").write_bytes(((d0 if name == "lacks" else d) / "config.json").read_bytes())
        st.save(str(db / "model.safetensors"), tensors)
        with pytest.raises(reference.ReferenceError):
            reference.Model(str(db))


def _fma32_exact(a, b, c):
    """float32 a * b + c rounded once, from exact rational arithmetic (ties to even)."""
    from fractions import Fraction
    v = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    f = np.float32(float(v))
    cands = (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf)))
    return min(cands, key=lambda z: (abs(Fraction(float(z)) - v), int(np.float32(z).view(np.uint32)) & 1))


def test_deepseek_v2_rope_is_complex_interleaved():
    """apply_rope_complex: the pairs (2i, 2i + 1) turned as complex numbers by rope_polar's angles
    (position * inv_freq) and written back interleaved, equal to the float64 complex product within
    float32 rounding; the same values as DeepSeek-V3's interleaved RoPE up to the column order (V3
    writes [evens | odds]); the fused rounding (HF's on x86-64 CPU) and the unfused one differ by a
    couple of float32 ulps of the inputs at most, and do differ. fma32 is the once-rounded a * b + c (against exact
    rationals, halfway cases included)."""
    rng = np.random.default_rng(0)
    T, d = 40, 8
    rope = {"rope_type": "default", "rope_theta": 10000.0, "max_position_embeddings": 128,
            "partial_rotary_factor": 1.0}
    cos, sin = reference.rope_polar(rope, d, T)
    inv = 10000.0 ** -(np.arange(0, d, 2) / d)
    ang = np.arange(T)[:, None] * inv[None, :]
    assert np.abs(cos.double().numpy() - np.cos(ang)).max() < 1e-5
    assert np.abs(sin.double().numpy() - np.sin(ang)).max() < 1e-5
    x = torch.from_numpy(rng.standard_normal((3, T, d)).astype(np.float32))
    out = reference.apply_rope_complex(x, cos, sin)
    z = (x[..., 0::2].double() + 1j * x[..., 1::2].double()).numpy() * (cos.double() + 1j * sin.double()).numpy()
    want = np.stack([z.real, z.imag], -1).reshape(3, T, d)
    assert np.abs(out.double().numpy() - want).max() < 1e-6
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    v3 = reference.apply_rope_interleaved(x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    assert np.abs(out.numpy()[..., perm] - v3.numpy()).max() < 1e-6
    plain = reference.apply_rope_complex(x, cos, sin, fused=False)
    diff = out.numpy() != plain.numpy()
    assert diff.any()
    # both round the products a c, b s (|.| <= max(|a|, |b|)) at most once more than the sum: within
    # two ulps of the pair's larger component
    big = np.repeat(np.maximum(np.abs(x.numpy()[..., 0::2]), np.abs(x.numpy()[..., 1::2])), 2, axis=-1)
    assert np.all(np.abs(out.numpy() - plain.numpy()) <= 2 * np.spacing(big))
    # fma32 against exact arithmetic
    a = rng.standard_normal(300).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    c = np.concatenate([rng.standard_normal(100), -(a[100:200].astype(np.float64) * b[100:200]) * (1 + 1e-7),
                        rng.standard_normal(100) * 2.0 ** -40]).astype(np.float32)
    h = np.float32(1 + 2 ** -12)  # h * h = 1 + 2^-11 + 2^-24: halfway between two float32
    a, b = np.append(a, [h, h, h]), np.append(b, [h, h, h])
    c = np.append(c, np.float32([2.0 ** -60, -(2.0 ** -60), 0.0]))
    got = reference.fma32(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)).numpy()
    assert [float(g) for g in got] == [float(_fma32_exact(*t)) for t in zip(a, b, c)]
    assert got[-3] == np.float32(1 + 2 ** -11 + 2 ** -23) and got[-2] == got[-1] == np.float32(1 + 2 ** -11)


def test_gptj_scores_are_complex_rope_on_interleaved_pairs(tmp_path):
    """GPT-J's reference against an independent formulation: each head's first rotary_dim features
    of q_proj / k_proj read as complex numbers x[2i] + i x[2i+1], times exp(i * position * 10000^(-2i /
    rotary_dim)) in float64, the rest unrotated; q k^T / sqrt(head_dim) equals the recorded scores.
    And the block's wiring: attn and mlp both read ln_1's output; the block adds both to its input."""
    d = _ckpt(tmp_path, "gptj")
    c = reference.Config(synth.tiny_config("gptj"))
    T, nh, hd, rd = 9, c.heads, c.head_dim, c.rotary_dim
    pts = reference.Model(str(d)).forward(list(range(3, 3 + T)), patterns=True)
    pos = np.arange(T, dtype=np.float64)[:, None, None]
    inv = 10000.0 ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)

    def rotated(x):
        x = x.astype(np.float64).reshape(T, nh, hd)
        z = (x[..., :rd:2] + 1j * x[..., 1:rd:2]) * np.exp(1j * pos * inv)
        out = x.copy()
        out[..., :rd:2], out[..., 1:rd:2] = z.real, z.imag
        return out

    for i in range(c.layers):
        p = f"transformer.h.{i}"
        q, k = rotated(pts[p + ".attn.q_proj"]), rotated(pts[p + ".attn.k_proj"])
        want = np.einsum("thd,shd->ths", q, k) / math.sqrt(hd)
        got = pts[p + ".attn:scores"]
        causal = np.tril(np.ones((T, T), bool))[:, None, :].repeat(nh, 1)
        assert np.all(np.isneginf(got[~causal]))
        assert np.allclose(got[causal], want[causal], rtol=0, atol=2e-5), i
        assert np.array_equal(pts[p + ".attn:input"], pts[p + ".ln_1"])
        assert np.array_equal(pts[p + ".mlp:input"], pts[p + ".ln_1"])
        assert np.allclose(pts[p], pts[p + ".attn"] + pts[p + ".mlp"] + pts[p + ":input"], rtol=0, atol=1e-6)
    assert "lm_head" in pts and pts["lm_head"].shape == (T, c.vocab_size)


def test_phi_wiring_and_rotary_width(tmp_path):
    """Phi's reference: attn and mlp both read input_layernorm's output and the block adds both to
    its input; the scores equal q k^T / sqrt(head_dim) of the projections rotated by complex-number
    RoPE (halves paired: feature i with i + rotary_dim / 2) on the first rotary_dim features, in
    float64, keys of kv head j serving query heads j * groups ... (j + 1) * groups - 1."""
    d = _ckpt(tmp_path, "phi")
    c = reference.Config(synth.tiny_config("phi"))
    T, nh, nkv, hd = 8, c.heads, c.kv_heads, c.head_dim
    rd = int(hd * 0.5)
    pts = reference.Model(str(d)).forward(list(range(40, 40 + T)), patterns=True)
    pos = np.arange(T, dtype=np.float64)[:, None, None]
    inv = 10000.0 ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)

    def rotated(x, heads):
        x = x.astype(np.float64).reshape(T, heads, hd)
        z = (x[..., :rd // 2] + 1j * x[..., rd // 2:rd]) * np.exp(1j * pos * inv)
        out = x.copy()
        out[..., :rd // 2], out[..., rd // 2:rd] = z.real, z.imag
        return out

    for i in range(c.layers):
        p = f"model.layers.{i}"
        q = rotated(pts[p + ".self_attn.q_proj"], nh)
        k = np.repeat(rotated(pts[p + ".self_attn.k_proj"], nkv), nh // nkv, axis=1)
        want = np.einsum("thd,shd->ths", q, k) / math.sqrt(hd)
        causal = np.tril(np.ones((T, T), bool))[:, None, :].repeat(nh, 1)
        assert np.allclose(pts[p + ".self_attn:scores"][causal], want[causal], rtol=0, atol=2e-5), i
        assert np.array_equal(pts[p + ".self_attn:input"], pts[p + ".input_layernorm"])
        assert np.array_equal(pts[p + ".mlp:input"], pts[p + ".input_layernorm"])
        assert np.allclose(pts[p], pts[p + ".self_attn"] + pts[p + ".mlp"] + pts[p + ":input"], rtol=0, atol=1e-6)


def test_gpt_neo_unscaled_scores_local_windows_and_wiring(tmp_path):
    """GPT-Neo's reference against an independent float64 formulation, layer by layer (global,
    local, local; window 4 < T = 9): the q / k / v projections are ln_1's output times the bias-free
    weights; the scores equal q_proj k_proj^T per head with NO scale at the allowed keys and are -inf
    exactly elsewhere (global: j <= i; local: 0 <= i - j < window_size); each probs row is the
    softmax over its allowed keys; the attention output is out_proj of the merged probs @ v. The
    wiring: .attn and .attn.attention both read ln_1's output and hold the same output; ln_2 reads
    the block input plus the attention output; the block output is that plus the MLP's; wpe's
    output is rows 0..T-1 of wpe.weight (input: the positions); lm_head uses the tied wte. A
    checkpoint with the mask buffers older transformers saved (attn.attention.bias / masked_bias)
    gives the same points; a sequence longer than max_position_embeddings is refused."""
    cfg = synth.tiny_config("gpt_neo")
    d = tmp_path / "m"
    w = {k: v.astype(np.float64) for k, v in synth.write_checkpoint(str(d), cfg).items()}
    c = reference.Config(cfg)
    assert c.windows == [None, 4, 4] and "lm_head.weight" not in w
    T, nh, hd, win = 9, c.heads, c.head_dim, 4
    ids = list(range(3, 3 + T))
    m = reference.Model(str(d))
    pts = m.forward(ids, patterns=True)
    qi, kj = np.arange(T)[:, None], np.arange(T)[None, :]
    assert np.array_equal(pts["transformer.wpe:input"], np.arange(T)) and pts["transformer.wpe:input"].dtype == np.int64
    assert np.array_equal(pts["transformer.wpe"], w["transformer.wpe.weight"][:T].astype(np.float32))
    assert np.array_equal(pts["transformer.wte"], w["transformer.wte.weight"][ids].astype(np.float32))
    assert np.allclose(pts["transformer.h.0:input"], pts["transformer.wte"] + pts["transformer.wpe"], rtol=0, atol=1e-6)
    for i, local in enumerate([False, True, True]):
        p = f"transformer.h.{i}"
        A = p + ".attn.attention"
        x = pts[p + ".ln_1"].astype(np.float64)
        for nm in ("q_proj", "k_proj", "v_proj"):
            assert np.allclose(pts[f"{A}.{nm}"], x @ w[f"{A}.{nm}.weight"].T, rtol=0, atol=2e-6), (i, nm)
        q, k, v = (pts[f"{A}.{nm}"].astype(np.float64).reshape(T, nh, hd) for nm in ("q_proj", "k_proj", "v_proj"))
        want = np.einsum("thd,shd->ths", q, k)
        allowed = (kj <= qi) & ((qi - kj < win) if local else True)
        assert local == bool(((kj <= qi) & ~allowed).any())  # the window bites on local layers only
        allowed3 = np.repeat(allowed[:, None, :], nh, axis=1)
        got = pts[A + ":scores"]
        assert np.all(np.isneginf(got[~allowed3])) and np.all(np.isfinite(got[allowed3])), i
        assert np.abs(want[allowed3]).max() > 0.5  # a stray 1 / sqrt(head_dim) would show
        assert np.allclose(got[allowed3], want[allowed3], rtol=0, atol=2e-5), i
        ex = np.where(allowed3, np.exp(want - np.where(allowed3, want, -np.inf).max(-1, keepdims=True)), 0.0)
        probs = ex / ex.sum(-1, keepdims=True)
        assert np.allclose(pts[A + ":probs"], probs, rtol=0, atol=1e-6), i
        o = np.einsum("ths,shd->thd", probs, v).reshape(T, nh * hd)
        a = o @ w[A + ".out_proj.weight"].T + w[A + ".out_proj.bias"]
        assert np.allclose(pts[A], a, rtol=0, atol=2e-5), i
        assert np.array_equal(pts[A + ":input"], pts[p + ".ln_1"])
        assert np.array_equal(pts[p + ".attn:input"], pts[p + ".ln_1"])
        assert np.array_equal(pts[p + ".attn"], pts[A])
        assert np.array_equal(pts[p + ".ln_1:input"], pts[p + ":input"])
        assert np.allclose(pts[p + ".ln_2:input"], pts[p + ":input"] + pts[p + ".attn"], rtol=0, atol=1e-6)
        assert np.array_equal(pts[p + ".mlp:input"], pts[p + ".ln_2"])
        assert np.allclose(pts[p], pts[p + ".ln_2:input"] + pts[p + ".mlp"], rtol=0, atol=1e-6)
        if i + 1 < c.layers:
            assert np.array_equal(pts[f"transformer.h.{i + 1}:input"], pts[p])
    assert np.allclose(pts["lm_head"], pts["transformer.ln_f"].astype(np.float64) @ w["transformer.wte.weight"].T,
                       rtol=0, atol=2e-5)
    # the buffers old checkpoints saved are ignored
    tensors = {k: v.astype(np.float32) for k, v in w.items()}
    P = c.n_positions
    full = np.tril(np.ones((P, P), bool))
    for i, window in enumerate(c.windows):
        mask = full ^ np.tril(full, -window) if window else full
        tensors[f"transformer.h.{i}.attn.attention.bias"] = mask[None, None]
        tensors[f"transformer.h.{i}.attn.attention.masked_bias"] = np.array(-1e9, np.float32)
    db = _with_tensors(tmp_path, d, "buffers", tensors)
    pb = reference.Model(str(db)).forward(ids, patterns=True)
    assert pb.keys() == pts.keys() and all(np.array_equal(pb[k], pts[k]) for k in pts)
    with pytest.raises(reference.ReferenceError):
        m.forward([1] * (P + 1))


def test_gpt_neo_attention_types_refused():
    """GPTNeoConfig's per-layer attention: attention_types' expansion must list num_layers layers
    (the default [[["global", "local"], 12]] gives 24), each "global" or "local"; a config.json
    attention_layers that disagrees with that expansion (or is null) is refused. num_hidden_layers /
    num_attention_heads are accepted for num_layers / num_heads, and attention_layers may be absent."""
    base = synth.tiny_config("gpt_neo")
    no_layers = {k: v for k, v in base.items() if k != "attention_layers"}
    ok = reference.Config(no_layers)
    assert ok.attention_layers == ["global", "local", "local"] and ok.windows == [None, 4, 4]
    alias = {k: v for k, v in no_layers.items() if k not in ("num_layers", "num_heads")}
    alias.update(num_hidden_layers=3, num_attention_heads=4)
    assert reference.Config(alias).windows == [None, 4, 4] and reference.Config(alias).heads == 4
    assert reference.Config(dict(no_layers, attention_types=[[["local"], 3]], window_size=2)).windows == [2, 2, 2]
    for bad, match in (
            (dict(no_layers, attention_types=[[["global", "local"], 2]]), "num_layers"),  # 4 layers for 3
            ({k: v for k, v in no_layers.items() if k != "attention_types"}, "num_layers"),  # the default: 24
            (dict(base, attention_types=[[["global", "sliding"], 1], [["local"], 1]],
                  attention_layers=["global", "sliding", "local"]), "sliding"),
            (dict(base, attention_layers=["global", "global", "local"]), "attention_layers"),
            (dict(base, attention_layers=["global", "local"]), "attention_layers"),
            (dict(base, attention_layers=None), "attention_layers"),
            (dict(base, window_size=0), "window_size")):
        with pytest.raises(reference.ReferenceError, match=match):
            reference.Config(bad)


def _ln64(x, w=None, b=None, eps=1e-5):
    x = np.asarray(x, np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y if w is None else y * w + b


def test_opt_scaled_scores_projections_and_pre_ln_wiring(tmp_path):
    """OPT's reference (synth.TINY["opt"]: pre-LN, word_embed_proj_dim 24 != hidden_size 32, biases,
    affine LayerNorms, tied) against an independent float64 formulation: embed_tokens' output is the
    table's rows (width 24); embed_positions' input is the attention mask (int64 ones) and its output
    rows 2..T+1 of its table (OPT's offset of 2); project_in maps the token embeddings (no bias) and
    the first layer reads project_in + positions. Per layer: self_attn_layer_norm reads the block
    input (LayerNorm, eps 1e-5, with weight and bias); q / k / v_proj are its output times the
    weights plus biases (q_proj's point unscaled); the scores equal (q_proj / sqrt(head_dim)) k_proj^T
    per head on causal keys and are -inf exactly elsewhere; each probs row is a float64 softmax; the
    output is out_proj of probs @ v; final_layer_norm reads the block input + attention output; fc1,
    relu, fc2; the block output is final_layer_norm's input + fc2's output. Then
    model.decoder.final_layer_norm, project_out (no bias) and lm_head = project_out's output times
    the embedding^T. A sequence longer than max_position_embeddings is refused."""
    cfg = synth.tiny_config("opt")
    d = tmp_path / "m"
    w = {k: v.astype(np.float64) for k, v in synth.write_checkpoint(str(d), cfg).items()}
    c = reference.Config(cfg)
    assert (c.proj_dim, c.hidden, c.pre_norm, c.final_norm, c.bias, c.affine, c.tie) == (24, 32, True, True, True,
                                                                                       True, True)
    assert "lm_head.weight" not in w and w["model.decoder.embed_positions.weight"].shape == (130, 32)
    T, nh, hd = 11, c.heads, c.head_dim
    ids = [2] + list(range(40, 40 + T - 1))
    m = reference.Model(str(d))
    pts = m.forward(ids, patterns=True)
    D = "model.decoder"
    assert pts[D + ".embed_tokens:input"].dtype == np.int64 and np.array_equal(pts[D + ".embed_tokens:input"], ids)
    assert np.array_equal(pts[D + ".embed_tokens"], w[D + ".embed_tokens.weight"][ids].astype(np.float32))
    assert pts[D + ".embed_tokens"].shape == (T, 24)
    assert pts[D + ".embed_positions:input"].dtype == np.int64
    assert np.array_equal(pts[D + ".embed_positions:input"], np.ones(T))
    assert np.array_equal(pts[D + ".embed_positions"], w[D + ".embed_positions.weight"][2:T + 2].astype(np.float32))
    assert np.array_equal(pts[D + ".project_in:input"], pts[D + ".embed_tokens"])
    assert np.allclose(pts[D + ".project_in"], pts[D + ".embed_tokens"] @ w[D + ".project_in.weight"].T, rtol=0, atol=2e-6)
    assert np.allclose(pts[D + ".layers.0:input"], pts[D + ".project_in"] + pts[D + ".embed_positions"], rtol=0, atol=1e-6)
    causal = np.repeat(np.tril(np.ones((T, T), bool))[:, None, :], nh, axis=1)
    for i in range(c.layers):
        p = f"{D}.layers.{i}"
        A = p + ".self_attn"
        assert np.array_equal(pts[p + ".self_attn_layer_norm:input"], pts[p + ":input"])
        ln = _ln64(pts[p + ":input"], w[p + ".self_attn_layer_norm.weight"], w[p + ".self_attn_layer_norm.bias"])
        assert np.allclose(pts[p + ".self_attn_layer_norm"], ln, rtol=0, atol=2e-5), i
        x = pts[p + ".self_attn_layer_norm"].astype(np.float64)
        assert np.array_equal(pts[A + ":input"], pts[p + ".self_attn_layer_norm"])
        for nm in ("q_proj", "k_proj", "v_proj"):
            assert np.array_equal(pts[f"{A}.{nm}:input"], pts[p + ".self_attn_layer_norm"])
            want = x @ w[f"{A}.{nm}.weight"].T + w[f"{A}.{nm}.bias"]
            assert np.allclose(pts[f"{A}.{nm}"], want, rtol=0, atol=2e-6), (i, nm)  # q_proj unscaled
        q, k, v = (pts[f"{A}.{nm}"].astype(np.float64).reshape(T, nh, hd) for nm in ("q_proj", "k_proj", "v_proj"))
        want = np.einsum("thd,shd->ths", q / math.sqrt(hd), k)
        got = pts[A + ":scores"]
        assert np.all(np.isneginf(got[~causal])) and np.all(np.isfinite(got[causal])), i
        assert np.allclose(got[causal], want[causal], rtol=0, atol=2e-6), i
        # an unscaled product (or one scaled twice) would be far off
        assert np.abs(want[causal] * (math.sqrt(hd) - 1)).max() > 0.1
        ex = np.where(causal, np.exp(want - np.where(causal, want, -np.inf).max(-1, keepdims=True)), 0.0)
        probs = ex / ex.sum(-1, keepdims=True)
        assert np.allclose(pts[A + ":probs"], probs, rtol=0, atol=1e-6), i
        o = np.einsum("ths,shd->thd", probs, v).reshape(T, nh * hd)
        assert np.allclose(pts[A + ".out_proj:input"], o, rtol=0, atol=1e-6), i
        a = o @ w[A + ".out_proj.weight"].T + w[A + ".out_proj.bias"]
        assert np.allclose(pts[A + ".out_proj"], a, rtol=0, atol=2e-6), i
        assert np.array_equal(pts[A], pts[A + ".out_proj"])
        h = pts[p + ":input"].astype(np.float64) + pts[A]
        assert np.allclose(pts[p + ".final_layer_norm:input"], h, rtol=0, atol=1e-6), i
        ln2 = _ln64(pts[p + ".final_layer_norm:input"], w[p + ".final_layer_norm.weight"], w[p + ".final_layer_norm.bias"])
        assert np.allclose(pts[p + ".final_layer_norm"], ln2, rtol=0, atol=2e-5), i
        assert np.array_equal(pts[p + ".fc1:input"], pts[p + ".final_layer_norm"])
        f = pts[p + ".final_layer_norm"].astype(np.float64) @ w[p + ".fc1.weight"].T + w[p + ".fc1.bias"]
        assert np.allclose(pts[p + ".fc1"], f, rtol=0, atol=2e-6), i
        assert np.array_equal(pts[p + ".activation_fn:input"], pts[p + ".fc1"])
        assert np.array_equal(pts[p + ".activation_fn"], np.maximum(pts[p + ".fc1"], 0))
        assert (pts[p + ".fc1"] < 0).any() and (pts[p + ".fc1"] > 0).any()
        assert np.array_equal(pts[p + ".fc2:input"], pts[p + ".activation_fn"])
        m2 = pts[p + ".activation_fn"].astype(np.float64) @ w[p + ".fc2.weight"].T + w[p + ".fc2.bias"]
        assert np.allclose(pts[p + ".fc2"], m2, rtol=0, atol=2e-6), i
        assert np.allclose(pts[p], pts[p + ".final_layer_norm:input"] + pts[p + ".fc2"], rtol=0, atol=1e-6), i
        if i + 1 < c.layers:
            assert np.array_equal(pts[f"{D}.layers.{i + 1}:input"], pts[p])
    last = f"{D}.layers.{c.layers - 1}"
    assert np.array_equal(pts[D + ".final_layer_norm:input"], pts[last])
    lnf = _ln64(pts[last], w[D + ".final_layer_norm.weight"], w[D + ".final_layer_norm.bias"])
    assert np.allclose(pts[D + ".final_layer_norm"], lnf, rtol=0, atol=2e-5)
    assert np.array_equal(pts[D + ".project_out:input"], pts[D + ".final_layer_norm"])
    po = pts[D + ".final_layer_norm"].astype(np.float64) @ w[D + ".project_out.weight"].T
    assert np.allclose(pts[D + ".project_out"], po, rtol=0, atol=2e-6) and po.shape == (T, 24)
    assert np.array_equal(pts["lm_head:input"], pts[D + ".project_out"])
    logits = pts[D + ".project_out"].astype(np.float64) @ w[D + ".embed_tokens.weight"].T
    assert np.allclose(pts["lm_head"], logits, rtol=0, atol=2e-5) and logits.shape == (T, c.vocab_size)
    # HF's call order, per layer and around it
    names = [k for k in pts if ":" not in k]
    layer0 = [n[len(D + ".layers.0"):] for n in names if n.startswith(D + ".layers.0")]
    assert layer0 == [".self_attn_layer_norm", ".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj",
                      ".self_attn.out_proj", ".self_attn", ".final_layer_norm", ".fc1", ".activation_fn", ".fc2", ""]
    assert names[:3] == [D + ".embed_tokens", D + ".embed_positions", D + ".project_in"]
    assert names[-3:] == [D + ".final_layer_norm", D + ".project_out", "lm_head"]
    assert _maxdiff(m.forward(ids[:5])["lm_head"], pts["lm_head"][:5]) < 1e-4  # causal
    m.forward([3] * c.n_positions)
    with pytest.raises(reference.ReferenceError, match="max_position_embeddings"):
        m.forward([3] * (c.n_positions + 1))


def test_opt_post_ln_without_affine_or_bias(tmp_path):
    """OPT with do_layer_norm_before false (opt-350m's post-LN layer), word_embed_proj_dim ==
    hidden_size (no project_in / project_out), enable_bias false and layer_norm_elementwise_affine
    false (no LayerNorm parameters): the attention reads the block input; self_attn_layer_norm reads
    block input + attention output and is a parameter-free float64 LayerNorm (eps 1e-5); fc1 reads its
    output; final_layer_norm reads that + fc2's output and gives the block's output; no
    model.decoder.final_layer_norm (post-LN never has one), the head reads the last block's output.
    Stray biases / LayerNorm weights in the checkpoint are ignored, as transformers drops them."""
    cfg = synth.tiny_config("opt", do_layer_norm_before=False, word_embed_proj_dim=32, enable_bias=False,
                            layer_norm_elementwise_affine=False)
    d = tmp_path / "m"
    w = {k: v.astype(np.float64) for k, v in synth.write_checkpoint(str(d), cfg).items()}
    c = reference.Config(cfg)
    assert (c.pre_norm, c.final_norm, c.proj_dim) == (False, False, 32)
    assert not any(k.endswith(".bias") or "norm" in k or "project" in k for k in w)
    T, nh, hd = 9, c.heads, c.head_dim
    ids = list(range(100, 100 + T))
    pts = reference.Model(str(d)).forward(ids, patterns=True)
    D = "model.decoder"
    assert not any(k.startswith((D + ".final_layer_norm", D + ".project_")) for k in pts)
    assert np.allclose(pts[D + ".layers.0:input"], pts[D + ".embed_tokens"] + pts[D + ".embed_positions"], rtol=0, atol=1e-6)
    causal = np.repeat(np.tril(np.ones((T, T), bool))[:, None, :], nh, axis=1)
    names = [k for k in pts if ":" not in k]
    layer0 = [n[len(D + ".layers.0"):] for n in names if n.startswith(D + ".layers.0")]
    assert layer0 == [".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.out_proj",
                      ".self_attn", ".self_attn_layer_norm", ".fc1", ".activation_fn", ".fc2", ".final_layer_norm", ""]
    for i in range(c.layers):
        p = f"{D}.layers.{i}"
        A = p + ".self_attn"
        x = pts[p + ":input"].astype(np.float64)
        assert np.array_equal(pts[A + ":input"], pts[p + ":input"])
        for nm in ("q_proj", "k_proj", "v_proj"):
            assert np.allclose(pts[f"{A}.{nm}"], x @ w[f"{A}.{nm}.weight"].T, rtol=0, atol=2e-6), (i, nm)
        q, k = (pts[f"{A}.{nm}"].astype(np.float64).reshape(T, nh, hd) for nm in ("q_proj", "k_proj"))
        want = np.einsum("thd,shd->ths", q, k) / math.sqrt(hd)
        assert np.allclose(pts[A + ":scores"][causal], want[causal], rtol=0, atol=2e-6), i
        assert np.allclose(pts[A + ".out_proj"], pts[A + ".out_proj:input"].astype(np.float64) @ w[A + ".out_proj.weight"].T,
                           rtol=0, atol=2e-6), i
        assert np.allclose(pts[p + ".self_attn_layer_norm:input"], x + pts[A], rtol=0, atol=1e-6), i
        assert np.allclose(pts[p + ".self_attn_layer_norm"], _ln64(pts[p + ".self_attn_layer_norm:input"]), rtol=0, atol=2e-5)
        assert np.array_equal(pts[p + ".fc1:input"], pts[p + ".self_attn_layer_norm"])
        f = pts[p + ".self_attn_layer_norm"].astype(np.float64) @ w[p + ".fc1.weight"].T
        assert np.allclose(pts[p + ".fc1"], f, rtol=0, atol=2e-6), i
        assert np.allclose(pts[p + ".fc2"], pts[p + ".fc2:input"].astype(np.float64) @ w[p + ".fc2.weight"].T, rtol=0, atol=2e-6)
        assert np.allclose(pts[p + ".final_layer_norm:input"], pts[p + ".self_attn_layer_norm"] + pts[p + ".fc2"],
                           rtol=0, atol=1e-6), i
        assert np.allclose(pts[p + ".final_layer_norm"], _ln64(pts[p + ".final_layer_norm:input"]), rtol=0, atol=2e-5)
        assert np.array_equal(pts[p], pts[p + ".final_layer_norm"])
    last = f"{D}.layers.{c.layers - 1}"
    assert np.array_equal(pts["lm_head:input"], pts[last])
    logits = pts[last].astype(np.float64) @ w[D + ".embed_tokens.weight"].T
    assert np.allclose(pts["lm_head"], logits, rtol=0, atol=2e-5)
    # stray tensors transformers has no parameter for (nn.Linear(bias=False), elementwise_affine=False,
    # project_in / out when the widths agree, a final LayerNorm) are ignored
    tensors = {k: v.astype(np.float32) for k, v in w.items()}
    rng = np.random.default_rng(5)
    for i in range(c.layers):
        p = f"{D}.layers.{i}."
        for nm in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc2",
                   "self_attn_layer_norm", "final_layer_norm"):
            tensors[p + nm + ".bias"] = rng.standard_normal(32).astype(np.float32)
        tensors[p + "fc1.bias"] = rng.standard_normal(c.inner).astype(np.float32)
        tensors[p + "self_attn_layer_norm.weight"] = rng.standard_normal(32).astype(np.float32)
    tensors[D + ".final_layer_norm.weight"] = rng.standard_normal(32).astype(np.float32)
    tensors[D + ".project_in.weight"] = rng.standard_normal((32, 32)).astype(np.float32)
    ds = _with_tensors(tmp_path, d, "stray", tensors)
    ps = reference.Model(str(ds)).forward(ids, patterns=True)
    assert ps.keys() == pts.keys() and all(np.array_equal(ps[k], pts[k]) for k in pts)


def test_opt_hub_names_tying_and_untied_head(tmp_path):
    """The Hub's OPT checkpoints (saved from OPTModel) hold bare decoder.* names: they load as
    model.decoder.*, giving the same points; a tied model's single copy may also be stored as
    lm_head.weight; untied (with _remove_final_layer_norm: no model.decoder.final_layer_norm, the
    last block feeding project_out) the head is lm_head.weight, not the embedding."""
    cfg = synth.tiny_config("opt")
    d = _ckpt(tmp_path, "opt")
    ids = [2, 50, 51, 383, 0, 1, 7]
    want = reference.Model(str(d)).forward(ids, patterns=True)
    w = st.load_checkpoint(str(d))
    hub = {k[len("model."):]: v for k, v in w.items()}
    assert all(k.startswith("decoder.") for k in hub) and "decoder.embed_tokens.weight" in hub
    for name, tensors in (("hub", hub),
                          ("lm_head", {("lm_head.weight" if k == "model.decoder.embed_tokens.weight" else k): v
                                       for k, v in w.items()})):
        got = reference.Model(str(_with_tensors(tmp_path, d, name, tensors))).forward(ids, patterns=True)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want), name
    du = _ckpt(tmp_path, "opt", name="untied", tie_word_embeddings=False, _remove_final_layer_norm=True)
    wu = st.load_checkpoint(str(du))
    assert "lm_head.weight" in wu and not any(k.startswith("model.decoder.final_layer_norm") for k in wu)
    r = reference.Model(str(du)).forward(ids)
    assert "model.decoder.final_layer_norm" not in r
    assert np.array_equal(r["model.decoder.project_out:input"], r["model.decoder.layers.1"])
    assert _maxdiff(r["lm_head"], r["model.decoder.project_out"] @ wu["lm_head.weight"].T) < 1e-5
    assert _maxdiff(r["lm_head"], r["model.decoder.project_out"] @ wu["model.decoder.embed_tokens.weight"].T) > 1e-3
    assert reference.Config(cfg).final_norm and not reference.Config(dict(cfg, _remove_final_layer_norm=True)).final_norm


def test_opt_config_defaults_refusals_and_parameter_counts():
    """OPTConfig's defaults (opt-125m's sizes), word_embed_proj_dim null -> hidden_size, nulls in the
    other fields refused (transformers' strict config), hidden_size not a multiple of
    num_attention_heads refused; expected_shapes of opt-125m and opt-350m (post-LN, word_embed_proj_dim
    512) add up to the parameter counts transformers 5.12.1's OPTForCausalLM reports (built on the
    meta device, the tied head counted once): 125,239,296 and 331,196,416."""
    c = reference.Config({"model_type": "opt"})
    assert (c.vocab_size, c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.inner, c.n_positions) == (
        50272, 768, 12, 12, 12, 64, 3072, 2048)
    assert (c.act, c.eps, c.tie, c.proj_dim, c.pre_norm, c.final_norm, c.bias, c.affine) == (
        "relu", 1e-5, True, 768, True, True, True, True)
    assert c.windows == [None] * 12
    assert reference.Config({"model_type": "opt", "word_embed_proj_dim": None, "hidden_size": 64,
                             "num_attention_heads": 4}).proj_dim == 64
    assert not reference.Config({"model_type": "opt", "do_layer_norm_before": False}).final_norm
    for bad, match in (({"hidden_size": None}, "null"), ({"enable_bias": None}, "null"),
                       ({"do_layer_norm_before": None}, "null"), ({"hidden_size": 30}, "divisible"),
                       ({"activation_function": "gelu_weird"}, "activation")):
        with pytest.raises(reference.ReferenceError, match=match):
            reference.Config(dict({"model_type": "opt"}, **bad))
    counts = {}
    for name, cfg in (("125m", dict(hidden_size=768, ffn_dim=3072, num_hidden_layers=12, num_attention_heads=12,
                                    word_embed_proj_dim=768, do_layer_norm_before=True)),
                      ("350m", dict(hidden_size=1024, ffn_dim=4096, num_hidden_layers=24, num_attention_heads=16,
                                    word_embed_proj_dim=512, do_layer_norm_before=False))):
        c = reference.Config(dict(cfg, model_type="opt"))
        shapes = reference.expected_shapes(c)
        counts[name] = sum(int(np.prod(s)) for k, s in shapes.items() if not (c.tie and k == "lm_head.weight"))
    assert counts == {"125m": 125_239_296, "350m": 331_196_416}
    s = reference.expected_shapes(reference.Config({"model_type": "opt", "hidden_size": 1024, "num_attention_heads": 16,
                                                    "word_embed_proj_dim": 512, "do_layer_norm_before": False}))
    assert s["model.decoder.project_in.weight"] == [1024, 512] and s["model.decoder.project_out.weight"] == [512, 1024]
    assert s["model.decoder.embed_positions.weight"] == [2050, 1024] and s["lm_head.weight"] == [50272, 512]
    assert "model.decoder.final_layer_norm.weight" not in s
