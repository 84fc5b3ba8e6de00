"""16-bit compute (`--compute-dtype bf16`, docs/execution.md): every architecture's bfloat16 forward
against the independent float32 reference (reference.py) within the documented bfloat16 tolerance,
captures stored in the compute dtype, a 3-device split equal to one device, extract + verify, the
Python engine, and float16 refused (exit 2, one line, nothing written) where the CPU kernels lack
it."""
import json
import re

import numpy as np
import pytest
import torch

import actcap_helpers as H
import reference

ARCHS = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo2", "olmo3", "gemma2", "gemma3_text", "gpt_neox", "gptj", "gpt_neo", "opt", "phi",
         "phi3", "mixtral", "qwen3_moe", "olmoe", "gpt_oss", "gemma", "olmo", "qwen2_moe", "deepseek_v3", "deepseek_v2"]
# docs/execution.md: per point, ||actcap_bf16 - reference_f32|| / ||reference_f32|| <= RMS_TOL and
# max|diff| / max|reference| <= MAX_TOL (measured on these tiny random models: up to 3.4e-2 and
# 5.1e-2, OLMo 2's post-norms; bfloat16 keeps 8 significant bits, 2^-9 relative per rounding).
RMS_TOL, MAX_TOL = 5e-2, 1e-1

pytestmark = pytest.mark.usefixtures("actcap_bin")


def cpu_has_half_gemm():
    try:
        a = torch.ones(2, 2, dtype=torch.float16)
        a @ a
        return True
    except RuntimeError:
        return False


LAYER = re.compile(r"\.layers\.(\d+)(\.|:|$)")


def top_k_choice(k):
    """The experts a softmax / top-k router chooses from its logits [T, E] (as sorted sets [T, k])
    and each token's distance from a tie (the k-th largest logit minus the next)."""
    def choose(name, logits):
        top = -np.sort(-logits, axis=1)
        gap = top[:, k - 1] - top[:, k] if k < logits.shape[1] else np.full(len(logits), np.inf)
        return np.sort(np.argsort(-logits, axis=1)[:, :k], axis=1), gap
    return choose


