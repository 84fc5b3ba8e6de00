"""actcap against Hugging Face transformers itself: its modeling code run on the CPU in float32,
not a reference written from it (reference.py). Skipped where `transformers` is not importable
(Debian bookworm, CI); `make torch2-check` installs it in its root (sid: transformers 5.12,
accelerate 1.14) and runs these, and the GPU machine has it.

* actcap's own checkpoints (`init-model`, every architecture) load in transformers with no missing,
  unexpected or mis-shaped tensor, and every hook point actcap captures (`**`, `**:input`) equals
  the output (and first input) of the transformers module of the same name, row for row, for a
  batch of three sequences of different lengths (transformers runs the same right-padded batch
  with its attention mask; only the real tokens' rows are compared);
* models transformers builds and writes itself (`save_pretrained`: its own config.json fields and
  tensor layout, tied heads dropped from the file), one per architecture and per feature actcap
  reads from a config (RoPE types linear, dynamic, yarn, llama3, longrope and partial rotary;
  sliding windows shorter than the batch; per-layer layer_types; GPT-2's attention scalings;
  Gemma's soft-caps and query_pre_attn_scalar; biases; head_dim apart from hidden/heads; Gemma 3
  multimodal with its vision tower; Mixtral's, Qwen3-MoE's and OLMoE's experts: top-k, renormalised or not,
  Qwen3-MoE's dense layers by mlp_only_layers and decoder_sparse_step), compared the same way;
* attention probabilities (`**:probs`) equal transformers' eager attention weights
  (output_attentions) on the real keys, 0 on the padded ones;
* `actcap generate` (greedy, KV cache) produces transformers' `generate` tokens;
* every `init-model` preset's config (the real shapes the GPU benchmark runs included) builds the
  class it names in transformers with exactly the parameter count init-model reports;
* `--compute-dtype bf16` is as accurate as transformers in bfloat16, against its float32 forward;
  checkpoints transformers saved in bfloat16 / float16 run as transformers runs them in float32;
* text in, activations out: `actcap extract` of a text corpus with a tokenizer.json the Rust
  `tokenizers` library trained and wrote gives its token ids and transformers' layer outputs.

One layout differs by design: Gemma 3's q_norm / k_norm run on transformers' [batch, heads, T,
head_dim] view; actcap's rows are tokens ([heads, head_dim] per token), so that view is transposed
before comparing, and a mixture of experts' router (`.mlp.gate`, gpt-oss's `.mlp.router`) runs on
the batch flattened to [B * T, hidden]: its logits are viewed [B, T, experts]. Tolerance: max |diff| <= 1e-5 * max(1, max |transformers|) per point (float32;
over the same padded batch on the same LibTorch most points come out bit-identical, the largest
difference measured 1.1e-7)."""
import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

import actcap_helpers as H

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"written for transformers 5's config fields (rope_parameters, layer_types) and "
                f"from_pretrained(dtype=); this is {transformers.__version__}", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("actcap_bin", "no_reexec")

ARCHS = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo", "olmo2", "olmo3", "gemma", "gemma2",
         "gemma3_text", "gemma3", "gpt_neox", "gptj", "gpt_neo", "opt", "phi", "phi3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe",
         "gpt_oss", "deepseek_v3", "deepseek_v2"]
LENGTHS = [9, 5, 12]  # 12 > the windows (4 or 8) of the windowed variants
REL = 1e-5  # measured with transformers 5.12 on torch 2.14: most points bit-identical, the largest 1.1e-7
TRANSPOSED = (".self_attn.q_norm", ".self_attn.k_norm")  # Gemma 3's [B, heads, T, hd] views


# ---------------------------------------------------------------------------------------------
# transformers' side
# ---------------------------------------------------------------------------------------------

