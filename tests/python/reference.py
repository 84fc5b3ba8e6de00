"""Independent float32 reference forward for the actcap parity tests.

Written from the semantics of Hugging Face transformers' modeling_gpt2.py, modeling_llama.py,
modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py, modeling_olmo.py, modeling_olmo2.py,
modeling_olmo3.py, modeling_smollm3.py, modeling_gemma.py, modeling_gemma2.py, modeling_gemma3.py, modeling_gpt_neox.py,
modeling_gptj.py, modeling_gpt_neo.py, modeling_phi.py, modeling_phi3.py, modeling_mixtral.py,
modeling_qwen3_moe.py, modeling_qwen2_moe.py, modeling_olmoe.py, modeling_gpt_oss.py,
modeling_deepseek_v3.py, modeling_deepseek_v2.py, modeling_opt.py (with configuration_mixtral.py,
configuration_qwen3_moe.py, configuration_qwen2_moe.py, configuration_olmo.py, configuration_olmo3.py,
configuration_smollm3.py,
configuration_olmoe.py, configuration_gpt_oss.py, configuration_gemma.py, configuration_deepseek_v3.py,
configuration_deepseek_v2.py, configuration_gpt_neo.py, configuration_opt.py, masking_utils.py,
conversion_mapping.py, integrations/moe.py and
integrations/mxfp4.py of transformers 5.12) and modeling_rope_utils.py (eager attention, eager
experts (Qwen2-MoE, gpt-oss and DeepSeek-V3 / V2: transformers 5's default grouped_mm experts), no
padding, no cache, eval mode),
using only torch + numpy + the minimal safetensors
reader in st.py. config.json may be in transformers 4.x form (rope_theta / rope_scaling,
torch_dtype) or 5.x form (rope_parameters, layer_types, dtype); the dtype fields are not read.

RoPE types: default, linear, dynamic (NTK, recomputed for a forward longer than
max_position_embeddings), yarn, longrope (short/long factors), llama3; attention factors scale cos
and sin. GPT-2: scale_attn_weights, scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn.

    run(ckpt_dir, [[1, 2, 3], [4, 5]]) -> [ {point: np.ndarray [T, ...features]}, ... ]

Each sequence is run ALONE (batch of one, positions 0..T-1, no padding). For every hook point the
dict holds the module's output under NAME and its first positional input under NAME + ":input".
Values are float32 except the token / position ids fed to the embeddings (int64).

Attention patterns (only with forward(ids, patterns=True) / run(..., patterns=True); the default
output has no such entries): for every attention module NAME (transformer.h.N.attn,
<prefix>.layers.N.self_attn, gpt_neox.layers.N.attention, model.decoder.layers.N.self_attn; for
gpt_neo transformer.h.N.attn.attention, the innermost module, GPTNeoSelfAttention, which computes
them, not its GPTNeoAttention wrapper) the dict also holds
  NAME:scores  [T, heads, T] float32: q k^T after the scale (GPT-2: 1/sqrt(head_dim) and
               1/(layer+1) as configured; GPT-Neo: no scale at all; OPT: q scaled by
               head_dim ** -0.5 BEFORE the product, as HF does; GQA keys repeated per query
               head), Gemma 2's soft-cap c * tanh(s / c) and the causal / sliding-window mask; a
               masked key holds -inf (HF writes finfo(float32).min there; the softmax is the same);
  NAME:probs   [T, heads, T] float32: the float32 softmax eager attention multiplies the values by
               (HF's attn_weights), 0 where masked.
Row t is query position t, laid out [heads, keys] (heads in HF order, key column j = position j).

Hook points (N = layer index):
  gpt2:  transformer.wte, transformer.wpe, transformer.h.N, .ln_1, .attn, .attn.c_attn,
         .attn.c_proj, .ln_2, .mlp, .mlp.c_fc, .mlp.act, .mlp.c_proj, transformer.ln_f, lm_head
  llama/mistral/qwen2/qwen3: model.embed_tokens, model.layers.N, .input_layernorm, .self_attn,
         .self_attn.{q,k,v,o}_proj, .post_attention_layernorm, .mlp, .mlp.{gate,up,down}_proj,
         .mlp.act_fn, model.norm, lm_head
  gemma (Gemma 1, GemmaForCausalLM): exactly llama's points. model.embed_tokens is the embedding
         module's own output, scaled by sqrt(hidden_size) (GemmaTextScaledWordEmbedding); the norms
         are Gemma's (1 + w) RMSNorm; lm_head is uncapped and is the model's logits. The MLP's
         activation is a rule of ours, not transformers 5's (see Config._gemma): hidden_activation
         when config.json has it non-null, else hidden_act, else gelu_pytorch_tanh.
  gemma2: as llama plus .pre_feedforward_layernorm (before .mlp) and .post_feedforward_layernorm
         (after it); model.embed_tokens is the embedding times sqrt(hidden_size); lm_head is
         uncapped (the model's logits are soft-capped after it)
  gemma3 (model_type gemma3_text): as gemma2 plus .self_attn.q_norm / .k_norm, per head after the
         three projections ([heads, head_dim] per token; HF applies them to the [heads, T, head_dim]
         view); model.embed_tokens is the embedding module's own (scaled) output; local layers use
         their own RoPE; lm_head uncapped.
  gemma3 (model_type gemma3, Gemma3ForConditionalGeneration): the same text model under HF's
         names model.language_model.embed_tokens, model.language_model.layers.N...,
         model.language_model.norm, lm_head; the vision tower is not run (its tensors are skipped).
  olmo (OLMo 1, OlmoForCausalLM): exactly llama's points. input_layernorm, post_attention_layernorm
         and model.norm are OlmoLayerNorm: a LayerNorm WITHOUT weight or bias (the checkpoint has no
         norm tensors; stray ones are ignored, as transformers does), eps fixed at 1e-5 (no config
         field), computed in float32. With clip_qkv (a positive number) the outputs of q_proj, k_proj
         and v_proj are clamped to [-clip_qkv, clip_qkv] before the head split and RoPE; HF clamps
         them in place AFTER the modules returned, so the .self_attn.{q,k,v}_proj points hold the
         UNclamped projections (the module's output at the moment it returned) while the attention
         uses the clamped ones.
  olmo2: as llama without .input_layernorm, plus .post_feedforward_layernorm (after .mlp) and
         .self_attn.q_norm / .k_norm over the whole projection ([heads * head_dim] per token)
  olmo3 (Olmo3ForCausalLM): exactly olmo2's points and wiring; "sliding_attention" layers
         (layer_types; by default all but every 4th) attend within sliding_window, one RoPE table
         (rope_parameters, yarn included) for every layer. See Config._olmo3 and Model._olmo2.
  smollm3 (SmolLM3ForCausalLM): exactly llama's points and wiring (q / k / v / o biases with
         attention_bias, MLP biases with mlp_bias, tied head by default). NoPE layers
         (no_rope_layers[i] == 0; by default every 4th layer) leave q and k unrotated; the other
         layers rotate them with one RoPE table (rope_parameters, theta 2e6 by default).
         "sliding_attention" layers (layer_types) attend within sliding_window. See Config._smollm3.
  qwen3 adds .self_attn.q_norm and .self_attn.k_norm (RMSNorm over head_dim, applied per head to
         q_proj / k_proj output viewed [T, heads, head_dim], before RoPE): their input and output
         are [T, num_attention_heads, head_dim] and [T, num_key_value_heads, head_dim], i.e. the
         per-token shape is [heads, head_dim], not flattened.
  gpt_neox: gpt_neox.embed_in, gpt_neox.layers.N, .input_layernorm, .attention,
         .attention.query_key_value, .attention.dense, .post_attention_layernorm, .mlp,
         .mlp.dense_h_to_4h, .mlp.act, .mlp.dense_4h_to_h, gpt_neox.final_layer_norm, embed_out
         (the head; a checkpoint may store its weight as lm_head.weight, as newer transformers
         name the module).
  gptj:  transformer.wte, transformer.h.N, .ln_1, .attn, .attn.q_proj, .attn.k_proj, .attn.v_proj,
         .attn.out_proj, .mlp, .mlp.fc_in, .mlp.act, .mlp.fc_out, transformer.ln_f, lm_head (with a
         bias). The MLP reads ln_1's output, as the attention does.
  gpt_neo (GPTNeoForCausalLM): transformer.wte, transformer.wpe (input: the positions 0..T-1,
         int64), transformer.h.N, .ln_1, .attn, .attn.attention, .attn.attention.q_proj,
         .attn.attention.k_proj, .attn.attention.v_proj, .attn.attention.out_proj, .ln_2, .mlp,
         .mlp.c_fc, .mlp.act, .mlp.c_proj, transformer.ln_f, lm_head (no bias; tied to wte by
         default). .attn (GPTNeoAttention) only wraps .attn.attention (GPTNeoSelfAttention): both
         read ln_1's output and hold the same [T, H] output. q / k / v_proj have no biases,
         out_proj has; c_fc / c_proj are nn.Linear (weights [out, in], unlike GPT-2's Conv1D).
         Sequential pre-LN blocks as GPT-2's; "local" layers attend within window_size (see
         Config._gpt_neo and Model._gpt_neo).
  opt (OPTForCausalLM: facebook/opt-125m ... 66b, opt-350m): model.decoder.embed_tokens (width
         word_embed_proj_dim P), model.decoder.embed_positions (input: the ATTENTION MASK, HF's first
         positional argument: [T] ones, recorded int64 as a tokenizer's mask; output rows 2..T+1 of
         its table), model.decoder.project_in (P -> hidden, only when P != hidden_size),
         model.decoder.layers.N, then in HF's call order either (do_layer_norm_before, pre-LN)
         .self_attn_layer_norm, .self_attn, .self_attn.{q,k,v}_proj, .self_attn.out_proj,
         .final_layer_norm, .fc1, .activation_fn, .fc2, or (post-LN, opt-350m) .self_attn (reading
         the block input) with its four projections, .self_attn_layer_norm (input: block input +
         attention output), .fc1, .activation_fn, .fc2, .final_layer_norm (input: fc1's input +
         fc2's output; its output is the block's); then model.decoder.final_layer_norm (only pre-LN
         without _remove_final_layer_norm), model.decoder.project_out (hidden -> P, only when P !=
         hidden_size), lm_head (P -> vocab, no bias; tied to embed_tokens by default). The
         .self_attn.q_proj point is the module's own (unscaled) output. LayerNorms (eps 1e-5) have
         no parameters without layer_norm_elementwise_affine; no linear has a bias without
         enable_bias. (transformers runs the layer's feed-forward part on the flattened [B * T, H]
         view: for one sequence those are the rows listed here.) See Config._opt and Model._opt.
  phi:   model.embed_tokens, model.layers.N, .input_layernorm, .self_attn, .self_attn.q_proj,
         .self_attn.k_proj, .self_attn.v_proj, .self_attn.dense, .mlp, .mlp.fc1, .mlp.activation_fn,
         .mlp.fc2, model.final_layernorm, lm_head (with a bias). The MLP reads input_layernorm's
         output, as the attention does.
  phi3:  model.embed_tokens, model.layers.N, .input_layernorm, .self_attn, .self_attn.qkv_proj,
         .self_attn.o_proj, .post_attention_layernorm, .mlp, .mlp.gate_up_proj, .mlp.activation_fn
         (its input is the gate half of gate_up_proj), .mlp.down_proj, model.norm, lm_head
  olmoe: as qwen3_moe's sparse layers on every layer, with .self_attn.q_norm / .k_norm over the
         whole projections ([heads * head_dim] and [kv_heads * head_dim] per token) as olmo2's,
         inside a pre-norm layer (input_layernorm, post_attention_layernorm). With clip_qkv the
         clamp (as olmo's) acts on q_norm's and k_norm's outputs and v_proj's, i.e. AFTER the norms;
         the .self_attn.q_norm / .k_norm / .v_proj points hold the unclamped values (HF clamps them
         in place after the hooks ran).
  mixtral / qwen3_moe (MixtralForCausalLM, Qwen3MoeForCausalLM; transformers 5's module names:
         Mixtral's MoE block is .mlp, though its tensors are stored as .block_sparse_moe.*):
         model.embed_tokens, model.layers.N, .input_layernorm, .self_attn, .self_attn.{q,k,v,o}_proj
         (qwen3_moe also .self_attn.q_norm / .k_norm exactly as qwen3), .post_attention_layernorm,
         model.norm, lm_head, and per layer either
           sparse: .mlp ([T, H] in and out) and .mlp.gate, the router: input [T, H], output the
                   router logits [T, num_experts] float32 (the first element of HF's (logits,
                   scores, indices)); no per-expert points (an expert sees a variable number of
                   tokens); or
           dense (qwen3_moe layers in mlp_only_layers or off decoder_sparse_step): .mlp,
                   .mlp.{gate,up,down}_proj, .mlp.act_fn as qwen3.
         Mixtral's layers are all sparse. Model.routing(ids) gives the chosen experts, their
         weights and the top-k margin per sparse layer (not hook points).
  qwen2_moe (Qwen2MoeForCausalLM: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): model.embed_tokens,
         model.layers.N, .input_layernorm, .self_attn, .self_attn.{q,k,v,o}_proj (q / k / v with
         biases when qkv_bias, the default; o_proj never), .post_attention_layernorm, model.norm,
         lm_head, and per layer either
           sparse (Qwen2MoeSparseMoeBlock): .mlp ([T, H] in and out); .mlp.gate, the router (input
                   [T, H], output the router logits [T, num_experts], the first element of HF's
                   (logits, scores, indices)); .mlp.shared_expert (a gated MLP of
                   shared_expert_intermediate_size S: input and output [T, H]) with
                   .mlp.shared_expert.{gate_proj, up_proj} ([T, S]), .mlp.shared_expert.act_fn
                   ([T, S] in and out), .mlp.shared_expert.down_proj ([T, S] -> [T, H]); and
                   .mlp.shared_expert_gate (input [T, H], output [T, 1]: the gate's LOGIT, before
                   the sigmoid). No per-expert points. HF runs these children on the flattened
                   [B * T, H] view; for one sequence those are the rows listed here. The block's
                   output is experts + sigmoid(shared_expert_gate(x)) * shared_expert(x) (see
                   Model._sparse_moe); or
           dense (layers in mlp_only_layers or off decoder_sparse_step, or num_experts <= 0;
                   Qwen2MoeMLP of intermediate_size): .mlp, .mlp.{gate,up,down}_proj, .mlp.act_fn.
         Sliding windows per layer_types (see Config._qwen2_moe_windows: NOT Qwen2's rule).
         Model.routing(ids) as for the other MoE families. Checkpoints hold the Hub's per-expert
         tensors (mlp.experts.E.{gate,up,down}_proj.weight, what transformers 5's save_pretrained
         writes by default); the fused save_original_format=False layout (experts.gate_up_proj /
         experts.down_proj) is refused ("checkpoint lacks ...").
  gpt_oss (GptOssForCausalLM): model.embed_tokens, model.layers.N, .input_layernorm, .self_attn,
         .self_attn.{q,k,v,o}_proj (with biases when attention_bias, the default),
         .post_attention_layernorm, .mlp ([T, H] in and out), .mlp.router (input [T, H], output
         the router logits [T, num_experts] float32, bias included), model.norm, lm_head; every
         layer sparse, no per-expert points. Attention has a learnt per-head sink logit
         (.self_attn.sinks): softmax over the keys plus the sink, the sink's share dropped, so
         :probs rows sum to < 1 (:scores are the masked scores without the sink column); sliding
         layers (layer_types, by default the even ones) attend within sliding_window. The router
         takes the top-k of the logits and softmaxes those k; the experts' clamped SwiGLU reads
         gate / up from the even / odd columns of gate_up_proj (see Model._gpt_oss_moe).
         Model.routing(ids) works as for the other MoE families (its margin is between logits). An
         MXFP4 checkpoint (quantization_config quant_method "mxfp4") stores the experts'
         gate_up_proj / down_proj as _blocks / _scales, dequantized at load (mxfp4_dequantize).
  deepseek_v3 (DeepseekV3ForCausalLM: DeepSeek-V3 / R1, Moonlight, Kimi-K2's shape): model.embed_tokens,
         model.layers.N, .input_layernorm, .self_attn (multi-head latent attention) with, in forward
         order, either .self_attn.q_proj ([heads * qk_head_dim], q_lora_rank null) or
         .self_attn.q_a_proj ([q_lora_rank]), .q_a_layernorm, .q_b_proj ([heads * qk_head_dim]);
         then .self_attn.kv_a_proj_with_mqa ([kv_lora_rank + qk_rope_head_dim]), .kv_a_layernorm
         (input and output [kv_lora_rank]: the first part of kv_a_proj_with_mqa's output),
         .kv_b_proj ([heads * (qk_nope_head_dim + v_head_dim)]), .o_proj (input [heads *
         v_head_dim]); .post_attention_layernorm, .mlp, model.norm, lm_head; per layer either
           dense (N < first_k_dense_replace): .mlp.gate_proj, .mlp.act_fn, .mlp.up_proj,
                   .mlp.down_proj (intermediate_size), in that (HF's call) order; or
           sparse: .mlp.gate, the router: input [T, H], output the float32 router logits [T,
                   n_routed_experts] (before the sigmoid and the correction bias); then
                   .mlp.shared_experts ([T, H] in and out, run after the routed experts) with
                   .mlp.shared_experts.{gate_proj, act_fn, up_proj, down_proj} (width
                   moe_intermediate_size * n_shared_experts); no per-expert points.
         :scores / :probs of .self_attn as the other families ([T, heads, T]; the scale is
         qk_head_dim ** -0.5, times YaRN's mscale_all_dim factor squared). See
         Config._deepseek_v3, Model._deepseek_v3_attention and Model._deepseek_v3_moe;
         Model.routing(ids) works as for the other MoE families (its margin in sigmoid-score units,
         the group choice's included). Checkpoints: the Hub's per-expert tensors or transformers 5's
         stacked experts.gate_up_proj / down_proj; the MTP layer (layer num_hidden_layers) ignored.
  deepseek_v2 (DeepseekV2ForCausalLM: DeepSeek-V2, V2-Lite, DeepSeek-Coder-V2(-Lite)): exactly
         deepseek_v3's points (q_proj when q_lora_rank is null, as in V2-Lite, else q_a_proj,
         q_a_layernorm, q_b_proj; the dense MLP's and the shared experts' children), with
           .mlp.gate: input [T, H], output the float32 router logits [T, n_routed_experts] (before the
                   softmax). NOT a transformers hook output: DeepseekV2Moe uses the gate's weight
                   functionally (F.linear(x.float(), gate.weight.float())), so a hook on the module
                   never fires; the point holds those logits all the same;
           .mlp.shared_experts (+ its 4 children): always present (n_shared_experts 0 gives
                   zero-width [T, 0] children and a [T, H] output of 0, or down_proj's bias).
         Differences from DeepSeek-V3, all in Config._deepseek_v2 / Model._deepseek_v2_moe /
         apply_rope_complex: RoPE on the interleaved pairs as complex numbers, the result left
         interleaved (rounded as torch's complex64 product is on x86-64 CPU: fused multiply-adds),
         cos / sin from torch.polar; softmax scale qk_head_dim ** -0.5 even with YaRN; softmax
         routing, greedy or group-limited (group score = the group's largest probability, the other
         groups' probabilities masked to 0.0), weights times routed_scaling_factor, never
         renormalised; mlp_bias on the dense MLP and the shared experts. Model.routing's margin is in
         probability units. Checkpoints as deepseek_v3's (no e_score_correction_bias).
"""
import json
import math
import os
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

import st

ARCHS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "olmo3", "smollm3", "gemma", "gemma2", "gemma3_text",
         "gemma3", "gpt_neox", "gptj", "gpt_neo", "phi", "phi3", "mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3",
         "deepseek_v2", "opt")
MOE_ARCHS = ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3", "deepseek_v2")


class ReferenceError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# activations (transformers.activations.ACT2FN subset)
# ---------------------------------------------------------------------------------------------

def _gelu_new(x):
    # NewGELUActivation: tanh approximation, written exactly as HF does.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x):
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