def deepseek_v3_choice(model_dir):
    """DeepSeek-V3's choice from the router's logits (config.json and the checkpoint's
    e_score_correction_bias; the rule of DeepseekV3MoE.route_tokens_to_experts): sigmoid plus the
    bias, the topk_group groups of largest top-2 sum kept, the k largest among them; the distance
    from a tie is the smaller of the expert and the group gaps (in score units, which sigmoid
    compresses: a logit error moves a score by at most a quarter of it)."""
    cfg = H.load_config(model_dir)
    k, G, kept = cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]
    bias = {n: t.numpy().astype(np.float64) for n, t in reference.load_weights(str(model_dir)).items()
            if n.endswith("e_score_correction_bias")}

    def choose(name, logits):
        T, E = logits.shape
        c = 1 / (1 + np.exp(-logits)) + bias[name + ".e_score_correction_bias"]
        groups = -np.sort(-c.reshape(T, G, E // G), axis=2)[:, :, :2].sum(axis=2)
        order = np.argsort(-groups, axis=1)
        masked = np.full_like(c, -np.inf)
        for t in range(T):
            for g in order[t, :kept]:
                masked[t, g * (E // G):(g + 1) * (E // G)] = c[t, g * (E // G):(g + 1) * (E // G)]
        top = -np.sort(-masked, axis=1)
        gap = top[:, k - 1] - top[:, k] if k < E else np.full(T, np.inf)
        if kept < G:
            gs = -np.sort(-groups, axis=1)
            gap = np.minimum(gap, gs[:, kept - 1] - gs[:, kept])
        return np.sort(np.argsort(-masked, axis=1)[:, :k], axis=1), gap
    return choose


def routing_flip(ref, got, choose, failures, label):
    """A mixture of experts in bfloat16 may route a token to other experts than float32 does where
    two experts' router logits are closer than the bfloat16 error: that token's later activations
    are then another computation, not an error. Finds the first sparse layer where some token's
    experts (as a set: `choose(router point, logits)` -> sets and distances from a tie) differ;
    each such token must be such a tie (its float32 distance at most twice its largest logit error,
    the only way rounding can reorder them; else a failure). Returns None when no token changed
    experts, else a predicate naming the points computed from that layer's experts on (skipped: the
    block's MLP and output, later layers, the final norm and the head)."""
    for name in sorted((n for n in ref if n.endswith(".mlp.gate")),
                       key=lambda n: int(LAYER.search(n).group(1))):
        r, g = ref[name].astype(np.float64), got[name].astype(np.float64)
        want, gaps = choose(name, r)
        have, _ = choose(name, g)
        flipped = np.nonzero(np.any(want != have, axis=1))[0]
        if not len(flipped):
            continue
        for t in flipped:
            gap, err = gaps[t], np.max(np.abs(g[t] - r[t]))
            if not gap <= 2 * err:
                failures.append(f"{label}{name}: token {t} chose other experts with a float32 gap "
                                f"of {gap:.3g} between the k-th and next choice, its error {err:.3g}")
        layer = int(LAYER.search(name).group(1))

        def after(point):
            m = LAYER.search(point)
            if not m:
                return not point.startswith("model.embed_tokens")
            n, rest = int(m.group(1)), point[m.end(1):]
            if n != layer:
                return n > layer
            return rest in ("", ".mlp") or (rest.startswith(".mlp.") and not
                                            rest.startswith(".mlp.gate")) and ":input" not in rest
        return after
    return None


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_compute_against_the_f32_reference(models, tmp_path, arch):
    model = models(arch, dtype="bf16")  # weights used as stored: what a bf16 checkpoint runs as
    vocab = H.load_config(model).get("vocab_size") or H.load_config(model)["text_config"]["vocab_size"]
    seqs = H.random_tokens(vocab, [9, 6], seed=1)
    manifest, tensors, _ = H.run_capture(model, tmp_path / "out", seqs,
                                         extra=("--compute-dtype", "bf16", "--devices", "2"))
    refs = reference.run(str(model), seqs)
    assert set(tensors) - H.ROWS == set(refs[0])
    # kept in the compute dtype; ids stay int64; DeepSeek's routers are float32 as in transformers
    for name, info in manifest["points"].items():
        want = "I64" if refs[0][name].dtype == np.int64 else \
            "F32" if arch.startswith("deepseek") and name.endswith(".mlp.gate") else "BF16"
        assert info["dtype"] == want, name
    failures, largest = [], 0.0
    top_k = H.load_config(model).get("num_experts_per_tok")
    choose = deepseek_v3_choice(model) if arch == "deepseek_v3" else top_k_choice(top_k)
    for i in range(len(seqs)):
        sel = tensors[H.ROWS_SEQ] == i
        after = routing_flip(refs[i], {n: tensors[n][sel] for n in refs[i]}, choose, failures,
                             f"seq {i} ") if top_k else None
        for name, r in refs[i].items():
            if after and after(name):
                continue
            g = tensors[name][sel]
            if r.dtype == np.int64:
                if not np.array_equal(g, r):
                    failures.append(f"seq {i} {name}: ids differ")
                continue
            d = g.astype(np.float64) - r.astype(np.float64)
            rms = np.linalg.norm(d) / max(np.linalg.norm(r), 1e-30)
            mx = np.max(np.abs(d)) / max(np.max(np.abs(r)), 1e-30)
            largest = max(largest, float(np.max(np.abs(d))))
            if not (rms <= RMS_TOL and mx <= MAX_TOL):
                failures.append(f"seq {i} {name}: rms rel {rms:.3g}, max rel {mx:.3g}")
    assert not failures, "\n".join(failures[:20])
    assert largest > 1e-4, "no point differs from float32: the forward did not run in bfloat16"


@pytest.mark.parametrize("arch", ["gemma2", "gpt_neox", "phi3"])
def test_bf16_split_over_three_devices_equals_one_device(models, arch):
    p = H.actcap("compare", models(arch), "--tokens", "1,5,9,2,7,3;8,6", "--devices", "3",
                 "--compute-dtype", "bf16", "--json", check=True)
    res = json.loads(p.stdout)
    assert res["equal"] is True and res["mismatched"] == 0, p.stdout[-2000:]


def test_bf16_extract_verifies_and_f32_storage_is_the_exact_widening(models, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"input_ids": [int(t) for t in s]}) + "\n"
                              for s in H.random_tokens(256, [12, 5, 30, 8], seed=4)))
    model = models("llama")
    outs = {}
    for dtype in ("keep", "f32"):
        out = tmp_path / dtype
        H.actcap("extract", model, "--input", corpus, "--capture", "model.layers.*",
                 "--compute-dtype", "bf16", "--devices", "3", "--dtype", dtype, "--out", out,
                 check=True)
        H.actcap("verify", out, check=True)
        outs[dtype] = out
    keep = json.loads((outs["keep"] / "manifest.json").read_text())
    assert {p["dtype"] for p in keep["points"].values()} == {"BF16"}
    import st
    a, _ = st.load(str(outs["keep"] / "shard-00000.safetensors"))  # BF16 widened bit-exactly
    b, _ = st.load(str(outs["f32"] / "shard-00000.safetensors"))
    assert set(a) == set(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_engine_computes_in_bf16(ac, gpt2_ckpt, tmp_path):
    engine = ac.load(gpt2_ckpt, devices=2, compute_dtype="bf16")
    seqs = [[5, 17, 300, 42, 7], [8, 9, 10]]
    out = engine.run(seqs, "transformer.h.*", logits=True)
    assert out["transformer.h.0"].dtype == torch.bfloat16
    assert out["logits"].dtype == torch.bfloat16
    assert [p.dtype for p in engine.resolve("transformer.h.0")] == [torch.bfloat16]
    cli = tmp_path / "cli"
    H.actcap("run", gpt2_ckpt, "--tokens", H.tokens_arg(seqs), "--capture", "transformer.h.*",
             "--compute-dtype", "bf16", "--out", cli, check=True)
    ref = ac.open(cli)
    for name in [f"transformer.h.{i}" for i in range(4)]:
        assert torch.equal(out[name], ref[name]), name
    with pytest.raises(ac.InputError, match="compute dtype"):
        ac.load(gpt2_ckpt, compute_dtype="fp8")


@pytest.mark.skipif(cpu_has_half_gemm(), reason="this torch has float16 CPU kernels")
@pytest.mark.parametrize("command", ["run", "extract"])
def test_f16_compute_on_cpu_is_one_line_exit_2_and_writes_nothing(models, tmp_path, command):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5]}\n')
    out = tmp_path / "out"
    args = ["--tokens", "1,2,3"] if command == "run" else ["--input", corpus]
    p = H.actcap(command, models("gpt2"), *args, "--capture", "transformer.h.0", "--devices", "2",
                 "--compute-dtype", "f16", "--out", out)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "f16 compute is not supported on cpu" in lines[0], p.stderr
    assert "[--compute-dtype]" in lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_unknown_compute_dtype_is_one_line_exit_2(models, tmp_path):
    p = H.actcap("run", models("gpt2"), "--tokens", "1,2", "--capture", "transformer.h.0",
                 "--compute-dtype", "fp8", "--out", tmp_path / "o")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "actcap: error: unknown compute dtype 'fp8'; supported: f32, bf16, f16 [--compute-dtype]")