def hf_load(model_dir):
    """The checkpoint as transformers loads it (float32, eager attention), and its loading info."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    return model.eval(), info


def hf_points(model, names, seqs, attentions=False):
    """Every module of `names` hooked over one right-padded batch: name -> [B, T, ...] output and
    name + ':input' -> its first input; with attentions, also the eager attention weights."""
    mods = dict(model.named_modules())
    absent = sorted(n for n in names if n not in mods)
    assert not absent, f"actcap points that are not transformers modules: {absent[:10]}"
    rec = {}

    def hook_for(name):
        def hook(module, args, kwargs, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            rec[name] = out.detach().clone()
            inp = args[0] if args else next(
                (kwargs[k] for k in ("hidden_states", "input", "input_ids", "x") if k in kwargs), None)
            if isinstance(inp, torch.Tensor):
                rec[name + ":input"] = inp.detach().clone()
        return hook

    # DeepSeek-V2's router is never called as a module (DeepseekV2Moe uses its weight directly):
    # its logits are what that call computes from the block's input
    uncalled = [n for n in names if n.endswith(".mlp.gate") and model.config.model_type == "deepseek_v2"]
    names = list(dict.fromkeys([n for n in names if n not in uncalled] +
                               [n[:-len(".gate")] for n in uncalled]))
    handles = [mods[n].register_forward_hook(hook_for(n), with_kwargs=True) for n in names]
    ids, mask = H.padded(seqs)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, output_attentions=attentions,
                        use_cache=False)
    finally:
        for h in handles:
            h.remove()
    for n in uncalled:
        x = rec[n[:-len(".gate")] + ":input"]
        rec[n] = torch.nn.functional.linear(x.float(), mods[n].weight.detach().float())
        rec[n + ":input"] = x
    heads_first = model.config.model_type in ("gemma3", "gemma3_text")
    opt = model.config.model_type == "opt"  # OPTDecoderLayer flattens its MLP's rows
    for name in list(rec):
        # A mixture of experts' router, Qwen2-MoE's shared expert (and the layers inside it) and
        # its gate, and OPT's pre-norm MLP (final_layer_norm, fc1, activation_fn, fc2) run on the
        # batch flattened to [B * T, hidden] (the router's output is a tuple
        # whose first element is the logits): back to [B, T, ...] as actcap's rows.
        t = rec[name]
        module = name.split(":")[0]
        flat = module.endswith((".mlp.gate", ".mlp.router", ".mlp.shared_expert_gate")) or \
            ".mlp.shared_expert." in module + "." or \
            (opt and module.endswith((".final_layer_norm", ".fc1", ".activation_fn", ".fc2")))
        if t.dim() == 2 and t.shape[0] == ids.numel() and flat:
            rec[name] = t.view(*ids.shape, t.shape[1])
        if heads_first and name.split(":")[0].endswith(TRANSPOSED):
            rec[name] = rec[name].transpose(1, 2)  # [B, heads, T, hd] -> [B, T, heads, hd]
    return rec, (out.attentions if attentions else None)


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------

def compare(got, hf, seqs, label=""):
    """actcap's rows (name -> [rows, ...]) against transformers' [B, T, ...], per sequence."""
    failures = []
    for i, s in enumerate(seqs):
        sel = got[H.ROWS_SEQ] == i
        # [1, T] position ids broadcast over the batch
        ref = {n: (t[i] if t.shape[0] > i else t[0])[:len(s)].numpy() for n, t in hf.items()}
        failures += H.compare_points(ref, {n: got[n][sel] for n in hf}, tol=REL, scaled=True,
                                     label=f"{label}seq {i} ")
    return failures


def check_against_hf(model_dir, out_dir, seqs, label="", patterns=False):
    """actcap run over the batch vs transformers over the same padded batch."""
    capture = ["**", "**:input"] + (["**:probs"] if patterns else [])
    _, got, _ = H.run_capture(model_dir, out_dir, seqs, capture=capture)
    names = sorted({k.split(":")[0] for k in got if k not in H.ROWS})
    model, info = hf_load(model_dir)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"{label}transformers loading {model_dir}: {key} {info[key]}"
    hf, attentions = hf_points(model, names, seqs, attentions=patterns)
    plain = {k for k in got if k not in H.ROWS and not k.endswith(":probs")}
    assert plain == set(hf), (f"{label}point sets differ: only actcap {sorted(plain - set(hf))[:8]}, "
                              f"only transformers {sorted(set(hf) - plain)[:8]}")
    failures = compare(got, hf, seqs, label)
    if patterns:
        failures += compare_patterns(got, attentions, seqs, label)
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


def compare_patterns(got, attentions, seqs, label):
    names = sorted((k for k in got if k.endswith(":probs")), key=layer_index)
    assert len(names) == len(attentions), f"{label}{len(names)} :probs points, {len(attentions)} layers"
    failures = []
    for name, a in zip(names, attentions):
        for i, s in enumerate(seqs):
            L = len(s)
            rows = got[name][got[H.ROWS_SEQ] == i]  # [L, heads, K]
            want = a[i, :, :L, :L].permute(1, 0, 2).numpy()  # [L, heads, L]
            d = float(np.max(np.abs(rows[:, :, :L] - want)))
            if not d <= REL:
                failures.append(f"{label}seq {i} {name}: probs differ by {d:.3e}")
            if rows.shape[2] > L and np.any(rows[:, :, L:] != 0):
                failures.append(f"{label}seq {i} {name}: padded keys' probs are not 0")
    return failures


def layer_index(name):
    return [int(p) if p.isdigit() else p for p in name.replace(":", ".").split(".")]


def tokens(vocab, lengths=LENGTHS, seed=0):
    return H.random_tokens(vocab, lengths, seed=seed)


def vocab_of(model_dir):
    cfg = H.load_config(model_dir)
    return cfg.get("vocab_size") or cfg["text_config"]["vocab_size"]


# ---------------------------------------------------------------------------------------------
# actcap's checkpoints in transformers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_init_model_checkpoint_matches_transformers(models, tmp_path, arch):
    m = models(arch)
    check_against_hf(m, tmp_path / "out", tokens(vocab_of(m)), label=f"{arch}: ")


# ---------------------------------------------------------------------------------------------
# transformers' checkpoints in actcap
# ---------------------------------------------------------------------------------------------

LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
PHI = {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}
GEMMA = dict(LLAMA, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
             hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)

# name -> (model_type, config fields); each is built by transformers with random weights (norm
# weights and biases perturbed too) and written with save_pretrained.
VARIANTS = {
    "gpt2": ("gpt2", dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=3, n_head=4)),
    "gpt2-scalings": ("gpt2", dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=3, n_head=4,
                                   scale_attn_by_inverse_layer_idx=True,
                                   reorder_and_upcast_attn=True, activation_function="gelu")),
    "llama": ("llama", dict(LLAMA)),
    "llama-bias-headdim": ("llama", dict(LLAMA, attention_bias=True, mlp_bias=True, head_dim=24)),
    "llama-tied": ("llama", dict(LLAMA, tie_word_embeddings=True)),
    "llama-rope-linear": ("llama", dict(LLAMA, rope_parameters=dict(
        rope_type="linear", factor=2.5, rope_theta=5000.0))),
    "llama-rope-dynamic": ("llama", dict(LLAMA, max_position_embeddings=8, rope_parameters=dict(
        rope_type="dynamic", factor=2.0, rope_theta=10000.0))),
    "llama-rope-yarn": ("llama", dict(LLAMA, rope_parameters=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16, rope_theta=10000.0))),
    "llama-rope-llama3": ("llama", dict(LLAMA, rope_parameters=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16, rope_theta=500000.0))),
    "mistral-window": ("mistral", dict(LLAMA, sliding_window=4)),
    "qwen2-window-layers": ("qwen2", dict(LLAMA, use_sliding_window=True, sliding_window=4,
                                          max_window_layers=1)),
    "qwen3": ("qwen3", dict(LLAMA, head_dim=24)),
    # SmolLM3Config's defaults in miniature: layer 3 NoPE (every fourth), tied. (Each SmolLM3
    # variant sets a pad id: the default, 128004, lies outside these vocabularies.)
    "smollm3": ("smollm3", dict(LLAMA, num_hidden_layers=4, tie_word_embeddings=True, pad_token_id=0)),
    # NoPE layers of its own, use_sliding_window with a 4-key window (the NoPE layers slide),
    # q/k/v/o and MLP biases, llama3 RoPE, untied
    "smollm3-nope-window-bias": ("smollm3", dict(
        LLAMA, no_rope_layers=[0, 1, 0], use_sliding_window=True, sliding_window=4, pad_token_id=0,
        attention_bias=True, mlp_bias=True, rope_parameters=dict(
            rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=16, rope_theta=500000.0))),
    # layer_types listed without use_sliding_window: transformers' eager attention slides by
    # them all the same (SmolLM3Model masks by layer_types)
    "smollm3-types-without-flag": ("smollm3", dict(
        LLAMA, sliding_window=4, pad_token_id=0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "olmo": ("olmo", dict(LLAMA)),
    # clip_qkv small enough to clamp most q, k and v values; tied; llama3 RoPE
    "olmo-bias-clip-tied": ("olmo", dict(LLAMA, attention_bias=True, clip_qkv=0.05,
                                         tie_word_embeddings=True, rope_parameters=dict(
                                             rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0,
                                             original_max_position_embeddings=16,
                                             rope_theta=500000.0))),
    "olmo2": ("olmo2", dict(LLAMA)),
    # Olmo3Config's default layer_types (sliding, sliding, sliding, full) with a 4-key window
    "olmo3": ("olmo3", dict(LLAMA, num_hidden_layers=4, sliding_window=4)),
    # layer_types of its own, the released models' yarn RoPE over 8 original positions, q/k/v/o
    # biases, tied
    "olmo3-types-yarn-bias-tied": ("olmo3", dict(
        LLAMA, sliding_window=4, attention_bias=True, tie_word_embeddings=True,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=8,
                             rope_theta=500000.0, attention_factor=1.2079441541679836,
                             beta_fast=32.0, beta_slow=1.0))),
    # GemmaConfig's default activation (gelu_pytorch_tanh); tied
    "gemma": ("gemma", dict(LLAMA, head_dim=16, tie_word_embeddings=True)),
    "gemma-bias-gelu-rope-linear": ("gemma", dict(LLAMA, head_dim=24, attention_bias=True,
                                                  hidden_act="gelu", rope_parameters=dict(
                                                      rope_type="linear", factor=2.0,
                                                      rope_theta=5000.0))),
    "gemma2-softcaps": ("gemma2", dict(GEMMA, attn_logit_softcapping=0.5,
                                       final_logit_softcapping=2.0)),
    "gemma3_text": ("gemma3_text", dict(GEMMA, num_hidden_layers=4, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
    "gemma3_text-rope": ("gemma3_text", dict(GEMMA, num_hidden_layers=4, rope_parameters=dict(
        full_attention=dict(rope_type="linear", factor=4.0, rope_theta=100000.0),
        sliding_attention=dict(rope_type="default", rope_theta=5000.0)))),
    "gpt_neox-partial-rotary": ("gpt_neox", dict(vocab_size=512, hidden_size=64,
                                                 intermediate_size=128, num_hidden_layers=3,
                                                 num_attention_heads=4, max_position_embeddings=64,
                                                 rotary_pct=0.25, tie_word_embeddings=False)),
    "gpt_neox-sequential": ("gpt_neox", dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=3, num_attention_heads=4,
                                             max_position_embeddings=64, use_parallel_residual=False,
                                             attention_bias=False, tie_word_embeddings=False)),
    # head_dim 16: rotary_dim 8 (4 interleaved pairs, 8 features passed through); GPTJConfig's gelu_new
    "gptj-partial-rotary": ("gptj", dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=3, n_head=4,
                                         rotary_dim=8, tie_word_embeddings=False)),
    # whole heads rotated, an inner width of its own, exact gelu, tied (lm_head keeps its bias)
    "gptj-tied-full-rotary": ("gptj", dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=3, n_head=4,
                                           rotary_dim=16, n_inner=96, activation_function="gelu",
                                           tie_word_embeddings=True)),
    # global, local, local with a 4-key window (shorter than the longest sequence); tied, gelu_new,
    # an inner width of its own
    "gpt_neo-window": ("gpt_neo", dict(vocab_size=512, max_position_embeddings=64, hidden_size=64,
                                       num_layers=3, num_heads=4, intermediate_size=96,
                                       attention_types=[[["global", "local"], 1], [["local"], 1]],
                                       window_size=4, tie_word_embeddings=True)),
    # local first, untied, exact gelu, GPTNeoConfig's 4 * hidden MLP
    "gpt_neo-untied-gelu": ("gpt_neo", dict(vocab_size=512, max_position_embeddings=64, hidden_size=64,
                                            num_layers=4, num_heads=8, activation_function="gelu",
                                            attention_types=[[["local", "global"], 2]], window_size=8,
                                            tie_word_embeddings=False)),
    # OPT: embeddings narrower than the layers (project_in / project_out), untied, gelu
    "opt-projected-untied": ("opt", dict(vocab_size=512, hidden_size=64, num_hidden_layers=3,
                                         num_attention_heads=4, ffn_dim=96, max_position_embeddings=64,
                                         word_embed_proj_dim=48, activation_function="gelu",
                                         tie_word_embeddings=False)),
    # opt-350m's post-norm layers in miniature; no biases, LayerNorms without weights; tied
    "opt-post-norm-plain": ("opt", dict(vocab_size=512, hidden_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, ffn_dim=96, max_position_embeddings=64,
                                        do_layer_norm_before=False, enable_bias=False,
                                        layer_norm_elementwise_affine=False)),
    # pre-norm without the decoder's final LayerNorm (_remove_final_layer_norm), relu
    "opt-no-final-norm": ("opt", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=8, ffn_dim=128, max_position_embeddings=64,
                                      _remove_final_layer_norm=True)),
    # Phi-2's layout in miniature: partial_rotary_factor 0.4 at the top level (6 of 16 features),
    # GQA; gelu_new
    "phi-partial-rotary": ("phi", dict(PHI, partial_rotary_factor=0.4)),
    # transformers 5's rope dict with the factor inside it, linear scaling, tied (lm_head's bias kept)
    "phi-rope-linear-tied": ("phi", dict(PHI, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="linear", factor=2.0, rope_theta=5000.0, partial_rotary_factor=0.5))),
    "phi3-window": ("phi3", dict(LLAMA, sliding_window=4, pad_token_id=0)),
    "mixtral": ("mixtral", dict(LLAMA, num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-window-top3": ("mixtral", dict(LLAMA, num_local_experts=6, num_experts_per_tok=3,
                                            sliding_window=4, head_dim=24)),
    "qwen3_moe": ("qwen3_moe", dict(LLAMA, head_dim=24, num_experts=8, num_experts_per_tok=3,
                                    moe_intermediate_size=40, mlp_only_layers=[1])),
    "olmoe": ("olmoe", dict(LLAMA, num_experts=6, num_experts_per_tok=2, attention_bias=True,
                            pad_token_id=0, eos_token_id=2)),
    "qwen2_moe": ("qwen2_moe", dict(LLAMA, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                    mlp_only_layers=[1])),
    # transformers 5's default windows: the even layers below max_window_layers
    "qwen2_moe-norm-step-window-nobias": ("qwen2_moe", dict(
        LLAMA, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=24,
        shared_expert_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=2,
        qkv_bias=False, use_sliding_window=True, sliding_window=4, max_window_layers=2)),
    "olmoe-clip": ("olmoe", dict(LLAMA, num_experts=4, num_experts_per_tok=2, clip_qkv=0.05,
                                 attention_bias=True, pad_token_id=0, eos_token_id=2)),
    "olmoe-norm-topk": ("olmoe", dict(LLAMA, num_experts=4, num_experts_per_tok=3,
                                      norm_topk_prob=True, pad_token_id=0, eos_token_id=2)),
    "qwen3_moe-step-norm-window": ("qwen3_moe", dict(LLAMA, num_experts=5, num_experts_per_tok=2,
                                                     moe_intermediate_size=24, norm_topk_prob=True,
                                                     decoder_sparse_step=2, use_sliding_window=True,
                                                     sliding_window=4)),
    # GptOssConfig's defaults otherwise: YaRN (factor 32 over 4096 positions), even layers slide
    "gpt_oss": ("gpt_oss", dict(LLAMA, num_local_experts=4, num_experts_per_tok=2, head_dim=24,
                                intermediate_size=64, sliding_window=4, pad_token_id=0,
                                eos_token_id=2)),
    "gpt_oss-top3-nobias-full": ("gpt_oss", dict(LLAMA, num_local_experts=5, num_experts_per_tok=3,
                                                 attention_bias=False, sliding_window=4,
                                                 layer_types=["full_attention", "sliding_attention",
                                                              "full_attention"],
                                                 rope_parameters=dict(rope_type="default",
                                                                      rope_theta=10000.0),
                                                 pad_token_id=0, eos_token_id=2)),
    # latent attention: q through a bottleneck, values (12) narrower than queries/keys (8 + 4);
    # one dense layer, then 8 experts in 4 groups (2 kept), 3 chosen, 2 shared experts
    "deepseek_v3": ("deepseek_v3", dict(LLAMA, num_key_value_heads=4, q_lora_rank=16,
                                        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                        v_head_dim=12, n_routed_experts=8, n_group=4, topk_group=2,
                                        num_experts_per_tok=3, n_shared_experts=2,
                                        moe_intermediate_size=24, first_k_dense_replace=1)),
    # one q_proj, rotate-half RoPE (YaRN, whose mscale_all_dim scales the softmax), biases, no
    # renormalisation, 2 groups (1 kept), first layer sparse
    "deepseek_v3-qproj-yarn-bias": ("deepseek_v3", dict(
        LLAMA, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=24, qk_nope_head_dim=12,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=6, n_group=2, topk_group=1,
        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
        first_k_dense_replace=0, rope_interleave=False, attention_bias=True, norm_topk_prob=False,
        routed_scaling_factor=1.7, rope_parameters=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=1.0,
            mscale_all_dim=0.8, rope_theta=10000.0))),
    # DeepSeek-V2-Lite's form: one q_proj, greedy top-3 of 8 times 1.5, 2 shared experts
    "deepseek_v2": ("deepseek_v2", dict(LLAMA, num_key_value_heads=4, q_lora_rank=None,
                                        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                        v_head_dim=12, n_routed_experts=8, num_experts_per_tok=3,
                                        n_shared_experts=2, moe_intermediate_size=24,
                                        first_k_dense_replace=1, routed_scaling_factor=1.5,
                                        topk_method="greedy")),
    # the q bottleneck, every bias, YaRN without mscale_all_dim (transformers 5.12.1 leaves its
    # softmax factor out: see test_deepseek_v2_yarn_softmax_scale)
    "deepseek_v2-qlora-bias-yarn": ("deepseek_v2", dict(
        LLAMA, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=24, qk_nope_head_dim=12,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=6, num_experts_per_tok=2,
        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=0,
        attention_bias=True, mlp_bias=True, rope_parameters=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=16, rope_theta=10000.0))),
    "phi3-longrope-partial": ("phi3", dict(LLAMA, max_position_embeddings=64,
                                           original_max_position_embeddings=8,
                                           partial_rotary_factor=0.5, pad_token_id=0,
                                           rope_parameters=dict(
                                               rope_type="longrope", rope_theta=10000.0,
                                               short_factor=[1.0, 1.1, 1.3, 1.6],
                                               long_factor=[1.5, 2.0, 3.0, 4.5]))),
}


def build_hf_model(model_type, fields, out_dir, seed=0, original_format=True):
    """transformers' own model of that config, random, written with save_pretrained (in
    transformers' in-memory layout where original_format is False)."""
    torch.manual_seed(seed)
    # transformers standardizes the RoPE dicts it is given in place: a copy keeps VARIANTS as written
    cfg = transformers.AutoConfig.for_model(model_type, **copy.deepcopy(fields))
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms and biases: not their identity initialisation
                p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's: zero at init
                b.add_(torch.randn_like(b) * 0.02)
    model.save_pretrained(str(out_dir), **({} if original_format else
                                            dict(save_original_format=False)))
    return out_dir


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_transformers_checkpoint_matches(tmp_path, variant):
    model_type, fields = VARIANTS[variant]
    m = build_hf_model(model_type, fields, tmp_path / "model")
    check_against_hf(m, tmp_path / "out", tokens(vocab_of(m), seed=1), label=f"{variant}: ")