ACT = {
    "gelu_new": _gelu_new,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "gelu_fast": _gelu_fast,
    "quick_gelu": _quick_gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def _act(name):
    if name not in ACT:
        raise ReferenceError(f"unsupported activation {name!r}")
    return ACT[name]


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------

def load_config(ckpt_dir):
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        return json.load(f)


def _get(cfg, *keys, default=None, required=False):
    """First key present with a non-null value; HF attribute_map aliases are passed as extra keys."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if required:
        raise ReferenceError(f"config.json lacks {keys[0]}")
    return default


# Qwen3Config's defaults (transformers 4.51+ and 5.x agree): every field may be absent.
QWEN3_DEFAULTS = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      head_dim=128, hidden_act="silu", max_position_embeddings=32768,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0,
                      attention_bias=False, use_sliding_window=False, sliding_window=4096,
                      max_window_layers=28)
LAYER_TYPES = ("full_attention", "sliding_attention")
# MixtralConfig's defaults (configuration_mixtral.py, transformers 5.x; rope_theta is its
# default_theta). head_dim (Optional, default None) and sliding_window (Optional, default None) are
# read separately.
MIXTRAL_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                        max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_theta=1_000_000.0, num_local_experts=8, num_experts_per_tok=2)
# Qwen3MoeConfig's defaults (configuration_qwen3_moe.py, transformers 5.x). No head_dim field (a
# head_dim in config.json is used; absent: hidden_size // num_attention_heads), no layer_types or
# max_window_layers; mlp_only_layers (Optional) is read separately.
QWEN3_MOE_DEFAULTS = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                          num_attention_heads=32, num_key_value_heads=4, hidden_act="silu",
                          max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
                          rope_theta=10000.0, attention_bias=False, use_sliding_window=False,
                          sliding_window=4096, decoder_sparse_step=1, moe_intermediate_size=768,
                          num_experts_per_tok=8, num_local_experts=128, norm_topk_prob=False)
# Qwen2MoeConfig's defaults (configuration_qwen2_moe.py, transformers 5.12, a @strict dataclass:
# Qwen1.5-MoE-A2.7B's sizes; rope_theta is its default_theta). No head_dim field (a head_dim in
# config.json is used: getattr(config, "head_dim", hidden // heads)); no attribute_map (num_experts
# only; a num_local_experts key is an unread extra attribute); num_key_value_heads is Optional but
# never filled in (null cannot build the attention); sliding_window Optional (see _qwen2_moe);
# mlp_only_layers None -> [] and layer_types None -> the default rule (__post_init__).
QWEN2_MOE_DEFAULTS = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                          num_attention_heads=16, num_key_value_heads=16, hidden_act="silu",
                          max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
                          rope_theta=10000.0, use_sliding_window=False, sliding_window=4096, max_window_layers=28,
                          decoder_sparse_step=1, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                          num_experts_per_tok=4, num_experts=60, norm_topk_prob=False, qkv_bias=True)
# OlmoeConfig's defaults (configuration_olmoe.py, transformers 5.x): num_key_value_heads None means
# num_attention_heads (its __post_init__); attribute_map num_local_experts -> num_experts; no head_dim
# or sliding_window field; clip_qkv None (Optional; see _clip_qkv).
OLMOE_DEFAULTS = dict(vocab_size=50304, hidden_size=2048, intermediate_size=2048, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=None, hidden_act="silu",
                      max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      rope_theta=10000.0, attention_bias=False, clip_qkv=None, num_experts_per_tok=8,
                      num_local_experts=64, norm_topk_prob=False)
# GptOssConfig's defaults (configuration_gpt_oss.py, transformers 5.x; rope_theta is its default_theta).
# swiglu_limit / alpha are constants of GptOssExperts (7.0, 1.702), not config fields.
GPT_OSS_DEFAULTS = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128,
                        num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072,
                        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True, rope_theta=150000.0)
# GptOssConfig.__post_init__'s rope_parameters when config.json has neither rope_parameters nor
# rope_scaling (a null or absent field; an empty dict is plain RoPE).
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
GPT_OSS_SWIGLU_LIMIT = 7.0
GPT_OSS_SWIGLU_ALPHA = 1.702
# GemmaConfig's defaults (configuration_gemma.py, transformers 5.12; gemma-7b's sizes). A @strict
# dataclass: a null in any of these fields is refused (rope_parameters, the token ids and
# use_bidirectional_attention are the Optional ones). head_dim and num_key_value_heads are fixed
# defaults, never derived (hidden_size // num_attention_heads, num_attention_heads). GemmaConfig has
# no hidden_activation field (see Config._gemma for the activation rule).
GEMMA_DEFAULTS = dict(vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=256,
                      hidden_act="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, attention_bias=False, rope_theta=10000.0,
                      use_bidirectional_attention=None)
GEMMA_ACT_DEFAULT = "gelu_pytorch_tanh"
# Gemma2Config's defaults (configuration_gemma2.py).
GEMMA2_DEFAULTS = dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=256, hidden_activation="gelu_pytorch_tanh",
                       max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
                       final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
# Gemma3TextConfig's defaults (configuration_gemma3.py, transformers 4.50+ and 5.x agree).
GEMMA3_DEFAULTS = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=256, hidden_activation="gelu_pytorch_tanh",
                       max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
                       final_logit_softcapping=None, attn_logit_softcapping=None,
                       rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, sliding_window_pattern=6,
                       use_bidirectional_attention=False)
# OlmoConfig's defaults (configuration_olmo.py, transformers 5.12, a @strict dataclass: OLMo-7B's
# sizes). num_key_value_heads None means num_attention_heads (__post_init__); no head_dim field (a
# head_dim in config.json is used: getattr(config, "head_dim", ...)); no norm eps field (OlmoLayerNorm
# hard-codes OLMO_LAYER_NORM_EPS); rope_theta is its default_theta; clip_qkv Optional.
OLMO_DEFAULTS = dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
                     max_position_embeddings=2048, tie_word_embeddings=False, attention_bias=False,
                     clip_qkv=None, rope_theta=10000.0)
OLMO_OPTIONAL = ("num_key_value_heads", "clip_qkv", "rope_theta")  # null allowed (rope_theta: see _olmo)
OLMO_LAYER_NORM_EPS = 1e-5
# Olmo2Config's defaults (configuration_olmo2.py).
OLMO2_DEFAULTS = dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008,
                      num_hidden_layers=32, num_attention_heads=32, hidden_act="silu",
                      max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      attention_bias=False)
# Olmo3Config's defaults (configuration_olmo3.py, transformers 5.12, a @strict dataclass: Olmo2Config's
# fields plus sliding_window and layer_types). num_key_value_heads None means num_attention_heads
# (__post_init__); no head_dim field (a head_dim in config.json is used: getattr(config, "head_dim",
# ...)); no rope_theta field (PreTrainedConfig's default_theta, 10000, when neither the top level nor
# the rope dict gives one); layer_types None -> OLMO3_FULL_EVERY's rule (__post_init__).
OLMO3_DEFAULTS = dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
                      max_position_embeddings=2048, tie_word_embeddings=False, attention_bias=False,
                      rms_norm_eps=1e-5, sliding_window=4096, layer_types=None, rope_theta=10000.0)
# Olmo3Config's fields typed Optional (null passes the strict check); every other null is refused.
OLMO3_OPTIONAL = ("num_key_value_heads", "sliding_window", "layer_types", "rope_theta", "rope_parameters",
                  "rope_scaling", "pad_token_id", "bos_token_id", "eos_token_id")
# Olmo3Config.__post_init__'s default layer_types: layer i is "full_attention" iff (i + 1) % 4 == 0
OLMO3_FULL_EVERY = 4
# SmolLM3Config's defaults (configuration_smollm3.py, transformers 5.12, a @strict dataclass: SmolLM3-3B's
# sizes). num_key_value_heads is 4 when ABSENT (a field default); only an explicit null becomes
# num_attention_heads (__post_init__). No head_dim field (a head_dim in config.json is used:
# getattr(config, "head_dim", hidden // heads)); no rope_theta field (default_theta 2e6 when neither
# the top level nor the rope dict gives one). no_rope_layers None -> RoPE on layer i iff (i + 1) %
# no_rope_layer_interval != 0; layer_types None -> "sliding_attention" on the NoPE layers iff
# use_sliding_window and sliding_window is not None, else "full_attention" (__post_init__).
SMOLLM3_DEFAULTS = dict(vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                        num_attention_heads=16, num_key_value_heads=4, hidden_act="silu",
                        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        attention_bias=False, mlp_bias=False, use_sliding_window=False, sliding_window=None,
                        no_rope_layers=None, no_rope_layer_interval=4, layer_types=None, rope_theta=2000000.0)
# SmolLM3Config's fields typed Optional (null passes the strict check); every other null is refused.
SMOLLM3_OPTIONAL = ("num_key_value_heads", "sliding_window", "no_rope_layers", "layer_types", "rope_theta",
                    "rope_parameters", "rope_scaling", "pad_token_id", "bos_token_id", "eos_token_id")
# GPTNeoXConfig's defaults (4.x and 5.x agree).
NEOX_DEFAULTS = dict(vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
                     intermediate_size=24576, hidden_act="gelu", max_position_embeddings=2048,
                     layer_norm_eps=1e-5, tie_word_embeddings=False, use_parallel_residual=True,
                     attention_bias=True, rotary_pct=0.25)
# GPTJConfig's defaults (EleutherAI/gpt-j-6B's sizes); attribute_map: hidden_size -> n_embd,
# num_hidden_layers -> n_layer, num_attention_heads -> n_head, max_position_embeddings -> n_positions.
GPTJ_DEFAULTS = dict(vocab_size=50400, n_positions=2048, n_embd=4096, n_layer=28, n_head=16,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=False)
# GPTNeoConfig's defaults (configuration_gpt_neo.py, transformers 5.12, a @strict dataclass:
# gpt-neo-1.3B's sizes). attribute_map: num_attention_heads -> num_heads, num_hidden_layers ->
# num_layers. intermediate_size None -> 4 * hidden_size (GPTNeoBlock); attention_types None ->
# GPT_NEO_ATTENTION_TYPES (__post_init__), whose expansion must have num_layers entries, each one of
# GPT_NEO_LAYER_TYPES (see Config._gpt_neo).
GPT_NEO_DEFAULTS = dict(vocab_size=50257, max_position_embeddings=2048, hidden_size=2048, num_layers=24,
                        num_heads=16, window_size=256, activation_function="gelu_new",
                        layer_norm_epsilon=1e-5, tie_word_embeddings=True)
GPT_NEO_ATTENTION_TYPES = [[["global", "local"], 12]]
GPT_NEO_LAYER_TYPES = ("global", "local")
# OPTConfig's defaults (configuration_opt.py, transformers 5.12, a @strict dataclass: opt-125m's
# sizes). No attribute_map. word_embed_proj_dim (Optional) None -> hidden_size (__post_init__); every
# other field refuses null. The LayerNorms take nn.LayerNorm's default eps (OPT_LAYER_NORM_EPS: no
# config field).
OPT_DEFAULTS = dict(vocab_size=50272, hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
                    max_position_embeddings=2048, do_layer_norm_before=True, _remove_final_layer_norm=False,
                    word_embed_proj_dim=None, num_attention_heads=12, activation_function="relu",
                    enable_bias=True, layer_norm_elementwise_affine=True, tie_word_embeddings=True)
OPT_OPTIONAL = ("word_embed_proj_dim",)
OPT_LAYER_NORM_EPS = 1e-5
# OPTLearnedPositionalEmbedding.offset: position p reads row p + 2 of embed_positions.weight
OPT_POSITION_OFFSET = 2
# PhiConfig's defaults (Phi-1.5's sizes); num_key_value_heads None -> num_attention_heads;
# partial_rotary_factor 0.5 when neither the rope dict nor the top level names it.
PHI_DEFAULTS = dict(vocab_size=51200, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                    num_attention_heads=32, hidden_act="gelu_new", max_position_embeddings=2048,
                    layer_norm_eps=1e-5, tie_word_embeddings=False, qk_layernorm=False)
# Phi3Config's defaults.
PHI3_DEFAULTS = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                     num_attention_heads=32, hidden_act="silu", max_position_embeddings=4096,
                     original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                     tie_word_embeddings=False)
# DeepseekV3Config's defaults (configuration_deepseek_v3.py, transformers 5.12, a @strict dataclass:
# DeepSeek-V3's sizes). num_key_value_heads is 128 when ABSENT (a field default, not
# num_attention_heads); only an explicit null becomes num_attention_heads (__post_init__).
# attribute_map: num_local_experts -> n_routed_experts. head_dim is set to qk_rope_head_dim and
# qk_head_dim to qk_nope_head_dim + qk_rope_head_dim in __post_init__, but a head_dim / qk_head_dim
# key of config.json is set AFTER that (the extra kwargs), so it wins (see Config._deepseek_v3).
DEEPSEEK_V3_DEFAULTS = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                            num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                            n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512,
                            q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8,
                            topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True,
                            hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6,
                            tie_word_embeddings=False, rope_interleave=True, attention_bias=False)
# Fields typed Optional (null passes the strict check); every other null is refused.
DEEPSEEK_V3_OPTIONAL = ("num_key_value_heads", "q_lora_rank", "v_head_dim", "n_group", "topk_group",
                        "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob", "rope_interleave")
# DeepseekV3RMSNorm's class default eps: q_a_layernorm and kv_a_layernorm are built without an eps
# argument, so they use it whatever rms_norm_eps is (only the layer and final norms read rms_norm_eps).
DEEPSEEK_V3_LORA_NORM_EPS = 1e-6
# DeepseekV3MoE.route_tokens_to_experts: added to the sum of the k gathered weights before dividing.
DEEPSEEK_V3_NORM_EPS = 1e-20


# DeepseekV2Config's defaults (configuration_deepseek_v2.py, transformers 5.12, a @strict dataclass).
# Unlike DeepseekV3Config: num_key_value_heads defaults to None (-> num_attention_heads), head_dim is
# always overwritten with qk_rope_head_dim in __post_init__, there is no qk_head_dim field and no
# attribute_map (num_local_experts is ignored), num_experts_per_tok defaults to None.
DEEPSEEK_V2_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
                            max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                            attention_bias=False, mlp_bias=False, first_k_dense_replace=0, kv_lora_rank=512,
                            q_lora_rank=1536, n_group=None, n_routed_experts=64, n_shared_experts=2,
                            qk_nope_head_dim=128, qk_rope_head_dim=64, routed_scaling_factor=1.0, topk_group=None,
                            topk_method="greedy", v_head_dim=128, num_experts_per_tok=None,
                            moe_intermediate_size=1407)
# Fields typed Optional (null passes the strict check); every other null is refused.
DEEPSEEK_V2_OPTIONAL = ("num_key_value_heads", "q_lora_rank", "n_group", "topk_group", "topk_method",
                        "num_experts_per_tok", "norm_topk_prob", "head_dim", "pad_token_id", "bos_token_id",
                        "eos_token_id", "pretraining_tp", "attention_dropout", "rope_parameters")
# DeepseekV2Moe.route_tokens_to_experts's branches (anything else leaves it without weights)
DEEPSEEK_V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
# DeepseekV2RMSNorm's class default eps, which q_a_layernorm and kv_a_layernorm use (as DeepSeek-V3's)
DEEPSEEK_V2_LORA_NORM_EPS = 1e-6


class Config:
    """Resolved hyper-parameters, with HF defaults for optional fields."""

    # per layer: whether the layer rotates q / k (None: every layer does; smollm3's NoPE layers do not)
    rope_layers = None

    def __init__(self, cfg):
        self.raw = cfg
        mt = cfg.get("model_type")
        if mt not in ARCHS:
            raise ReferenceError(f"unknown model_type {mt!r}")
        self.arch = mt
        if mt == "gpt2":
            self.vocab_size = _get(cfg, "vocab_size", required=True)
            # GPT2Config's attribute_map aliases (hidden_size, ...) are set after its fields: an
            # alias wins where config.json has both names
            self.hidden = _get(cfg, "hidden_size", "n_embd", required=True)
            self.layers = _get(cfg, "num_hidden_layers", "n_layer", required=True)
            self.heads = _get(cfg, "num_attention_heads", "n_head", required=True)
            self.kv_heads = self.heads
            self.n_positions = _get(cfg, "max_position_embeddings", "n_positions", default=1024)
            self.inner = _get(cfg, "n_inner", default=4 * self.hidden)
            self.act = _get(cfg, "activation_function", default="gelu_new")
            self.eps = float(_get(cfg, "layer_norm_epsilon", default=1e-5))
            self.scale_attn_weights = bool(_get(cfg, "scale_attn_weights", default=True))
            self.scale_by_layer = bool(_get(cfg, "scale_attn_by_inverse_layer_idx", default=False))
            self.reorder_and_upcast = bool(_get(cfg, "reorder_and_upcast_attn", default=False))
            self.tie = bool(_get(cfg, "tie_word_embeddings", default=True))
            if self.hidden % self.heads:
                raise ReferenceError("n_embd not divisible by n_head")
            self.head_dim = self.hidden // self.heads
        elif mt == "qwen3":
            self._qwen3(cfg)
        elif mt == "olmo":
            self._olmo(cfg)
        elif mt == "olmo2":
            self._olmo2(cfg)
        elif mt == "olmo3":
            self._olmo3(cfg)
        elif mt == "smollm3":
            self._smollm3(cfg)
        elif mt == "gemma":
            self._gemma(cfg)
        elif mt == "gemma2":
            self._gemma2(cfg)
        elif mt in ("gemma3_text", "gemma3"):
            self._gemma3(cfg)
        elif mt == "gpt_neox":
            self._gpt_neox(cfg)
        elif mt == "gptj":
            self._gptj(cfg)
        elif mt == "gpt_neo":
            self._gpt_neo(cfg)
        elif mt == "opt":
            self._opt(cfg)
        elif mt == "phi":
            self._phi(cfg)
        elif mt == "phi3":
            self._phi3(cfg)
        elif mt == "gpt_oss":
            self._gpt_oss(cfg)
        elif mt == "qwen2_moe":
            self._qwen2_moe(cfg)
        elif mt == "deepseek_v3":
            self._deepseek_v3(cfg)
        elif mt == "deepseek_v2":
            self._deepseek_v2(cfg)
        elif mt in MOE_ARCHS:
            self._moe(cfg)
        else:
            self.vocab_size = _get(cfg, "vocab_size", required=True)
            self.hidden = _get(cfg, "hidden_size", required=True)
            self.layers = _get(cfg, "num_hidden_layers", required=True)
            self.heads = _get(cfg, "num_attention_heads", required=True)
            self.kv_heads = _get(cfg, "num_key_value_heads", default=self.heads)
            self.inner = _get(cfg, "intermediate_size", required=True)
            self.act = _get(cfg, "hidden_act", default="silu")
            self.eps = float(_get(cfg, "rms_norm_eps", default=1e-6))
            self.tie = bool(_get(cfg, "tie_word_embeddings", default=False))
            hd = cfg.get("head_dim")
            if hd is None:
                if self.hidden % self.heads:
                    raise ReferenceError("hidden_size not divisible by num_attention_heads")
                hd = self.hidden // self.heads
            self.head_dim = int(hd)
            if self.heads % self.kv_heads:
                raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
            # As transformers: Llama reads attention_bias / mlp_bias; Mistral has no biases and
            # Qwen2 q/k/v biases only, whatever the config says.
            llama = mt == "llama"
            self.attention_bias = (
                llama and bool(_get(cfg, "attention_bias", default=False))) or mt == "qwen2"
            self.mlp_bias = llama and bool(_get(cfg, "mlp_bias", default=False))
            self.rope = self._rope(cfg)
            self.windows = self._windows(cfg)

    def _qwen3(self, cfg):
        """Qwen3Config: every field has a default (QWEN3_DEFAULTS); head_dim is its own field,
        128 when absent (never hidden_size // num_attention_heads); attention_bias gives q, k, v
        AND o biases; no MLP bias."""
        d = QWEN3_DEFAULTS

        def get(k):
            return cfg[k] if cfg.get(k) is not None else d[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        # absent -> 32 (the dataclass default); explicit null -> num_attention_heads
        if "num_key_value_heads" not in cfg:
            self.kv_heads = d["num_key_value_heads"]
        else:
            self.kv_heads = int(_get(cfg, "num_key_value_heads", default=self.heads))
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        if "head_dim" in cfg and cfg["head_dim"] is None:
            # Qwen3Attention builds nn.Linear(hidden, heads * head_dim): null cannot run in HF
            raise ReferenceError("qwen3 head_dim is null")
        self.head_dim = int(get("head_dim"))
        if self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        self.attention_bias = bool(get("attention_bias"))
        self.mlp_bias = False
        self.rope = self._rope(cfg)
        self.windows = self._windows(cfg)

    def _olmo(self, cfg):
        """OlmoConfig (transformers 5.12, a @strict dataclass; OLMO_DEFAULTS for absent fields):
        - nulls: refused in every non-Optional field (transformers' strict validation raises);
          num_key_value_heads null or absent -> num_attention_heads; clip_qkv null -> no clamp;
        - head_dim: not an OlmoConfig field. A head_dim in config.json is used by both OlmoAttention
          (getattr(config, "head_dim", hidden // heads)) and the rotary table (getattr(..., None) or
          hidden // heads); absent -> hidden_size // num_attention_heads, floored as HF builds
          q_proj [heads * head_dim, hidden]; an explicit null is refused (OlmoAttention's scaling
          would be None ** -0.5); even and >= 2 (rotate-half RoPE);
        - norms: OlmoLayerNorm, no parameters, eps OLMO_LAYER_NORM_EPS (rms_norm_eps /
          layer_norm_eps in config.json are not read);
        - attention_bias gives q, k, v AND o biases; no MLP biases (mlp_bias is not read);
        - clip_qkv: see _clip_qkv;
        - RoPE as Llama's: rope_scaling (4.x) or rope_parameters (5.x), every rope type, the whole
          head rotated; theta 10000 when absent; a null rope_theta with no theta in the rope dict is
          refused (HF would compute base None ** ...); no sliding window."""
        get = self._strict_llama_sizes(cfg, "olmo", OLMO_DEFAULTS, OLMO_OPTIONAL, "OlmoAttention",
                                       eps_field=None)
        self.eps = OLMO_LAYER_NORM_EPS
        self.mlp_bias = False
        self.clip_qkv = _clip_qkv(cfg, "olmo")
        rcfg = dict(cfg, model_type="olmo", max_position_embeddings=int(get("max_position_embeddings")))
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rd = rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {}
        if "rope_theta" in cfg and cfg["rope_theta"] is None and rd.get("rope_theta") is None:
            raise ReferenceError("olmo rope_theta is null")
        self.rope = self._rope(rcfg)
        self.windows = [None] * self.layers

    def _olmo2(self, cfg):
        """Olmo2Config: every field has a default; num_key_value_heads None -> num_attention_heads;
        head_dim is not a config field (getattr(config, "head_dim", hidden // heads): a head_dim in
        config.json is used); attention_bias gives q, k, v and o biases; rms_norm_eps 1e-5."""
        d = OLMO2_DEFAULTS

        def get(k):
            return cfg[k] if cfg.get(k) is not None else d[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(_get(cfg, "num_key_value_heads", default=self.heads))
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        hd = cfg.get("head_dim")
        if hd is None:
            if self.hidden % self.heads:
                raise ReferenceError("hidden_size not divisible by num_attention_heads")
            hd = self.hidden // self.heads
        self.head_dim = int(hd)
        if self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        self.attention_bias = bool(get("attention_bias"))
        self.mlp_bias = False
        self.rope = self._rope(cfg)
        self.windows = [None] * self.layers

    def _strict_llama_sizes(self, cfg, arch, d, optional, attn, eps_field="rms_norm_eps"):
        """What OLMo, OLMo 3 and SmolLM3 read alike from their @strict config classes (defaults `d`
        for absent fields; a null refused unless the field is in `optional`): the sizes, kv heads
        (null: num_attention_heads), activation (one ACT2FN has), eps (from `eps_field`; None: not
        read, OLMo's norms have their own), tying, head_dim (not a config field,
        but a head_dim in config.json is used by `attn` and the rotary table; absent: hidden //
        heads, floored as HF builds q_proj; null refused; even and >= 2 for rotate-half RoPE) and
        attention_bias (q, k, v and o biases). Returns the getter."""
        def get(k):
            if k not in cfg:
                return d[k]
            if cfg[k] is None and k not in optional:
                raise ReferenceError(f"{arch} {k} is null (transformers' strict config refuses it)")
            return cfg[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        kv = get("num_key_value_heads")
        self.kv_heads = self.heads if kv is None else int(kv)
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        _act(self.act)  # refuses an activation ACT2FN has not (here rather than at the first forward)
        if eps_field:
            self.eps = float(get(eps_field))
        self.tie = bool(get("tie_word_embeddings"))
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        if "head_dim" in cfg:
            if cfg["head_dim"] is None:
                raise ReferenceError(f"{arch} head_dim is null ({attn} cannot use it)")
            self.head_dim = int(cfg["head_dim"])
        else:
            self.head_dim = self.hidden // self.heads
        if self.head_dim < 2 or self.head_dim % 2:
            raise ReferenceError(f"head_dim {self.head_dim} must be even and >= 2 (RoPE)")
        self.attention_bias = bool(get("attention_bias"))
        return get

    def _olmo3(self, cfg):
        """Olmo3Config (transformers 5.12, a @strict dataclass; OLMO3_DEFAULTS for absent fields) as
        Olmo3Model, Olmo3Attention and Olmo3RotaryEmbedding use it:
        - nulls: refused in every field not in OLMO3_OPTIONAL (the strict check raises);
          num_key_value_heads null or absent -> num_attention_heads (__post_init__);
        - head_dim: not an Olmo3Config field. A head_dim in config.json is used by both Olmo3Attention
          (getattr(config, "head_dim", hidden // heads)) and the rotary table (getattr(..., None) or
          hidden // heads); absent -> hidden_size // num_attention_heads, floored as HF builds q_proj
          [heads * head_dim, hidden]; an explicit null is refused (Olmo3Attention's scaling would be
          None ** -0.5); even and >= 2 (rotate-half RoPE). q_norm / k_norm are RMSNorms over the whole
          projections (heads * head_dim, kv_heads * head_dim), so any head_dim loads;
        - rms_norm_eps (default 1e-5) for every Olmo3RMSNorm (q_norm, k_norm, post_attention_layernorm,
          post_feedforward_layernorm, model.norm);
        - attention_bias gives q, k, v AND o biases; no MLP biases (mlp_bias is not read);
        - windows: layer_types (Optional) null or absent -> "full_attention" on the layers with
          (i + 1) % 4 == 0, "sliding_attention" elsewhere (Olmo3Config.__post_init__); a given list must
          have num_hidden_layers entries (validate_layer_type), each full_attention or sliding_attention
          (validate_layer_type would pass any of ALLOWED_LAYER_TYPES, chunked_attention say, but
          Olmo3Model has masks for these two only: a KeyError in forward). A sliding layer attends to
          keys j with i - sliding_window < j <= i (sliding_window_overlay and the causal mask), a full
          layer causally. sliding_window (Optional, default 4096): an integer; null is refused WHATEVER
          the layer types: Olmo3Model.forward builds the sliding mask on every forward, and
          create_sliding_window_causal_mask raises without a window even when no layer slides (as
          gpt_oss / qwen2_moe here; Gemma 2 / 3's models raise the same way, but their path here lets
          a null through when no layer slides). A sliding layer with a window < 1 is refused (HF would
          mask every key and the eager softmax would spread over all of them, future ones included);
        - RoPE: ONE Olmo3RotaryEmbedding (Gemma2RotaryEmbedding) for the whole model, read as Llama's:
          rope_scaling + rope_theta (4.x) or rope_parameters (5.x), every rope type of _rope, so a yarn
          (or any) scaling rotates the sliding layers too (modular_olmo3.py's comment "RoPE scaling is
          not applied to sliding window attention layers" does not describe the code); theta 10000 when
          absent (default_theta); a null theta (top level with none in the rope dict, or in the dict) is
          refused. A rope dict with per-layer-type entries ({"full_attention": {...}, ...}, Gemma 3's
          form) is refused: transformers 5.12 silently ignores them (convert_rope_params_to_dict adds a
          rope_theta key beside them, so standardize_rope_params never takes its per-layer branch, and
          Olmo3RotaryEmbedding runs default RoPE with the top-level theta, 10000 when absent; only a
          warning, "Unrecognized keys in `rope_parameters`");
        - precision (not exercised here, all float32): Gemma2RotaryEmbedding returns cos / sin cast to
          the hidden states' dtype, so under a 16-bit dtype OLMo 3 rotates q / k in that dtype, where
          OLMo 2 (float32 tables; q * cos promotes, the result cast back) rotates in float32."""
        get = self._strict_llama_sizes(cfg, "olmo3", OLMO3_DEFAULTS, OLMO3_OPTIONAL, "Olmo3Attention")
        self.mlp_bias = False
        # windows
        types = get("layer_types")
        if types is None:
            types = ["sliding_attention" if (i + 1) % OLMO3_FULL_EVERY else "full_attention"
                     for i in range(self.layers)]
        if not isinstance(types, list) or len(types) != self.layers:
            raise ReferenceError(f"layer_types must list {self.layers} layer types")
        bad = [t for t in types if t not in LAYER_TYPES]
        if bad:
            raise ReferenceError(f"unsupported layer type {bad[0]!r}")
        sw = get("sliding_window")
        if sw is None:
            raise ReferenceError("olmo3 sliding_window is null (Olmo3Model builds its sliding mask on every "
                                 "forward: create_sliding_window_causal_mask raises)")
        if isinstance(sw, bool) or not isinstance(sw, int):
            raise ReferenceError(f"olmo3 sliding_window {sw!r} must be an integer")
        if "sliding_attention" in types and sw < 1:
            raise ReferenceError(f"sliding_attention layers need a sliding_window >= 1, not {sw}")
        self.layer_types = list(types)
        self.windows = [sw if t == "sliding_attention" else None for t in types]
        # RoPE: one table for every layer
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rd = rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {}
        if any(k in LAYER_TYPES for k in rd):
            raise ReferenceError("olmo3 rope parameters keyed by layer type (transformers ignores them: one "
                                 "rope dict for every layer)")
        if ("rope_theta" in cfg and cfg["rope_theta"] is None and rd.get("rope_theta") is None) or (
                "rope_theta" in rd and rd["rope_theta"] is None):
            raise ReferenceError("olmo3 rope_theta is null")
        rcfg = dict(cfg, model_type="olmo3", max_position_embeddings=int(get("max_position_embeddings")))
        self.rope = self._rope(rcfg)

    def _smollm3(self, cfg):
        """SmolLM3Config (transformers 5.12, a @strict dataclass; SMOLLM3_DEFAULTS for absent fields) as
        SmolLM3Model, SmolLM3Attention and SmolLM3RotaryEmbedding (Qwen2's) use it. Llama's layer:
        - nulls: refused in every field not in SMOLLM3_OPTIONAL (the strict check raises);
          num_key_value_heads: 4 when absent, num_attention_heads when null (__post_init__);
        - head_dim: not a SmolLM3Config field. A head_dim in config.json is used by both SmolLM3Attention
          (getattr(config, "head_dim", hidden // heads)) and the rotary table; absent -> hidden_size //
          num_attention_heads, floored; null is refused (scaling None ** -0.5); even and >= 2 (RoPE);
        - attention_bias gives q, k, v AND o biases; mlp_bias gate / up / down biases; tied by default;
        - NoPE (self.rope_layers, one bool per layer): no_rope_layers null or absent -> layer i uses
          RoPE iff (i + 1) % no_rope_layer_interval != 0 (default 4: layers 3, 7, ... are NoPE;
          interval 1: every layer NoPE; interval 0 refused: HF divides by zero). A given list needs
          AT LEAST num_hidden_layers entries (HF indexes it per layer: a shorter one is an IndexError;
          the entries past the last layer are never read, so a longer list is accepted and its tail
          ignored). Entries must be 0 (NoPE) or 1 (RoPE): HF's strict check refuses bools and floats
          and tests only the truth of an int (2 or -1 would rotate); we refuse anything but 0 / 1.
          A NoPE layer leaves q and k exactly as projected (SmolLM3Attention skips
          apply_rotary_pos_emb), attention still causal and scaled by head_dim ** -0.5;
        - windows: layer_types null or absent -> "sliding_attention" on the NoPE layers when
          use_sliding_window and sliding_window is not None, else "full_attention" everywhere (so
          use_sliding_window with a null window is all full, and runs). A given list must have
          num_hidden_layers entries, each full_attention or sliding_attention (chunked_attention passes
          validate_layer_type but SmolLM3Model has no mask for it: KeyError). The eager and SDPA paths
          slide exactly the layers layer_types calls sliding (the mask mapping is keyed by layer type;
          SmolLM3Attention.sliding_window, which also requires use_sliding_window, is read only by
          flash attention). So a sliding layer with use_sliding_window false is REFUSED: eager / SDPA
          slide it, flash attention would not (transformers 5.12 measured: eager and SDPA slide it). A
          sliding layer needs an integer sliding_window >= 1 (null or 0: create_sliding_window_causal_mask
          raises; the sliding mask is only built when some layer slides, so an unused null / 0 window
          is fine). Keys j with i - sliding_window < j <= i, as the other families;
        - RoPE: ONE table for the RoPE layers, read as Llama's (rope_scaling + rope_theta or
          rope_parameters, every rope type of _rope); theta 2e6 when absent (default_theta); a null
          theta refused; partial_rotary_factor != 1 refused (the default table ignores it in HF while
          yarn & co. would honour it);
        - precision (not exercised here, all float32): SmolLM3RotaryEmbedding returns cos / sin cast to
          the hidden states' dtype, so under a 16-bit dtype q / k are rotated in that dtype."""
        get = self._strict_llama_sizes(cfg, "smollm3", SMOLLM3_DEFAULTS, SMOLLM3_OPTIONAL, "SmolLM3Attention")
        self.mlp_bias = bool(get("mlp_bias"))
        # NoPE layers
        nrl = get("no_rope_layers")
        if nrl is None:
            interval = get("no_rope_layer_interval")
            if isinstance(interval, bool) or not isinstance(interval, int) or interval == 0:
                raise ReferenceError(f"smollm3 no_rope_layer_interval {interval!r} must be a non-zero integer")
            nrl = [int((i + 1) % interval != 0) for i in range(self.layers)]
        if not isinstance(nrl, list) or len(nrl) < self.layers:
            raise ReferenceError(f"no_rope_layers must list at least {self.layers} entries")
        bad = [x for x in nrl if isinstance(x, bool) or x not in (0, 1) or not isinstance(x, int)]
        if bad:
            raise ReferenceError(f"no_rope_layers entries must be 0 or 1, not {bad[0]!r}")
        self.rope_layers = [bool(x) for x in nrl[:self.layers]]
        # windows
        use_sw = get("use_sliding_window")
        if not isinstance(use_sw, bool):
            raise ReferenceError(f"smollm3 use_sliding_window {use_sw!r} must be a boolean")
        sw = get("sliding_window")
        types = get("layer_types")
        if types is None:
            types = ["sliding_attention" if use_sw and sw is not None and not r else "full_attention"
                     for r in self.rope_layers]
        if not isinstance(types, list) or len(types) != self.layers:
            raise ReferenceError(f"layer_types must list {self.layers} layer types")
        bad = [t for t in types if t not in LAYER_TYPES]
        if bad:
            raise ReferenceError(f"unsupported layer type {bad[0]!r}")
        if "sliding_attention" in types:
            if not use_sw:
                raise ReferenceError("smollm3 sliding_attention layers with use_sliding_window false (eager / "
                                     "SDPA slide them, flash attention would not)")
            if sw is None or isinstance(sw, bool) or not isinstance(sw, int) or sw < 1:
                raise ReferenceError(f"sliding_attention layers need an integer sliding_window >= 1, not {sw!r}")
        self.layer_types = list(types)
        self.windows = [sw if t == "sliding_attention" else None for t in types]
        # RoPE: one table for the RoPE layers
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rd = rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {}
        if any(k in LAYER_TYPES for k in rd):
            raise ReferenceError("smollm3 rope parameters keyed by layer type (one rope dict for every layer)")
        if ("rope_theta" in cfg and cfg["rope_theta"] is None and rd.get("rope_theta") is None) or (
                "rope_theta" in rd and rd["rope_theta"] is None):
            raise ReferenceError("smollm3 rope_theta is null")
        theta = rd.get("rope_theta", cfg.get("rope_theta"))
        rcfg = dict(cfg, model_type="smollm3", max_position_embeddings=int(get("max_position_embeddings")),
                    rope_theta=SMOLLM3_DEFAULTS["rope_theta"] if theta is None else theta)
        self.rope = self._rope(rcfg)

    def _gemma(self, cfg):
        """GemmaConfig (transformers 5.12, a @strict dataclass; GEMMA_DEFAULTS for absent fields):
        - nulls: refused in every non-Optional field (transformers' strict validation raises; 4.x
          would build q_proj / repeat_kv from a None and fail too);
        - head_dim: config.json's, 256 when absent (GemmaConfig's default, NOT hidden_size //
          num_attention_heads; GemmaAttention's getattr fallback never runs); even (RoPE halves);
          num_key_value_heads: 16 when absent (NOT num_attention_heads);
        - attention_bias gives q, k, v AND o biases; no MLP biases; tied by default;
        - RoPE as Llama's: rope_scaling (4.x) or rope_parameters (5.x), every rope type, the whole
          head rotated; rope_theta 10000 when absent (default_theta); a null rope_theta with no
          theta in the rope dict is refused (transformers would compute with None);
        - no sliding window, no soft-caps, scaling head_dim ** -0.5;
        - use_bidirectional_attention (Optional, default None): true is refused. transformers 5.12
          only turns GemmaAttention.is_causal off with it; the eager path still gets
          create_causal_mask's causal mask while SDPA / flash would attend both ways, so the
          model is not well defined;
        - activation, OUR RULE (shared with actcap's C++): hidden_activation when config.json has it
          non-null, else hidden_act, else gelu_pytorch_tanh. transformers 5.12's GemmaMLP reads
          only hidden_act (GemmaConfig has no hidden_activation field; it stays an extra
          attribute); transformers 4.x's after huggingface/transformers#29402 read
          hidden_activation, falling back to gelu_pytorch_tanh (with a warning) and ignoring
          hidden_act. So a config with only "hidden_act": "gelu" runs exact gelu here and in
          transformers 5, the tanh approximation in 4.4x. Gemma 1 configs may carry the
          legacy "hidden_act": "gelu" next to "hidden_activation": "gelu_pytorch_tanh", the
          activation the models were trained with: transformers 5.12 runs such a config with
          exact gelu, this rule with the tanh approximation. Where the two fields
          are equal (what actcap's init-model writes) every version agrees."""
        d = GEMMA_DEFAULTS

        def get(k):
            if k not in cfg:
                return d[k]
            if cfg[k] is None:
                raise ReferenceError(f"gemma {k} is null (transformers' strict config refuses it)")
            return cfg[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(get("num_key_value_heads"))
        self.inner = int(get("intermediate_size"))
        self.act = _get(cfg, "hidden_activation", "hidden_act", default=GEMMA_ACT_DEFAULT)
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        self.head_dim = int(get("head_dim"))
        if self.head_dim < 2 or self.head_dim % 2:
            raise ReferenceError(f"head_dim {self.head_dim} must be even and >= 2 (RoPE)")
        self.attention_bias = bool(get("attention_bias"))
        self.mlp_bias = False
        if cfg.get("use_bidirectional_attention"):
            raise ReferenceError("use_bidirectional_attention is not causal")
        rcfg = dict(cfg, model_type="gemma", max_position_embeddings=int(get("max_position_embeddings")))
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rd = rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {}
        if "rope_theta" in cfg and cfg["rope_theta"] is None and rd.get("rope_theta") is None:
            raise ReferenceError("gemma rope_theta is null")
        self.rope = self._rope(rcfg)
        self.windows = [None] * self.layers

    def _gemma_common(self, cfg, d, pattern):
        """What Gemma2Config and Gemma3TextConfig share, every field defaulting to `d`: sizes,
        hidden_activation (the MLP's; hidden_act is not read), eps, tying, head_dim, q/k/v/o biases,
        query_pre_attn_scalar, and the windows: layer_types, by default "full_attention" on the
        layers with (i + 1) % pattern == 0 and "sliding_attention" elsewhere; sliding_window may be
        null (off) unless a layer slides. Returns the readers get (null -> default) and get_nullable
        (only absent -> default)."""
        def get(k):
            return cfg[k] if cfg.get(k) is not None else d[k]

        def get_nullable(k):
            return cfg[k] if k in cfg else d[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(get("num_key_value_heads"))
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_activation")
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        self.head_dim = int(get("head_dim"))
        if self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        self.attention_bias = bool(get("attention_bias"))
        self.mlp_bias = False
        self.query_pre_attn_scalar = float(get("query_pre_attn_scalar"))
        sw = get_nullable("sliding_window")
        types = cfg.get("layer_types")
        if types is None:
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(self.layers)]
        if not isinstance(types, list) or len(types) != self.layers:
            raise ReferenceError(f"layer_types must list {self.layers} layer types")
        bad = [t for t in types if t not in LAYER_TYPES]
        if bad:
            raise ReferenceError(f"unsupported layer type {bad[0]!r}")
        if "sliding_attention" in types and sw is None:
            raise ReferenceError("sliding_attention layers but sliding_window is null")
        self.layer_types = list(types)
        self.windows = [sw if t == "sliding_attention" else None for t in types]
        return get, get_nullable

    def _gemma2(self, cfg):
        """Gemma2Config (GEMMA2_DEFAULTS): layer_types defaults to sliding_attention on even layers;
        the soft-caps may be null (off); hidden_size must be a multiple of num_attention_heads
        (validate_architecture)."""
        _, get_nullable = self._gemma_common(cfg, GEMMA2_DEFAULTS, 2)
        if self.hidden % self.heads:
            raise ReferenceError("hidden_size not divisible by num_attention_heads")
        self.attn_softcap = get_nullable("attn_logit_softcapping")
        self.final_softcap = get_nullable("final_logit_softcapping")
        self.rope = self._rope(cfg)

    def _gemma3(self, cfg):
        """Gemma3TextConfig (every field has a default, GEMMA3_DEFAULTS), directly (gemma3_text) or
        as Gemma3Config's text_config (gemma3: absent -> all defaults; its own tie_word_embeddings,
        when set, decides the tying). layer_types defaults to "full_attention" on layers with
        (i + 1) % sliding_window_pattern == 0, "sliding_attention" elsewhere. RoPE as
        Gemma3TextConfig.convert_rope_params_to_dict: rope_parameters keyed by layer type (5.x) or
        the defaults {"rope_type": "default"}; rope_scaling updates the full_attention entry;
        rope_theta (1e6) and rope_local_base_freq (1e4) set rope_theta where an entry lacks it.
        attn_logit_softcapping is never applied (Gemma3Attention does not pass it);
        final_logit_softcapping caps Gemma3ForCausalLM's logits only (Gemma3ForConditionalGeneration's
        forward does not cap)."""
        top = cfg
        self.multimodal = cfg.get("model_type") == "gemma3"
        self.arch = "gemma3"
        if self.multimodal:
            cfg = cfg.get("text_config") or {}
            if not isinstance(cfg, dict):
                raise ReferenceError("text_config must be an object")
        self.prefix = "model.language_model" if self.multimodal else "model"
        pattern = int(cfg.get("sliding_window_pattern") or GEMMA3_DEFAULTS["sliding_window_pattern"])
        get, get_nullable = self._gemma_common(cfg, GEMMA3_DEFAULTS, pattern)
        if self.multimodal and top.get("tie_word_embeddings") is not None:
            self.tie = bool(top["tie_word_embeddings"])
        if get("use_bidirectional_attention"):
            raise ReferenceError("use_bidirectional_attention is not causal")
        self.attn_softcap = None  # read by HF's config, never used by its attention
        self.final_softcap = None if self.multimodal else get_nullable("final_logit_softcapping")
        mp = int(get("max_position_embeddings"))
        rp = cfg.get("rope_parameters")
        full = dict((rp or {}).get("full_attention") or {"rope_type": "default"})
        local = dict((rp or {}).get("sliding_attention") or {"rope_type": "default"})
        rs = cfg.get("rope_scaling")
        if rs is not None:
            if rs.get("type", "default") != "default" and "rope_type" not in rs:
                # 4.x's Gemma3RotaryEmbedding reads `type`; 5.x merges it into {"rope_type": "default"}
                raise ReferenceError("rope_scaling with a legacy `type`: transformers 4.x and 5.x disagree")
            full.update(rs)
        if full.get("rope_theta") is None:
            full["rope_theta"] = get("rope_theta")
        if local.get("rope_theta") is None:
            local["rope_theta"] = get("rope_local_base_freq")
        self.rope = self._rope({"rope_parameters": full, "max_position_embeddings": mp,
                                "model_type": "gemma3_text"})
        self.local_rope = self._rope({"rope_parameters": local, "max_position_embeddings": mp,
                                      "model_type": "gemma3_text"})

    def _moe(self, cfg):
        """MixtralConfig / Qwen3MoeConfig (transformers 5.x, @strict dataclasses): an absent field
        takes MIXTRAL_DEFAULTS / QWEN3_MOE_DEFAULTS; an explicit null in a field that is not Optional
        fails HF's strict validation, so it is refused here (num_key_value_heads null is NOT
        num_attention_heads, as 4.x had it).
        - head_dim: Mixtral getattr(config, "head_dim", None) or hidden // heads (null -> the
          quotient); Qwen3-MoE getattr(config, "head_dim", hidden // heads) (absent -> the
          quotient, NOT Qwen3's 128; null cannot build q_proj). The quotient is floored (HF builds
          q_proj [heads * head_dim, hidden] even when that is not hidden); head_dim must be even
          (RoPE's cat(freqs, freqs)).
        - biases: Mixtral none; Qwen3-MoE attention_bias on q, k, v and o; no MLP / expert biases.
        - windows: Mixtral sliding_window (default None) on every layer; Qwen3-MoE sliding_window
          (default 4096) only if use_sliding_window, then on every layer.
        - experts: both map num_experts to num_local_experts (attribute_map; OLMoE the other way);
          transformers 5 writes num_local_experts, the Hub's Qwen3-MoE files num_experts. With both
          present Mixtral keeps num_experts, OLMoE num_local_experts (the aliases, set last) and
          Qwen3-MoE num_local_experts (as their config classes do).
          Mixtral: every layer sparse, experts of intermediate_size, top-k weights ALWAYS
          renormalised. Qwen3-MoE: layer i is sparse iff i not in mlp_only_layers and num_experts >
          0 and (i + 1) % decoder_sparse_step == 0 (evaluated in that order, as
          Qwen3MoeDecoderLayer), else a dense Qwen3MoeMLP of intermediate_size; experts of
          moe_intermediate_size; renormalised only if norm_topk_prob."""
        mixtral, olmoe = self.arch == "mixtral", self.arch == "olmoe"
        d = MIXTRAL_DEFAULTS if mixtral else OLMOE_DEFAULTS if olmoe else QWEN3_MOE_DEFAULTS

        def get(k):
            if olmoe and k == "num_key_value_heads" and cfg.get(k) is None:
                return get("num_attention_heads")  # OlmoeConfig.__post_init__
            if k not in cfg:
                return d[k]
            if cfg[k] is None:
                raise ReferenceError(f"{self.arch} {k} is null (transformers' strict config refuses it)")
            return cfg[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(get("num_key_value_heads"))
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        if mixtral:
            hd = cfg.get("head_dim") or self.hidden // self.heads
        elif olmoe:
            # OlmoeAttention: getattr(config, "head_dim", hidden // heads), but q_norm is
            # RMSNorm(hidden_size) and k_norm RMSNorm(hidden // heads * kv_heads) over the whole
            # projections: only head_dim = hidden // heads (with heads dividing hidden) loads.
            hd = cfg.get("head_dim", self.hidden // self.heads)
            if hd is None or hd * self.heads != self.hidden:
                raise ReferenceError("olmoe needs head_dim * num_attention_heads == hidden_size")
            self.clip_qkv = _clip_qkv(cfg, "olmoe")  # Optional: null is no clamping
        elif "head_dim" in cfg:
            if cfg["head_dim"] is None:
                raise ReferenceError("qwen3_moe head_dim is null (Qwen3MoeAttention cannot build q_proj)")
            hd = cfg["head_dim"]
        else:
            hd = self.hidden // self.heads
        self.head_dim = int(hd)
        if self.head_dim < 2 or self.head_dim % 2:
            raise ReferenceError(f"head_dim {self.head_dim} must be even and >= 2 (RoPE)")
        self.attention_bias = False if mixtral else bool(get("attention_bias"))
        self.mlp_bias = False
        get("max_position_embeddings")  # refuses a null
        theta_cfg = dict(cfg, rope_theta=get("rope_theta"), model_type=self.arch)
        self.rope = self._rope(theta_cfg)
        if mixtral:
            sw = cfg.get("sliding_window")
        elif olmoe:
            sw = None  # OlmoeConfig has no sliding_window
        else:
            sw = (cfg["sliding_window"] if "sliding_window" in cfg else d["sliding_window"]) \
                if get("use_sliding_window") else None
        if sw is not None and int(sw) < 1:
            raise ReferenceError(f"sliding_window {sw} must be >= 1")
        self.windows = [sw] * self.layers
        # experts
        ne, nle = cfg.get("num_experts"), cfg.get("num_local_experts")
        if "num_experts" in cfg and ne is None or "num_local_experts" in cfg and nle is None:
            raise ReferenceError(f"{self.arch} num_experts / num_local_experts is null")
        first = (ne, nle) if mixtral else (nle, ne)
        E = next((v for v in first if v is not None), d["num_local_experts"])
        self.experts = int(E)
        self.top_k = int(get("num_experts_per_tok"))
        if mixtral:
            self.moe_inner = self.inner
            self.norm_topk = True
            self.sparse = [True] * self.layers
        elif olmoe:  # every layer an OlmoeSparseMoeBlock of intermediate_size experts
            self.moe_inner = self.inner
            self.norm_topk = bool(get("norm_topk_prob"))
            self.sparse = [True] * self.layers
        else:
            self.moe_inner = int(get("moe_intermediate_size"))
            self.norm_topk = bool(get("norm_topk_prob"))
            self.sparse = _sparse_layers(self.layers, cfg.get("mlp_only_layers"), self.experts,
                                         int(get("decoder_sparse_step")))
        if any(self.sparse) and not 1 <= self.top_k <= self.experts:
            raise ReferenceError(
                f"num_experts_per_tok {self.top_k} must be in 1..num_experts ({self.experts})")

    def _qwen2_moe(self, cfg):
        """Qwen2MoeConfig (transformers 5.12, a @strict dataclass; QWEN2_MOE_DEFAULTS for absent
        fields). An explicit null in a non-Optional field fails HF's strict validation and is
        refused; so is a null num_key_value_heads (Optional, but Qwen2MoeAttention divides by it).
        - head_dim: config.json's when present (null refused: Qwen2MoeAttention's getattr would
          return None), else hidden // heads (floored, as HF builds q_proj [heads * head_dim,
          hidden]); even and >= 2 (RoPE).
        - biases: q / k / v with qkv_bias (default True; an attention_bias key is not read); o_proj,
          the router, the experts, the shared expert and its gate never.
        - experts: num_experts (no alias; num_local_experts is ignored); layer i is a
          Qwen2MoeSparseMoeBlock iff i not in mlp_only_layers and num_experts > 0 and
          (i + 1) % decoder_sparse_step == 0 (_sparse_layers), else Qwen2MoeMLP(intermediate_size).
          Routed experts of moe_intermediate_size, renormalised top-k only with norm_topk_prob; a
          shared expert of shared_expert_intermediate_size on every sparse layer.
        - windows: see _qwen2_moe_windows."""
        d = QWEN2_MOE_DEFAULTS

        def get(k):
            if k not in cfg:
                return d[k]
            if cfg[k] is None:
                raise ReferenceError(f"qwen2_moe {k} is null (transformers cannot build or run it)")
            return cfg[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(get("num_key_value_heads"))
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        _act(self.act)  # refuses an activation ACT2FN has not (here rather than at the first forward)
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        if "head_dim" in cfg:
            if cfg["head_dim"] is None:
                raise ReferenceError("qwen2_moe head_dim is null (Qwen2MoeAttention cannot build q_proj)")
            hd = cfg["head_dim"]
        else:
            hd = self.hidden // self.heads
        self.head_dim = int(hd)
        if self.head_dim < 2 or self.head_dim % 2:
            raise ReferenceError(f"head_dim {self.head_dim} must be even and >= 2 (RoPE)")
        self.attention_bias = bool(get("qkv_bias"))  # q, k, v only
        self.mlp_bias = False
        get("max_position_embeddings")  # refuses a null
        self.rope = self._rope(dict(cfg, rope_theta=get("rope_theta"), model_type=self.arch))
        self.windows = self._qwen2_moe_windows(cfg, get)
        self.experts = int(get("num_experts"))
        self.top_k = int(get("num_experts_per_tok"))
        self.moe_inner = int(get("moe_intermediate_size"))
        self.shared_inner = int(get("shared_expert_intermediate_size"))
        self.norm_topk = bool(get("norm_topk_prob"))
        if self.moe_inner < 0 or self.shared_inner < 0 or self.inner < 0:
            raise ReferenceError("negative intermediate size")
        self.sparse = _sparse_layers(self.layers, cfg.get("mlp_only_layers"), self.experts,
                                     int(get("decoder_sparse_step")))
        if any(self.sparse) and not 1 <= self.top_k <= self.experts:
            raise ReferenceError(
                f"num_experts_per_tok {self.top_k} must be in 1..num_experts ({self.experts})")

    def _qwen2_moe_windows(self, cfg, get):
        """Qwen2MoeConfig.__post_init__ and Qwen2MoeModel, exactly:
          sliding_window = config sliding_window (default 4096) if use_sliding_window else 0;
          layer_types = config layer_types if given (non-null), else layer i is "sliding_attention"
            iff (i + 1) % 2 (the EVEN layers 0, 2, 4, ...) and i < max_window_layers (default 28)
            and use_sliding_window, else "full_attention";
          a "sliding_attention" layer attends to keys j with i - sliding_window < j <= i, a
            "full_attention" layer causally.
        NOT Qwen2's rule (there: every layer i >= max_window_layers slides). transformers 5 writes
        layer_types (and sliding_window 0 when use_sliding_window is false) into config.json, so a
        saved file carries its own list. Refused: use_sliding_window with a null sliding_window
        (Qwen2MoeModel builds the sliding mask on every forward, which then raises, even when no
        layer slides); a sliding layer whose window is < 1 (0 when use_sliding_window is false: HF
        would mask every key and its eager softmax would spread over all of them, future ones
        included); layer types other than full / sliding (Qwen2MoeModel has masks for those two
        only) and a list whose length is not num_hidden_layers."""
        use = bool(get("use_sliding_window"))
        mwl = int(get("max_window_layers"))  # non-Optional: a null is refused even when unused
        sw = cfg["sliding_window"] if "sliding_window" in cfg else QWEN2_MOE_DEFAULTS["sliding_window"]
        if not use:
            sw = 0
        elif sw is None:
            raise ReferenceError("qwen2_moe use_sliding_window with a null sliding_window (HF's "
                                 "create_sliding_window_causal_mask raises on every forward)")
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            layer_types = ["sliding_attention" if (i + 1) % 2 and i < mwl and use else "full_attention"
                           for i in range(self.layers)]
        if not isinstance(layer_types, list) or len(layer_types) != self.layers:
            raise ReferenceError(f"layer_types must list {self.layers} layer types")
        bad = [t for t in layer_types if t not in LAYER_TYPES]
        if bad:
            raise ReferenceError(f"unsupported layer type {bad[0]!r}")
        if "sliding_attention" in layer_types and int(sw) < 1:
            raise ReferenceError(f"qwen2_moe sliding_attention layers with sliding_window {sw} "
                                 "(use_sliding_window false gives 0)")
        return [int(sw) if t == "sliding_attention" else None for t in layer_types]

    def _gpt_oss(self, cfg):
        """GptOssConfig (transformers 5.x, a @strict dataclass; GPT_OSS_DEFAULTS for absent fields).
        - nulls: every non-Optional field refuses null (num_key_value_heads and head_dim too: the
          strict check runs before __post_init__ could fill them); sliding_window is Optional, but
          GptOssModel builds the sliding-window mask on every forward, which raises without one
          (even when no layer slides); a sliding layer's window must be >= 1 (refused here).
        - head_dim: config.json's (default 64, never hidden // heads unless given so); even (the
          RoPE halves); q_proj is [heads * head_dim, hidden].
        - num_experts is an alias of num_local_experts (attribute_map); with both present
          num_experts wins (as GptOssConfig resolves it).
        - layer_types (validated: one per layer, full_attention / sliding_attention here), default
          "sliding_attention" on even layers ((i + 1) % 2), "full_attention" on odd; the window
          applies to the sliding layers only.
        - attention_bias (default true) gives q, k, v and o biases; the router and the experts
          always have biases; every layer is sparse: experts of intermediate_size, top-k on the
          router logits, weights softmax(top-k logits) (= the renormalised top-k of the full
          softmax: norm_topk).
        - RoPE: rope_scaling (4.x, the Hub's openai/gpt-oss-* files) or rope_parameters (5.x); with
          neither (null or absent) GPT_OSS_ROPE (YaRN, factor 32, truncate false, original 4096);
          rope_theta (top level or in the dict) defaults to 150000. rotate-half RoPE over the whole
          head (a partial_rotary_factor cannot run in HF).
        - quantization_config: absent / null, or quant_method "mxfp4" (self.mxfp4: the experts'
          gate_up_proj / down_proj are stored as _blocks / _scales and dequantized at load, as
          transformers does without triton kernels); anything else is refused.
        hidden_act, swiglu_limit, experts_per_token, initial_context_length and
        router_aux_loss_coef are not read (HF's experts hard-code limit 7.0 and alpha 1.702)."""
        d = GPT_OSS_DEFAULTS

        def get(k):
            if k not in cfg:
                return d[k]
            if cfg[k] is None:
                raise ReferenceError(f"gpt_oss {k} is null (transformers' strict config refuses it)")
            return cfg[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(get("num_key_value_heads"))
        self.inner = int(get("intermediate_size"))
        self.act = None  # GptOssExperts' own clamped SwiGLU (hidden_act is not read)
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        self.head_dim = int(get("head_dim"))
        if self.head_dim < 2 or self.head_dim % 2:
            raise ReferenceError(f"head_dim {self.head_dim} must be even and >= 2 (RoPE)")
        self.attention_bias = bool(get("attention_bias"))
        self.mlp_bias = False
        get("max_position_embeddings")  # refuses a null
        # RoPE: rope_scaling or rope_parameters, else GptOssConfig's YaRN default
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rcfg = dict(cfg, model_type="gpt_oss")
        if not (isinstance(rs, dict) and rs) and rp is None:
            rcfg["rope_parameters"] = dict(GPT_OSS_ROPE)
        if "rope_theta" in cfg and cfg["rope_theta"] is None and not (
                (rs if isinstance(rs, dict) and rs else rcfg["rope_parameters"] or {}).get("rope_theta")):
            raise ReferenceError("gpt_oss rope_theta is null")
        rcfg["rope_theta"] = d["rope_theta"] if cfg.get("rope_theta") is None else cfg["rope_theta"]
        self.rope = self._rope(rcfg)
        # layers
        types = cfg.get("layer_types")
        if types is None:
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(self.layers)]
        if not isinstance(types, list) or len(types) != self.layers:
            raise ReferenceError(f"layer_types must list {self.layers} layer types")
        bad = [t for t in types if t not in LAYER_TYPES]
        if bad:
            raise ReferenceError(f"unsupported layer type {bad[0]!r}")
        sw = cfg["sliding_window"] if "sliding_window" in cfg else d["sliding_window"]
        if sw is None:  # GptOssModel builds the sliding mask whatever the layer types: HF raises
            raise ReferenceError("gpt_oss sliding_window is null (transformers cannot build its sliding mask)")
        if "sliding_attention" in types and int(sw) < 1:
            raise ReferenceError(f"sliding_attention layers need a sliding_window >= 1, not {sw!r}")
        self.layer_types = list(types)
        self.windows = [int(sw) if t == "sliding_attention" else None for t in types]
        # experts
        ne, nle = cfg.get("num_experts"), cfg.get("num_local_experts")
        if "num_experts" in cfg and ne is None or "num_local_experts" in cfg and nle is None:
            raise ReferenceError("gpt_oss num_experts / num_local_experts is null")
        self.experts = int(next((v for v in (ne, nle) if v is not None), d["num_local_experts"]))
        self.top_k = int(get("num_experts_per_tok"))
        self.moe_inner = self.inner
        self.norm_topk = True
        self.sparse = [True] * self.layers
        if not 1 <= self.top_k <= self.experts:
            raise ReferenceError(
                f"num_experts_per_tok {self.top_k} must be in 1..num_experts ({self.experts})")
        q = cfg.get("quantization_config")
        if q is not None and (not isinstance(q, dict) or q.get("quant_method") != "mxfp4"):
            raise ReferenceError(f"unsupported quantization_config {q!r} (only mxfp4)")
        self.mxfp4 = q is not None

    def _deepseek_v3(self, cfg):
        """DeepseekV3Config (transformers 5.12, a @strict dataclass; DEEPSEEK_V3_DEFAULTS for absent
        fields). A null in a non-Optional field is refused (strict validation); of the Optional ones
        (DEEPSEEK_V3_OPTIONAL) null means: num_key_value_heads -> num_attention_heads; q_lora_rank ->
        a plain q_proj; norm_topk_prob and rope_interleave -> false (read as truthiness); v_head_dim
        and first_k_dense_replace cannot build the model, n_group / topk_group / num_experts_per_tok
        cannot run a sparse layer: refused (the latter three only when some layer is sparse).
        - attention (MLA): q = q_proj(x) (q_lora_rank null) or q_b_proj(q_a_layernorm(q_a_proj(x)));
          [kv_lora_rank | qk_rope_head_dim] = kv_a_proj_with_mqa(x); heads of qk_head_dim =
          qk_nope_head_dim + qk_rope_head_dim for q and k, v_head_dim for v. attention_bias gives
          q_a_proj, kv_a_proj_with_mqa and o_proj biases (q_proj, q_b_proj, kv_b_proj never).
          num_key_value_heads must equal num_attention_heads: kv_b_proj already gives every head its
          keys, and HF's repeat_kv(num_attention_heads // num_key_value_heads) would repeat them
          again (any other value cannot run). Softmax scale attn_scale: qk_head_dim ** -0.5, times
          m * m with m = 0.1 * mscale_all_dim * ln(factor) + 1 (1 for factor <= 1) when the rope
          type is not default and the rope dict's mscale_all_dim is truthy (any rope type: HF
          reads rope_parameters["factor"], so a non-default type without a factor is refused).
        - RoPE over qk_rope_head_dim (HF's config.head_dim): a head_dim / qk_head_dim key in
          config.json overrides the derived value in HF, so one that differs from qk_rope_head_dim /
          qk_nope_head_dim + qk_rope_head_dim (or is null) is refused (HF's rotary tables or
          projections would not match). rope_interleave: pairs (2i, 2i + 1) instead of (i, i + d/2).
          rope_theta from the rope dict or the top level, default 10000; rope_scaling (4.x, the
          Hub's files: {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, ...}) or
          rope_parameters (5.x); a partial_rotary_factor is ignored with the default type (as HF's
          default table does) and refused with the others.
        - integers in float fields (routed_scaling_factor, rms_norm_eps) are read as floats, as
          transformers 4.x does; transformers 5.12's strict validation refuses them.
        - layers: i < first_k_dense_replace a dense MLP of intermediate_size, else DeepseekV3MoE:
          n_routed_experts (num_local_experts wins when both are present, as its attribute_map
          makes the later setattr overwrite) experts of moe_intermediate_size; shared experts: one
          gated MLP of moe_intermediate_size * n_shared_experts; sigmoid routing limited to
          topk_group of n_group groups (see Model._deepseek_v3_moe). Refused where HF raises or is
          ill-defined: n_group not dividing n_routed_experts, groups of < 2 experts (HF's top-2
          per group), topk_group outside 1..n_group, num_experts_per_tok outside 1..topk_group *
          group size (more would pick masked experts in torch.topk's tie order).
        - quantization_config (DeepSeek-V3's / Kimi-K2's FP8 files) is refused.
        Not read (transformers ignores them): moe_layer_freq, topk_method, scoring_func, ep_size,
        aux_loss_alpha, seq_aux, num_nextn_predict_layers (the MTP layer's tensors, stored as layer
        num_hidden_layers, are ignored: _norm_deepseek_v3_names), pretraining_tp, mlp_bias."""
        d = DEEPSEEK_V3_DEFAULTS

        def get(k):
            if k not in cfg:
                return d[k]
            if cfg[k] is None and k not in DEEPSEEK_V3_OPTIONAL:
                raise ReferenceError(f"deepseek_v3 {k} is null (transformers' strict config refuses it)")
            return cfg[k]

        if cfg.get("quantization_config") is not None:
            raise ReferenceError("deepseek_v3 quantization_config (FP8 checkpoints) is not supported")
        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        kv = get("num_key_value_heads")
        self.kv_heads = self.heads if kv is None else int(kv)
        if self.heads < 1 or self.kv_heads != self.heads:
            raise ReferenceError(f"deepseek_v3 num_key_value_heads {self.kv_heads} != num_attention_heads "
                                 f"{self.heads} (HF's repeat_kv cannot run it)")
        self.inner = int(get("intermediate_size"))
        self.moe_inner = int(get("moe_intermediate_size"))
        self.shared_inner = self.moe_inner * int(get("n_shared_experts"))
        self.act = get("hidden_act")
        _act(self.act)
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        self.attention_bias = bool(get("attention_bias"))
        self.mlp_bias = False
        self._deepseek_mla(cfg, get, "deepseek_v3")
        if "head_dim" in cfg and cfg["head_dim"] != self.qk_rope:
            raise ReferenceError(f"deepseek_v3 head_dim {cfg['head_dim']!r} != qk_rope_head_dim {self.qk_rope} "
                                 "(HF's rotary embedding would use head_dim)")
        if "qk_head_dim" in cfg and cfg["qk_head_dim"] != self.qk_head_dim:
            raise ReferenceError(f"deepseek_v3 qk_head_dim {cfg['qk_head_dim']!r} != qk_nope_head_dim + "
                                 f"qk_rope_head_dim ({self.qk_head_dim})")
        self.rope_interleave = bool(get("rope_interleave"))
        self.rope_style = "interleave" if self.rope_interleave else "half"
        scale = self.qk_head_dim ** (-0.5)
        if self.rope["rope_type"] != "default":
            mscale_all_dim = self.rope.get("mscale_all_dim", 0)
            if mscale_all_dim:
                m = _yarn_mscale(self.rope["factor"], mscale_all_dim)
                scale = scale * m * m  # as HF: Python floats, (s * m) * m
        self.attn_scale = scale
        self.windows = [None] * self.layers
        # experts
        fk = get("first_k_dense_replace")
        if fk is None:
            raise ReferenceError("deepseek_v3 first_k_dense_replace is null (DeepseekV3DecoderLayer compares "
                                 "the layer index with it)")
        self.first_k_dense = int(fk)
        self.sparse = [i >= self.first_k_dense for i in range(self.layers)]
        if "num_local_experts" in cfg:
            E = cfg["num_local_experts"]
            if E is None:
                raise ReferenceError("deepseek_v3 num_local_experts is null")
        else:
            E = get("n_routed_experts")
        self.experts = int(E)
        self.routed_scale = float(get("routed_scaling_factor"))
        self.norm_topk = bool(get("norm_topk_prob"))
        self.n_group, self.topk_group, self.top_k = (get(k) for k in ("n_group", "topk_group", "num_experts_per_tok"))
        if any(self.sparse):
            if None in (self.n_group, self.topk_group, self.top_k):
                raise ReferenceError("deepseek_v3 n_group / topk_group / num_experts_per_tok is null "
                                     "(DeepseekV3MoE cannot route)")
            self.n_group, self.topk_group, self.top_k = int(self.n_group), int(self.topk_group), int(self.top_k)
            E, G = self.experts, self.n_group
            if G < 1 or E % G or E // G < 2:
                raise ReferenceError(f"deepseek_v3 n_group {G} must divide n_routed_experts {E} into groups "
                                     "of >= 2 experts")
            if not 1 <= self.topk_group <= G:
                raise ReferenceError(f"deepseek_v3 topk_group {self.topk_group} must be in 1..n_group ({G})")
            if not 1 <= self.top_k <= self.topk_group * (E // G):
                raise ReferenceError(f"deepseek_v3 num_experts_per_tok {self.top_k} must be in 1.."
                                     f"{self.topk_group * (E // G)} (the experts of the topk_group kept groups)")

    def _deepseek_mla(self, cfg, get, arch):
        """The multi-head latent attention widths and the RoPE dict, read alike by DeepseekV3Config
        and DeepseekV2Config (get: the family's null-checking field reader): q_lora_rank (null: a
        plain q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim (even >= 2: the rotary width,
        HF's config.head_dim), v_head_dim; qk_head_dim = qk_nope + qk_rope. RoPE: rope_theta from the
        rope dict or the top level (default 10000; null refused), rope_scaling (4.x) or
        rope_parameters (5.x); a partial_rotary_factor is dropped with the default type (the
        families' compute_default_rope_parameters never reads it) and refused with the others; a
        non-default type needs a factor (HF's rope functions read rope_parameters["factor"])."""
        q_lora = get("q_lora_rank")
        self.q_lora_rank = None if q_lora is None else int(q_lora)
        self.kv_lora_rank = int(get("kv_lora_rank"))
        self.qk_nope = int(get("qk_nope_head_dim"))
        self.qk_rope = int(get("qk_rope_head_dim"))
        v = get("v_head_dim")
        if v is None:
            raise ReferenceError(f"{arch} v_head_dim is null (the attention cannot build kv_b_proj)")
        self.v_head_dim = int(v)
        self.qk_head_dim = self.qk_nope + self.qk_rope
        if self.qk_rope < 2 or self.qk_rope % 2 or self.qk_nope < 0 or self.v_head_dim < 1 or \
                self.kv_lora_rank < 1 or (self.q_lora_rank is not None and self.q_lora_rank < 1):
            raise ReferenceError(f"{arch}: qk_rope_head_dim must be even >= 2, qk_nope_head_dim >= 0, "
                                 "v_head_dim, kv_lora_rank and q_lora_rank >= 1")
        self.head_dim = self.qk_rope  # HF's config.head_dim: the rotary width
        get("max_position_embeddings")  # refuses a null
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rd = rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {}
        if "rope_theta" in cfg and cfg["rope_theta"] is None and rd.get("rope_theta") is None:
            raise ReferenceError(f"{arch} rope_theta is null")
        rcfg = dict(cfg, model_type=arch)
        if (rd.get("rope_type", rd.get("type")) or "default") == "default":
            # compute_default_rope_parameters of DeepseekV3RotaryEmbedding / DeepseekV2RotaryEmbedding
            # never reads partial_rotary_factor (the other types do, and are refused with one)
            rcfg.pop("partial_rotary_factor", None)
            for key in ("rope_scaling", "rope_parameters"):
                if isinstance(rcfg.get(key), dict):
                    rcfg[key] = {k: v for k, v in rcfg[key].items() if k != "partial_rotary_factor"}
        self.rope = self._rope(rcfg)
        if self.rope["rope_type"] != "default" and self.rope.get("factor") is None:
            raise ReferenceError(f"{arch} rope type {self.rope['rope_type']!r} without a factor "
                                 "(HF reads rope_parameters['factor'])")

    def _deepseek_v2(self, cfg):
        """DeepseekV2Config (transformers 5.12, a @strict dataclass; DEEPSEEK_V2_DEFAULTS for absent
        fields). A null in a non-Optional field is refused (strict validation: n_shared_experts,
        first_k_dense_replace, v_head_dim, kv_lora_rank, rms_norm_eps, ...); of the Optional ones
        (DEEPSEEK_V2_OPTIONAL) null means: num_key_value_heads -> num_attention_heads (also when
        absent: its default is None); q_lora_rank -> a plain q_proj; topk_method / num_experts_per_tok
        / n_group / topk_group cannot route: refused when a sparse layer needs them.
        - hidden_size must be a multiple of num_attention_heads (validate_architecture raises).
        - attention (MLA, see Config._deepseek_mla and Model._deepseek_v3_attention): as DeepSeek-V3's
          but RoPE as complex numbers on the INTERLEAVED pairs (2i, 2i + 1) whose result stays
          interleaved (rope_style "complex", apply_rope_complex), cos / sin being torch.polar's
          (rope_polar); softmax scale qk_head_dim ** -0.5 times mscale(factor, mscale_all_dim) ** 2
          for a non-default rope with mscale_all_dim, as DeepseekV3Attention, DeepSeek's own V2
          modeling code and transformers from pull request 47435 on (merged after 5.12.1, whose
          DeepseekV2Attention leaves the factor out: 1.59 with DeepSeek-V2-Lite's YaRN, factor 40,
          mscale_all_dim 0.707); YaRN's attention factor (mscale / mscale_all_dim) multiplies
          cos and sin as usual (exactly 1 for the Hub's configs, whose two mscales are equal). num_key_value_heads must equal
          num_attention_heads (HF's eager repeat_kv cannot run anything else). A head_dim key is
          ignored (__post_init__ sets head_dim = qk_rope_head_dim over it), and so is a qk_head_dim key
          (the attention computes its own). attention_bias: q_a_proj, kv_a_proj_with_mqa, o_proj.
        - mlp_bias: biases on the dense MLP's and the shared experts' gate_proj / up_proj / down_proj
          (DeepseekV2MLP); never on the routed experts or the router.
        - layers: i < first_k_dense_replace a dense MLP of intermediate_size, else DeepseekV2Moe
          (moe_layer_freq is not read): n_routed_experts (num_local_experts is NOT an alias here:
          ignored) experts of moe_intermediate_size; shared experts: one gated MLP of
          moe_intermediate_size * n_shared_experts, ALWAYS run (DeepseekV2Moe.forward calls it
          unconditionally; n_shared_experts 0 gives a zero-width MLP: its output is 0, or
          down_proj's bias with mlp_bias); softmax routing (Model._deepseek_v2_moe) by topk_method
          "greedy" or "group_limited_greedy" (any other value, null included, leaves HF's
          route_tokens_to_experts without weights: refused). num_experts_per_tok in 1..E;
          group_limited_greedy: n_group dividing n_routed_experts, topk_group in 1..n_group (k may
          exceed the kept experts: the extra slots take masked experts of weight 0). transformers
          5.12.1's group_limited_greedy reads self.num_experts, which DeepseekV2Moe never sets
          (AttributeError: HF cannot run DeepSeek-V2 / Coder-V2 236B); the reference runs the evident
          intent (num_experts = n_routed_experts), checked against HF with that attribute supplied.
        - integers in float fields (routed_scaling_factor, rms_norm_eps) are read as floats, as
          transformers 4.x does; transformers 5.12's strict validation refuses them.
        - quantization_config is refused.
        Not read (transformers ignores them): norm_topk_prob (no renormalisation whatever it says),
        scoring_func, moe_layer_freq, aux_loss_alpha, seq_aux, ep_size, num_local_experts, head_dim,
        qk_head_dim, pretraining_tp, the token ids."""
        d = DEEPSEEK_V2_DEFAULTS

        def get(k):
            if k not in cfg:
                return d[k]
            if cfg[k] is None and k not in DEEPSEEK_V2_OPTIONAL:
                raise ReferenceError(f"deepseek_v2 {k} is null (transformers' strict config refuses it)")
            return cfg[k]

        if cfg.get("quantization_config") is not None:
            raise ReferenceError("deepseek_v2 quantization_config is not supported")
        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        if self.heads < 1 or self.hidden % self.heads:
            raise ReferenceError(f"deepseek_v2 hidden_size {self.hidden} is not a multiple of num_attention_heads "
                                 f"{self.heads} (DeepseekV2Config.validate_architecture)")
        kv = get("num_key_value_heads")
        self.kv_heads = self.heads if kv is None else int(kv)
        if self.kv_heads != self.heads:
            raise ReferenceError(f"deepseek_v2 num_key_value_heads {self.kv_heads} != num_attention_heads "
                                 f"{self.heads} (HF's repeat_kv cannot run it)")
        self.inner = int(get("intermediate_size"))
        self.moe_inner = int(get("moe_intermediate_size"))
        self.n_shared = int(get("n_shared_experts"))
        if self.n_shared < 0:
            raise ReferenceError(f"deepseek_v2 n_shared_experts {self.n_shared} < 0")
        self.shared_inner = self.moe_inner * self.n_shared
        self.act = get("hidden_act")
        _act(self.act)
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        self.attention_bias = bool(get("attention_bias"))
        self.mlp_bias = bool(get("mlp_bias"))
        self._deepseek_mla(cfg, get, "deepseek_v2")
        self.rope_interleave = True  # the pairs (2i, 2i + 1); the result stays interleaved
        self.rope_style = "complex"
        scale = self.qk_head_dim ** (-0.5)  # DeepseekV2Attention.scaling, with PR 47435's factor
        if self.rope["rope_type"] != "default":
            mscale_all_dim = self.rope.get("mscale_all_dim", 0)
            if mscale_all_dim:
                m = _yarn_mscale(self.rope["factor"], mscale_all_dim)
                scale = scale * m * m  # as HF: Python floats, (s * m) * m
        self.attn_scale = scale
        self.windows = [None] * self.layers
        # experts
        self.first_k_dense = int(get("first_k_dense_replace"))
        self.sparse = [i >= self.first_k_dense for i in range(self.layers)]
        self.experts = int(get("n_routed_experts"))
        self.routed_scale = float(get("routed_scaling_factor"))
        self.norm_topk = False  # norm_topk_prob is not read
        self.topk_method = get("topk_method")
        self.n_group, self.topk_group, self.top_k = (get(k) for k in ("n_group", "topk_group", "num_experts_per_tok"))
        if any(self.sparse):
            E = self.experts
            if self.topk_method not in DEEPSEEK_V2_TOPK_METHODS:
                raise ReferenceError(f"deepseek_v2 topk_method {self.topk_method!r} (DeepseekV2Moe knows "
                                     f"{' / '.join(DEEPSEEK_V2_TOPK_METHODS)} only)")
            if self.top_k is None:
                raise ReferenceError("deepseek_v2 num_experts_per_tok is null (DeepseekV2Moe cannot route)")
            self.top_k = int(self.top_k)
            if E < 1 or not 1 <= self.top_k <= E:
                raise ReferenceError(f"deepseek_v2 num_experts_per_tok {self.top_k} must be in 1..n_routed_experts "
                                     f"({E})")
            if self.topk_method == "group_limited_greedy":
                if self.n_group is None or self.topk_group is None:
                    raise ReferenceError("deepseek_v2 group_limited_greedy with a null n_group / topk_group")
                self.n_group, self.topk_group = int(self.n_group), int(self.topk_group)
                G = self.n_group
                if G < 1 or E % G:
                    raise ReferenceError(f"deepseek_v2 n_group {G} must divide n_routed_experts {E}")
                if not 1 <= self.topk_group <= G:
                    raise ReferenceError(f"deepseek_v2 topk_group {self.topk_group} must be in 1..n_group ({G})")

    # -- RoPE ----------------------------------------------------------------------------------
    def _gpt_neox(self, cfg):
        """GPTNeoXConfig: every field has a default (gpt-neox-20b's sizes); hidden_act gelu (exact);
        LayerNorm eps layer_norm_eps; use_parallel_residual True; attention_bias True (biases of
        query_key_value and dense; the MLP and the LayerNorms always have biases); untied.
        RoPE: rope_theta from the rope dict (5.x) or rotary_emb_base (4.x), default 10000; the
        rotated width int(head_dim * partial_rotary_factor), the factor from the rope dict (5.x)
        or rotary_pct (4.x), default 0.25."""
        d = NEOX_DEFAULTS

        def get(k):
            return cfg[k] if cfg.get(k) is not None else d[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = self.heads
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        self.eps = float(get("layer_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        self.parallel = bool(get("use_parallel_residual"))
        self.attention_bias = bool(get("attention_bias"))
        if self.hidden % self.heads:
            raise ReferenceError("hidden_size not divisible by num_attention_heads")
        self.head_dim = self.hidden // self.heads
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rd = rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {}
        prf = rd.get("partial_rotary_factor")
        if prf is None:
            prf = get("rotary_pct")
        theta_cfg = dict(cfg)
        if cfg.get("rotary_emb_base") is not None:
            theta_cfg["rope_theta"] = cfg["rotary_emb_base"]
        self.rope = self._rope(theta_cfg, partial=float(prf))
        rot = _rope_dim(self.rope, self.head_dim)
        if rot < 2 or rot % 2:
            raise ReferenceError(f"rotary dim {rot} must be even and >= 2")
        self.windows = [None] * self.layers

    def _gptj(self, cfg):
        """GPTJConfig: every field has a default; n_inner None -> 4 * n_embd. rotary_dim 64 when
        absent; an explicit null makes GPTJAttention build its tables n_embd wide
        (`self.rotary_dim or self.embed_dim`) and rotate whole heads, which only broadcasts with one
        head. apply_rotary_pos_emb's repeat_interleave(sin, 2) must give rotary_dim features, so an
        odd rotary_dim, or one wider than a head, fails in transformers' forward. The attribute_map
        aliases (hidden_size, ...) are set after the fields, so an alias wins where config.json has
        both names."""
        d = GPTJ_DEFAULTS

        def get(k, alias=None):
            return _get(cfg, *((alias, k) if alias else (k,)), default=d[k])

        self.vocab_size = int(get("vocab_size"))
        self.n_positions = int(get("n_positions", "max_position_embeddings"))
        self.hidden = int(get("n_embd", "hidden_size"))
        self.layers = int(get("n_layer", "num_hidden_layers"))
        self.heads = int(get("n_head", "num_attention_heads"))
        self.kv_heads = self.heads
        self.inner = int(cfg["n_inner"]) if cfg.get("n_inner") is not None else 4 * self.hidden
        self.act = get("activation_function")
        self.eps = float(get("layer_norm_epsilon"))
        self.tie = bool(get("tie_word_embeddings"))
        if self.hidden % self.heads:
            raise ReferenceError("n_embd not divisible by n_head")
        self.head_dim = self.hidden // self.heads
        if "rotary_dim" in cfg and cfg["rotary_dim"] is None:
            self.rotary_dim = self.hidden  # pos_embd_dim = embed_dim
        else:
            self.rotary_dim = int(cfg.get("rotary_dim", 64))
        if self.rotary_dim % 2 or not 2 <= self.rotary_dim <= self.head_dim:
            raise ReferenceError(f"rotary_dim {self.rotary_dim} with head_dim {self.head_dim} does not broadcast")
        self.windows = [None] * self.layers

    def _gpt_neo(self, cfg):
        """GPTNeoConfig: every field has a default (gpt-neo-1.3B's sizes); intermediate_size null or
        absent -> 4 * hidden_size; LayerNorm eps layer_norm_epsilon; tied by default; no RoPE (learned
        positions, n_positions = max_position_embeddings). The attribute_map aliases
        num_attention_heads / num_hidden_layers are set after the fields (as extra kwargs), so an
        alias wins where config.json has both names.
        Per-layer attention: attention_types (null or absent -> [[["global", "local"], 12]]) is a
        list of [types, n] items, expanded as expand_attention_types_params does (each item's types
        list repeated n times, concatenated); the expansion must have num_layers entries
        (validate_architecture) and each must be "global" or "local" (GPTNeoAttention raises
        NotImplementedError otherwise). A "local" layer's bias buffer is tril XOR
        tril(.., -window_size): key j is allowed for query i iff 0 <= i - j < window_size; windows
        holds window_size for local layers, None for global ones. window_size < 1 on a local layer
        (no key left: HF's added causal mask then spreads the row uniformly over the causal keys)
        is refused.
        attention_layers: __post_init__ sets it from attention_types, but a config.json key
        attention_layers (the released files carry one) is set after that as an extra kwarg and
        wins in transformers 5.12: it decides when present (with attention_types absent too), and
        one that disagrees with attention_types' expansion (a null one included) is refused."""
        d = GPT_NEO_DEFAULTS

        def get(k, alias=None):
            return _get(cfg, *((alias, k) if alias else (k,)), default=d[k])

        self.vocab_size = int(get("vocab_size"))
        self.n_positions = int(get("max_position_embeddings"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_layers", "num_hidden_layers"))
        self.heads = int(get("num_heads", "num_attention_heads"))
        self.kv_heads = self.heads
        inner = cfg.get("intermediate_size")
        self.inner = int(inner) if inner is not None else 4 * self.hidden
        self.act = get("activation_function")
        self.eps = float(get("layer_norm_epsilon"))
        self.tie = bool(get("tie_word_embeddings"))
        if self.heads < 1 or self.hidden % self.heads:
            raise ReferenceError("hidden_size not divisible by num_heads")
        self.head_dim = self.hidden // self.heads
        self.window_size = int(get("window_size"))
        types = cfg.get("attention_types")

        def expand(types):  # expand_attention_types_params
            out = []
            try:
                for item in types:
                    for _ in range(item[1]):
                        out.extend(item[0])
            except (TypeError, IndexError, KeyError):
                raise ReferenceError(f"attention_types must be a list of [types, count] items, not {types!r}")
            return out

        if "attention_layers" in cfg:  # set over __post_init__'s expansion: it decides
            layer_types = cfg["attention_layers"]
            if not isinstance(layer_types, list) or not layer_types:
                raise ReferenceError(f"attention_layers must be a non-empty list, not {layer_types!r}")
            if types is not None and expand(types) != layer_types:
                raise ReferenceError(f"attention_layers {layer_types!r} disagrees with attention_types, "
                                     f"which expands to {expand(types)!r}")
        else:
            layer_types = expand(GPT_NEO_ATTENTION_TYPES if types is None else types)
        if len(layer_types) != self.layers:
            raise ReferenceError(f"{len(layer_types)} attention layer types, num_layers is {self.layers}")
        bad = [t for t in layer_types if t not in GPT_NEO_LAYER_TYPES]
        if bad:
            raise ReferenceError(f"unsupported attention type {bad[0]!r} (only 'global' and 'local')")
        if "local" in layer_types and self.window_size < 1:
            raise ReferenceError(f"window_size {self.window_size} leaves the local layers no key")
        self.attention_layers = layer_types
        self.windows = [self.window_size if t == "local" else None for t in layer_types]

    def _opt(self, cfg):
        """OPTConfig (transformers 5.12, a @strict dataclass; OPT_DEFAULTS for absent fields, a null
        refused except word_embed_proj_dim's, which -> hidden_size). No attribute_map (num_layers /
        n_embd ... are not read). Attention: num_attention_heads heads of hidden_size //
        num_attention_heads (OPTAttention raises unless it divides), no GQA, no RoPE: learned positions
        (embed_positions has max_position_embeddings + 2 rows, n_positions = max_position_embeddings).
        ffn_dim the MLP width (inner), activation_function the MLP's act (ACT2FN). LayerNorm eps is
        nn.LayerNorm's default 1e-5 (OPT_LAYER_NORM_EPS).
        Fields: proj_dim = word_embed_proj_dim (the embedding / lm_head width: project_in and
        project_out exist iff it differs from hidden_size); pre_norm = do_layer_norm_before;
        final_norm = do_layer_norm_before and not _remove_final_layer_norm (OPTDecoder builds
        model.decoder.final_layer_norm only then); bias = enable_bias (q/k/v/out_proj, fc1, fc2;
        never project_in / project_out / lm_head); affine = layer_norm_elementwise_affine (weight and
        bias of every LayerNorm, or neither); tie = tie_word_embeddings (default True)."""
        d = OPT_DEFAULTS

        def get(k):
            if k not in cfg:
                return d[k]
            if cfg[k] is None and k not in OPT_OPTIONAL:
                raise ReferenceError(f"opt {k} is null (transformers' strict config refuses it)")
            return cfg[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = self.heads
        if self.heads < 1 or self.hidden % self.heads:
            raise ReferenceError(f"opt hidden_size {self.hidden} not divisible by num_attention_heads {self.heads}")
        self.head_dim = self.hidden // self.heads
        self.inner = int(get("ffn_dim"))
        self.act = get("activation_function")
        _act(self.act)
        self.eps = OPT_LAYER_NORM_EPS
        self.tie = bool(get("tie_word_embeddings"))
        self.n_positions = int(get("max_position_embeddings"))
        pd = get("word_embed_proj_dim")
        self.proj_dim = self.hidden if pd is None else int(pd)
        self.pre_norm = bool(get("do_layer_norm_before"))
        self.final_norm = self.pre_norm and not bool(get("_remove_final_layer_norm"))
        self.bias = bool(get("enable_bias"))
        self.affine = bool(get("layer_norm_elementwise_affine"))
        self.windows = [None] * self.layers

    def _phi(self, cfg):
        """PhiConfig: every field has a default; num_key_value_heads null or absent ->
        num_attention_heads; head_dim: PhiAttention's getattr(config, "head_dim", hidden_size //
        num_attention_heads); q, k, v and dense with biases; LayerNorm eps layer_norm_eps. RoPE: the
        Llama rope types on int(head_dim * partial_rotary_factor) features, the factor from the rope
        dict, else the top level, else 0.5 (PhiConfig's __post_init__). qk_layernorm (false) is not
        modelled: refused."""
        d = PHI_DEFAULTS

        def get(k):
            return cfg[k] if cfg.get(k) is not None else d[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(_get(cfg, "num_key_value_heads", default=self.heads))
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        self.eps = float(get("layer_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        if get("qk_layernorm"):
            raise ReferenceError("qk_layernorm is not modelled")
        if self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        if self.hidden % self.heads:
            raise ReferenceError("hidden_size not divisible by num_attention_heads")
        self.head_dim = int(_get(cfg, "head_dim", default=self.hidden // self.heads))
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        rd = rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {}
        prf = rd.get("partial_rotary_factor")
        if prf is None:
            prf = _get(cfg, "partial_rotary_factor", default=0.5)
        self.rope = self._rope(cfg, partial=float(prf))
        rot = _rope_dim(self.rope, self.head_dim)
        if rot < 2 or rot % 2:
            raise ReferenceError(f"rotary dim {rot} must be even and >= 2")
        self.windows = [None] * self.layers

    def _phi3(self, cfg):
        """Phi3Config: every field has a default (Phi-3-mini's sizes); num_key_value_heads null or
        absent -> num_attention_heads; head_dim from config.json if there, else hidden_size //
        num_attention_heads (Phi3Attention's getattr); no biases; sliding_window (default None) on
        every layer. RoPE: rope_theta (10000), partial_rotary_factor (top level, or in the rope
        dict in 5.x; default 1.0); the rope dict's type "su" or "yarn" is longrope (Phi3Config's
        backward compatibility: a Phi-3 "yarn" is NOT YaRN); only default and longrope run;
        original_max_position_embeddings defaults to 4096."""
        d = PHI3_DEFAULTS

        def get(k):
            return cfg[k] if cfg.get(k) is not None else d[k]

        self.vocab_size = int(get("vocab_size"))
        self.hidden = int(get("hidden_size"))
        self.layers = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(_get(cfg, "num_key_value_heads", default=self.heads))
        self.inner = int(get("intermediate_size"))
        self.act = get("hidden_act")
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(get("tie_word_embeddings"))
        if self.heads % self.kv_heads:
            raise ReferenceError("num_attention_heads not divisible by num_key_value_heads")
        hd = cfg.get("head_dim")
        if hd is None:
            if self.hidden % self.heads:
                raise ReferenceError("hidden_size not divisible by num_attention_heads")
            hd = self.hidden // self.heads
        self.head_dim = int(hd)
        self.attention_bias = False
        self.mlp_bias = False
        rcfg = dict(cfg)
        prf = cfg.get("partial_rotary_factor")
        has_original = cfg.get("original_max_position_embeddings") is not None
        for key in ("rope_scaling", "rope_parameters"):
            r = cfg.get(key)
            if isinstance(r, dict):
                r = dict(r)
                for t in ("type", "rope_type"):
                    if r.get(t) in ("su", "yarn"):
                        r[t] = "longrope"
                if r and r.get("partial_rotary_factor") is not None:
                    prf = r["partial_rotary_factor"]
                has_original = has_original or r.get("original_max_position_embeddings") is not None
                rcfg[key] = r
        if not has_original:
            rcfg["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        self.rope = self._rope(rcfg, partial=float(1.0 if prf is None else prf))
        if self.rope["rope_type"] not in ("default", "longrope"):
            raise ReferenceError(f"phi3 runs default or longrope rope, not {self.rope['rope_type']!r}")
        rot = _rope_dim(self.rope, self.head_dim)
        if rot < 2 or rot % 2:
            raise ReferenceError(f"rotary dim {rot} must be even and >= 2")
        self.windows = [cfg.get("sliding_window")] * self.layers

    # -- RoPE ----------------------------------------------------------------------------------
    @staticmethod
    def _rope(cfg, partial=None):
        """Returns the merged rope parameter dict, resolved as transformers v5's
        RotaryEmbeddingConfigMixin.standardize_rope_params does: rope_type, rope_theta,
        max_position_embeddings, and the scaling fields of the type.

        Accepts transformers v4 (`rope_theta` + optional `rope_scaling` with `type` or `rope_type`)
        and v5 (`rope_parameters: {"rope_type", "rope_theta", ...}`). For llama3 / yarn / longrope,
        original_max_position_embeddings comes from the top level of config.json when present
        (Phi-3's layout, which HF prefers), else from the rope dict, else max_position_embeddings."""
        # v5's convert_rope_params_to_dict: `rope_scaling or rope_parameters` (v4 reads
        # rope_scaling only)
        rs, rp = cfg.get("rope_scaling"), cfg.get("rope_parameters")
        params = dict(rs if isinstance(rs, dict) and rs else rp if isinstance(rp, dict) else {})
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        theta = params.get("rope_theta", cfg.get("rope_theta"))
        if theta is None:
            theta = 10000.0
        params["rope_type"] = rope_type
        params["rope_theta"] = float(theta)
        mt = cfg.get("model_type", "llama")
        params["max_position_embeddings"] = _get(
            cfg, "max_position_embeddings", default=MAX_POSITIONS_DEFAULT.get(mt, 2048))
        prf = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
        if partial is not None:  # architectures whose attention passes the rest through (NeoX)
            prf = 1.0
        # LlamaAttention / MistralAttention / Qwen2Attention / Qwen3Attention rotate the whole head (their
        # apply_rotary_pos_emb has no pass-through part): a smaller rotary dim cannot run in HF.
        if prf is not None and float(prf) != 1.0:
            raise ReferenceError(f"partial_rotary_factor {prf} is not supported by {mt}")
        params["partial_rotary_factor"] = 1.0 if partial is None else partial
        if rope_type not in ROPE_TYPES:
            raise ReferenceError(f"unsupported rope_type {rope_type!r}")
        if rope_type in ("llama3", "yarn", "longrope"):
            if cfg.get("original_max_position_embeddings") is not None:
                params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
            elif params.get("original_max_position_embeddings") is None:
                params["original_max_position_embeddings"] = params["max_position_embeddings"]
        return params

    # -- sliding window per layer -------------------------------------------------------------
    def _windows(self, cfg):
        """sliding window (int) or None for each layer, as HF decides it.

        Qwen2 and Qwen3 (Qwen2Config / Qwen3Config, transformers 4.53+ and 5.x):
          sliding_window = config sliding_window (default 4096) if use_sliding_window else None;
          layer_types = config layer_types if given, else "sliding_attention" for layers
            i >= max_window_layers (default 28) when sliding_window is not None, else
            "full_attention";
          a "sliding_attention" layer attends within sliding_window, a "full_attention" layer
            causally.
        So use_sliding_window false means no window anywhere, and layer_types overrides
        max_window_layers. A "sliding_attention" layer without a window (use_sliding_window false
        or sliding_window null) makes HF's create_sliding_window_causal_mask raise: refused here
        ("with all full_attention" is the only list HF runs with use_sliding_window false)."""
        sw = cfg.get("sliding_window")
        if self.arch == "mistral":
            return [sw] * self.layers
        if self.arch in ("qwen2", "qwen3"):
            if "sliding_window" not in cfg:
                sw = 4096
            if not cfg.get("use_sliding_window", False):
                sw = None
            layer_types = cfg.get("layer_types")
            if layer_types is None:
                mwl = _get(cfg, "max_window_layers", default=28)
                layer_types = ["sliding_attention" if sw is not None and i >= mwl else "full_attention"
                               for i in range(self.layers)]
            if not isinstance(layer_types, list) or len(layer_types) != self.layers:
                raise ReferenceError(f"layer_types must list {self.layers} layer types")
            bad = [t for t in layer_types if t not in LAYER_TYPES]
            if bad:
                raise ReferenceError(f"unsupported layer type {bad[0]!r}")
            if "sliding_attention" in layer_types and sw is None:
                raise ReferenceError("layer_types has sliding_attention layers but no sliding window "
                                     "(use_sliding_window false or sliding_window null)")
            return [sw if t == "sliding_attention" else None for t in layer_types]
        return [None] * self.layers  # llama


def _sparse_layers(layers, mlp_only, experts, step):
    """Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer: layer i is sparse iff i not in mlp_only_layers
    and num_experts > 0 and (i + 1) % decoder_sparse_step == 0, evaluated in that order (so step 0
    raises only where it is reached, as HF's ZeroDivisionError). mlp_only_layers null means []."""
    mlp_only = [] if mlp_only is None else mlp_only
    if not isinstance(mlp_only, list):
        raise ReferenceError("mlp_only_layers must be a list of layer indices")
    sparse = []
    for i in range(layers):
        if i in mlp_only or not experts > 0:
            sparse.append(False)
        elif step == 0:
            raise ReferenceError("decoder_sparse_step 0 (HF's (i + 1) % 0 raises)")
        else:
            sparse.append((i + 1) % step == 0)
    return sparse


def _clip_qkv(cfg, arch):
    """OlmoConfig / OlmoeConfig's clip_qkv (Optional float, default None): absent or null -> None
    (no clamp); else a positive finite number, returned as a float. Refused: zero, negatives (HF's
    clamp_(min=c, max=-c) with min > max would set every value to -c), inf / nan, booleans and
    non-numbers. An integer (8 for 8.0) is accepted as its float, as transformers 4.x does;
    transformers 5.12's strict validation refuses a JSON integer there ("expected float, got int")."""
    v = cfg.get("clip_qkv")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ReferenceError(f"{arch} clip_qkv {v!r} must be null or a positive number")
    return float(v)


def _rope_dim(rope, head_dim):
    return int(head_dim * rope.get("partial_rotary_factor", 1.0))


def _default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


# One function per rope type, as transformers' ROPE_INIT_FUNCTIONS: (rope dict, head_dim, seq_len)
# -> (inv_freq float32 [dim/2], attention_factor). seq_len is None at init time, or the length the
# forward's dynamic_rope_update passes (max position id + 1, a tensor in HF).

def _rope_default(rope, head_dim, seq_len=None):
    return _default_inv_freq(rope["rope_theta"], _rope_dim(rope, head_dim)), 1.0


def _rope_linear(rope, head_dim, seq_len=None):
    inv_freq, _ = _rope_default(rope, head_dim)
    inv_freq /= rope["factor"]
    return inv_freq, 1.0


def _rope_dynamic(rope, head_dim, seq_len=None):
    """_compute_dynamic_ntk_parameters: the base grows with the sequence beyond
    max_position_embeddings. At init (seq_len None) the arithmetic is Python floats; in the forward
    seq_len is a 0-dim int64 tensor, so the new base is computed in float32 tensor arithmetic."""
    base = rope["rope_theta"]
    dim = _rope_dim(rope, head_dim)
    factor = rope["factor"]
    max_pos = rope["max_position_embeddings"]
    if seq_len is None:
        seq_len = max_pos
    elif isinstance(seq_len, torch.Tensor):
        seq_len = torch.maximum(seq_len, torch.tensor(max_pos, dtype=seq_len.dtype))
    else:
        seq_len = max(seq_len, max_pos)
    base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim)), 1.0


def _yarn_mscale(scale, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _rope_yarn(rope, head_dim, seq_len=None):
    """_compute_yarn_parameters: NTK-by-parts interpolation between the original frequencies
    (extrapolation) and frequencies / factor (interpolation), with a linear ramp over the dims whose
    rotation counts within original_max_position_embeddings lie between beta_slow and beta_fast;
    attention_factor scales cos and sin."""
    base = rope["rope_theta"]
    dim = _rope_dim(rope, head_dim)
    factor = rope.get("factor")
    attention_factor = rope.get("attention_factor")
    mscale = rope.get("mscale")
    mscale_all_dim = rope.get("mscale_all_dim")
    original = rope["original_max_position_embeddings"]
    if factor is None:
        factor = rope["max_position_embeddings"] / original
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1

    def correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = correction_dim(beta_fast)
    high = correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as HF: no division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp.to(dtype=torch.float)
    inv_freq = (inv_freq_interpolation * (1 - extrapolation_factor)
                + inv_freq_extrapolation * extrapolation_factor)
    return inv_freq, attention_factor


def _rope_longrope(rope, head_dim, seq_len=None):
    """_compute_longrope_parameters: per-dimension divisors, long_factor when the sequence is longer
    than original_max_position_embeddings, short_factor otherwise; attention factor
    sqrt(1 + ln(factor) / ln(original)) unless given."""
    base = rope["rope_theta"]
    dim = _rope_dim(rope, head_dim)
    factor = rope.get("factor")
    attention_factor = rope.get("attention_factor")
    original = rope["original_max_position_embeddings"]
    if factor is None:
        factor = rope["max_position_embeddings"] / original
    if attention_factor is None:
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    if seq_len and seq_len > original:
        ext_factors = torch.tensor(rope["long_factor"], dtype=torch.float32)
    else:
        ext_factors = torch.tensor(rope["short_factor"], dtype=torch.float32)
    inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext_factors * base ** inv_freq_shape), attention_factor


def _rope_llama3(rope, head_dim, seq_len=None):
    inv_freq, _ = _rope_default(rope, head_dim)
    factor = rope["factor"]
    low_freq_factor = rope["low_freq_factor"]
    high_freq_factor = rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama), 1.0


ROPE_FUNCTIONS = {"default": _rope_default, "linear": _rope_linear, "dynamic": _rope_dynamic,
                  "yarn": _rope_yarn, "longrope": _rope_longrope, "llama3": _rope_llama3}
ROPE_TYPES = tuple(ROPE_FUNCTIONS)
MAX_POSITIONS_DEFAULT = {"gemma": 8192, "gemma2": 8192, "gemma3_text": 131072, "llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768,
                         "gpt_neox": 2048, "gptj": 2048, "phi": 2048, "phi3": 4096, "mixtral": 4096 * 32, "qwen3_moe": 32768, "qwen2_moe": 32768,
                         "olmo": 2048, "olmo2": 2048, "olmo3": 2048, "smollm3": 32768, "olmoe": 4096, "gpt_oss": 131072, "deepseek_v3": 4096,
                         "deepseek_v2": 2048}


def rope_parameters(rope, head_dim, seq_len=None):
    """(inv_freq, attention_scaling) that LlamaRotaryEmbedding uses in a forward whose largest
    position id is seq_len - 1 (None: as initialised). A fresh module: the init-time tables, except
    that dynamic_rope_update recomputes dynamic frequencies when seq_len > max_position_embeddings
    (from a 0-dim int64 tensor, as torch.max(position_ids) + 1 is) and switches longrope to its long
    factors when seq_len > original_max_position_embeddings. The attention scaling stays the
    init-time value (dynamic's is 1.0 either way)."""
    fn = ROPE_FUNCTIONS[rope["rope_type"]]
    inv_freq, attention_scaling = fn(rope, head_dim)
    if seq_len is None:
        return inv_freq, attention_scaling
    if rope["rope_type"] == "dynamic" and seq_len > rope["max_position_embeddings"]:
        inv_freq, attention_scaling = fn(rope, head_dim, seq_len=torch.tensor(seq_len, dtype=torch.int64))
    elif rope["rope_type"] == "longrope" and seq_len > rope["original_max_position_embeddings"]:
        inv_freq, _ = fn(rope, head_dim, seq_len=rope["original_max_position_embeddings"] + 1)
    return inv_freq, attention_scaling


def rope_inv_freq(rope, head_dim, seq_len=None):
    """inv_freq exactly as transformers' modeling_rope_utils (float32 arithmetic)."""
    return rope_parameters(rope, head_dim, seq_len)[0]


def rope_cos_sin(rope, head_dim, T, seq_len=None):
    """cos/sin [T, dim] for positions 0..T-1, multiplied by the attention scaling as
    LlamaRotaryEmbedding.forward does. seq_len: the length dynamic_rope_update sees (default T; a
    padded batch passes its padded length)."""
    inv_freq, attention_scaling = rope_parameters(rope, head_dim, T if seq_len is None else seq_len)
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ pos[None, :]).transpose(0, 1)  # [T, dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention_scaling, emb.sin() * attention_scaling


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x: [heads, T, head_dim]; cos/sin [T, rot_dim]. Partial rotary leaves the tail unrotated."""
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return (x * cos) + (rotate_half(x) * sin)
    xr, xp = x[..., :rd], x[..., rd:]
    return torch.cat(((xr * cos) + (rotate_half(xr) * sin), xp), dim=-1)


def apply_rope_interleaved(x, cos, sin):
    """DeepSeek's apply_rotary_pos_emb_interleave on x [..., T, d] with cos / sin [T, d] (the
    cat(freqs, freqs) tables): the pairs (x[2i], x[2i + 1]) rotate by frequency i, and the result is
    laid out [all rotated evens, all rotated odds] (rotate-half layout), i.e.
    cat(x1 cos - x2 sin, x2 cos + x1 sin) with x1 = x[0::2], x2 = x[1::2] and the first half of cos /
    sin. The layout does not change q . k (q and k come out alike); the pairing does."""
    d = cos.shape[-1] // 2
    c, s = cos[..., :d], sin[..., :d]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rope_polar(rope, dim, T, seq_len=None):
    """DeepseekV2RotaryEmbedding's table for positions 0..T-1: freqs_cis = torch.polar(1, freqs) *
    attention_scaling (complex64, freqs [T, dim/2] = position * inv_freq in float32), returned as
    (cos, sin) = (real, imaginary parts) [T, dim/2]. torch.polar on CPU takes std::cos / std::sin of
    each float32 angle (glibc's cosf / sinf), which differ from torch.cos / torch.sin (vectorised) in
    the last bit for a good share of the angles, so the table is made the same way here. seq_len: as
    rope_cos_sin's."""
    inv_freq, attention_scaling = rope_parameters(rope, dim, T if seq_len is None else seq_len)
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ pos[None, :]).transpose(0, 1)  # [T, dim/2]
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs) * attention_scaling
    return freqs_cis.real.contiguous(), freqs_cis.imag.contiguous()


def fma32(a, b, c):
    """a * b + c on float32 tensors rounded ONCE (a fused multiply-add): the product exactly in
    float64, the sum by TwoSum, its rounding to float32 corrected where the float64 sum lands exactly
    halfway between two float32 values (the only case double rounding gets wrong)."""
    p = a.double() * b.double()  # exact: 24 + 24 significant bits
    q = c.double()
    s = p + q
    t = s - p
    err = (p - (s - t)) + (q - t)  # s + err == p + q exactly
    r = s.float()
    lo = torch.where(r.double() > s, torch.nextafter(r, torch.full_like(r, -math.inf)), r)
    hi = torch.nextafter(lo, torch.full_like(lo, math.inf))
    tie = (lo.double() + hi.double() == 2 * s) & (err != 0)
    return torch.where(tie, torch.where(err > 0, hi, lo), r)


def apply_rope_complex(x, cos, sin, fused=True):
    """DeepSeek-V2's apply_rotary_emb on x [..., T, d] with rope_polar's cos / sin [T, d/2]: the pairs
    (x[2i], x[2i + 1]) read as complex numbers a + ib, multiplied by c + is = freqs_cis, and written
    back INTERLEAVED (view_as_real(...).flatten): out[2i] = a c - b s, out[2i + 1] = a s + b c.
    Rounding as torch's complex64 product computes it there (transformers 5.12.1 on x86-64 CPU,
    checked bit for bit): for a forward of T > 1 positions freqs_cis is a transposed table (stride T
    along the pairs), so torch's elementwise loop cannot vectorise and runs c10::complex's scalar
    operator*, which the compiler
    contracts into fused multiply-adds: out[2i] = fma(a, c, -(b s)), out[2i + 1] = fma(a, s, b c),
    each product b s / b c rounded first. (At position 0 both forms agree. torch's vectorised
    product, fused=False here, rounds both products before the sum: what a one-position decoding
    step gets when d/2 fills a vector; last-bit differences; a GPU or another compiler may round
    either way.)"""
    a, b = x[..., 0::2], x[..., 1::2]
    if fused:
        re, im = fma32(a, cos, -(b * sin)), fma32(a, sin, b * cos)
    else:
        re, im = a * cos - b * sin, a * sin + b * cos
    return torch.stack((re, im), dim=-1).flatten(-2)


ROPE_STYLES = {"half": apply_rope, "interleave": apply_rope_interleaved, "complex": apply_rope_complex}


# ---------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------

def load_weights(ckpt_dir):
    """All checkpoint tensors as float32 torch tensors (f16/bf16 upcast exactly)."""
    out = {}
    for k, v in st.load_checkpoint(ckpt_dir).items():
        t = torch.from_numpy(np.ascontiguousarray(v))
        if t.is_floating_point():
            t = t.to(torch.float32)
        out[k] = t
    return out


def _norm_gpt2_names(w):
    """Strips the optional `transformer.` prefix and drops the attn.bias/attn.masked_bias buffers."""
    out = {}
    for k, v in w.items():
        if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
            continue
        if k.startswith("transformer."):
            k = k[len("transformer."):]
        out[k] = v
    return out


def _norm_neox_names(w):
    """Drops the buffers older GPT-NeoX checkpoints saved (causal mask, masked_bias, inv_freq) and
    reads a head stored as lm_head.weight (newer transformers' name) as embed_out.weight."""
    out = {}
    for k, v in w.items():
        if k.endswith(".attention.bias") or k.endswith(".attention.masked_bias") or k.endswith(
                "rotary_emb.inv_freq"):
            continue
        out["embed_out.weight" if k == "lm_head.weight" else k] = v
    return out


def _norm_opt_names(w):
    """OPTForCausalLM's names for the bare ones the Hub's OPT checkpoints hold (saved from OPTModel:
    decoder.* -> model.decoder.*, as from_pretrained adds base_model_prefix "model")."""
    return {("model." + k if k.startswith("decoder.") else k): v for k, v in w.items()}


def _norm_llama_names(w):
    return {k: v for k, v in w.items() if not k.endswith("rotary_emb.inv_freq")}


GEMMA3_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                          "model.multi_modal_projector.")


def _norm_gemma3_multimodal_names(w):
    """Gemma3ForConditionalGeneration's tensors under the names of transformers >= 4.52
    (its _checkpoint_conversion_mapping: language_model.model. -> model.language_model.,
    language_model.lm_head. -> lm_head.), without the vision tower and the projector."""
    out = {}
    for k, v in w.items():
        if k.startswith(GEMMA3_VISION_PREFIXES):
            continue
        if k.startswith("language_model.model."):
            k = "model.language_model." + k[len("language_model.model."):]
        elif k.startswith("language_model.lm_head."):
            k = "lm_head." + k[len("language_model.lm_head."):]
        out[k] = v
    return out


def expected_shapes(cfg):
    """HF tensor name -> shape for a checkpoint of this config (untied: includes lm_head.weight).

    GPT-2 names carry the `transformer.` prefix and Conv1D weights are [in, out]."""
    c = cfg if isinstance(cfg, Config) else Config(cfg)
    s = OrderedDict()
    H, V, I = c.hidden, c.vocab_size, c.inner
    if c.arch == "gpt2":
        s["transformer.wte.weight"] = [V, H]
        s["transformer.wpe.weight"] = [c.n_positions, H]
        for i in range(c.layers):
            p = f"transformer.h.{i}."
            s[p + "ln_1.weight"] = [H]
            s[p + "ln_1.bias"] = [H]
            s[p + "attn.c_attn.weight"] = [H, 3 * H]
            s[p + "attn.c_attn.bias"] = [3 * H]
            s[p + "attn.c_proj.weight"] = [H, H]
            s[p + "attn.c_proj.bias"] = [H]
            s[p + "ln_2.weight"] = [H]
            s[p + "ln_2.bias"] = [H]
            s[p + "mlp.c_fc.weight"] = [H, I]
            s[p + "mlp.c_fc.bias"] = [I]
            s[p + "mlp.c_proj.weight"] = [I, H]
            s[p + "mlp.c_proj.bias"] = [H]
        s["transformer.ln_f.weight"] = [H]
        s["transformer.ln_f.bias"] = [H]
    elif c.arch == "gpt_neox":
        s["gpt_neox.embed_in.weight"] = [V, H]
        for i in range(c.layers):
            p = f"gpt_neox.layers.{i}."
            for nm in ("input_layernorm", "post_attention_layernorm"):
                s[p + nm + ".weight"] = [H]
                s[p + nm + ".bias"] = [H]
            s[p + "attention.query_key_value.weight"] = [3 * H, H]
            if c.attention_bias:
                s[p + "attention.query_key_value.bias"] = [3 * H]
            s[p + "attention.dense.weight"] = [H, H]
            if c.attention_bias:
                s[p + "attention.dense.bias"] = [H]
            s[p + "mlp.dense_h_to_4h.weight"] = [I, H]
            s[p + "mlp.dense_h_to_4h.bias"] = [I]
            s[p + "mlp.dense_4h_to_h.weight"] = [H, I]
            s[p + "mlp.dense_4h_to_h.bias"] = [H]
        s["gpt_neox.final_layer_norm.weight"] = [H]
        s["gpt_neox.final_layer_norm.bias"] = [H]
        s["embed_out.weight"] = [V, H]
        return s
    elif c.arch == "gptj":
        s["transformer.wte.weight"] = [V, H]
        for i in range(c.layers):
            p = f"transformer.h.{i}."
            s[p + "ln_1.weight"] = [H]
            s[p + "ln_1.bias"] = [H]
            for nm in ("q_proj", "k_proj", "v_proj", "out_proj"):
                s[p + f"attn.{nm}.weight"] = [H, H]
            s[p + "mlp.fc_in.weight"] = [I, H]
            s[p + "mlp.fc_in.bias"] = [I]
            s[p + "mlp.fc_out.weight"] = [H, I]
            s[p + "mlp.fc_out.bias"] = [H]
        s["transformer.ln_f.weight"] = [H]
        s["transformer.ln_f.bias"] = [H]
        s["lm_head.weight"] = [V, H]
        s["lm_head.bias"] = [V]
        return s
    elif c.arch == "gpt_neo":  # nn.Linear weights [out, in]; lm_head.weight (no bias) added below
        s["transformer.wte.weight"] = [V, H]
        s["transformer.wpe.weight"] = [c.n_positions, H]
        for i in range(c.layers):
            p = f"transformer.h.{i}."
            s[p + "ln_1.weight"] = [H]
            s[p + "ln_1.bias"] = [H]
            for nm in ("q_proj", "k_proj", "v_proj", "out_proj"):
                s[p + f"attn.attention.{nm}.weight"] = [H, H]
            s[p + "attn.attention.out_proj.bias"] = [H]
            s[p + "ln_2.weight"] = [H]
            s[p + "ln_2.bias"] = [H]
            s[p + "mlp.c_fc.weight"] = [I, H]
            s[p + "mlp.c_fc.bias"] = [I]
            s[p + "mlp.c_proj.weight"] = [H, I]
            s[p + "mlp.c_proj.bias"] = [H]
        s["transformer.ln_f.weight"] = [H]
        s["transformer.ln_f.bias"] = [H]
    elif c.arch == "opt":  # OPTForCausalLM's names (a Hub checkpoint's bare decoder.* are normalised)
        P = c.proj_dim
        s["model.decoder.embed_tokens.weight"] = [V, P]
        s["model.decoder.embed_positions.weight"] = [c.n_positions + OPT_POSITION_OFFSET, H]
        if P != H:
            s["model.decoder.project_in.weight"] = [H, P]
            s["model.decoder.project_out.weight"] = [P, H]
        norms = ("self_attn_layer_norm", "final_layer_norm")
        for i in range(c.layers):
            p = f"model.decoder.layers.{i}."
            for nm in ("q_proj", "k_proj", "v_proj", "out_proj"):
                s[p + f"self_attn.{nm}.weight"] = [H, H]
                if c.bias:
                    s[p + f"self_attn.{nm}.bias"] = [H]
            if c.affine:
                s[p + norms[0] + ".weight"] = [H]
                s[p + norms[0] + ".bias"] = [H]
            s[p + "fc1.weight"] = [I, H]
            if c.bias:
                s[p + "fc1.bias"] = [I]
            s[p + "fc2.weight"] = [H, I]
            if c.bias:
                s[p + "fc2.bias"] = [H]
            if c.affine:
                s[p + norms[1] + ".weight"] = [H]
                s[p + norms[1] + ".bias"] = [H]
        if c.final_norm and c.affine:
            s["model.decoder.final_layer_norm.weight"] = [H]
            s["model.decoder.final_layer_norm.bias"] = [H]
        s["lm_head.weight"] = [V, P]
        return s
    elif c.arch == "phi":
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        s["model.embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = [H]
            s[p + "input_layernorm.bias"] = [H]
            for nm, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                s[p + f"self_attn.{nm}.weight"] = [rows, H]
                s[p + f"self_attn.{nm}.bias"] = [rows]
            s[p + "self_attn.dense.weight"] = [H, q]
            s[p + "self_attn.dense.bias"] = [H]
            s[p + "mlp.fc1.weight"] = [I, H]
            s[p + "mlp.fc1.bias"] = [I]
            s[p + "mlp.fc2.weight"] = [H, I]
            s[p + "mlp.fc2.bias"] = [H]
        s["model.final_layernorm.weight"] = [H]
        s["model.final_layernorm.bias"] = [H]
        s["lm_head.weight"] = [V, H]
        s["lm_head.bias"] = [V]
        return s
    elif c.arch == "phi3":
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        s["model.embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = [H]
            s[p + "self_attn.qkv_proj.weight"] = [q + 2 * kv, H]
            s[p + "self_attn.o_proj.weight"] = [H, q]
            s[p + "post_attention_layernorm.weight"] = [H]
            s[p + "mlp.gate_up_proj.weight"] = [2 * I, H]
            s[p + "mlp.down_proj.weight"] = [H, I]
        s["model.norm.weight"] = [H]
    elif c.arch in ("gemma2", "gemma3"):
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        base = getattr(c, "prefix", "model")
        s[base + ".embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"{base}.layers.{i}."
            s[p + "input_layernorm.weight"] = [H]
            for nm, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                s[p + f"self_attn.{nm}.weight"] = [rows, H]
                if c.attention_bias:
                    s[p + f"self_attn.{nm}.bias"] = [rows]
            s[p + "self_attn.o_proj.weight"] = [H, q]
            if c.attention_bias:
                s[p + "self_attn.o_proj.bias"] = [H]
            if c.arch == "gemma3":
                s[p + "self_attn.q_norm.weight"] = [c.head_dim]
                s[p + "self_attn.k_norm.weight"] = [c.head_dim]
            s[p + "post_attention_layernorm.weight"] = [H]
            s[p + "pre_feedforward_layernorm.weight"] = [H]
            s[p + "mlp.gate_proj.weight"] = [I, H]
            s[p + "mlp.up_proj.weight"] = [I, H]
            s[p + "mlp.down_proj.weight"] = [H, I]
            s[p + "post_feedforward_layernorm.weight"] = [H]
        s[base + ".norm.weight"] = [H]
    elif c.arch == "gpt_oss":
        # GptOssForCausalLM's parameters (no conversion mapping: the Hub's names are the modules'):
        # the experts stacked, [in, out] (x @ W), gate / up interleaved in gate_up_proj's columns.
        # An MXFP4 checkpoint stores gate_up_proj / down_proj as _blocks / _scales instead
        # (mxfp4_shapes); these are the dequantized shapes.
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        E = c.experts
        s["model.embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = [H]
            for nm, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                s[p + f"self_attn.{nm}.weight"] = [rows, H]
                if c.attention_bias:
                    s[p + f"self_attn.{nm}.bias"] = [rows]
            s[p + "self_attn.o_proj.weight"] = [H, q]
            if c.attention_bias:
                s[p + "self_attn.o_proj.bias"] = [H]
            s[p + "self_attn.sinks"] = [c.heads]
            s[p + "post_attention_layernorm.weight"] = [H]
            s[p + "mlp.router.weight"] = [E, H]
            s[p + "mlp.router.bias"] = [E]
            s[p + "mlp.experts.gate_up_proj"] = [E, H, 2 * I]
            s[p + "mlp.experts.gate_up_proj_bias"] = [E, 2 * I]
            s[p + "mlp.experts.down_proj"] = [E, I, H]
            s[p + "mlp.experts.down_proj_bias"] = [E, H]
        s["model.norm.weight"] = [H]
    elif c.arch in ("deepseek_v3", "deepseek_v2"):
        # the Hub's layout (what transformers 5 also saves): per-expert tensors (on load HF stacks
        # them into experts.gate_up_proj [E, 2I, H] (gate rows first) and experts.down_proj [E, H, I];
        # a checkpoint stored that way is read too: _norm_deepseek_v3_names); DeepSeek-V3: the
        # router's float32 e_score_correction_bias buffer beside its weight; DeepSeek-V2: no such
        # buffer, and with mlp_bias the dense MLP's and the shared experts' biases (n_shared_experts 0:
        # zero-width shared experts, [0, H] / [H, 0] tensors a checkpoint may leave out)
        nh, qk, r_kv, E, Ie, S = c.heads, c.qk_head_dim, c.kv_lora_rank, c.experts, c.moe_inner, c.shared_inner
        s["model.embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            A = p + "self_attn."
            s[p + "input_layernorm.weight"] = [H]
            if c.q_lora_rank is None:
                s[A + "q_proj.weight"] = [nh * qk, H]
            else:
                s[A + "q_a_proj.weight"] = [c.q_lora_rank, H]
                if c.attention_bias:
                    s[A + "q_a_proj.bias"] = [c.q_lora_rank]
                s[A + "q_a_layernorm.weight"] = [c.q_lora_rank]
                s[A + "q_b_proj.weight"] = [nh * qk, c.q_lora_rank]
            s[A + "kv_a_proj_with_mqa.weight"] = [r_kv + c.qk_rope, H]
            if c.attention_bias:
                s[A + "kv_a_proj_with_mqa.bias"] = [r_kv + c.qk_rope]
            s[A + "kv_a_layernorm.weight"] = [r_kv]
            s[A + "kv_b_proj.weight"] = [nh * (c.qk_nope + c.v_head_dim), r_kv]
            s[A + "o_proj.weight"] = [H, nh * c.v_head_dim]
            if c.attention_bias:
                s[A + "o_proj.bias"] = [H]
            s[p + "post_attention_layernorm.weight"] = [H]
            m = p + "mlp."
            if c.sparse[i]:
                s[m + "gate.weight"] = [E, H]
                if c.arch == "deepseek_v3":
                    s[m + "gate.e_score_correction_bias"] = [E]
                for e in range(E):
                    s[f"{m}experts.{e}.gate_proj.weight"] = [Ie, H]
                    s[f"{m}experts.{e}.up_proj.weight"] = [Ie, H]
                    s[f"{m}experts.{e}.down_proj.weight"] = [H, Ie]
                m += "shared_experts."
                I_m = S
            else:
                I_m = I
            s[m + "gate_proj.weight"] = [I_m, H]
            s[m + "up_proj.weight"] = [I_m, H]
            s[m + "down_proj.weight"] = [H, I_m]
            if c.mlp_bias:  # DeepSeek-V2's DeepseekV2MLP (dense MLP and shared experts)
                s[m + "gate_proj.bias"] = [I_m]
                s[m + "up_proj.bias"] = [I_m]
                s[m + "down_proj.bias"] = [H]
        s["model.norm.weight"] = [H]
    elif c.arch == "olmo":
        # OlmoLayerNorm has no parameters: no norm tensors at all
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        s["model.embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            for nm, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                s[p + f"self_attn.{nm}.weight"] = [rows, H]
                if c.attention_bias:
                    s[p + f"self_attn.{nm}.bias"] = [rows]
            s[p + "self_attn.o_proj.weight"] = [H, q]
            if c.attention_bias:
                s[p + "self_attn.o_proj.bias"] = [H]
            s[p + "mlp.gate_proj.weight"] = [I, H]
            s[p + "mlp.up_proj.weight"] = [I, H]
            s[p + "mlp.down_proj.weight"] = [H, I]
    elif c.arch in ("olmo2", "olmo3"):
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        s["model.embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            for nm, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                s[p + f"self_attn.{nm}.weight"] = [rows, H]
                if c.attention_bias:
                    s[p + f"self_attn.{nm}.bias"] = [rows]
            s[p + "self_attn.o_proj.weight"] = [H, q]
            if c.attention_bias:
                s[p + "self_attn.o_proj.bias"] = [H]
            s[p + "self_attn.q_norm.weight"] = [q]  # over the whole projection
            s[p + "self_attn.k_norm.weight"] = [kv]
            s[p + "post_attention_layernorm.weight"] = [H]
            s[p + "mlp.gate_proj.weight"] = [I, H]
            s[p + "mlp.up_proj.weight"] = [I, H]
            s[p + "mlp.down_proj.weight"] = [H, I]
            s[p + "post_feedforward_layernorm.weight"] = [H]
        s["model.norm.weight"] = [H]
    else:
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        s["model.embed_tokens.weight"] = [V, H]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = [H]
            for nm, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                s[p + f"self_attn.{nm}.weight"] = [rows, H]
                if c.attention_bias:
                    s[p + f"self_attn.{nm}.bias"] = [rows]
            if c.arch in ("qwen3", "qwen3_moe"):
                s[p + "self_attn.q_norm.weight"] = [c.head_dim]
                s[p + "self_attn.k_norm.weight"] = [c.head_dim]
            if c.arch == "olmoe":  # over the whole projections
                s[p + "self_attn.q_norm.weight"] = [q]
                s[p + "self_attn.k_norm.weight"] = [kv]
            s[p + "self_attn.o_proj.weight"] = [H, q]
            if c.attention_bias and c.arch not in ("qwen2", "qwen2_moe"):  # those: q / k / v only
                s[p + "self_attn.o_proj.bias"] = [H]
            s[p + "post_attention_layernorm.weight"] = [H]
            if c.arch in MOE_ARCHS and c.sparse[i]:
                # the Hub layout, which transformers 5 also saves (its conversion_mapping fuses
                # w1 / w3 or gate_proj / up_proj into experts.gate_up_proj [E, 2I, H] on load)
                E, Ie = c.experts, c.moe_inner
                m = p + ("block_sparse_moe." if c.arch == "mixtral" else "mlp.")
                s[m + "gate.weight"] = [E, H]
                names = ("w1", "w2", "w3") if c.arch == "mixtral" else ("gate_proj", "down_proj", "up_proj")
                for e in range(E):
                    s[f"{m}experts.{e}.{names[0]}.weight"] = [Ie, H]
                    s[f"{m}experts.{e}.{names[1]}.weight"] = [H, Ie]
                    s[f"{m}experts.{e}.{names[2]}.weight"] = [Ie, H]
                if c.arch == "qwen2_moe":  # Qwen2MoeSparseMoeBlock's shared expert and its gate
                    S = c.shared_inner
                    s[m + "shared_expert.gate_proj.weight"] = [S, H]
                    s[m + "shared_expert.up_proj.weight"] = [S, H]
                    s[m + "shared_expert.down_proj.weight"] = [H, S]
                    s[m + "shared_expert_gate.weight"] = [1, H]
                continue
            s[p + "mlp.gate_proj.weight"] = [I, H]
            s[p + "mlp.up_proj.weight"] = [I, H]
            s[p + "mlp.down_proj.weight"] = [H, I]
            if c.mlp_bias:
                s[p + "mlp.gate_proj.bias"] = [I]
                s[p + "mlp.up_proj.bias"] = [I]
                s[p + "mlp.down_proj.bias"] = [H]
        s["model.norm.weight"] = [H]
    s["lm_head.weight"] = [V, H]
    return s


MXFP4_EXPERTS = ("gate_up_proj", "down_proj")  # GptOssExperts' quantized parameters
# transformers.integrations.mxfp4.FP4_VALUES: the e2m1 value of each 4-bit code (bit 3 the sign)
FP4_VALUES = (+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_shapes(cfg):
    """gpt_oss with MXFP4 experts: the stored name -> shape of each expert matrix's blocks and
    scales (uint8), replacing gate_up_proj / down_proj of expected_shapes: for W of dequantized
    shape [E, in, out], W_blocks [E, out, in / 32, 16] and W_scales [E, out, in / 32] (in must be a
    multiple of 32)."""
    c = cfg if isinstance(cfg, Config) else Config(cfg)
    s = OrderedDict()
    for name, shape in expected_shapes(c).items():
        if c.arch == "gpt_oss" and name.rsplit(".", 1)[-1] in MXFP4_EXPERTS:
            E, n_in, n_out = shape
            if n_in % 32:
                raise ReferenceError(f"{name}: MXFP4 needs an input width multiple of 32, not {n_in}")
            s[name + "_blocks"] = [E, n_out, n_in // 32, 16]
            s[name + "_scales"] = [E, n_out, n_in // 32]
    return s


def mxfp4_dequantize(blocks, scales):
    """transformers' _convert_moe_packed_tensors in float32: blocks uint8 [E, R, G, 16] (two e2m1
    codes a byte, the low nibble the even element), scales uint8 [E, R, G] (e8m0, bias 127):
    value = FP4_VALUES[code] * 2 ** (scale - 127), the 32 values of group g being columns
    32 g .. 32 g + 31; the [E, R, G * 32] result transposed to [E, G * 32, R] (x @ W layout).
    Exact in float32 (HF computes it in bf16, also exactly, then the model casts it)."""
    blocks = torch.as_tensor(blocks).to(torch.uint8)
    scales = torch.as_tensor(scales).to(torch.int64) - 127
    if blocks.ndim != 4 or blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ReferenceError(f"MXFP4 blocks {list(blocks.shape)} / scales {list(scales.shape)} do not match")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    E, R, G, B = blocks.shape
    codes = torch.stack(((blocks & 0x0F).long(), (blocks >> 4).long()), dim=-1)  # [E, R, G, 16, 2]
    vals = lut[codes].reshape(E, R, G, 2 * B)
    # 2.0 ** (scale - 127) as a float32 tensor (torch.ldexp's pow(2.0, exp)); 2 ** 128 is inf
    vals = vals * torch.pow(torch.tensor(2.0), scales.to(torch.float32))[..., None]
    return vals.reshape(E, R, G * 2 * B).transpose(1, 2).contiguous()


def _norm_gpt_oss_names(w, cfg):
    """An MXFP4 checkpoint (quantization_config mxfp4): each expert matrix's _blocks / _scales
    pair becomes the dequantized float32 tensor (a matrix stored unquantized is taken as is).
    Without the quantization_config transformers would not read the pairs: refused."""
    out = {}
    for k, v in w.items():
        base, _, suffix = k.rpartition("_")
        if suffix not in ("blocks", "scales") or not base.endswith(MXFP4_EXPERTS):
            out[k] = v
            continue
        if not cfg.mxfp4:
            raise ReferenceError(f"{k}: MXFP4 tensors without quantization_config mxfp4")
        if suffix == "scales":
            continue
        if base + "_scales" not in w:
            raise ReferenceError(f"{k} without {base}_scales")
        if base in w:
            raise ReferenceError(f"{base} stored both quantized and unquantized")
        out[base] = mxfp4_dequantize(v, w[base + "_scales"])
    for k in w:
        if k.endswith("_scales") and k[:-len("_scales")].endswith(MXFP4_EXPERTS) and k[:-7] + "_blocks" not in w:
            raise ReferenceError(f"{k} without {k[:-7]}_blocks")
    return out


def _norm_deepseek_v3_names(w, cfg):
    """DeepSeek-V3 checkpoints as transformers reads them:
    - the tensors of layers >= num_hidden_layers (the multi-token-prediction layer the Hub's files
      store as model.layers.61.*: DeepseekV3PreTrainedModel._keys_to_ignore_on_load_unexpected) are
      dropped, as are stray biases HF has no parameter for (unexpected keys it drops);
    - transformers 5's stacked experts (mlp.experts.gate_up_proj [E, 2I, H], gate rows first, and
      mlp.experts.down_proj [E, H, I], what save_pretrained(save_original_format=False) writes and
      what HF's parameters are) are split into the Hub's per-expert tensors. A layer holding both
      forms is refused.
    DeepSeek-V2 checkpoints the same way (DeepseekV2PreTrainedModel has no
    _keys_to_ignore_on_load_unexpected, but from_pretrained drops unexpected keys all the same);
    besides, an expected tensor with no elements (the zero-width shared experts of
    n_shared_experts 0) may be absent: HF's missing-key initialisation of it is a no-op."""
    shapes = expected_shapes(cfg)
    out = {}
    for k, v in w.items():
        layer = k.split(".")[2] if k.startswith("model.layers.") else ""
        if (layer.isdigit() and int(layer) >= cfg.layers) or (k.endswith(".bias") and k not in shapes):
            continue
        if k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            m = k.rsplit(".", 1)[0]  # model.layers.L.mlp.experts
            E, Ie, H = cfg.experts, cfg.moe_inner, cfg.hidden
            want = [E, 2 * Ie, H] if k.endswith("gate_up_proj") else [E, H, Ie]
            if f"{m}.0.down_proj.weight" in w or f"{m}.0.gate_proj.weight" in w:
                raise ReferenceError(f"{m}: both stacked and per-expert tensors")
            if list(v.shape) != want:
                raise ReferenceError(f"{k}: shape {list(v.shape)} != {want}")
            for e in range(E):
                if k.endswith("gate_up_proj"):
                    out[f"{m}.{e}.gate_proj.weight"], out[f"{m}.{e}.up_proj.weight"] = v[e].chunk(2, dim=0)
                else:
                    out[f"{m}.{e}.down_proj.weight"] = v[e]
            continue
        out[k] = v
    for k, shape in shapes.items():
        if k not in out and 0 in shape:
            out[k] = torch.zeros(shape)
    return out


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------

class Model:
    def __init__(self, ckpt_dir):
        self.cfg = Config(load_config(ckpt_dir))
        w = load_weights(ckpt_dir)
        head_key = "lm_head.weight"
        if self.cfg.arch == "gpt2":
            w = _norm_gpt2_names(w)
            emb_key = "wte.weight"
            prefix = "transformer."
        elif self.cfg.arch == "gpt_neox":
            w = _norm_neox_names(w)
            emb_key = "gpt_neox.embed_in.weight"
            head_key = "embed_out.weight"
            prefix = ""
        elif self.cfg.arch == "gptj":  # the causal-mask buffers older checkpoints saved
            w = {k: v for k, v in w.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
            emb_key = "transformer.wte.weight"
            prefix = ""
        elif self.cfg.arch == "gpt_neo":  # the mask buffers (bias, masked_bias) older checkpoints saved
            w = {k: v for k, v in w.items()
                 if not k.endswith((".attn.attention.bias", ".attn.attention.masked_bias"))}
            emb_key = "transformer.wte.weight"
            prefix = ""
        elif self.cfg.arch == "opt":
            w = _norm_opt_names(w)
            emb_key = "model.decoder.embed_tokens.weight"
            prefix = ""
        else:
            w = _norm_llama_names(w)
            if self.cfg.arch == "gpt_oss":
                w = _norm_gpt_oss_names(w, self.cfg)
            if self.cfg.arch in ("deepseek_v3", "deepseek_v2"):
                w = _norm_deepseek_v3_names(w, self.cfg)
            if getattr(self.cfg, "multimodal", False):
                w = _norm_gemma3_multimodal_names(w)
            emb_key = getattr(self.cfg, "prefix", "model") + ".embed_tokens.weight"
            prefix = ""
        # Tied embeddings: the single stored copy may live under either name.
        if self.cfg.tie:
            src = w.get(emb_key, w.get(head_key))
            if src is None:
                raise ReferenceError("no embedding weight")
            w[emb_key] = src
            w[head_key] = src
        # Shape check against the config (catches reference/config mismatches early).
        shapes = expected_shapes(self.cfg)
        if self.cfg.arch == "qwen2_moe":
            # nn.Linear(bias=False) modules: a stored bias HF has no parameter for (o_proj, or q / k / v
            # without qkv_bias) is an unexpected key transformers drops; so does the reference (its
            # linear layers would otherwise pick it up)
            w = {k: v for k, v in w.items() if not k.endswith(".bias") or k in shapes}
        for name, shape in shapes.items():
            key = name[len(prefix):] if name.startswith(prefix) and prefix else name
            if key not in w:
                raise ReferenceError(f"checkpoint lacks {name}")
            if list(w[key].shape) != list(shape):
                raise ReferenceError(f"{name}: shape {list(w[key].shape)} != {shape}")
        self.w = w

    # -- forward ------------------------------------------------------------------------------
    def forward(self, ids, rope_seq_len=None, patterns=False):
        """rope_seq_len: the sequence length the RoPE module sees (default: len(ids)). A sequence
        right-padded into a batch of length L runs as if alone but with rope_seq_len=L, which
        matters for dynamic and longrope scaling (HF derives it from the largest position id).
        patterns: also record NAME:scores and NAME:probs per attention module (module docstring)."""
        self._patterns = bool(patterns)
        ids = torch.as_tensor(list(ids), dtype=torch.int64)
        if ids.ndim != 1 or ids.numel() == 0:
            raise ReferenceError("a sequence must be a non-empty list of token ids")
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ReferenceError("token id outside the vocabulary")
        with torch.no_grad():
            if self.cfg.arch == "gpt2":
                pts = self._gpt2(ids)
            elif self.cfg.arch == "olmo":
                pts = self._olmo(ids, rope_seq_len)
            elif self.cfg.arch in ("olmo2", "olmo3"):
                pts = self._olmo2(ids, rope_seq_len)
            elif self.cfg.arch == "gemma":
                pts = self._gemma1(ids, rope_seq_len)
            elif self.cfg.arch in ("gemma2", "gemma3"):
                pts = self._gemma(ids, rope_seq_len)
            elif self.cfg.arch == "gpt_neox":
                pts = self._gpt_neox(ids, rope_seq_len)
            elif self.cfg.arch == "gptj":
                pts = self._gptj(ids)
            elif self.cfg.arch == "gpt_neo":
                pts = self._gpt_neo(ids)
            elif self.cfg.arch == "opt":
                pts = self._opt(ids)
            elif self.cfg.arch == "phi":
                pts = self._phi(ids, rope_seq_len)
            elif self.cfg.arch == "phi3":
                pts = self._phi3(ids, rope_seq_len)
            elif self.cfg.arch == "gpt_oss":
                pts = self._gpt_oss(ids, rope_seq_len)
            elif self.cfg.arch in ("deepseek_v3", "deepseek_v2"):
                pts = self._deepseek_v3(ids, rope_seq_len)
            else:
                pts = self._llama(ids, rope_seq_len)
        return OrderedDict((k, v.detach().cpu().contiguous().numpy()) for k, v in pts.items())

    def _pattern(self, pts, name, scores, allowed, probs):
        """Records NAME:scores / NAME:probs when forward(patterns=True): scores [heads, T, T] before
        the mask (scaled, soft-capped), allowed [T, T] bool (query, key), probs [heads, T, T]; both
        stored [T, heads, T] float32, masked scores as -inf."""
        if not getattr(self, "_patterns", False):
            return
        masked = torch.where(allowed, scores.float(), torch.tensor(float("-inf")))
        pts[name + ":scores"] = masked.transpose(0, 1).contiguous()
        pts[name + ":probs"] = probs.float().transpose(0, 1).contiguous()

    def _gpt2(self, ids):
        c, w = self.cfg, self.w
        T = ids.shape[0]
        if T > c.n_positions:
            raise ReferenceError("sequence longer than n_positions")
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def ln(x, p):
            return F.layer_norm(x, (c.hidden,), w[p + ".weight"], w[p + ".bias"], c.eps)

        def conv1d(x, p):  # HF Conv1D: x @ W[in, out] + b
            return torch.addmm(w[p + ".bias"], x, w[p + ".weight"])

        pos = torch.arange(T, dtype=torch.int64)
        e = F.embedding(ids, w["wte.weight"])
        rec("transformer.wte", ids, e)
        pe = F.embedding(pos, w["wpe.weight"])
        rec("transformer.wpe", pos, pe)
        h = e + pe  # dropout is the identity in eval
        nh, hd = c.heads, c.head_dim
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        act = _act(c.act)
        for i in range(c.layers):
            p = f"h.{i}"
            P = "transformer." + p
            block_in = h
            x = ln(h, p + ".ln_1")
            rec(P + ".ln_1", h, x)
            qkv = conv1d(x, p + ".attn.c_attn")
            rec(P + ".attn.c_attn", x, qkv)
            q, k, v = qkv.split(c.hidden, dim=-1)
            q = q.view(T, nh, hd).transpose(0, 1)
            k = k.view(T, nh, hd).transpose(0, 1)
            v = v.view(T, nh, hd).transpose(0, 1)
            if c.reorder_and_upcast:
                # GPT2Attention._upcast_and_reordered_attn (eager attention): one float32 baddbmm
                # with the scale folded into alpha, then mask and softmax in float32.
                scale_factor = 1.0
                if c.scale_attn_weights:
                    scale_factor /= float(v.size(-1)) ** 0.5
                if c.scale_by_layer:
                    scale_factor /= float(i + 1)
                att = torch.empty(nh, T, T, dtype=torch.float32)
                att = torch.baddbmm(att, q.float(), k.transpose(-1, -2).float(), beta=0, alpha=scale_factor)
                scores = att
                att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))
                att = F.softmax(att, dim=-1).type(v.dtype)
            else:
                # eager_attention_forward: divide by sqrt(head_dim), then by layer_idx + 1
                att = torch.matmul(q, k.transpose(-1, -2))
                if c.scale_attn_weights:
                    att = att / torch.full([], v.size(-1) ** 0.5, dtype=att.dtype)
                if c.scale_by_layer:
                    att = att / float(i + 1)
                scores = att
                att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))
                att = F.softmax(att, dim=-1, dtype=torch.float32)
            self._pattern(pts, P + ".attn", scores, causal, att)
            o = torch.matmul(att, v)  # [nh, T, hd]
            merged = o.transpose(0, 1).contiguous().view(T, nh * hd)
            a = conv1d(merged, p + ".attn.c_proj")
            rec(P + ".attn.c_proj", merged, a)
            rec(P + ".attn", x, a)
            h = a + block_in
            x2 = ln(h, p + ".ln_2")
            rec(P + ".ln_2", h, x2)
            f = conv1d(x2, p + ".mlp.c_fc")
            rec(P + ".mlp.c_fc", x2, f)
            g = act(f)
            rec(P + ".mlp.act", f, g)
            m = conv1d(g, p + ".mlp.c_proj")
            rec(P + ".mlp.c_proj", g, m)
            rec(P + ".mlp", x2, m)
            h = h + m
            rec(P, block_in, h)
        hf = ln(h, "ln_f")
        rec("transformer.ln_f", h, hf)
        logits = F.linear(hf, w["lm_head.weight"])
        rec("lm_head", hf, logits)
        return pts

    def _llama(self, ids, rope_seq_len=None):
        c, w = self.cfg, self.w
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def rms(x, p):
            var = x.pow(2).mean(-1, keepdim=True)
            return w[p + ".weight"] * (x * torch.rsqrt(var + c.eps))

        def lin(x, p):
            return F.linear(x, w[p + ".weight"], w.get(p + ".bias"))

        nh, nkv, hd = c.heads, c.kv_heads, c.head_dim
        groups = nh // nkv
        scaling = hd ** -0.5
        cos, sin = rope_cos_sin(c.rope, hd, T, seq_len=rope_seq_len)
        qi = torch.arange(T)[:, None]
        kj = torch.arange(T)[None, :]
        masks = []
        for win in c.windows:
            allowed = kj <= qi
            if win is not None:
                allowed = allowed & (kj > qi - int(win))
            masks.append(allowed)
        act = _act(c.act)
        neg = torch.tensor(torch.finfo(torch.float32).min)
        qk_norm = c.arch in ("qwen3", "qwen3_moe")
        qk_norm_whole = c.arch == "olmoe"  # OlmoeAttention: q_norm(q_proj(x)), k_norm(k_proj(x))
        clip = getattr(c, "clip_qkv", None)  # olmoe only

        def clamp(t):
            # OlmoeAttention's clip_qkv: clamp_ in place on q_norm's / k_norm's / v_proj's outputs after
            # their hooks ran, so the recorded points keep the unclamped values: out of place here
            return t if clip is None else t.clamp(min=-clip, max=clip)

        e = F.embedding(ids, w["model.embed_tokens.weight"])
        rec("model.embed_tokens", ids, e)
        h = e
        for i in range(c.layers):
            p = f"model.layers.{i}"
            layer_in = h
            x = rms(h, p + ".input_layernorm")
            rec(p + ".input_layernorm", h, x)
            # Module order as Qwen3Attention.forward calls them: q_proj, q_norm, k_proj, k_norm,
            # v_proj (the other families have no q_norm / k_norm).
            q = lin(x, p + ".self_attn.q_proj")
            rec(p + ".self_attn.q_proj", x, q)
            if qk_norm_whole:
                qn = rms(q, p + ".self_attn.q_norm")  # over heads * head_dim
                rec(p + ".self_attn.q_norm", q, qn)
                q = qn
            q = q.view(T, nh, hd)
            if qk_norm:
                qn = rms(q, p + ".self_attn.q_norm")  # over head_dim, per head
                rec(p + ".self_attn.q_norm", q, qn)
                q = qn
            k = lin(x, p + ".self_attn.k_proj")
            rec(p + ".self_attn.k_proj", x, k)
            if qk_norm_whole:
                kn = rms(k, p + ".self_attn.k_norm")  # over kv_heads * head_dim
                rec(p + ".self_attn.k_norm", k, kn)
                k = kn
            k = k.view(T, nkv, hd)
            if qk_norm:
                kn = rms(k, p + ".self_attn.k_norm")
                rec(p + ".self_attn.k_norm", k, kn)
                k = kn
            v = lin(x, p + ".self_attn.v_proj")
            rec(p + ".self_attn.v_proj", x, v)
            # olmoe's clip_qkv, after q_norm / k_norm (elementwise: the [T, heads, hd] views clamp alike)
            q, k, v = clamp(q), clamp(k), clamp(v)
            qh = q.transpose(0, 1)
            kh = k.transpose(0, 1)
            vh = v.view(T, nkv, hd).transpose(0, 1)
            if c.rope_layers is None or c.rope_layers[i]:  # smollm3's NoPE layers skip it
                qh = apply_rope(qh, cos, sin)
                kh = apply_rope(kh, cos, sin)
            # repeat_kv: kv head j serves query heads j*groups .. (j+1)*groups-1
            kh = kh[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
            vh = vh[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
            att = torch.matmul(qh, kh.transpose(1, 2)) * scaling
            scores = att
            att = torch.where(masks[i], att, neg)
            att = F.softmax(att, dim=-1, dtype=torch.float32)
            self._pattern(pts, p + ".self_attn", scores, masks[i], att)
            o = torch.matmul(att, vh).transpose(0, 1).contiguous().view(T, nh * hd)
            a = lin(o, p + ".self_attn.o_proj")
            rec(p + ".self_attn.o_proj", o, a)
            rec(p + ".self_attn", x, a)
            h = layer_in + a
            x2 = rms(h, p + ".post_attention_layernorm")
            rec(p + ".post_attention_layernorm", h, x2)
            if c.arch in MOE_ARCHS and c.sparse[i]:
                h = h + self._sparse_moe(x2, i, rec)
                rec(p, layer_in, h)
                continue
            g = lin(x2, p + ".mlp.gate_proj")
            rec(p + ".mlp.gate_proj", x2, g)
            u = lin(x2, p + ".mlp.up_proj")
            rec(p + ".mlp.up_proj", x2, u)
            ga = act(g)
            rec(p + ".mlp.act_fn", g, ga)
            d_in = ga * u
            d = lin(d_in, p + ".mlp.down_proj")
            rec(p + ".mlp.down_proj", d_in, d)
            rec(p + ".mlp", x2, d)
            h = h + d
            rec(p, layer_in, h)
        hn = rms(h, "model.norm")
        rec("model.norm", h, hn)
        logits = F.linear(hn, w["lm_head.weight"])
        rec("lm_head", hn, logits)
        return pts

    def _sparse_moe(self, x, i, rec):
        """MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock of layer i on x
        [T, H] (eval: no router jitter). Records .mlp.gate (its input x, its output the router
        logits [T, E]: the first element of HF's (logits, scores, indices)) and .mlp (Qwen2-MoE
        also its shared expert, see below); returns the block's output.
        Router (MixtralTopKRouter / Qwen3MoeTopKRouter / Qwen2MoeTopKRouter): logits = x @ gate.T;
        probs = softmax in float32; topk(probs, k) (torch.topk: the k largest, descending); Mixtral
        divides the k values by their sum always, Qwen3-MoE and Qwen2-MoE only with norm_topk_prob
        (then casts them to the logits' dtype, float32 here).
        Experts, Mixtral / Qwen3-MoE (MixtralExperts / Qwen3MoeExperts.forward,
        experts_implementation "eager"): final = zeros; for each expert e that some token picked,
        in ascending e: the (slot, token) pairs with idx[token, slot] == e in row-major order of
        idx.T (HF's torch.where(one_hot(idx).permute(2, 1, 0)[e])), y = down(act(gate(x_t)) *
        up(x_t)) times the token's routing weight in that slot, final.index_add_(0, tokens, y). HF
        computes gate and up in one F.linear with the fused gate_up_proj [w1; w3] (its load-time
        conversion of the Hub tensors), chunked in two: done the same way here. So each token's
        output is 0 + w_a y_a + w_b y_b ... summed in ascending expert order, which makes the
        float32 result bit-identical to HF's eager experts.
        Qwen2-MoE (Qwen2MoeSparseMoeBlock.forward, transformers 5's DEFAULT experts
        implementation grouped_mm_experts_forward, which is what from_pretrained picks for
        Qwen2MoeExperts when none is requested), in HF's call order:
          s = shared_expert(x) = down(act(gate_proj(x)) * up_proj(x)) (shared_expert_intermediate_size);
          router as above;
          experts: for each (token, slot) y = down_e(act(g) * u) * weight[token, slot], with g, u the
            halves of x_t @ [gate_e; up_e].T; routed = sum over the token's k slots in SLOT order
            (topk order, largest probability first: HF's view(T, k, H).sum(1)), not expert order;
          z = shared_expert_gate(x) ([T, 1], no bias; the recorded point is this logit);
          output = routed + sigmoid(z) * s."""
        c, w = self.cfg, self.w
        P = f"model.layers.{i}.mlp"
        mixtral, qwen2 = c.arch == "mixtral", c.arch == "qwen2_moe"
        W = f"model.layers.{i}." + ("block_sparse_moe" if mixtral else "mlp")
        g_name, d_name, u_name = ("w1", "w2", "w3") if mixtral else ("gate_proj", "down_proj", "up_proj")
        if qwen2:
            shared = self._gated_mlp(x, P + ".shared_expert", rec)  # records its children and itself
        logits = F.linear(x, w[W + ".gate.weight"])
        rec(P + ".gate", x, logits)
        probs = F.softmax(logits.float(), dim=-1)
        top, idx = torch.topk(probs, c.top_k, dim=-1)  # [T, k]
        if c.norm_topk:
            top = top / top.sum(dim=-1, keepdim=True)
        top = top.to(logits.dtype)
        if getattr(self, "_routes", None) is not None:
            srt = logits.sort(dim=-1, descending=True).values
            gap = srt[:, c.top_k - 1] - srt[:, c.top_k] if c.top_k < c.experts else \
                torch.full((x.shape[0],), float("inf"))
            self._routes[i] = dict(experts=idx, weights=top, logits=logits, margin=gap)
        act = _act(c.act)
        if qwen2:
            per_slot = torch.zeros(x.shape[0], c.top_k, x.shape[1], dtype=x.dtype)
            for e in range(c.experts):
                tok, slot = torch.where(idx == e)
                if tok.numel() == 0:
                    continue
                E = f"{W}.experts.{e}."
                gate_up = torch.cat((w[E + g_name + ".weight"], w[E + u_name + ".weight"]), dim=0)
                gate, up = torch.matmul(x[tok], gate_up.t()).chunk(2, dim=-1)
                y = torch.matmul(act(gate) * up, w[E + d_name + ".weight"].t())
                per_slot[tok, slot] = y * top[tok, slot, None]
            routed = per_slot.sum(dim=1)
            z = F.linear(x, w[P + ".shared_expert_gate.weight"])
            rec(P + ".shared_expert_gate", x, z)
            out = routed + torch.sigmoid(z) * shared
            rec(P, x, out)
            return out
        out = torch.zeros_like(x)
        slot_of = idx.transpose(0, 1)  # [k, T]
        for e in range(c.experts):
            slot, tok = torch.where(slot_of == e)
            if tok.numel() == 0:
                continue
            E = f"{W}.experts.{e}."
            gate_up = torch.cat((w[E + g_name + ".weight"], w[E + u_name + ".weight"]), dim=0)
            gate, up = F.linear(x[tok], gate_up).chunk(2, dim=-1)
            y = F.linear(act(gate) * up, w[E + d_name + ".weight"])
            out.index_add_(0, tok, y * top[tok, slot, None])
        rec(P, x, out)
        return out

    def routing(self, ids):
        """Routing of every sparse layer for one sequence: OrderedDict layer -> dict of numpy
        arrays: experts [T, k] int64 (torch.topk's order), weights [T, k] float32 (after the
        renormalisation, if any), logits [T, E], margin [T] float32 (the k-th largest router
        logit minus the (k+1)-th: how far the token is from a top-k tie, to set against the float32
        rounding of another implementation's logits; inf when k = E; DeepSeek-V3: in biased-score
        units, the smaller of the expert and the group gaps, see _deepseek_v3_moe; DeepSeek-V2: in
        probability units, likewise, see _deepseek_v2_moe)."""
        if self.cfg.arch not in MOE_ARCHS:
            raise ReferenceError(f"{self.cfg.arch} has no router")
        self._routes = OrderedDict()
        try:
            self.forward(ids)
            return OrderedDict((i, {k: v.detach().numpy() for k, v in r.items()})
                               for i, r in self._routes.items())
        finally:
            self._routes = None

    def _lin(self, x, p):
        return F.linear(x, self.w[p + ".weight"], self.w.get(p + ".bias"))

    def _attend(self, q, k, v, cos, sin, scale, window=None, softcap=None, pts=None, name=None, sinks=None):
        """eager_attention_forward on q [T, heads * head_dim], k / v [T, kv_heads * head_dim]:
        RoPE, repeat_kv, scores * scale, optional softcap * tanh(scores / softcap), the causal (and
        sliding: i - window < j <= i) mask, softmax in float32; returns the context
        [T, heads * head_dim] (o_proj's input). pts / name: where the attention patterns of module
        name go (forward(patterns=True)). sinks [heads] (gpt-oss): GptOss's eager_attention_forward
        instead: the masked scores get the head's sink logit as a last column, minus the row max,
        softmax (in their dtype), the sink column dropped; the recorded :scores are without it."""
        c = self.cfg
        T, nh, nkv, hd = q.shape[0], c.heads, c.kv_heads, c.head_dim
        qh = apply_rope(q.view(T, nh, hd).transpose(0, 1), cos, sin)
        kh = apply_rope(k.view(T, nkv, hd).transpose(0, 1), cos, sin)
        vh = v.view(T, nkv, hd).transpose(0, 1)
        groups = nh // nkv
        kh = kh[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
        vh = vh[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
        att = torch.matmul(qh, kh.transpose(1, 2)) * scale
        if softcap is not None:
            att = torch.tanh(att / softcap) * softcap
        qi, kj = torch.arange(T)[:, None], torch.arange(T)[None, :]
        allowed = kj <= qi
        if window is not None:
            allowed = allowed & (kj > qi - int(window))
        scores = att
        att = torch.where(allowed, att, torch.tensor(torch.finfo(torch.float32).min))
        if sinks is None:
            att = F.softmax(att, dim=-1, dtype=torch.float32)
        else:
            combined = torch.cat((att, sinks.reshape(nh, 1, 1).expand(nh, T, 1).to(att.dtype)), dim=-1)
            combined = combined - combined.max(dim=-1, keepdim=True).values
            att = F.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
        if pts is not None:
            self._pattern(pts, name, scores, allowed, att)
        return torch.matmul(att, vh).transpose(0, 1).contiguous().view(T, nh * hd)

    def _gated_mlp(self, x, p, rec):
        """down_proj(act_fn(gate_proj(x)) * up_proj(x)), recording each module in call order."""
        g = self._lin(x, p + ".gate_proj")
        rec(p + ".gate_proj", x, g)
        ga = _act(self.cfg.act)(g)
        rec(p + ".act_fn", g, ga)
        u = self._lin(x, p + ".up_proj")
        rec(p + ".up_proj", x, u)
        d = self._lin(ga * u, p + ".down_proj")
        rec(p + ".down_proj", ga * u, d)
        rec(p, x, d)
        return d

    def _olmo(self, ids, rope_seq_len=None):
        """OLMo 1 (eager): OlmoModel / OlmoDecoderLayer / OlmoAttention / OlmoMLP and
        OlmoForCausalLM, all float32:
        - OlmoLayerNorm: F.layer_norm(x.float(), (hidden,), None, None, eps=1e-5) cast back: no
          weight, no bias (input_layernorm, post_attention_layernorm, model.norm);
        - Llama's pre-norm layer: h = x + self_attn(input_layernorm(x));
          out = h + mlp(post_attention_layernorm(h));
        - attention: q / k / v projections (biases with attention_bias); with clip_qkv each of the
          three outputs clamped to [-clip_qkv, clip_qkv] (HF: clamp_ in place, after the
          projections' forward hooks ran: the q/k/v_proj points are the UNclamped outputs); then
          the head split, RoPE (rotate-half, the whole head), repeat_kv, scores * head_dim ** -0.5,
          causal mask, softmax in float32, o_proj (bias with attention_bias);
        - mlp: down(act(gate(x)) * up(x)) with hidden_act;
        - logits = lm_head(norm(h)) (lm_head tied to the embedding with tie_word_embeddings)."""
        c, w, lin = self.cfg, self.w, self._lin
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def ln(x):
            return F.layer_norm(x.float(), (c.hidden,), None, None, eps=OLMO_LAYER_NORM_EPS).to(x.dtype)

        def clamp(t):  # out of place: the recorded projection keeps its unclamped values
            return t if c.clip_qkv is None else t.clamp(min=-c.clip_qkv, max=c.clip_qkv)

        cos, sin = rope_cos_sin(c.rope, c.head_dim, T, seq_len=rope_seq_len)
        h = F.embedding(ids, w["model.embed_tokens.weight"])
        rec("model.embed_tokens", ids, h)
        for i in range(c.layers):
            p = f"model.layers.{i}"
            A = p + ".self_attn"
            layer_in = h
            x = ln(h)
            rec(p + ".input_layernorm", h, x)
            qkv = []
            for nm in ("q_proj", "k_proj", "v_proj"):
                y = lin(x, f"{A}.{nm}")
                rec(f"{A}.{nm}", x, y)
                qkv.append(clamp(y))
            o = self._attend(*qkv, cos, sin, c.head_dim ** -0.5, pts=pts, name=A)
            a = lin(o, A + ".o_proj")
            rec(A + ".o_proj", o, a)
            rec(A, x, a)
            h = layer_in + a
            x2 = ln(h)
            rec(p + ".post_attention_layernorm", h, x2)
            h = h + self._gated_mlp(x2, p + ".mlp", rec)
            rec(p, layer_in, h)
        hn = ln(h)
        rec("model.norm", h, hn)
        rec("lm_head", hn, F.linear(hn, w["lm_head.weight"]))
        return pts

    def _olmo2(self, ids, rope_seq_len=None):
        """OLMo 2 and OLMo 3 (eager). Olmo2DecoderLayer / Olmo3DecoderLayer: no norm before the
        sublayers; each sublayer's output is normalised (post_attention_layernorm,
        post_feedforward_layernorm) before its residual add. Olmo2Attention / Olmo3Attention:
        q_norm(q_proj(x)) and k_norm(k_proj(x)) over the whole projection, then the head split, RoPE
        (one table for every layer), repeat_kv, scores * head_dim ** -0.5, the causal mask (OLMo 3's
        "sliding_attention" layers: also i - sliding_window < j <= i, c.windows), softmax in float32,
        o_proj. Olmo2RMSNorm / Olmo3RMSNorm multiply by the weight in float32 before casting back (all
        float32 here; so is RoPE, whose 16-bit precision differs between the two, see Config._olmo3)."""
        c, w, lin = self.cfg, self.w, self._lin
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def rms(x, p):
            var = x.pow(2).mean(-1, keepdim=True)
            return w[p + ".weight"] * (x * torch.rsqrt(var + c.eps))

        cos, sin = rope_cos_sin(c.rope, c.head_dim, T, seq_len=rope_seq_len)
        h = F.embedding(ids, w["model.embed_tokens.weight"])
        rec("model.embed_tokens", ids, h)
        for i in range(c.layers):
            p = f"model.layers.{i}"
            A = p + ".self_attn"
            layer_in = h
            q = lin(h, A + ".q_proj")
            rec(A + ".q_proj", h, q)
            qn = rms(q, A + ".q_norm")  # over heads * head_dim, before the head split
            rec(A + ".q_norm", q, qn)
            k = lin(h, A + ".k_proj")
            rec(A + ".k_proj", h, k)
            kn = rms(k, A + ".k_norm")
            rec(A + ".k_norm", k, kn)
            v = lin(h, A + ".v_proj")
            rec(A + ".v_proj", h, v)
            o = self._attend(qn, kn, v, cos, sin, c.head_dim ** -0.5, c.windows[i], pts=pts, name=A)
            a = lin(o, A + ".o_proj")
            rec(A + ".o_proj", o, a)
            rec(A, h, a)
            an = rms(a, p + ".post_attention_layernorm")
            rec(p + ".post_attention_layernorm", a, an)
            h = layer_in + an
            d = self._gated_mlp(h, p + ".mlp", rec)
            dn = rms(d, p + ".post_feedforward_layernorm")
            rec(p + ".post_feedforward_layernorm", d, dn)
            out = h + dn
            rec(p, layer_in, out)
            h = out
        hn = rms(h, "model.norm")
        rec("model.norm", h, hn)
        rec("lm_head", hn, F.linear(hn, w["lm_head.weight"]))
        return pts

    def _gemma1(self, ids, rope_seq_len=None):
        """Gemma 1 (eager): GemmaModel / GemmaDecoderLayer / GemmaAttention / GemmaMLP and
        GemmaForCausalLM, all float32:
        - GemmaRMSNorm: x * rsqrt(mean(x^2) + eps) in float32, times (1 + w) in float32, cast back;
        - GemmaTextScaledWordEmbedding: the embedding times torch.tensor(hidden_size ** 0.5) cast
          to the weight's dtype, inside the module (model.embed_tokens is HF's own output);
        - Llama's pre-norm layer, two norms: h = x + self_attn(input_layernorm(x));
          out = h + mlp(post_attention_layernorm(h));
        - attention: q / k / v projections (biases with attention_bias), RoPE (rotate-half, the
          whole head), repeat_kv, scores * head_dim ** -0.5, causal mask, softmax in float32,
          o_proj (bias with attention_bias); no soft-cap, no window, no query_pre_attn_scalar;
        - mlp: down(act(gate(x)) * up(x)) with the activation of Config._gemma's rule;
        - logits = lm_head(norm(h)), uncapped."""
        c, w, lin = self.cfg, self.w, self._lin
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def rms(x, p):
            out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + c.eps)
            return (out * (1.0 + w[p + ".weight"].float())).type_as(x)

        cos, sin = rope_cos_sin(c.rope, c.head_dim, T, seq_len=rope_seq_len)
        weight = w["model.embed_tokens.weight"]
        h = F.embedding(ids, weight) * torch.tensor(c.hidden ** 0.5).to(weight.dtype)
        rec("model.embed_tokens", ids, h)
        for i in range(c.layers):
            p = f"model.layers.{i}"
            A = p + ".self_attn"
            layer_in = h
            x = rms(h, p + ".input_layernorm")
            rec(p + ".input_layernorm", h, x)
            qkv = []
            for nm in ("q_proj", "k_proj", "v_proj"):
                qkv.append(lin(x, f"{A}.{nm}"))
                rec(f"{A}.{nm}", x, qkv[-1])
            o = self._attend(*qkv, cos, sin, c.head_dim ** -0.5, pts=pts, name=A)
            a = lin(o, A + ".o_proj")
            rec(A + ".o_proj", o, a)
            rec(A, x, a)
            h = layer_in + a
            x2 = rms(h, p + ".post_attention_layernorm")
            rec(p + ".post_attention_layernorm", h, x2)
            h = h + self._gated_mlp(x2, p + ".mlp", rec)
            rec(p, layer_in, h)
        hn = rms(h, "model.norm")
        rec("model.norm", h, hn)
        rec("lm_head", hn, F.linear(hn, w["lm_head.weight"]))
        return pts

    def _gemma(self, ids, rope_seq_len=None):
        """Gemma 2 and Gemma 3 (eager): Gemma2Model / Gemma2DecoderLayer / Gemma2Attention and
        Gemma2ForCausalLM; Gemma3TextModel / Gemma3DecoderLayer / Gemma3Attention and
        Gemma3ForCausalLM or Gemma3ForConditionalGeneration's text path.
        - Gemma2RMSNorm / Gemma3RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, times (1 + w) in
          float32, cast back;
        - the embedding times torch.tensor(hidden_size ** 0.5) in the weight's dtype (float32 here).
          Gemma 2: Gemma2Model multiplies after nn.Embedding, so HF's module returns it unscaled; the
          model.embed_tokens point is recorded scaled (actcap's documented point). Gemma 3:
          Gemma3TextScaledWordEmbedding scales inside the module, so the point is HF's own;
        - h = x + post_attention_layernorm(self_attn(input_layernorm(x)));
          out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
        - attention: Gemma 3 runs q_proj, k_proj, v_proj, then q_norm and k_norm (its RMSNorm over
          head_dim, per head) before RoPE, and rotates local ("sliding_attention") layers with their
          own table; scores * query_pre_attn_scalar**-0.5, then cap * tanh(scores / cap) with Gemma
          2's attn_logit_softcapping (Gemma 3 never caps them), then the (sliding or causal) mask,
          softmax in float32;
        - mlp: down(act(gate(x)) * up(x)) with hidden_activation;
        - logits = lm_head(norm(h)), the lm_head point; the model then caps them with
          final_logit_softcapping (final_logits)."""
        c, w, lin = self.cfg, self.w, self._lin
        gemma3 = c.arch == "gemma3"
        T = ids.shape[0]
        B = getattr(c, "prefix", "model")
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def rms(x, p):
            out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + c.eps)
            return (out * (1.0 + w[p + ".weight"].float())).type_as(x)

        tables = {"full_attention": rope_cos_sin(c.rope, c.head_dim, T, seq_len=rope_seq_len)}
        if gemma3:
            tables["sliding_attention"] = rope_cos_sin(c.local_rope, c.head_dim, T, seq_len=rope_seq_len)
        weight = w[B + ".embed_tokens.weight"]
        h = F.embedding(ids, weight) * torch.tensor(c.hidden ** 0.5).to(weight.dtype)
        rec(B + ".embed_tokens", ids, h)
        for i in range(c.layers):
            p = f"{B}.layers.{i}"
            A = p + ".self_attn"
            layer_in = h
            x = rms(h, p + ".input_layernorm")
            rec(p + ".input_layernorm", h, x)
            qkv = []
            for nm in ("q_proj", "k_proj", "v_proj"):
                qkv.append(lin(x, f"{A}.{nm}"))
                rec(f"{A}.{nm}", x, qkv[-1])
            if gemma3:
                for j, (nm, n) in enumerate((("q_norm", c.heads), ("k_norm", c.kv_heads))):
                    per_head = qkv[j].view(T, n, c.head_dim)
                    normed = rms(per_head, f"{A}.{nm}")
                    rec(f"{A}.{nm}", per_head, normed)
                    qkv[j] = normed.reshape(T, n * c.head_dim)
            cos, sin = tables[c.layer_types[i] if gemma3 else "full_attention"]
            o = self._attend(*qkv, cos, sin, c.query_pre_attn_scalar ** -0.5, c.windows[i], c.attn_softcap,
                             pts=pts, name=A)
            a = lin(o, A + ".o_proj")
            rec(A + ".o_proj", o, a)
            rec(A, x, a)
            an = rms(a, p + ".post_attention_layernorm")
            rec(p + ".post_attention_layernorm", a, an)
            h = layer_in + an
            x2 = rms(h, p + ".pre_feedforward_layernorm")
            rec(p + ".pre_feedforward_layernorm", h, x2)
            d = self._gated_mlp(x2, p + ".mlp", rec)
            dn = rms(d, p + ".post_feedforward_layernorm")
            rec(p + ".post_feedforward_layernorm", d, dn)
            out = h + dn
            rec(p, layer_in, out)
            h = out
        hn = rms(h, B + ".norm")
        rec(B + ".norm", h, hn)
        rec("lm_head", hn, F.linear(hn, w["lm_head.weight"]))
        return pts

    def final_logits(self, ids):
        """The logits the model returns (Gemma 2: soft-capped; others: lm_head's output)."""
        lm = torch.from_numpy(self.forward(ids)["lm_head"])  # patterns off
        cap = getattr(self.cfg, "final_softcap", None)
        return (torch.tanh(lm / cap) * cap if cap is not None else lm).numpy()

    # -- point catalogue ----------------------------------------------------------------------
    def _gpt_neox(self, ids, rope_seq_len=None):
        """GPTNeoXModel / GPTNeoXLayer / GPTNeoXAttention (eager): query_key_value's output viewed
        [T, heads, 3 * head_dim] (each head's q, k and v side by side), RoPE on the first
        rotary dims of q and k, the rest passed through; scores scaled by head_dim ** -0.5, causal;
        parallel residual: mlp(ln2(x)) + attn(ln1(x)) + x, else x + attn(ln1(x)) then
        mlp(ln2(.)) + that."""
        c, w = self.cfg, self.w
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def ln(x, p):
            return F.layer_norm(x, (c.hidden,), w[p + ".weight"], w[p + ".bias"], c.eps)

        def lin(x, p):
            return F.linear(x, w[p + ".weight"], w.get(p + ".bias"))

        nh, hd = c.heads, c.head_dim
        cos, sin = rope_cos_sin(c.rope, hd, T, seq_len=rope_seq_len)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        neg = torch.tensor(torch.finfo(torch.float32).min)
        act = _act(c.act)
        e = F.embedding(ids, w["gpt_neox.embed_in.weight"])
        rec("gpt_neox.embed_in", ids, e)
        h = e
        for i in range(c.layers):
            p = f"gpt_neox.layers.{i}"
            x = ln(h, p + ".input_layernorm")
            rec(p + ".input_layernorm", h, x)
            qkv = lin(x, p + ".attention.query_key_value")
            rec(p + ".attention.query_key_value", x, qkv)
            qkv = qkv.view(T, nh, 3 * hd).transpose(0, 1)  # [nh, T, 3 * hd]
            q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            att = torch.matmul(q, k.transpose(1, 2)) * (hd ** -0.5)
            scores = att
            att = torch.where(causal, att, neg)
            att = F.softmax(att, dim=-1, dtype=torch.float32)
            self._pattern(pts, p + ".attention", scores, causal, att)
            o = torch.matmul(att, v).transpose(0, 1).contiguous().view(T, nh * hd)
            a = lin(o, p + ".attention.dense")
            rec(p + ".attention.dense", o, a)
            rec(p + ".attention", x, a)
            mlp_in = h if c.parallel else a + h
            x2 = ln(mlp_in, p + ".post_attention_layernorm")
            rec(p + ".post_attention_layernorm", mlp_in, x2)
            f = lin(x2, p + ".mlp.dense_h_to_4h")
            rec(p + ".mlp.dense_h_to_4h", x2, f)
            g = act(f)
            rec(p + ".mlp.act", f, g)
            m = lin(g, p + ".mlp.dense_4h_to_h")
            rec(p + ".mlp.dense_4h_to_h", g, m)
            rec(p + ".mlp", x2, m)
            out = m + a + h if c.parallel else m + mlp_in
            rec(p, h, out)
            h = out
        hf = ln(h, "gpt_neox.final_layer_norm")
        rec("gpt_neox.final_layer_norm", h, hf)
        logits = F.linear(hf, w["embed_out.weight"])
        rec("embed_out", hf, logits)
        return pts

    def _gptj(self, ids):
        """GPTJModel / GPTJBlock / GPTJAttention (eager) / GPTJMLP. create_sinusoidal_positions:
        inv_freq = 1 / 10000 ** (arange(0, rotary_dim, 2) / rotary_dim), angles = position (float32) x
        inv_freq, the table cat(sin, cos) for n_positions positions; each of q's and k's heads
        ([T, heads, head_dim], before the head transpose) rotates its first rotary_dim features with
        apply_rotary_pos_emb: sin and cos repeat_interleave'd by 2, x * cos + rotate_every_two(x) *
        sin, where rotate_every_two takes (x[2i], x[2i+1]) to (-x[2i+1], x[2i]); the rest passes
        through. _attn: q and k in float32, (q k^T) / sqrt(head_dim), the causal mask, softmax. Block:
        x = ln_1(h); attn(x) + mlp(x) + h."""
        c, w = self.cfg, self.w
        T = ids.shape[0]
        if T > c.n_positions:
            raise ReferenceError("sequence longer than n_positions")
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def ln(x, p):
            return F.layer_norm(x, (c.hidden,), w[p + ".weight"], w[p + ".bias"], c.eps)

        def lin(x, p):
            return F.linear(x, w[p + ".weight"], w.get(p + ".bias"))

        def rotate_every_two(x):
            x1, x2 = x[..., ::2], x[..., 1::2]
            return torch.stack((-x2, x1), dim=-1).flatten(-2)

        nh, hd, rd = c.heads, c.head_dim, c.rotary_dim
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rd, 2, dtype=torch.int64) / rd))
        angles = torch.einsum("i , j -> i j", torch.arange(c.n_positions, dtype=torch.int64).float(), inv_freq)
        table = torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)[:T]
        sin, cos = torch.split(table, rd // 2, dim=-1)
        sin = torch.repeat_interleave(sin[:, None, :], 2, 2)  # [T, 1, rd]
        cos = torch.repeat_interleave(cos[:, None, :], 2, 2)

        def rope(x):  # [T, heads, head_dim]
            r = x[..., :rd]
            return torch.cat([r * cos + rotate_every_two(r) * sin, x[..., rd:]], dim=-1)

        causal = torch.ones(T, T, dtype=torch.bool).tril()
        neg = torch.tensor(torch.finfo(torch.float32).min)
        act = _act(c.act)
        e = F.embedding(ids, w["transformer.wte.weight"])
        rec("transformer.wte", ids, e)
        h = e
        for i in range(c.layers):
            p = f"transformer.h.{i}"
            x = ln(h, p + ".ln_1")
            rec(p + ".ln_1", h, x)
            proj = {}
            for nm in ("q_proj", "k_proj", "v_proj"):
                proj[nm] = lin(x, f"{p}.attn.{nm}")
                rec(f"{p}.attn.{nm}", x, proj[nm])
            q = rope(proj["q_proj"].view(T, nh, hd)).transpose(0, 1)
            k = rope(proj["k_proj"].view(T, nh, hd)).transpose(0, 1)
            v = proj["v_proj"].view(T, nh, hd).transpose(0, 1)
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
            scores = att
            att = F.softmax(torch.where(causal, att, neg), dim=-1)
            self._pattern(pts, p + ".attn", scores, causal, att)
            o = torch.matmul(att, v).transpose(0, 1).contiguous().view(T, nh * hd)
            a = lin(o, p + ".attn.out_proj")
            rec(p + ".attn.out_proj", o, a)
            rec(p + ".attn", x, a)
            f = lin(x, p + ".mlp.fc_in")
            rec(p + ".mlp.fc_in", x, f)
            g = act(f)
            rec(p + ".mlp.act", f, g)
            m = lin(g, p + ".mlp.fc_out")
            rec(p + ".mlp.fc_out", g, m)
            rec(p + ".mlp", x, m)
            out = a + m + h
            rec(p, h, out)
            h = out
        hf = ln(h, "transformer.ln_f")
        rec("transformer.ln_f", h, hf)
        logits = lin(hf, "lm_head")
        rec("lm_head", hf, logits)
        return pts

    def _gpt_neo(self, ids):
        """GPTNeoModel / GPTNeoBlock / GPTNeoAttention / GPTNeoSelfAttention (eager) / GPTNeoMLP.
        Embeddings: wte(ids) + wpe(position_ids), position_ids = arange(T) (no cache), no scaling.
        Block (sequential pre-LN, as GPT-2's): h = h + attn(ln_1(h)); h = h + mlp(ln_2(h)).
        GPTNeoAttention only forwards to its .attention (GPTNeoSelfAttention): q_proj, k_proj,
        v_proj (no biases), heads split [heads, T, head_dim]; _attn: q and k cast to float32,
        scores = q k^T with NO 1/sqrt(head_dim) scale; torch.where(bias, scores, finfo(float32).min)
        with the layer's bias buffer (global: causal j <= i; local: also i - j < window_size); then
        create_causal_mask's eager mask is added (0 where causal, finfo.min elsewhere: for one
        unpadded sequence it adds nothing beyond causal; a causal-masked entry becomes -inf, a
        window-masked one stays finfo.min, the same softmax); softmax in float32, cast to v's
        dtype; probs @ v, heads merged, out_proj (with bias). GPTNeoMLP: c_proj(act(c_fc(x))), both
        nn.Linear with biases, act = ACT2FN[activation_function]. ln_f, then lm_head (no bias; wte
        when tied). Dropouts are the identity in eval. Patterns under the inner module's name,
        transformer.h.N.attn.attention."""
        c, w = self.cfg, self.w
        T = ids.shape[0]
        if T > c.n_positions:
            raise ReferenceError("sequence longer than max_position_embeddings")
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def ln(x, p):
            return F.layer_norm(x, (c.hidden,), w[p + ".weight"], w[p + ".bias"], c.eps)

        pos = torch.arange(T, dtype=torch.int64)
        e = F.embedding(ids, w["transformer.wte.weight"])
        rec("transformer.wte", ids, e)
        pe = F.embedding(pos, w["transformer.wpe.weight"])
        rec("transformer.wpe", pos, pe)
        h = e + pe
        nh, hd = c.heads, c.head_dim
        qi = torch.arange(T)[:, None]
        kj = torch.arange(T)[None, :]
        causal = kj <= qi
        neg = torch.tensor(torch.finfo(torch.float32).min)
        act = _act(c.act)
        for i in range(c.layers):
            p = f"transformer.h.{i}"
            A = p + ".attn.attention"
            block_in = h
            x = ln(h, p + ".ln_1")
            rec(p + ".ln_1", h, x)
            proj = {}
            for nm in ("q_proj", "k_proj", "v_proj"):
                proj[nm] = self._lin(x, f"{A}.{nm}")
                rec(f"{A}.{nm}", x, proj[nm])
            q = proj["q_proj"].view(T, nh, hd).transpose(0, 1).float()
            k = proj["k_proj"].view(T, nh, hd).transpose(0, 1).float()
            v = proj["v_proj"].view(T, nh, hd).transpose(0, 1)
            allowed = causal if c.windows[i] is None else causal & (qi - kj < c.windows[i])
            scores = torch.matmul(q, k.transpose(-1, -2))  # unscaled
            att = F.softmax(torch.where(allowed, scores, neg), dim=-1).to(v.dtype)
            self._pattern(pts, A, scores, allowed, att)
            o = torch.matmul(att, v).transpose(0, 1).contiguous().view(T, nh * hd)
            a = self._lin(o, A + ".out_proj")
            rec(A + ".out_proj", o, a)
            rec(A, x, a)
            rec(p + ".attn", x, a)
            h = a + block_in
            x2 = ln(h, p + ".ln_2")
            rec(p + ".ln_2", h, x2)
            f = self._lin(x2, p + ".mlp.c_fc")
            rec(p + ".mlp.c_fc", x2, f)
            g = act(f)
            rec(p + ".mlp.act", f, g)
            m = self._lin(g, p + ".mlp.c_proj")
            rec(p + ".mlp.c_proj", g, m)
            rec(p + ".mlp", x2, m)
            h = h + m
            rec(p, block_in, h)
        hf = ln(h, "transformer.ln_f")
        rec("transformer.ln_f", h, hf)
        logits = F.linear(hf, w["lm_head.weight"])
        rec("lm_head", hf, logits)
        return pts

    def _opt(self, ids):
        """OPTForCausalLM / OPTDecoder / OPTLearnedPositionalEmbedding / OPTDecoderLayer / OPTAttention
        (eager_attention_forward). Embeddings: embed_tokens(ids) ([T, P], P = word_embed_proj_dim);
        OPTDecoder builds attention_mask = ones and position_ids = cumsum(mask) * mask - 1 = 0..T-1
        (no padding, no cache); embed_positions(attention_mask, 0, position_ids=...) reads rows
        position_ids + 2 (OPTLearnedPositionalEmbedding.offset); THEN project_in (P != H; no bias) on
        the token embeddings; h = project_in(embed_tokens(ids)) + embed_positions, no scaling.
        OPTAttention: query = q_proj(x) * head_dim ** -0.5 (scaled BEFORE the product; the q_proj
        point is the module's unscaled output), k_proj, v_proj, heads split [heads, T, head_dim];
        eager_attention_forward with scaling=1.0: scores = query k^T, + create_causal_mask's eager
        mask (0 where j <= i, finfo(float32).min elsewhere), softmax in float32, to the query's
        dtype; probs @ v, heads merged, out_proj. Biases of q/k/v/out_proj, fc1 and fc2 iff
        enable_bias. OPTDecoderLayer, do_layer_norm_before (pre-LN: 125m, 1.3b ... 66b):
        h = x + self_attn(self_attn_layer_norm(x)); out = h + fc2(act(fc1(final_layer_norm(h))));
        else (post-LN: opt-350m): h = self_attn_layer_norm(x + self_attn(x));
        out = final_layer_norm(h + fc2(act(fc1(h)))). nn.LayerNorm eps 1e-5, with weight and bias
        iff layer_norm_elementwise_affine. Then model.decoder.final_layer_norm (do_layer_norm_before
        and not _remove_final_layer_norm), project_out (P != H; no bias), lm_head (nn.Linear(P, V,
        bias=False), embed_tokens' weight when tied). Dropouts and LayerDrop are off in eval.
        Patterns under model.decoder.layers.N.self_attn (scores: the scaled query times k^T)."""
        c, w = self.cfg, self.w
        T = ids.shape[0]
        if T > c.n_positions:
            raise ReferenceError("sequence longer than max_position_embeddings")
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def ln(x, p):
            if c.affine:
                return F.layer_norm(x, (c.hidden,), w[p + ".weight"], w[p + ".bias"], c.eps)
            return F.layer_norm(x, (c.hidden,), None, None, c.eps)

        def lin(x, p, bias):
            return F.linear(x, w[p + ".weight"], w[p + ".bias"] if bias else None)

        D = "model.decoder"
        e = F.embedding(ids, w[D + ".embed_tokens.weight"])
        rec(D + ".embed_tokens", ids, e)
        mask = torch.ones(T, dtype=torch.int64)
        pos = torch.cumsum(mask, dim=0) * mask - 1
        pe = F.embedding(pos + OPT_POSITION_OFFSET, w[D + ".embed_positions.weight"])
        rec(D + ".embed_positions", mask, pe)
        if c.proj_dim != c.hidden:
            x = lin(e, D + ".project_in", False)
            rec(D + ".project_in", e, x)
            e = x
        h = e + pe
        nh, hd = c.heads, c.head_dim
        scaling = hd ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        neg = torch.tensor(torch.finfo(torch.float32).min)
        act = _act(c.act)
        for i in range(c.layers):
            p = f"{D}.layers.{i}"
            A = p + ".self_attn"
            block_in = h
            if c.pre_norm:
                x = ln(h, p + ".self_attn_layer_norm")
                rec(p + ".self_attn_layer_norm", h, x)
            else:
                x = h
            proj = {}
            for nm in ("q_proj", "k_proj", "v_proj"):
                proj[nm] = lin(x, f"{A}.{nm}", c.bias)
                rec(f"{A}.{nm}", x, proj[nm])
            q = (proj["q_proj"] * scaling).view(T, nh, hd).transpose(0, 1)
            k = proj["k_proj"].view(T, nh, hd).transpose(0, 1)
            v = proj["v_proj"].view(T, nh, hd).transpose(0, 1)
            scores = torch.matmul(q, k.transpose(-1, -2))
            att = F.softmax(torch.where(causal, scores, neg), dim=-1, dtype=torch.float32).to(q.dtype)
            self._pattern(pts, A, scores, causal, att)
            o = torch.matmul(att, v).transpose(0, 1).contiguous().view(T, nh * hd)
            a = lin(o, A + ".out_proj", c.bias)
            rec(A + ".out_proj", o, a)
            rec(A, x, a)
            h = block_in + a
            if not c.pre_norm:
                x = ln(h, p + ".self_attn_layer_norm")
                rec(p + ".self_attn_layer_norm", h, x)
                h = x
            if c.pre_norm:
                x2 = ln(h, p + ".final_layer_norm")
                rec(p + ".final_layer_norm", h, x2)
            else:
                x2 = h
            f = lin(x2, p + ".fc1", c.bias)
            rec(p + ".fc1", x2, f)
            g = act(f)
            rec(p + ".activation_fn", f, g)
            m = lin(g, p + ".fc2", c.bias)
            rec(p + ".fc2", g, m)
            h = h + m
            if not c.pre_norm:
                x3 = ln(h, p + ".final_layer_norm")
                rec(p + ".final_layer_norm", h, x3)
                h = x3
            rec(p, block_in, h)
        if c.final_norm:
            x = ln(h, D + ".final_layer_norm")
            rec(D + ".final_layer_norm", h, x)
            h = x
        if c.proj_dim != c.hidden:
            x = lin(h, D + ".project_out", False)
            rec(D + ".project_out", h, x)
            h = x
        logits = F.linear(h, w["lm_head.weight"])
        rec("lm_head", h, logits)
        return pts

    def _phi(self, ids, rope_seq_len=None):
        """PhiModel / PhiDecoderLayer / PhiAttention / PhiMLP (eager): q_proj, k_proj, v_proj (with
        biases) viewed [T, heads, head_dim]; RoPE (rotate_half) on the first rotary dims of each head,
        the rest passed through; GQA keys and values repeated per query head; scores scaled by
        head_dim ** -0.5, causal, softmax in float32; dense. Block: x = input_layernorm(h);
        attn(x) + mlp(x) + h, mlp = fc2(act(fc1(x)))."""
        c, w = self.cfg, self.w
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def ln(x, p):
            return F.layer_norm(x, (c.hidden,), w[p + ".weight"], w[p + ".bias"], c.eps)

        def lin(x, p):
            return F.linear(x, w[p + ".weight"], w[p + ".bias"])

        nh, nkv, hd = c.heads, c.kv_heads, c.head_dim
        groups = nh // nkv
        cos, sin = rope_cos_sin(c.rope, hd, T, seq_len=rope_seq_len)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        neg = torch.tensor(torch.finfo(torch.float32).min)
        act = _act(c.act)
        e = F.embedding(ids, w["model.embed_tokens.weight"])
        rec("model.embed_tokens", ids, e)
        h = e
        for i in range(c.layers):
            p = f"model.layers.{i}"
            x = ln(h, p + ".input_layernorm")
            rec(p + ".input_layernorm", h, x)
            proj = {}
            for nm in ("q_proj", "k_proj", "v_proj"):
                proj[nm] = lin(x, f"{p}.self_attn.{nm}")
                rec(f"{p}.self_attn.{nm}", x, proj[nm])
            q = apply_rope(proj["q_proj"].view(T, nh, hd).transpose(0, 1), cos, sin)
            k = apply_rope(proj["k_proj"].view(T, nkv, hd).transpose(0, 1), cos, sin)
            v = proj["v_proj"].view(T, nkv, hd).transpose(0, 1)
            k = k[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
            v = v[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
            att = torch.matmul(q, k.transpose(1, 2)) * hd ** -0.5
            scores = att
            att = F.softmax(torch.where(causal, att, neg), dim=-1, dtype=torch.float32)
            self._pattern(pts, p + ".self_attn", scores, causal, att)
            o = torch.matmul(att, v).transpose(0, 1).contiguous().view(T, nh * hd)
            a = lin(o, p + ".self_attn.dense")
            rec(p + ".self_attn.dense", o, a)
            rec(p + ".self_attn", x, a)
            f = lin(x, p + ".mlp.fc1")
            rec(p + ".mlp.fc1", x, f)
            g = act(f)
            rec(p + ".mlp.activation_fn", f, g)
            m = lin(g, p + ".mlp.fc2")
            rec(p + ".mlp.fc2", g, m)
            rec(p + ".mlp", x, m)
            out = a + m + h
            rec(p, h, out)
            h = out
        hf = ln(h, "model.final_layernorm")
        rec("model.final_layernorm", h, hf)
        logits = lin(hf, "lm_head")
        rec("lm_head", hf, logits)
        return pts

    def _phi3(self, ids, rope_seq_len=None):
        """Phi3Model / Phi3DecoderLayer / Phi3Attention / Phi3MLP (eager): qkv_proj's rows are
        [q (heads * D); k (kv_heads * D); v (kv_heads * D)]; RoPE on the first rotary dims of each
        head; the sliding window (if any) on every layer; gate_up_proj's output chunked in two,
        up * act(gate), then down_proj."""
        c, w = self.cfg, self.w
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def rms(x, p):
            var = x.pow(2).mean(-1, keepdim=True)
            return w[p + ".weight"] * (x * torch.rsqrt(var + c.eps))

        def lin(x, p):
            return F.linear(x, w[p + ".weight"])

        nh, nkv, hd = c.heads, c.kv_heads, c.head_dim
        groups = nh // nkv
        cos, sin = rope_cos_sin(c.rope, hd, T, seq_len=rope_seq_len)
        qi = torch.arange(T)[:, None]
        kj = torch.arange(T)[None, :]
        act = _act(c.act)
        neg = torch.tensor(torch.finfo(torch.float32).min)
        e = F.embedding(ids, w["model.embed_tokens.weight"])
        rec("model.embed_tokens", ids, e)
        h = e
        for i in range(c.layers):
            p = f"model.layers.{i}"
            allowed = kj <= qi
            if c.windows[i] is not None:
                allowed = allowed & (kj > qi - int(c.windows[i]))
            layer_in = h
            x = rms(h, p + ".input_layernorm")
            rec(p + ".input_layernorm", h, x)
            qkv = lin(x, p + ".self_attn.qkv_proj")
            rec(p + ".self_attn.qkv_proj", x, qkv)
            qp = nh * hd
            q = qkv[..., :qp].reshape(T, nh, hd).transpose(0, 1)
            k = qkv[..., qp:qp + nkv * hd].reshape(T, nkv, hd).transpose(0, 1)
            v = qkv[..., qp + nkv * hd:].reshape(T, nkv, hd).transpose(0, 1)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            k = k[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
            v = v[:, None].expand(nkv, groups, T, hd).reshape(nh, T, hd)
            att = torch.matmul(q, k.transpose(1, 2)) * hd ** -0.5
            scores = att
            att = torch.where(allowed, att, neg)
            att = F.softmax(att, dim=-1, dtype=torch.float32)
            self._pattern(pts, p + ".self_attn", scores, allowed, att)
            o = torch.matmul(att, v).transpose(0, 1).contiguous().view(T, nh * hd)
            a = lin(o, p + ".self_attn.o_proj")
            rec(p + ".self_attn.o_proj", o, a)
            rec(p + ".self_attn", x, a)
            h = layer_in + a
            x2 = rms(h, p + ".post_attention_layernorm")
            rec(p + ".post_attention_layernorm", h, x2)
            gu = lin(x2, p + ".mlp.gate_up_proj")
            rec(p + ".mlp.gate_up_proj", x2, gu)
            gate, up = gu.chunk(2, dim=-1)
            ga = act(gate)
            rec(p + ".mlp.activation_fn", gate, ga)
            d_in = up * ga
            d = lin(d_in, p + ".mlp.down_proj")
            rec(p + ".mlp.down_proj", d_in, d)
            rec(p + ".mlp", x2, d)
            h = h + d
            rec(p, layer_in, h)
        hn = rms(h, "model.norm")
        rec("model.norm", h, hn)
        logits = F.linear(hn, w["lm_head.weight"])
        rec("lm_head", hn, logits)
        return pts

    def _gpt_oss(self, ids, rope_seq_len=None):
        """GptOssModel / GptOssDecoderLayer / GptOssAttention / GptOssMLP (eager attention, the
        default grouped_mm experts), all float32:
        - GptOssRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)) (HF keeps the norms in float32);
        - pre-norm layers: h = x + self_attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h));
        - attention: q / k / v projections (with biases when attention_bias), RoPE on the two
          halves of each head (GptOssRotaryEmbedding's cos / sin of freqs, x1 cos - x2 sin and
          x2 cos + x1 sin: Llama's rotate-half), repeat_kv, scores * head_dim**-0.5 plus the
          causal or sliding (i - window < j <= i) mask; then the layer's per-head sink logit
          (self_attn.sinks [heads]) is appended as one more column, the row max subtracted, the
          softmax taken over keys + sink and the sink column dropped (rows sum to < 1); o_proj;
        - mlp: _gpt_oss_moe."""
        c, w, lin = self.cfg, self.w, self._lin
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def rms(x, p):
            var = x.pow(2).mean(-1, keepdim=True)
            return w[p + ".weight"] * (x * torch.rsqrt(var + c.eps))

        cos, sin = rope_cos_sin(c.rope, c.head_dim, T, seq_len=rope_seq_len)
        h = F.embedding(ids, w["model.embed_tokens.weight"])
        rec("model.embed_tokens", ids, h)
        for i in range(c.layers):
            p = f"model.layers.{i}"
            A = p + ".self_attn"
            layer_in = h
            x = rms(h, p + ".input_layernorm")
            rec(p + ".input_layernorm", h, x)
            qkv = []
            for nm in ("q_proj", "k_proj", "v_proj"):
                qkv.append(lin(x, f"{A}.{nm}"))
                rec(f"{A}.{nm}", x, qkv[-1])
            o = self._attend(*qkv, cos, sin, c.head_dim ** -0.5, c.windows[i], pts=pts, name=A,
                             sinks=w[A + ".sinks"])
            a = lin(o, A + ".o_proj")
            rec(A + ".o_proj", o, a)
            rec(A, x, a)
            h = layer_in + a
            x2 = rms(h, p + ".post_attention_layernorm")
            rec(p + ".post_attention_layernorm", h, x2)
            h = h + self._gpt_oss_moe(x2, i, rec)
            rec(p, layer_in, h)
        hn = rms(h, "model.norm")
        rec("model.norm", h, hn)
        rec("lm_head", hn, F.linear(hn, w["lm_head.weight"]))
        return pts

    def _gpt_oss_moe(self, x, i, rec):
        """GptOssMLP of layer i on x [T, H]; records .mlp.router (input x, output the router logits
        [T, E], the first element of HF's (logits, scores, indices)) and .mlp; returns the block's
        output.
        Router (GptOssTopKRouter): logits = x @ router.weight.T + router.bias; top-k on the LOGITS
        (torch.topk: the k largest, descending, ties to the lower index); weights = softmax over
        those k logits (in the logits' dtype: float32 here, bf16 in a bf16 model).
        Experts (GptOssExperts, grouped_mm_experts_forward): for each (token, slot) with expert e,
        gu = x_t @ gate_up_proj[e] + gate_up_proj_bias[e] ([H, 2I] stored [in, out]); gate =
        gu[0::2], up = gu[1::2] (INTERLEAVED columns, not halves); gate = min(gate, 7); up =
        clamp(up, -7, 7); y = ((up + 1) * gate * sigmoid(1.702 * gate)) @ down_proj[e] +
        down_proj_bias[e]; the block's output is sum over the token's slots (in slot order, as
        HF's view(T, k, H).sum(1)) of weight * y."""
        c, w = self.cfg, self.w
        P = f"model.layers.{i}.mlp"
        logits = F.linear(x, w[P + ".router.weight"], w[P + ".router.bias"])
        rec(P + ".router", x, logits)
        top, idx = torch.topk(logits, c.top_k, dim=-1)  # [T, k]
        weights = F.softmax(top, dim=1, dtype=top.dtype)
        if getattr(self, "_routes", None) is not None:
            srt = logits.sort(dim=-1, descending=True).values
            gap = srt[:, c.top_k - 1] - srt[:, c.top_k] if c.top_k < c.experts else \
                torch.full((x.shape[0],), float("inf"))
            self._routes[i] = dict(experts=idx, weights=weights, logits=logits, margin=gap)
        gu_w, gu_b = w[P + ".experts.gate_up_proj"], w[P + ".experts.gate_up_proj_bias"]
        dn_w, dn_b = w[P + ".experts.down_proj"], w[P + ".experts.down_proj_bias"]
        limit, alpha = GPT_OSS_SWIGLU_LIMIT, GPT_OSS_SWIGLU_ALPHA
        per_slot = torch.zeros(x.shape[0], c.top_k, x.shape[1], dtype=x.dtype)
        for e in range(c.experts):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            gu = torch.matmul(x[tok], gu_w[e]) + gu_b[e]
            gate, up = gu[..., ::2], gu[..., 1::2]
            gate = gate.clamp(max=limit)
            up = up.clamp(min=-limit, max=limit)
            glu = gate * torch.sigmoid(gate * alpha)
            y = torch.matmul((up + 1) * glu, dn_w[e]) + dn_b[e]
            per_slot[tok, slot] = y * weights[tok, slot, None]
        out = per_slot.sum(dim=1)
        rec(P, x, out)
        return out

    def _deepseek_v3(self, ids, rope_seq_len=None):
        """DeepseekV3Model / DeepseekV3DecoderLayer (eager attention, the default grouped_mm
        experts), all float32: pre-norm layers h = x + self_attn(input_layernorm(x)); out = h +
        mlp(post_attention_layernorm(h)), the mlp a gated MLP of intermediate_size below
        first_k_dense_replace, else _deepseek_v3_moe; RMSNorm weight * (x * rsqrt(mean(x^2) + eps)).
        DeepseekV2Model / DeepseekV2DecoderLayer the same way, with rope_polar / apply_rope_complex
        for the RoPE, _deepseek_v2_moe for the sparse blocks and mlp_bias's biases in the MLPs.
        Points per layer, in the order HF's forward reaches the modules: input_layernorm, self_attn's
        q_proj | q_a_proj, q_a_layernorm, q_b_proj, then kv_a_proj_with_mqa, kv_a_layernorm,
        kv_b_proj, o_proj, self_attn; post_attention_layernorm; mlp's children (see
        _deepseek_v3_moe; dense: gate_proj, act_fn, up_proj, down_proj), mlp; the layer."""
        c, w = self.cfg, self.w
        T = ids.shape[0]
        pts = OrderedDict()

        def rec(name, inp, out):
            pts[name + ":input"] = inp
            pts[name] = out

        def rms(x, p, eps):
            var = x.pow(2).mean(-1, keepdim=True)
            return w[p + ".weight"] * (x * torch.rsqrt(var + eps))

        # cos / sin [T, qk_rope_head_dim] (with YaRN's attention factor), HF's rotary module on
        # config.head_dim = qk_rope_head_dim; DeepSeek-V2: torch.polar's [T, qk_rope_head_dim / 2]
        if c.rope_style == "complex":
            cos, sin = rope_polar(c.rope, c.qk_rope, T, seq_len=rope_seq_len)
        else:
            cos, sin = rope_cos_sin(c.rope, c.qk_rope, T, seq_len=rope_seq_len)
        rope = ROPE_STYLES[c.rope_style]

        def rot(t):
            return rope(t, cos, sin)

        h = F.embedding(ids, w["model.embed_tokens.weight"])
        rec("model.embed_tokens", ids, h)
        for i in range(c.layers):
            p = f"model.layers.{i}"
            layer_in = h
            x = rms(h, p + ".input_layernorm", c.eps)
            rec(p + ".input_layernorm", h, x)
            a = self._deepseek_v3_attention(x, p + ".self_attn", rot, rec, rms, pts)
            h = layer_in + a
            x2 = rms(h, p + ".post_attention_layernorm", c.eps)
            rec(p + ".post_attention_layernorm", h, x2)
            if c.sparse[i]:
                m = (self._deepseek_v2_moe if c.arch == "deepseek_v2" else self._deepseek_v3_moe)(x2, i, rec)
            else:
                m = self._gated_mlp(x2, p + ".mlp", rec)
            h = h + m
            rec(p, layer_in, h)
        hn = rms(h, "model.norm", c.eps)
        rec("model.norm", h, hn)
        rec("lm_head", hn, F.linear(hn, w["lm_head.weight"]))
        return pts

    def _deepseek_v3_attention(self, x, A, rot, rec, rms, pts):
        """DeepseekV3Attention (multi-head latent attention) on x [T, H]; returns o_proj's output.
        q [T, heads * qk_head_dim] from q_proj, or q_b_proj(q_a_layernorm(q_a_proj(x))); each head
        split [qk_nope_head_dim | qk_rope_head_dim]. kv_a_proj_with_mqa(x) split [kv_lora_rank |
        qk_rope_head_dim]: the first part through kv_a_layernorm and kv_b_proj, viewed per head
        [qk_nope_head_dim | v_head_dim] (k_nope, v); the second part is ONE rotary key shared by every
        head. q_a_layernorm / kv_a_layernorm use eps 1e-6 (DeepseekV3RMSNorm's default), not
        rms_norm_eps. RoPE (interleaved pairs when rope_interleave, else rotate-half) on q_rot and
        k_rot only; query = cat(q_nope, q_rot), key = cat(k_nope, k_rot); scores * attn_scale
        (Config._deepseek_v3), causal, softmax in float32, times v ([heads, T, v_head_dim]), merged
        [T, heads * v_head_dim] into o_proj. rot: the family's RoPE on [..., T, qk_rope_head_dim]
        (DeepseekV2Attention: apply_rope_complex, q_a_layernorm / kv_a_layernorm with eps 1e-6 too,
        DEEPSEEK_V2_LORA_NORM_EPS; scale Config._deepseek_v2's)."""
        c, lin = self.cfg, self._lin
        T, nh = x.shape[0], c.heads
        lora_eps = DEEPSEEK_V2_LORA_NORM_EPS if c.arch == "deepseek_v2" else DEEPSEEK_V3_LORA_NORM_EPS
        if c.q_lora_rank is None:
            q = lin(x, A + ".q_proj")
            rec(A + ".q_proj", x, q)
        else:
            qa = lin(x, A + ".q_a_proj")
            rec(A + ".q_a_proj", x, qa)
            qn = rms(qa, A + ".q_a_layernorm", lora_eps)
            rec(A + ".q_a_layernorm", qa, qn)
            q = lin(qn, A + ".q_b_proj")
            rec(A + ".q_b_proj", qn, q)
        q = q.view(T, nh, c.qk_head_dim).transpose(0, 1)  # [heads, T, qk_head_dim]
        q_pass, q_rot = torch.split(q, [c.qk_nope, c.qk_rope], dim=-1)
        ckv = lin(x, A + ".kv_a_proj_with_mqa")
        rec(A + ".kv_a_proj_with_mqa", x, ckv)
        k_pass, k_rot = torch.split(ckv, [c.kv_lora_rank, c.qk_rope], dim=-1)
        kn = rms(k_pass, A + ".kv_a_layernorm", lora_eps)
        rec(A + ".kv_a_layernorm", k_pass, kn)
        kv = lin(kn, A + ".kv_b_proj")
        rec(A + ".kv_b_proj", kn, kv)
        kv = kv.view(T, nh, c.qk_nope + c.v_head_dim).transpose(0, 1)
        k_pass, v = torch.split(kv, [c.qk_nope, c.v_head_dim], dim=-1)
        k_rot = k_rot.view(1, T, c.qk_rope)
        q_rot, k_rot = rot(q_rot), rot(k_rot)
        k_rot = k_rot.expand(nh, T, c.qk_rope)
        query = torch.cat((q_pass, q_rot), dim=-1)
        key = torch.cat((k_pass, k_rot), dim=-1)
        att = torch.matmul(query, key.transpose(1, 2)) * c.attn_scale
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        scores = att
        att = torch.where(allowed, att, torch.tensor(torch.finfo(torch.float32).min))
        att = F.softmax(att, dim=-1, dtype=torch.float32)
        self._pattern(pts, A, scores, allowed, att)
        o = torch.matmul(att, v).transpose(0, 1).contiguous().view(T, nh * c.v_head_dim)
        a = lin(o, A + ".o_proj")
        rec(A + ".o_proj", o, a)
        rec(A, x, a)
        return a

    def _deepseek_v3_moe(self, x, i, rec):
        """DeepseekV3MoE of layer i on x [T, H]; records .mlp.gate, the shared experts' points and
        .mlp; returns the block's output. In HF's order:
        - router (DeepseekV3TopkRouter, the .mlp.gate point): logits = F.linear(x.float(),
          W.float()), float32 [T, E] (HF flattens the batch: [B * T, E]);
        - route_tokens_to_experts: s = sigmoid(logits); c = s + e_score_correction_bias (for the
          choice only); group score = sum of the 2 largest c of each of n_group groups of E / n_group
          consecutive experts; the topk_group best groups kept, the other experts' c set to -inf;
          the k = num_experts_per_tok experts of largest c (torch.topk(..., sorted=False): SLOT
          ORDER is torch's, see below); weights = s (NOT c) at those experts, divided by their sum
          + 1e-20 when norm_topk_prob, times routed_scaling_factor;
        - experts (transformers 5's default grouped_mm_experts_forward): per (token, slot) y =
          down_e(act(g) * u) with [g; u] = x_t @ gate_up_proj[e].T (gate rows first), times the
          slot's weight; routed = sum over the k slots in SLOT order (HF's view(T, k, H).sum(1));
        - output = routed + shared_experts(x) (a gated MLP of moe_intermediate_size *
          n_shared_experts on the same input, run after the routed experts).
        torch.topk(sorted=False) on CPU returns the top k in the order its selection leaves them
        (std::nth_element when k * 64 > E, else partial_sort, i.e. descending); the same call is
        made here, so the float32 sums (the weights' denominator, the routed sum) add in HF's order.
        Another order changes only their rounding."""
        c, w = self.cfg, self.w
        P = f"model.layers.{i}.mlp"
        logits = F.linear(x.float(), w[P + ".gate.weight"].float())
        rec(P + ".gate", x, logits)
        E, G = c.experts, c.n_group
        scores = logits.sigmoid()
        choice = scores + w[P + ".gate.e_score_correction_bias"]
        group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=c.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        masked = choice.masked_fill(~score_mask.bool(), float("-inf"))
        idx = torch.topk(masked, k=c.top_k, dim=-1, sorted=False)[1]  # [T, k]
        weights = scores.gather(1, idx)
        if c.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + DEEPSEEK_V3_NORM_EPS)
        weights = weights * c.routed_scale
        if getattr(self, "_routes", None) is not None:
            # margins in score units (sigmoid + bias): the k-th largest kept score minus the next one
            # (inf when none), and the topk_group-th group score minus the next (inf when all kept)
            srt = masked.sort(dim=-1, descending=True).values
            nxt = srt[:, c.top_k] if c.top_k < E else torch.full_like(srt[:, 0], float("-inf"))
            gap = srt[:, c.top_k - 1] - nxt
            gs = group_scores.sort(dim=-1, descending=True).values
            if c.topk_group < G:
                gap = torch.minimum(gap, gs[:, c.topk_group - 1] - gs[:, c.topk_group])
            self._routes[i] = dict(experts=idx, weights=weights, logits=logits, margin=gap)
        routed = self._deepseek_routed(x, P, idx, weights)
        shared = self._gated_mlp(x, P + ".shared_experts", rec)
        out = routed + shared
        rec(P, x, out)
        return out

    def _deepseek_routed(self, x, P, idx, weights):
        """The routed experts of DeepSeek-V3 / V2 (transformers 5's default grouped_mm_experts_forward
        over the stacked gate_up_proj / down_proj) on x [T, H] with idx / weights [T, k]: per (token,
        slot) y = down_e(act(g) * u), [g; u] = x_t @ [gate_e; up_e].T in one product, times the slot's
        weight; summed over the k slots in SLOT order (HF's view(T, k, H).sum(1))."""
        c, w = self.cfg, self.w
        act = _act(c.act)
        per_slot = torch.zeros(x.shape[0], idx.shape[1], x.shape[1], dtype=x.dtype)
        for e in range(c.experts):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            X = f"{P}.experts.{e}."
            gate_up = torch.cat((w[X + "gate_proj.weight"], w[X + "up_proj.weight"]), dim=0)
            gate, up = torch.matmul(x[tok], gate_up.t()).chunk(2, dim=-1)
            y = torch.matmul(act(gate) * up, w[X + "down_proj.weight"].t())
            per_slot[tok, slot] = y * weights[tok, slot, None]
        return per_slot.sum(dim=1)

    def _deepseek_v2_moe(self, x, i, rec):
        """DeepseekV2Moe of layer i on x [T, H]; records .mlp.gate, the shared experts' points and
        .mlp; returns the block's output. In HF's order:
        - router: logits = F.linear(x.float(), gate.weight.float()), float32 [T, E] (HF flattens the
          batch: [B * T, E]). The .mlp.gate point is these logits, though transformers never calls the
          gate module (its weight is used functionally, so a hook on it never fires);
        - route_tokens_to_experts: p = softmax(logits) in float32; topk_method
            greedy: the k = num_experts_per_tok largest p (torch.topk(..., sorted=False));
            group_limited_greedy: group score = the LARGEST p of each of n_group groups of E / n_group
              consecutive experts; torch.topk(sorted=False) of topk_group groups kept; the other
              experts' p set to 0.0 (not -inf: with k above the kept experts, the extra slots take
              masked experts of weight 0, in torch.topk's tie order); the k largest of that;
          weights = the chosen p times routed_scaling_factor (no renormalisation: norm_topk_prob is
          not read);
        - experts: _deepseek_routed (slot order, torch.topk(sorted=False)'s);
        - output = routed + shared_experts(x) (run after the routed experts, always: n_shared_experts
          0 is a zero-width MLP).
        Model.routing's margin: in probability units, the k-th largest (kept) p minus the next (inf
        when k covers every candidate), and for group_limited_greedy also the topk_group-th group
        score minus the next (inf when every group is kept); the smaller."""
        c, w = self.cfg, self.w
        P = f"model.layers.{i}.mlp"
        logits = F.linear(x.float(), w[P + ".gate.weight"].float())
        rec(P + ".gate", x, logits)
        E, T = c.experts, x.shape[0]
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        group_scores = None
        if c.topk_method == "greedy":
            cand = probs
            top, idx = torch.topk(probs, k=c.top_k, dim=-1, sorted=False)
        else:
            G = c.n_group
            group_scores = probs.view(T, G, E // G).max(dim=-1).values
            group_idx = torch.topk(group_scores, k=c.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(T, G, E // G).reshape(T, -1)
            cand = probs.masked_fill(~score_mask.bool(), 0.0)
            top, idx = torch.topk(cand, k=c.top_k, dim=-1, sorted=False)
        weights = top * c.routed_scale
        if getattr(self, "_routes", None) is not None:
            n_cand = E if group_scores is None else c.topk_group * (E // c.n_group)
            srt = cand.sort(dim=-1, descending=True).values
            gap = srt[:, c.top_k - 1] - srt[:, c.top_k] if c.top_k < n_cand else torch.full((T,), float("inf"))
            if group_scores is not None and c.topk_group < c.n_group:
                gs = group_scores.sort(dim=-1, descending=True).values
                gap = torch.minimum(gap, gs[:, c.topk_group - 1] - gs[:, c.topk_group])
            self._routes[i] = dict(experts=idx, weights=weights, logits=logits, margin=gap)
        routed = self._deepseek_routed(x, P, idx, weights)
        shared = self._gated_mlp(x, P + ".shared_experts", rec)
        out = routed + shared
        rec(P, x, out)
        return out

    # -- point catalogue ----------------------------------------------------------------------
    def points(self):
        """OrderedDict point name -> (per-token shape list, "F32" | "I64")."""
        out = OrderedDict()
        for k, v in self.forward([0]).items():
            out[k] = (list(v.shape[1:]), "I64" if v.dtype == np.int64 else "F32")
        return out


def run(ckpt_dir, sequences, rope_seq_len=None, patterns=False):
    """Runs each sequence alone; returns a list of OrderedDict point -> np.ndarray [T, ...].

    rope_seq_len: see Model.forward (e.g. the padded length of a batch holding these sequences).
    patterns: also the NAME:scores / NAME:probs attention patterns (see the module docstring)."""
    m = Model(ckpt_dir)
    return [m.forward(s, rope_seq_len=rope_seq_len, patterns=patterns) for s in sequences]


def points(ckpt_dir):
    return Model(ckpt_dir).points()


if __name__ == "__main__":  # python3 reference.py CKPT 1,2,3[;4,5]
    import sys
    seqs = [[int(t) for t in s.split(",")] for s in sys.argv[2].split(";")]
    for si, d in enumerate(run(sys.argv[1], seqs)):
        for k, v in d.items():
            print(si, k, list(v.shape), v.dtype, float(np.abs(v).max()) if v.size else 0.0)