def test_gpt_oss_mxfp4_checkpoint_matches_transformers(tmp_path):
    """The released checkpoints' layout: MXFP4 experts (synth.py's packer, written from the
    format). transformers on a CPU without Triton decodes them at load to bf16 and keeps them bf16
    in a float32 model; cast to float32 (exact: every MXFP4 value is a bf16 value), its model is the
    one actcap runs, decoding each expert to float32 as it runs."""
    import synth
    m = tmp_path / "model"
    synth.write_checkpoint(str(m), synth.tiny_config("gpt_oss_mxfp4"), seed=3)
    seqs = tokens(vocab_of(m), seed=2)
    _, got, _ = H.run_capture(m, tmp_path / "out", seqs, capture=["**", "**:input"])
    names = sorted({k.split(":")[0] for k in got if k not in H.ROWS})
    model, _ = hf_load(m)
    experts = [mod for n, mod in model.named_modules() if n.endswith(".mlp.experts")]
    assert len(experts) == H.load_config(m)["num_hidden_layers"]
    for e in experts:
        e.float()
    hf, _ = hf_points(model, names, seqs)
    failures = compare(got, hf, seqs, "mxfp4: ")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


@pytest.mark.parametrize("arch,block,scale_dtype", [("llama", (8, 16), "F32"), ("qwen3", (8, 8), "BF16"),
                                                    ("deepseek_v3", (4, 4), "F32")])
def test_fp8_checkpoint_matches_transformers(tmp_path, arch, block, scale_dtype):
    """An FP8 checkpoint (synth.write_fp8_checkpoint: quantization_config "fp8", F8_E4M3 weights
    beside their block scales, dtype bfloat16; blocks that divide every matrix, as transformers'
    Fp8Dequantize requires). transformers on a CPU decodes it at load (the float32 product) into the
    dtype it loads with: loaded as bfloat16 and cast to float32 (exact), its model is the one actcap
    runs on the weights it decodes."""
    import synth
    m = tmp_path / "fp8"
    synth.write_fp8_checkpoint(str(m), str(tmp_path / "twin"), synth.tiny_config(arch), seed=3, block=block,
                               scale_dtype=scale_dtype)
    seqs = tokens(vocab_of(m), seed=4)
    _, got, _ = H.run_capture(m, tmp_path / "out", seqs, capture=["**", "**:input"])
    names = sorted({k.split(":")[0] for k in got if k not in H.ROWS})
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(m), dtype=torch.bfloat16, attn_implementation="eager", output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"transformers loading {m}: {key} {info[key]}"
    assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if n.endswith("down_proj.weight"))
    hf, _ = hf_points(model.float().eval(), names, seqs)
    failures = compare(got, hf, seqs, f"fp8 {arch}: ")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


def test_gemma_released_activation_fields(tmp_path):
    """Gemma configs may carry the legacy "hidden_act": "gelu" beside "hidden_activation":
    "gelu_pytorch_tanh", the activation the models were trained with (transformers 4.x ran it
    after its Gemma fixes). actcap runs hidden_activation: the model transformers builds with hidden_act
    gelu_pytorch_tanh. transformers 5 reads only hidden_act and runs exact GELU on that config:
    its act_fn outputs differ from the tanh model's by far more than actcap's do."""
    tanh = build_hf_model("gemma", VARIANTS["gemma"][1], tmp_path / "tanh")
    released = H.copy_model(tanh, tmp_path / "released")
    cfg = H.load_config(released)
    assert cfg["hidden_act"] == "gelu_pytorch_tanh" and "hidden_activation" not in cfg
    cfg.update(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh")
    H.save_config(released, cfg)
    seqs = tokens(vocab_of(tanh), seed=4)
    _, got, _ = H.run_capture(released, tmp_path / "out", seqs, capture=["**", "**:input"])
    names = sorted({k.split(":")[0] for k in got if k not in H.ROWS})
    want, _ = hf_points(hf_load(tanh)[0], names, seqs)
    failures = compare(got, want, seqs, "released fields vs tanh: ")
    assert not failures, "\n".join(failures[:30])
    act = [n for n in names if n.endswith(".mlp.act_fn")]
    exact, _ = hf_points(hf_load(released)[0], act, seqs)
    for n in act:
        for i, s in enumerate(seqs):
            w = want[n][i, :len(s)].numpy()
            ours = float(np.abs(got[n][got[H.ROWS_SEQ] == i] - w).max())
            theirs = float(np.abs(exact[n][i, :len(s)].numpy() - w).max())
            assert theirs > 1e-6 and theirs > 100 * ours, (n, i, ours, theirs)


@pytest.mark.parametrize("variant", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3",
                                     "deepseek_v2"])
def test_transformers_stacked_experts_checkpoint_matches(tmp_path, variant):
    """save_pretrained(save_original_format=False) writes the experts as transformers holds them
    (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj, router mlp.gate, Mixtral's too):
    actcap runs that checkpoint as transformers does."""
    model_type, fields = VARIANTS[variant]
    m = build_hf_model(model_type, fields, tmp_path / "model", original_format=False)
    raw = (m / "model.safetensors").read_bytes()
    keys = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in keys), sorted(keys)[:8]
    check_against_hf(m, tmp_path / "out", tokens(vocab_of(m), seed=5), label=f"{variant} stacked: ")


def test_transformers_gemma3_multimodal_checkpoint_matches(tmp_path):
    """Gemma3ForConditionalGeneration as transformers writes it (5.12 saves the original layout:
    language_model.model.*, vision_tower.*, multi_modal_projector.*): actcap runs its text model
    under the names transformers' modules have (model.language_model.*, lm_head)."""
    torch.manual_seed(0)
    text = transformers.Gemma3TextConfig(**dict(GEMMA, num_hidden_layers=2))
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             image_size=16, patch_size=4)
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                    mm_tokens_per_image=4)
    model = transformers.Gemma3ForConditionalGeneration(cfg)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    m = tmp_path / "model"
    model.save_pretrained(str(m))
    raw = (m / "model.safetensors").read_bytes()
    keys = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert any("vision_tower." in k for k in keys), sorted(keys)[:5]  # the tower is in the file
    check_against_hf(m, tmp_path / "out", tokens(512, seed=2), label="gemma3 multimodal: ")


def test_deepseek_v2_group_limited_routing(tmp_path):
    """DeepSeek-V2's (and Coder-V2's) group_limited_greedy: transformers 5.12.1 fails on it
    (DeepseekV2Moe reads self.num_experts, which it never sets). With that attribute supplied, as
    evidently meant, its model equals actcap's point for point."""
    fields = dict(VARIANTS["deepseek_v2"][1], topk_method="group_limited_greedy", n_group=4,
                  topk_group=2)
    m = build_hf_model("deepseek_v2", fields, tmp_path / "model")
    seqs = tokens(vocab_of(m), seed=8)
    _, got, _ = H.run_capture(m, tmp_path / "out", seqs, capture=["**", "**:input"])
    names = sorted({k.split(":")[0] for k in got if k not in H.ROWS})
    model, _ = hf_load(m)
    blocks = [mod for mod in model.modules() if type(mod).__name__ == "DeepseekV2Moe"]
    assert blocks and not any(hasattr(b, "num_experts") for b in blocks), \
        "this transformers sets num_experts: compare with it directly"
    for b in blocks:
        b.num_experts = fields["n_routed_experts"]
    hf, _ = hf_points(model, names, seqs)
    failures = compare(got, hf, seqs, "group-limited: ")
    assert not failures, "\n".join(failures[:20])


def test_deepseek_v2_yarn_softmax_scale(tmp_path):
    """DeepSeek-V2-Lite's YaRN (factor 40 over 4096 positions, mscale = mscale_all_dim = 0.707,
    scaled down here): DeepSeek's own code, and transformers from PR #47435 on, multiply the
    softmax scale by mscale(40, 0.707) ** 2 = 1.59; transformers 5.12.1's DeepseekV2Attention
    leaves it out. actcap applies it: it equals 5.12.1's model with each attention's `scaling` so
    corrected, point for point, and differs from the uncorrected one."""
    rope = dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=2, mscale=0.707,
                mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0, rope_theta=10000.0)
    fields = dict(VARIANTS["deepseek_v2"][1], max_position_embeddings=80, rope_parameters=rope)
    m = build_hf_model("deepseek_v2", fields, tmp_path / "model")
    seqs = tokens(vocab_of(m), seed=7)
    _, got, _ = H.run_capture(m, tmp_path / "out", seqs, capture=["**", "**:input"])
    names = sorted({k.split(":")[0] for k in got if k not in H.ROWS})
    model, _ = hf_load(m)
    plain, _ = hf_points(model, names, seqs)
    factor = (0.1 * 0.707 * math.log(40.0) + 1.0) ** 2
    attentions = [mod for n, mod in model.named_modules() if n.endswith(".self_attn")]
    plain_scale = (fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"]) ** -0.5
    assert attentions and all(a.scaling == plain_scale for a in attentions), \
        "this transformers already applies the factor: compare with it directly"
    for a in attentions:
        a.scaling = a.scaling * factor
    fixed, _ = hf_points(model, names, seqs)
    failures = compare(got, fixed, seqs, "mscale-corrected: ")
    assert not failures, "\n".join(failures[:20])
    assert compare(got, plain, seqs, "5.12.1: "), "the mscale factor changed nothing"


# ---------------------------------------------------------------------------------------------
# attention patterns and generation
# ---------------------------------------------------------------------------------------------

# (model_type, the field, its attribute_map alias, what the reference calls the value)
ALIASES = [("gpt2", "n_embd", "hidden_size", "hidden"), ("gpt2", "n_layer", "num_hidden_layers", "layers"),
           ("gpt2", "n_head", "num_attention_heads", "heads"),
           ("gpt2", "n_positions", "max_position_embeddings", "n_positions"),
           ("gptj", "n_embd", "hidden_size", "hidden"), ("gptj", "n_layer", "num_hidden_layers", "layers"),
           ("gptj", "n_head", "num_attention_heads", "heads"),
           ("gptj", "n_positions", "max_position_embeddings", "n_positions"),
           ("gpt_neo", "num_layers", "num_hidden_layers", "layers"),
           ("gpt_neo", "num_heads", "num_attention_heads", "heads"),
           ("mixtral", "num_local_experts", "num_experts", "experts"),
           ("qwen3_moe", "num_local_experts", "num_experts", "experts"),
           ("olmoe", "num_experts", "num_local_experts", "experts")]


@pytest.mark.parametrize("model_type,field,alias,attr", ALIASES)
def test_config_field_and_alias_resolve_as_transformers(model_type, field, alias, attr):
    """A config.json naming a value under both a field and its attribute_map alias, in either
    order: the reference (and so actcap: test_parity_config_alias_wins) reads the value
    transformers' config class keeps (the alias, set last; Qwen3-MoE keeps its field)."""
    import reference
    import synth
    base = synth.tiny_config(model_type)
    base.pop(field, None)
    base.pop(alias, None)
    a, b = {"hidden": (64, 32), "layers": (4, 2), "heads": (8, 4), "n_positions": (64, 32),
            "experts": (8, 4)}[attr]
    if model_type == "gpt_neo":  # one type per layer of the alias's count (transformers checks it)
        base.pop("attention_layers", None)
        base["attention_types"] = [[["global"], b if attr == "layers" else base["num_layers"]]]
    for cfg in ({**base, field: a, alias: b}, {**base, alias: b, field: a}):
        cls = transformers.CONFIG_MAPPING[model_type]
        hf = getattr(cls.from_dict(dict(cfg)), field)
        ref = getattr(reference.Config(dict(cfg)), attr)
        assert hf == ref, (cfg, hf, ref)


@pytest.mark.parametrize("variant", ["gpt2", "mistral-window", "gemma2-softcaps", "gemma3_text",
                                     "gpt_neox-partial-rotary", "gptj-partial-rotary",
                                     "gpt_neo-window", "opt-post-norm-plain", "phi-partial-rotary",
                                     "phi3-longrope-partial", "olmo3-types-yarn-bias-tied",
                                     "smollm3-nope-window-bias"])
def test_attention_probs_match_transformers(tmp_path, variant):
    model_type, fields = VARIANTS[variant]
    m = build_hf_model(model_type, fields, tmp_path / "model")
    check_against_hf(m, tmp_path / "out", tokens(vocab_of(m), seed=3), label=f"{variant}: ",
                     patterns=True)


def hf_greedy(model, prompt, max_new, eos=None):
    gen = transformers.GenerationConfig(max_new_tokens=max_new,
                                        min_new_tokens=max_new if eos is None else 0,
                                        do_sample=False, eos_token_id=eos, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=gen,
                             attention_mask=torch.ones((1, len(prompt)), dtype=torch.int64),
                             output_scores=True, return_dict_in_generate=True)
    return out.sequences[0].tolist(), out.scores


@pytest.mark.parametrize("variant", ["gpt2", "llama-rope-llama3", "mistral-window", "qwen3",
                                     "gemma", "gemma2-softcaps", "olmo-bias-clip-tied", "olmo3", "smollm3-nope-window-bias", "gemma3_text", "gpt_neox-partial-rotary",
                                     "gptj-partial-rotary", "gpt_neo-window", "opt-projected-untied", "phi-partial-rotary", "phi3-window", "mixtral-window-top3", "qwen2_moe",
                                     "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3",
                                     "deepseek_v3-qproj-yarn-bias", "deepseek_v2",
                                     "deepseek_v2-qlora-bias-yarn"])
def test_generate_matches_transformers(tmp_path, variant):
    """Greedy decoding with the KV cache past the sliding windows: the same tokens as
    transformers' generate. A step where transformers' best two logits are within 1e-4 of each
    other is a tie that float32 rounding may break either way: the sequences are compared up
    to it. Then with the config's eos_token_id set to the first prompt's third generated token,
    that prompt alone, actcap stopping at the config's EOS: both stop at its first occurrence
    with the same tokens."""
    model_type, fields = VARIANTS[variant]
    m = build_hf_model(model_type, fields, tmp_path / "model")
    prompts = tokens(vocab_of(m), lengths=[6, 3], seed=4)
    max_new = 8
    proc = H.actcap("generate", m, "--tokens", H.tokens_arg(prompts), "--max-new-tokens", max_new,
                    "--ignore-eos", "--json", check=True, timeout=300)
    got = [s["tokens"] for s in json.loads(proc.stdout)["sequences"]]
    model, _ = hf_load(m)
    for i, p in enumerate(prompts):
        want, scores = hf_greedy(model, p, max_new)
        upto = len(want)
        for step, s in enumerate(scores):
            top = torch.topk(s[0].float(), 2).values
            if float(top[0] - top[1]) < 1e-4:
                upto = len(p) + step
                break
        assert upto > len(p), f"{variant}: the first step is a tie; choose another seed"
        assert got[i][:upto] == want[:upto], (
            f"{variant}: prompt {i}: actcap {got[i]} != transformers {want}")
        if i == 0:
            stop_upto = upto
    assert stop_upto >= len(prompts[0]) + 3, (
        f"{variant}: a tie before the third generated token leaves the stop undetermined; "
        "choose another seed")
    eos = got[0][len(prompts[0]) + 2]
    cfg = H.load_config(m)
    cfg["eos_token_id"] = eos
    H.save_config(m, cfg)
    proc = H.actcap("generate", m, "--tokens", H.tokens_arg(prompts[:1]), "--max-new-tokens",
                    max_new, "--json", check=True, timeout=300)
    stopped = json.loads(proc.stdout)["sequences"][0]["tokens"]
    want, _ = hf_greedy(model, prompts[0], max_new, eos=eos)
    assert stopped == want, f"{variant}: stopping at eos {eos}: actcap {stopped}, transformers {want}"
    assert len(stopped) <= len(prompts[0]) + 3 and stopped[-1] == eos, stopped


# ---------------------------------------------------------------------------------------------
# every preset's config in transformers
# ---------------------------------------------------------------------------------------------

def presets_of(arch):
    """init-model's presets for arch, as its error for an unknown one lists them."""
    proc = H.actcap("init-model", "--arch", arch, "--preset", "?", "--seed", "0", "--out", "/nonexistent")
    assert proc.returncode == 2 and "supported: " in proc.stderr, proc.stderr
    return [p.strip() for p in proc.stderr.strip().split("supported: ", 1)[1].split(",")]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_preset_is_the_model_transformers_builds(tmp_path, arch):
    """`init-model --config-only` for every preset (the real shapes the GPU benchmark runs
    included): transformers builds the class the config names (on the meta device: no memory)
    with exactly the parameter count init-model reports (its parameters and the buffers it saves)."""
    for preset in presets_of(arch):
        out = tmp_path / preset
        proc = H.actcap("init-model", "--arch", arch, "--preset", preset, "--seed", "0",
                        "--config-only", "--out", out, check=True)
        reported = int(proc.stdout.split(" parameters")[0].rsplit(" ", 1)[1])
        cfg = transformers.AutoConfig.from_pretrained(str(out))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        assert type(model).__name__ == H.load_config(out)["architectures"][0], (arch, preset)
        # and the buffers the checkpoint stores (DeepSeek-V3's e_score_correction_bias)
        saved = model.state_dict()
        count = sum(p.numel() for p in model.parameters()) + sum(
            b.numel() for n, b in model.named_buffers() if n in saved)
        assert count == reported, f"{arch} {preset}: transformers builds {count} parameters, " \
                                  f"init-model reports {reported}"


# ---------------------------------------------------------------------------------------------
# 16-bit compute, as accurate as transformers'
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["gpt2", "llama-rope-llama3", "gemma", "gemma2-softcaps",
                                     "gemma3_text", "olmo-bias-clip-tied", "olmo2", "olmo3-types-yarn-bias-tied", "smollm3",
                                     "phi3-longrope-partial", "gptj-partial-rotary", "gpt_neo-window", "opt-projected-untied", "phi-partial-rotary", "deepseek_v3",
                                     "deepseek_v2"])
def test_bf16_compute_is_as_accurate_as_transformers_in_bf16(tmp_path, variant):
    """`--compute-dtype bf16` against transformers' model cast to bfloat16, both measured against
    transformers' float32 forward: at every hook point actcap's largest error (relative to the
    point's largest float32 magnitude) is within 3x transformers' there plus 5e-3, and its worst
    over the model within 2x transformers' worst plus 2e-3 (measured on these variants with
    transformers 5.12: actcap's worst 0.73-1.22x transformers', at one point at most 1.75x)."""
    model_type, fields = VARIANTS[variant]
    m = build_hf_model(model_type, fields, tmp_path / "model")
    seqs = tokens(vocab_of(m), seed=1)
    _, got, _ = H.run_capture(m, tmp_path / "out", seqs, capture=["**"],
                              extra=["--compute-dtype", "bf16", "--dtype", "f32"])
    names = sorted(k for k in got if k not in H.ROWS)
    model, _ = hf_load(m)
    f32, _ = hf_points(model, names, seqs)
    # loaded in bfloat16 as a user would (DeepSeek-V3's e_score_correction_bias stays float32 then;
    # model.to(bfloat16) would round it)
    model16 = transformers.AutoModelForCausalLM.from_pretrained(
        str(m), dtype=torch.bfloat16, attn_implementation="eager").eval()
    bf16, _ = hf_points(model16, names, seqs)
    real = H.padded(seqs)[1].bool()
    errors, failures = [], []
    for name in names:
        ref = f32[name]
        if ref.dtype == torch.int64 or ref.shape[:2] != real.shape:
            continue
        ref = ref[real].double()
        scale = float(ref.abs().max()) or 1.0
        ours = float((torch.from_numpy(got[name]).double() - ref).abs().max()) / scale
        theirs = float((bf16[name][real].double() - ref).abs().max()) / scale
        errors.append((ours, theirs))
        if not ours <= 3 * theirs + 5e-3:  # NaN fails
            failures.append(f"{name}: actcap's bf16 error {ours:.2e}, transformers' {theirs:.2e}")
    assert len(errors) > 10, f"{variant}: only {len(errors)} points compared"
    worst_ours, worst_theirs = max(e[0] for e in errors), max(e[1] for e in errors)
    assert worst_ours <= 2 * worst_theirs + 2e-3, (
        f"{variant}: actcap's worst bf16 error {worst_ours:.2e}, transformers' {worst_theirs:.2e}")
    assert not failures, f"{variant}:\n" + "\n".join(failures[:20])


# ---------------------------------------------------------------------------------------------
# text in, activations out: extract with a tokenizer the Rust library trained and wrote
# ---------------------------------------------------------------------------------------------

def train_tokenizer(texts, out_file, vocab_size=400):
    """A byte-level BPE tokenizer.json trained and written by the Rust `tokenizers` library, with a
    BOS added by its template post-processor."""
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<bos>", "<eos>"],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = tk.processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)])
    tok.save(str(out_file))
    return tok


@pytest.mark.parametrize("variant", ["llama", "gemma3_text"])
def test_extract_of_text_matches_tokenizers_and_transformers(tmp_path, variant):
    """`actcap extract` of a text corpus (split over two virtual devices, two documents per batch)
    against the Rust library's ids for each document and transformers' forward on those ids:
    every token row (`__rows__.token`, `__rows__.pos`) and every layer output of every document."""
    lines = [t for t in (Path(__file__).parent / "data" / "tokenizer_corpus.txt").read_text(
        encoding="utf-8").split("\n") if t.strip()]
    model_type, fields = VARIANTS[variant]
    m = tmp_path / "model"
    m.mkdir()
    tok = train_tokenizer(lines, m / "tokenizer.json")
    build_hf_model(model_type, dict(fields, vocab_size=tok.get_vocab_size(),
                                    bos_token_id=tok.token_to_id("<bos>"),
                                    eos_token_id=tok.token_to_id("<eos>")), m)
    docs = [t for t in lines if len(tok.encode(t).ids) <= 64][:24]  # the model's context: 64
    assert len(docs) == 24
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in docs),
                      encoding="utf-8")
    out = tmp_path / "out"
    H.actcap("extract", m, "--input", corpus, "--capture", "model.layers.*", "--out", out,
             "--devices", "2", "--batch-size", "2", "--max-length", "64", "--quiet", check=True,
             timeout=300)
    _, rows = H.read_all_shards(out)
    model, _ = hf_load(m)
    layers = sorted((k for k in rows if k not in H.ROWS), key=layer_index)
    assert len(layers) == model.config.num_hidden_layers
    for d, text in enumerate(docs):
        ids = tok.encode(text).ids
        sel = rows[H.ROWS_SEQ] == d
        assert rows[H.ROWS_TOKEN][sel].tolist() == ids, f"document {d} {text!r}: token ids"
        assert rows[H.ROWS_POS][sel].tolist() == list(range(len(ids)))
        hf, _ = hf_points(model, layers, [ids])
        failures = H.compare_points({k: hf[k][0].numpy() for k in layers},
                                    {k: rows[k][sel] for k in layers}, tol=REL, scaled=True,
                                    label=f"document {d}: ")
        assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("variant,dtype", [("llama-bias-headdim", "bfloat16"),
                                           ("gemma2-softcaps", "bfloat16"), ("gpt2", "float16"),
                                           ("phi3-window", "float16")])
def test_16_bit_checkpoint_written_by_transformers(tmp_path, variant, dtype):
    """A model transformers saved in 16 bits: actcap keeps the weights 16-bit (widened per layer,
    exactly) and computes in float32, as transformers does after loading it with dtype=float32."""
    model_type, fields = VARIANTS[variant]
    m = tmp_path / "model"
    build_hf_model(model_type, fields, m)
    model, _ = hf_load(m)
    model.to(getattr(torch, dtype)).save_pretrained(str(m))
    cfg = H.load_config(m)
    assert cfg.get("dtype", cfg.get("torch_dtype")) == dtype
    check_against_hf(m, tmp_path / "out", tokens(vocab_of(m), seed=6), label=f"{variant} {dtype}: ")
