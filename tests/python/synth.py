"""Writes small random Hugging Face-layout checkpoints from Python (independent of actcap).

Used by the parity tests for config variants that actcap's init-model cannot produce (e.g. an
explicit head_dim that differs from hidden_size // num_attention_heads), and by the reference
self-tests. Weight names, shapes and layout follow transformers exactly (GPT-2 Conv1D weights are
[in, out], keys prefixed `transformer.`; tied models store only the embedding).
"""
import json
import os

import numpy as np

import reference
import st

TINY = {
    "gpt2": dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=384, n_positions=64,
                 n_embd=32, n_layer=2, n_head=4, n_inner=None, activation_function="gelu_new",
                 layer_norm_epsilon=1e-5, tie_word_embeddings=True),
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=384, hidden_size=32,
                  intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=384, hidden_size=32,
                    intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                    sliding_window=8, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=384, hidden_size=32,
                  intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  use_sliding_window=False, sliding_window=None, max_window_layers=2,
                  tie_word_embeddings=False),
    # head_dim 16 != hidden_size / num_attention_heads (8), as Qwen3-0.6B (128 vs 1024 / 16)
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=384, hidden_size=32,
                  intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, rope_scaling=None, attention_bias=False, use_sliding_window=False,
                  sliding_window=None, max_window_layers=2, tie_word_embeddings=True),
    # Gemma 1: head_dim 16 != hidden_size / num_attention_heads (8), GQA (4 heads, 2 kv heads);
    # hidden_act and hidden_activation equal, so transformers 4.x, 5.x and actcap's rule agree
    "gemma": dict(model_type="gemma", architectures=["GemmaForCausalLM"], vocab_size=384, hidden_size=32,
                  intermediate_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                  max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                  attention_bias=False, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1,
                  pad_token_id=0),
    # head_dim 16 != hidden_size / num_attention_heads (8); layers 0 and 2 slide
    "gemma2": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=384, hidden_size=32,
                   intermediate_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                   max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False,
                   query_pre_attn_scalar=16, sliding_window=4, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, tie_word_embeddings=True),
    # head_dim 16 != 32 / 4; sliding_window_pattern 2: layers 0 and 2 local (window 4, RoPE base
    # 10000 unscaled), 1 and 3 global (RoPE base 1e6 with rope_scaling when set)
    "gemma3_text": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], vocab_size=384,
                        hidden_size=32, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, hidden_activation="gelu_pytorch_tanh",
                        max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, rope_scaling=None, attention_bias=False,
                        query_pre_attn_scalar=16, sliding_window=4, sliding_window_pattern=2,
                        attn_logit_softcapping=None, final_logit_softcapping=None, tie_word_embeddings=True,
                        bos_token_id=2, eos_token_id=1, pad_token_id=0),
    # OLMo 1 (OlmoForCausalLM), OlmoConfig's defaults in miniature (pad 1, bos null, untied, clip_qkv
    # null; no head_dim, so 32 / 4 = 8): GQA (4 heads, 2 kv heads); 3 layers. The norms have no
    # tensors (OlmoLayerNorm): expected_shapes lists none, so random_weights writes none.
    "olmo": dict(model_type="olmo", architectures=["OlmoForCausalLM"], vocab_size=384, hidden_size=32,
                 intermediate_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 hidden_act="silu", max_position_embeddings=128, rope_theta=10000.0, rope_scaling=None,
                 attention_bias=False, clip_qkv=None, pad_token_id=1, bos_token_id=None, eos_token_id=50,
                 tie_word_embeddings=False),
    "olmo2": dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], vocab_size=384, hidden_size=32,
                  intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  rope_scaling=None, attention_bias=False, tie_word_embeddings=False),
    # OLMo 3 (Olmo3ForCausalLM), Olmo3Config's defaults in miniature (pad 1, bos null, untied; no
    # head_dim, so 32 / 4 = 8): GQA (4 heads, 2 kv heads); 4 layers and no layer_types, so the default
    # rule applies: layers 0, 1, 2 slide (window 4, shorter than the tests' sequences), layer 3 is full.
    # See OLMO3_VARIANTS.
    "olmo3": dict(model_type="olmo3", architectures=["Olmo3ForCausalLM"], vocab_size=384, hidden_size=32,
                  intermediate_size=80, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  rope_scaling=None, attention_bias=False, sliding_window=4, pad_token_id=1, bos_token_id=None,
                  eos_token_id=50, tie_word_embeddings=False),
    # SmolLM3 (SmolLM3ForCausalLM), SmolLM3Config's defaults in miniature (tied head; theta, no_rope_layers,
    # layer_types absent so the defaults apply: theta 2e6, layer 3 NoPE; no head_dim, so 32 / 4 = 8):
    # GQA (4 heads, 2 kv heads); 4 layers; pad null and bos / eos inside the tiny vocabulary (the
    # default pad 128004 breaks transformers' nn.Embedding(padding_idx=...) at vocab 384).
    # See SMOLLM3_VARIANTS.
    "smollm3": dict(model_type="smollm3", architectures=["SmolLM3ForCausalLM"], vocab_size=384, hidden_size=32,
                    intermediate_size=80, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6, attention_bias=False,
                    mlp_bias=False, pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True),
    # head_dim 8, rotary_pct 0.5: 4 rotary dims, 4 passed through
    "gpt_neox": dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], vocab_size=384,
                     hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     hidden_act="gelu", max_position_embeddings=128, layer_norm_eps=1e-5,
                     rotary_pct=0.5, rotary_emb_base=10000, use_parallel_residual=True,
                     tie_word_embeddings=False),
    # head_dim 8, rotary_dim 4 (two interleaved pairs, 4 features passed through), n_inner 96 != 4 * 32
    "gptj": dict(model_type="gptj", architectures=["GPTJForCausalLM"], vocab_size=384, n_positions=128,
                 n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=96, activation_function="gelu_new",
                 layer_norm_epsilon=1e-5, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1),
    # GPT-Neo (GPTNeoForCausalLM): head_dim 8, intermediate_size 96 != 4 * 32; attention_types gives
    # global, local, local (two items, so the expansion is exercised), with the attention_layers list
    # the released config.json files also carry; window_size 4, shorter than the tests' sequences;
    # tied (only transformer.wte.weight stored)
    "gpt_neo": dict(model_type="gpt_neo", architectures=["GPTNeoForCausalLM"], vocab_size=384,
                    max_position_embeddings=128, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=96,
                    window_size=4, attention_types=[[["global", "local"], 1], [["local"], 1]],
                    attention_layers=["global", "local", "local"], activation_function="gelu_new",
                    layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1),
    # OPT (OPTForCausalLM): head_dim 8, ffn_dim 80; word_embed_proj_dim 24 != hidden_size, so
    # project_in / project_out exist (as opt-350m's); pre-LN with the final LayerNorm (opt-125m's
    # layout), biases and LayerNorm parameters; tied (only model.decoder.embed_tokens.weight stored)
    "opt": dict(model_type="opt", architectures=["OPTForCausalLM"], vocab_size=384, hidden_size=32,
                num_hidden_layers=2, num_attention_heads=4, ffn_dim=80, max_position_embeddings=128,
                word_embed_proj_dim=24, do_layer_norm_before=True, _remove_final_layer_norm=False,
                enable_bias=True, layer_norm_elementwise_affine=True, activation_function="relu",
                tie_word_embeddings=True, pad_token_id=1, bos_token_id=2, eos_token_id=2),
    # head_dim 8, partial_rotary_factor 0.5 at the top level (Phi-2's layout: 4 rotary features);
    # GQA (2 kv heads for 4)
    "phi": dict(model_type="phi", architectures=["PhiForCausalLM"], vocab_size=384, hidden_size=32,
                intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                hidden_act="gelu_new", max_position_embeddings=128, layer_norm_eps=1e-5, rope_theta=10000.0,
                rope_scaling=None, partial_rotary_factor=0.5, qk_layernorm=False, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2),
    # head_dim 8, partial_rotary_factor 0.5 (4 rotary dims), a window shorter than the tests' sequences
    "phi3": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=384, hidden_size=32,
                 intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 hidden_act="silu", max_position_embeddings=128, original_max_position_embeddings=128,
                 rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, partial_rotary_factor=0.5,
                 sliding_window=6, tie_word_embeddings=False),
    # 4 experts of intermediate_size 48 (!= hidden), top-2, every layer sparse; no head_dim (8)
    "mixtral": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], vocab_size=384, hidden_size=32,
                    intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=1000000.0,
                    sliding_window=None, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                    router_jitter_noise=0.0, output_router_logits=False, tie_word_embeddings=False),
    # As the Hub's Qwen3-30B-A3B: num_experts (not num_local_experts), norm_topk_prob true,
    # head_dim 16 != 32 / 4. 8 experts of moe_intermediate_size 24, top-2; layer 1 in
    # mlp_only_layers is a dense MLP of intermediate_size 80, layers 0 and 2 sparse
    "qwen3_moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], vocab_size=384,
                      hidden_size=32, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                      max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
                      attention_bias=False, use_sliding_window=False, sliding_window=None, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                      router_aux_loss_coef=0.001, output_router_logits=False, tie_word_embeddings=False),
    # A Qwen3-MoE variant (model_type qwen3_moe): decoder_sparse_step 2, so layers 1 and 3 are
    # sparse and 0 and 2 dense; num_local_experts (the key transformers 5 writes) 6, top-3, weights
    # NOT renormalised (norm_topk_prob false); no head_dim, so 32 / 4 = 8 (not Qwen3's 128); tied
    "qwen3_moe_step2": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], vocab_size=384,
                            hidden_size=32, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                            max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                            use_sliding_window=False, num_local_experts=6, num_experts_per_tok=3,
                            norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                            tie_word_embeddings=True),
    # Qwen2-MoE (Qwen2MoeForCausalLM) in the 4.x layout of the Hub's Qwen MoE files (rope_theta at
    # the top level, num_experts, norm_topk_prob false, decoder_sparse_step 1, use_sliding_window
    # false beside a sliding_window and max_window_layers, no layer_types): 4 experts of moe_intermediate_size 24, top-2, a shared
    # expert of 40 (!= 24, != intermediate_size); layer 1 in mlp_only_layers is a dense MLP of
    # intermediate_size 64, layers 0 and 2 sparse; no qkv_bias key (its default: q / k / v
    # biases, no o_proj bias); no head_dim (32 / 4 = 8); untied
    "qwen2_moe": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], vocab_size=384,
                      hidden_size=32, intermediate_size=64, moe_intermediate_size=24,
                      shared_expert_intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6,
                      rope_theta=1000000.0, use_sliding_window=False, sliding_window=128, max_window_layers=3,
                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[1], router_aux_loss_coef=0.001, output_router_logits=False,
                      tie_word_embeddings=False),
    # As allenai/OLMoE-1B-7B-0924's config.json (no head_dim, bos_token_id null, clip_qkv null): 8
    # experts of intermediate_size 24, top-2, not renormalised; q_norm / k_norm over the whole
    # projections (32 and 16 wide)
    "olmoe": dict(model_type="olmoe", architectures=["OlmoeForCausalLM"], vocab_size=384, hidden_size=32,
                  intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                  rope_scaling=None, attention_bias=False, clip_qkv=None, num_experts=8,
                  num_experts_per_tok=2, norm_topk_prob=False, bos_token_id=None, eos_token_id=50,
                  pad_token_id=1, tie_word_embeddings=False),
    # As openai/gpt-oss-20b's config.json (4.x layout: rope_scaling + rope_theta, an explicit
    # layer_types, the unused swiglu_limit / experts_per_token / initial_context_length): head_dim 16
    # != 32 / 4; 4 experts of intermediate_size 24 (!= hidden), top-2, every layer sparse; layers 0
    # and 2 slide (window 4), 1 is full; YaRN factor 4 over 256 original positions (max_position_
    # embeddings 1024 = 4 * 256), base 150000, truncate false: with head_dim 16 the ramp runs over
    # dims 0.16 .. 2.49 (truncation would make it 0 .. 3), so truncate matters; not the defaults
    # (factor 32 over 4096), so a reader that ignores rope_scaling is caught.
    "gpt_oss": dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], vocab_size=384, hidden_size=32,
                    intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, hidden_act="silu", max_position_embeddings=1024, rms_norm_eps=1e-5,
                    rope_theta=150000.0,
                    rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                                      original_max_position_embeddings=256),
                    sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    attention_bias=True, num_local_experts=4, num_experts_per_tok=2, experts_per_token=2,
                    swiglu_limit=7.0, initial_context_length=256, router_aux_loss_coef=0.9,
                    output_router_logits=False, eos_token_id=200, pad_token_id=199, tie_word_embeddings=False),
    # gpt_oss with MXFP4 experts (write_checkpoint stores gate_up_proj / down_proj as _blocks /
    # _scales, see mxfp4_quantize): hidden 64 and intermediate 96, multiples of 32 (the MXFP4 block),
    # so gate_up_proj is [4, 64, 192] (blocks [4, 192, 2, 16]) and down_proj [4, 96, 64] (blocks
    # [4, 64, 3, 16]); head_dim 24 != 64 / 4; layer_types absent (the default: 0 and 2 slide).
    "gpt_oss_mxfp4": dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], vocab_size=384,
                          hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=24, hidden_act="silu", max_position_embeddings=1024,
                          rms_norm_eps=1e-5, rope_theta=150000.0,
                          rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                            truncate=False, original_max_position_embeddings=256),
                          sliding_window=4, attention_bias=True, num_local_experts=4, num_experts_per_tok=2,
                          tie_word_embeddings=False,
                          quantization_config=dict(quant_method="mxfp4", modules_to_not_convert=[
                              "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                              "lm_head"])),
    # DeepSeek-V3 (DeepseekV3ForCausalLM) in the Hub's 4.x layout (rope_theta at the top level, the
    # unread topk_method / scoring_func / moe_layer_freq / num_nextn_predict_layers): MLA with
    # q_lora_rank 16 and kv_lora_rank 16, heads of qk_nope 8 + qk_rope 4 = 12 for q / k but v_head_dim
    # 6 (!= 12 on purpose), interleaved RoPE; layer 0 dense (intermediate_size 48), layers 1 and 2
    # sparse: 8 routed experts of 12 in 4 groups of 2, the 2 best groups kept, top-3, renormalised,
    # times 2.5, plus 2 shared experts (one gated MLP of 2 * 12 = 24). See DEEPSEEK_V3_VARIANTS.
    "deepseek_v3": dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], vocab_size=384,
                        hidden_size=32, intermediate_size=48, moe_intermediate_size=12, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=8, n_group=4,
                        topk_group=2, num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1,
                        routed_scaling_factor=2.5, norm_topk_prob=True, hidden_act="silu",
                        max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                        rope_interleave=True, attention_bias=False, tie_word_embeddings=False, bos_token_id=0,
                        eos_token_id=1, topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1,
                        num_nextn_predict_layers=0),
    # DeepSeek-V2 (DeepseekV2ForCausalLM) in the Hub's 4.x layout, DeepSeek-V2-Lite's shape scaled down
    # (its unread scoring_func / moe_layer_freq / norm_topk_prob / aux_loss_alpha / seq_aux, and n_group
    # / topk_group 1, which greedy routing never reads): MLA with a plain q_proj (q_lora_rank null) and
    # kv_lora_rank 16, heads of qk_nope 8 + qk_rope 4 = 12 for q / k but v_head_dim 6, RoPE on the
    # interleaved pairs; layer 0 dense (intermediate_size 48), layers 1 and 2 sparse: the top-3 of 8
    # softmax-routed experts of 12, weights times 1.5 (no renormalisation), plus 2 shared experts
    # (one gated MLP of 2 * 12 = 24). See DEEPSEEK_V2_VARIANTS.
    "deepseek_v2": dict(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], vocab_size=384,
                        hidden_size=32, intermediate_size=48, moe_intermediate_size=12, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=8,
                        num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1,
                        routed_scaling_factor=1.5, topk_method="greedy", n_group=1, topk_group=1,
                        norm_topk_prob=False, scoring_func="softmax", moe_layer_freq=1, aux_loss_alpha=0.001,
                        seq_aux=True, hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-6,
                        rope_theta=10000.0, rope_scaling=None, attention_bias=False, tie_word_embeddings=False,
                        bos_token_id=0, eos_token_id=1),
}

# DeepSeek-V3 YaRN as the Hub's files write it (4.x rope_scaling with "type"), scaled down: factor 4
# over 32 original positions (max_position_embeddings 128 = 4 * 32); with qk_rope_head_dim 4 the ramp
# keeps frequency 0 and divides frequency 1 by 4. mscale 0.707 != mscale_all_dim 1.0, so both
# effects show: cos / sin times (0.1 * 0.707 ln 4 + 1) / (0.1 ln 4 + 1) and the softmax scale times
# (0.1 ln 4 + 1) ** 2.
DEEPSEEK_V3_YARN = {"type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1}
# tiny_config("deepseek_v3", **DEEPSEEK_V3_VARIANTS[name]); the stacked-experts layout is
# write_checkpoint(..., stacked_experts=True) instead.
DEEPSEEK_V3_VARIANTS = {
    "tiny": {},
    "q_proj": dict(q_lora_rank=None),  # Moonlight's / DeepSeek-V2-Lite's plain q_proj
    "rotate_half": dict(rope_interleave=False),
    "yarn": dict(rope_scaling=DEEPSEEK_V3_YARN),
    "attention_bias": dict(attention_bias=True),
    "no_norm": dict(norm_topk_prob=False),
    "all_kept": dict(num_experts_per_tok=4),  # k = every expert of the 2 kept groups of 2
    "one_group": dict(n_group=1, topk_group=1, num_experts_per_tok=2),  # Moonlight's / Kimi-K2's routing
}

# DeepSeek-V2-Lite's YaRN (4.x rope_scaling with "type": factor 40, mscale = mscale_all_dim = 0.707, so
# the cos / sin factor is exactly 1), scaled down as DEEPSEEK_V3_YARN: factor 4 over 32 original
# positions. DeepseekV2Attention's softmax scale stays qk_head_dim ** -0.5 (DeepSeek's own code and
# DeepseekV3Attention would multiply it by (0.1 * 0.707 ln 4 + 1) ** 2, about 1.21).
DEEPSEEK_V2_YARN = {"type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                    "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1}
# tiny_config("deepseek_v2", **DEEPSEEK_V2_VARIANTS[name]); the stacked-experts layout is
# write_checkpoint(..., stacked_experts=True) instead.
DEEPSEEK_V2_VARIANTS = {
    "tiny": {},  # DeepSeek-V2-Lite's / Coder-V2-Lite's form: plain q_proj, greedy routing
    "q_lora": dict(q_lora_rank=16),  # DeepSeek-V2's / Coder-V2's q bottleneck
    # DeepSeek-V2's routing (n_group 8, topk_group 3 there): the 2 best of 4 groups of 2 by their
    # largest probability, then the top-3 of the kept 4 experts
    "group_limited": dict(topk_method="group_limited_greedy", n_group=4, topk_group=2),
    # one group of 2 kept but k 3: the third slot takes a masked expert (probability 0.0, weight 0)
    "group_k_over_kept": dict(topk_method="group_limited_greedy", n_group=4, topk_group=1),
    "yarn": dict(rope_scaling=DEEPSEEK_V2_YARN),
    # mscale != mscale_all_dim: cos / sin times (0.1 * 0.707 ln 4 + 1) / (0.1 ln 4 + 1)
    "yarn_mscale": dict(rope_scaling=dict(DEEPSEEK_V2_YARN, mscale_all_dim=1.0)),
    # zero-width shared experts (n_shared_experts null is refused by DeepseekV2Config, and
    # DeepseekV2Moe.forward always calls shared_experts): their output is 0
    "no_shared": dict(n_shared_experts=0),
    "attention_bias": dict(attention_bias=True),  # q_a_proj / kv_a_proj_with_mqa / o_proj biases
    "mlp_bias": dict(mlp_bias=True),  # the dense MLP's and the shared experts' biases
}

# OLMo 3's YaRN as quoted for the released Olmo-3 7B / 32B (not read from the Hub here: factor 8,
# beta_fast 32, beta_slow 1, attention_factor 1.2079441541679836 = 0.1 ln 8 + 1, there over 8192
# original positions with theta 5e5), scaled down to head_dim 8: 64 original positions
# (max_position_embeddings 512 = 8 * 64) and theta 100, so that the ramp runs over the dims 0 .. 3 (truncated) and the interpolated frequencies turn
# visibly within the tests' sequences.
OLMO3_YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 32,
              "beta_slow": 1, "attention_factor": 1.2079441541679836}
# tiny_config("olmo3", **OLMO3_VARIANTS[name])
OLMO3_VARIANTS = {
    "tiny": {},  # the default layer_types: sliding, sliding, sliding, full
    # an explicit list the default rule would not give (a reader that ignores it is caught)
    "layer_types": dict(layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
                        sliding_window=3),
    "yarn": dict(rope_theta=100.0, max_position_embeddings=512, rope_scaling=OLMO3_YARN),
    "attention_bias": dict(attention_bias=True),  # q / k / v / o biases
    "tied": dict(tie_word_embeddings=True),
}

# SmolLM3 variants: tiny_config("smollm3", **SMOLLM3_VARIANTS[name]). The tests' sequences are longer
# than 2 * every window.
SMOLLM3_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
SMOLLM3_VARIANTS = {
    "tiny": {},  # defaults: RoPE on layers 0-2, layer 3 NoPE, all full, theta 2e6, tied
    # an explicit list the default rule would not give (NoPE on layers 0 and 2), untied, theta 1e4
    "no_rope_layers": dict(no_rope_layers=[0, 1, 0, 1], rope_theta=10000.0, tie_word_embeddings=False),
    # windows by the default rule: the NoPE layer 3 slides (window 3)
    "sliding": dict(use_sliding_window=True, sliding_window=3),
    # explicit layer_types: RoPE layers 0 and 1 slide, NoPE layer 3 full; interval 2: NoPE on 1 and 3
    "layer_types": dict(use_sliding_window=True, sliding_window=4, no_rope_layer_interval=2,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"]),
    "bias": dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False),  # q/k/v/o + MLP biases
    # llama3 scaling at theta 100 (the low / high frequency bands both occur at head_dim 8)
    "llama3": dict(rope_theta=100.0, rope_scaling=SMOLLM3_LLAMA3),
    "yarn": dict(rope_theta=100.0, max_position_embeddings=512,
                 rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}),
}

# openai/gpt-oss-20b's quantization_config
MXFP4_QUANTIZATION_CONFIG = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                        "model.embed_tokens", "lm_head"],
                             "quant_method": "mxfp4"}


GEMMA = ("gemma", "gemma2", "gemma3_text", "gemma3")  # norm weights are offsets from one: (1 + w)
ROUTER_STD = 0.25  # MoE router weights (see random_weights)
SHARED_GATE_STD = 0.25  # Qwen2-MoE's shared_expert_gate (see random_weights)
# gpt-oss (see random_weights): sinks, router bias, expert gate_up weights and biases
GPT_OSS_SINK_STD = 1.0
GPT_OSS_ROUTER_BIAS_STD = 0.5
GPT_OSS_GATE_UP_STD = 0.25
GPT_OSS_GATE_UP_BIAS_STD = 3.0
# OPT (see random_weights): project_in / project_out, between the embedding width and hidden_size
OPT_PROJ_STD = 0.25
# DeepSeek-V3 (see random_weights): the router's e_score_correction_bias, and the MLA projections
DEEPSEEK_V3_SCORE_BIAS_STD = 0.15
DEEPSEEK_V3_MLA_STD = 0.25


def tiny_config(arch, **overrides):
    cfg = dict(TINY[arch])
    cfg.update(overrides)
    return cfg


def random_weights(cfg, seed=0):
    """name -> float32 array for every tensor of the (untied) HF layout, random but well-scaled.

    Matrices ~ N(0, 0.02); embeddings ~ N(0, 0.5) so hidden states are O(1); biases ~ N(0, 0.1);
    norm weights ~ 1 + N(0, 0.1) (Gemma's offsets ~ N(0, 0.1)) so that bugs in any of them are
    visible. MoE routers (.gate.weight) ~ N(0, ROUTER_STD): router logits of std ~1.4 on the O(1)
    normalised hidden states, so the top-k choice is far from ties: over seeds 0-7 and
    test_reference's sequences the k-th and (k+1)-th largest logits are >= 8e-5 apart (most
    tokens far more), against float32 rounding differences of ~1e-6 between implementations;
    while the k-th expert's weight stays visible (>= 0.004). Model.routing(ids)["margin"] gives
    the gap per token for other seeds and sequences.
    Qwen2-MoE's shared_expert_gate.weight [1, H] ~ N(0, SHARED_GATE_STD): gate logits of std ~1.4,
    so sigmoid(logit) spreads over ~0.2 .. 0.8 and a missing sigmoid (or gate) shows. (A name no
    other family has: their draws are unchanged.)
    gpt-oss: router weights (.mlp.router.weight) ~ N(0, ROUTER_STD), its bias ~ N(0, 0.5);
    attention sinks ~ N(0, 1) (a sizeable share of each row next to scores of O(0.3));
    experts.gate_up_proj ~ N(0, 0.25) and gate_up_proj_bias ~ N(0, 3), so that gate / up values
    of std ~3.5 cross the SwiGLU clamps (gate > 7, |up| > 7) a few percent of the time;
    experts.down_proj ~ N(0, 0.02), down_proj_bias ~ N(0, 0.1). (Names no other family has: the
    other families' draws are unchanged.)
    DeepSeek-V3: the router's e_score_correction_bias ~ N(0, DEEPSEEK_V3_SCORE_BIAS_STD), next to
    sigmoid scores that spread over ~0.2 .. 0.8, so the bias changes the chosen experts (or groups)
    of a good share of the tokens (test_reference checks it); q_proj, q_a_proj, q_b_proj,
    kv_a_proj_with_mqa and kv_b_proj ~ N(0, DEEPSEEK_V3_MLA_STD): their inputs are normalised rows,
    so q, k (the shared rotary key included) and v come out O(1) and the attention is far from
    uniform. (Names no other family has.) DeepSeek-V2: the same MLA draws (its q_proj included) and
    routers; no correction bias.
    OPT: embed_positions ~ N(0, 0.5) as the token embeddings (so a position off by one shows);
    project_in / project_out ~ N(0, OPT_PROJ_STD): the projected embeddings (std ~0.6) and the
    head's input stay O(1) (at 0.02 project_in's output would vanish next to the positions).
    (Names no other family has.)"""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in reference.expected_shapes(cfg).items():
        leaf = name.rsplit(".", 2)
        if any(s in name for s in ("ln_", "layernorm", "norm.weight")) and name.endswith(".weight"):
            # Gemma's norm weights are offsets from one (it scales by 1 + w)
            a = (0.0 if cfg.get("model_type") in GEMMA else 1.0) + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".e_score_correction_bias"):
            a = DEEPSEEK_V3_SCORE_BIAS_STD * rng.standard_normal(shape)
        elif leaf[-2] in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj") or (
                leaf[-2] == "q_proj" and cfg.get("model_type") in ("deepseek_v3", "deepseek_v2")):
            a = (DEEPSEEK_V3_MLA_STD if leaf[-1] == "weight" else 0.1) * rng.standard_normal(shape)
        elif name.endswith(".self_attn.sinks"):
            a = GPT_OSS_SINK_STD * rng.standard_normal(shape)
        elif name.endswith(".mlp.router.bias"):
            a = GPT_OSS_ROUTER_BIAS_STD * rng.standard_normal(shape)
        elif name.endswith(".experts.gate_up_proj_bias"):
            a = GPT_OSS_GATE_UP_BIAS_STD * rng.standard_normal(shape)
        elif name.endswith(".experts.gate_up_proj"):
            a = GPT_OSS_GATE_UP_STD * rng.standard_normal(shape)
        elif name.endswith(".bias") or name.endswith(".experts.down_proj_bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif "wte" in name or "wpe" in name or "embed_tokens" in name or "embed_in" in name or \
                "embed_positions" in name:
            a = 0.5 * rng.standard_normal(shape)
        elif leaf[-2] in ("project_in", "project_out"):  # OPT
            a = OPT_PROJ_STD * rng.standard_normal(shape)
        elif leaf[-2] in ("gate", "router"):  # a MoE router (mlp.gate / block_sparse_moe.gate / mlp.router)
            a = ROUTER_STD * rng.standard_normal(shape)
        elif leaf[-2] == "shared_expert_gate":  # Qwen2-MoE
            a = SHARED_GATE_STD * rng.standard_normal(shape)
        else:
            a = 0.02 * rng.standard_normal(shape) * (4.0 if leaf[-2] in ("q_proj", "k_proj", "c_attn", "query_key_value", "qkv_proj") else 1.0)
        out[name] = a.astype(np.float32)
    return out


def gemma3_multimodal(text_cfg, layout="new", **top):
    """A Gemma3ForConditionalGeneration config.json around the text config `text_cfg` (as
    google/gemma-3-4b-pt's, with a small vision_config). `layout` is how write_checkpoint names the
    tensors: "new" as transformers >= 4.52 saves them (model.language_model.*, model.vision_tower.*,
    model.multi_modal_projector.*, lm_head), "old" as the Hub's checkpoints (language_model.model.*,
    vision_tower.*, multi_modal_projector.*, language_model.lm_head); "none" leaves out the text
    model's tensors (a vision-only file). Not a config field: popped by write_checkpoint."""
    text = {k: v for k, v in text_cfg.items() if k not in ("architectures", "torch_dtype", "dtype")}
    text["model_type"] = "gemma3_text"
    cfg = dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"], boi_token_index=255999,
               eoi_token_index=256000, eos_token_id=[1, 106], image_token_index=262144, initializer_range=0.02,
               mm_tokens_per_image=4, text_config=text,
               vision_config=dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32,
                                  num_attention_heads=2, num_hidden_layers=1, image_size=8, patch_size=4,
                                  vision_use_head=False))
    cfg.update(top)
    cfg["_layout"] = layout
    return cfg


# A few vision-tower and projector tensors of gemma3_multimodal's vision_config (names as
# SiglipVisionModel / Gemma3MultiModalProjector), stored beside the text model and never used.
GEMMA3_VISION = {"vision_tower.vision_model.embeddings.patch_embedding.weight": [16, 3, 4, 4],
                 "vision_tower.vision_model.embeddings.position_embedding.weight": [4, 16],
                 "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight": [16, 16],
                 "vision_tower.vision_model.post_layernorm.weight": [16],
                 "multi_modal_projector.mm_input_projection_weight": [16, 32],
                 "multi_modal_projector.mm_soft_emb_norm.weight": [16]}


def _gemma3_layout(w, layout, rng):
    """Renames model.language_model.* / lm_head to the old layout and adds the vision tensors."""
    out = {}
    if layout != "none":
        for k, v in w.items():
            if layout == "old":
                k = k.replace("model.language_model.", "language_model.model.", 1)
                k = "language_model.lm_head.weight" if k == "lm_head.weight" else k
            out[k] = v
    for k, shape in GEMMA3_VISION.items():
        out[k if layout == "old" else "model." + k] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out


def mxfp4_config(cfg):
    """The gpt_oss config `cfg` with openai/gpt-oss-20b's quantization_config (MXFP4 experts):
    write_checkpoint then stores the experts' gate_up_proj / down_proj quantized. hidden_size and
    intermediate_size must be multiples of 32."""
    return dict(cfg, quantization_config=json.loads(json.dumps(MXFP4_QUANTIZATION_CONFIG)))


def _is_mxfp4(cfg):
    q = cfg.get("quantization_config")
    return isinstance(q, dict) and q.get("quant_method") == "mxfp4"


FP4_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # e2m1 codes 0..7 (8..15: negated)


def mxfp4_quantize(w):
    """An expert matrix in transformers' layout, [E, in, out] (x @ W), as the MXFP4 tensors
    openai's checkpoints store: returns (blocks uint8 [E, out, in / 32, 16], scales uint8
    [E, out, in / 32], dequantized float32 [E, in, out]). Each run of 32 inputs of one output row
    shares the scale 2 ** (scale - 127), the smallest power of two that brings the run's largest
    magnitude to <= 6; each value is rounded to the nearest e2m1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4,
    6; a tie to the smaller) with its sign in bit 3 (so small negatives give -0.0, code 8); two codes
    a byte, the even element in the low nibble. At least one -0.0 code is guaranteed. Written from
    the format (transformers' _convert_moe_packed_tensors reads it), independent of reference.py's
    dequantizer."""
    t = np.swapaxes(np.asarray(w, np.float64), 1, 2)  # [E, out, in]
    E, R, C = t.shape
    if C % 32:
        raise ValueError(f"MXFP4 needs an input width multiple of 32, not {C}")
    g = t.reshape(E, R, C // 32, 32)
    amax = np.abs(g).max(-1)
    exp = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-300) / 6.0)), -127.0)
    exp = np.where(amax / np.exp2(exp) > 6.0, exp + 1, exp).clip(-127, 127).astype(np.int64)
    x = g / np.exp2(exp)[..., None]
    code = np.abs(np.abs(x)[..., None] - FP4_MAGNITUDES).argmin(-1) + 8 * np.signbit(x)
    if not (code == 8).any():  # force one -0.0 (a +0.0 or the smallest magnitude becomes it)
        flat = code.reshape(-1)
        flat[int(np.argmin(np.where(flat < 8, flat, 99)))] = 8
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    scales = (exp + 127).astype(np.uint8)
    deq = mxfp4_values(blocks, scales)
    return blocks, scales, deq


def mxfp4_values(blocks, scales):
    """The float32 [E, in, out] matrix of MXFP4 blocks [E, out, in / 32, 16] / scales [E, out, in / 32]
    (numpy, exact)."""
    blocks = np.asarray(blocks, np.uint8)
    E, R, G, _ = blocks.shape
    code = np.stack((blocks & 0x0F, blocks >> 4), axis=-1).reshape(E, R, G, 32)
    vals = np.where(code >= 8, -1.0, 1.0) * FP4_MAGNITUDES[code & 7]  # -0.0 for code 8
    vals = vals * np.exp2(np.asarray(scales, np.float64) - 127)[..., None]
    return np.swapaxes(vals.reshape(E, R, G * 32), 1, 2).astype(np.float32)


def _mxfp4_experts(w, seed):
    """write_checkpoint's MXFP4 step: each experts.gate_up_proj / down_proj is first multiplied by
    2 ** k per 32-input run (k uniform in -3..1, so the stored scales span several exponents), then
    replaced by its _blocks / _scales."""
    rng = np.random.default_rng(seed + 2)
    out = {}
    for k, v in w.items():
        if k.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            E, n_in, n_out = v.shape
            mult = np.exp2(rng.integers(-3, 2, size=(E, n_in // 32, 1, n_out)).astype(np.float64))
            v = (v.reshape(E, n_in // 32, 32, n_out) * mult).reshape(E, n_in, n_out)
            out[k + "_blocks"], out[k + "_scales"], _ = mxfp4_quantize(v)
        else:
            out[k] = v
    return out


def mxfp4_unpacked(w):
    """The tensors write_checkpoint returned for an MXFP4 checkpoint with every _blocks / _scales
    pair replaced by its float32 matrix (mxfp4_values): the same model unquantized."""
    out = {}
    for k, v in w.items():
        if k.endswith("_scales") and k[:-7] + "_blocks" in w:
            continue
        if k.endswith("_blocks") and k[:-7] + "_scales" in w:
            out[k[:-7]] = mxfp4_values(v, w[k[:-7] + "_scales"])
        else:
            out[k] = v
    return out


def write_unquantized_twin(src_dir, dst_dir, w):
    """The MXFP4 checkpoint at src_dir (w: its tensors as write_checkpoint returned them) written
    again to dst_dir unquantized: the decoded float32 experts, no quantization_config."""
    os.makedirs(dst_dir, exist_ok=True)
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config")
    with open(os.path.join(dst_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    st.save(os.path.join(dst_dir, "model.safetensors"), mxfp4_unpacked(w), metadata={"format": "pt"})


# deepseek-ai/DeepSeek-V3's quantization_config (Kimi-K2's and the Qwen3 FP8 releases' differ only in
# fmt's presence and the scales' dtype)
FP8_QUANTIZATION_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                           "weight_block_size": [128, 128]}


def e4m3_values():
    """The float64 values of the 256 e4m3fn codes, from the format alone: bit 7 the sign, bits 6..3
    the exponent (bias 7; 0: subnormal, m / 8 * 2**-6), bits 2..0 the mantissa; no infinities;
    S.1111.111 (0x7F, 0xFF) NaN. Independent of actcap's table."""
    code = np.arange(256)
    e, m = (code >> 3) & 15, code & 7
    mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return np.where(code & 128, -mag, mag)


def e4m3_encode(x):
    """The nearest e4m3fn code of each value (|x| clamped to 448; a tie to the even code), uint8."""
    x = np.asarray(x, np.float64)
    vals = e4m3_values()[:127]  # codes 0..126: the non-negative finite values, increasing
    a = np.minimum(np.abs(x), 448.0)
    i = np.clip(np.searchsorted(vals, a), 1, 126)  # vals[i - 1] < a <= vals[i]
    lo, hi = vals[i - 1], vals[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & (i % 2 == 0))
    return (np.where(up, i, i - 1) | np.where(np.signbit(x), 128, 0)).astype(np.uint8)


def fp8_quantize(w, block):
    """A float matrix [rows, cols] as an FP8 checkpoint stores it: (codes uint8 [rows, cols], scales
    float32 [ceil(rows / br), ceil(cols / bc)]; block None: one scale, [1, 1]), each block's scale its
    largest magnitude / 448 (as transformers' Fp8Quantize and DeepSeek's quantizer; 1 for an all-zero
    block) and each value the nearest code of value / scale."""
    w = np.asarray(w, np.float64)
    rows, cols = w.shape
    br, bc = block if block is not None else (rows, cols)
    scales = np.ones((-(-rows // br), -(-cols // bc)), np.float32)
    codes = np.zeros((rows, cols), np.uint8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            b = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = np.abs(b).max()
            scales[i, j] = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = e4m3_encode(b / np.float64(scales[i, j]))
    return codes, scales


def fp8_decode(codes, scales, block):
    """The float32 matrix FP8 codes and block scales stand for: each code's value times its block's
    scale, one float32 product (numpy's, IEEE-rounded)."""
    rows, cols = codes.shape
    br, bc = block if block is not None else (rows, cols)
    full = np.repeat(np.repeat(np.asarray(scales, np.float32), br, 0), bc, 1)[:rows, :cols]
    return e4m3_values().astype(np.float32)[codes] * full


def _fp8_quantized(name, v):
    """Whether an FP8 checkpoint stores this tensor quantized: the linear layers' matrices, as
    transformers' replace_with_fp8_linear converts them (not the embeddings, lm_head or DeepSeek's
    router, which is no nn.Linear)."""
    return (v.ndim == 2 and name.endswith(".weight") and not name.endswith("mlp.gate.weight")
            and "embed" not in name and not name.startswith("lm_head"))


def compressed_tensors_config(strategy, block=None):
    """The quantization_config llm-compressor writes for its FP8 schemes (format float-quantized):
    8-bit symmetric static float weights of `strategy` tensor, channel, group (block (1, g)) or block
    (block (rows, columns)), static per-tensor float input scales (FP8 W8A8)."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": strategy,
               "group_size": block[1] if strategy == "group" else None,
               "block_structure": list(block) if strategy == "block" else None,
               "actorder": None, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "global_compression_ratio": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                                                "dynamic": False, "strategy": "tensor"},
                                          "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": None}


def write_fp8_checkpoint(fp8_dir, twin_dir, cfg, seed=0, block=(128, 128), scale_dtype="F32",
                         dtype="bfloat16", every_code=None, compressed=None):
    """An FP8 checkpoint of `cfg` (quantization_config fp8 with weight_block_size `block`, None for
    one scale per matrix; config dtype `dtype`) at fp8_dir, and at twin_dir its twin: the same model
    with each FP8 weight decoded (fp8_decode, then rounded to `dtype` as the other tensors are),
    without quantization_config. Scales stored as `scale_dtype` (F32 as DeepSeek's, BF16 as Qwen's:
    the scales are rounded to bf16 first). every_code: a tensor name whose first 254 codes are set
    to every finite code. compressed: a compressed-tensors strategy (tensor, channel, group, block;
    `block` the group's (1, g) or the block's) instead of transformers' fp8: scales in <weight>_scale
    ([1] per tensor, [rows, 1] per channel), and an <input>_scale each. Returns the names stored
    quantized."""
    w = random_weights(cfg, seed)
    if reference.Config(cfg).tie:
        del w["embed_out.weight" if cfg["model_type"] == "gpt_neox" else "lm_head.weight"]
    round_to = {"bfloat16": lambda a: st.bf16_bits_to_f32(st.f32_to_bf16_bits(a)),
                "float16": lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float32),
                "float32": lambda a: np.asarray(a, np.float32)}[dtype]

    def stored(t):  # a float32 array (already rounded) as the checkpoint's dtype stores it
        if dtype == "float16":
            return t.astype(np.float16), None
        return t, "BF16" if dtype == "bfloat16" else None

    fp8, twin, fp8_names, twin_names, quantized = {}, {}, {}, {}, []
    for k, v in w.items():
        if not _fp8_quantized(k, v):
            fp8[k], fp8_names[k] = twin[k], twin_names[k] = stored(round_to(v))
            continue
        b = {None: block, "tensor": None, "channel": (1, v.shape[1])}.get(compressed, block)
        codes, scales = fp8_quantize(v, b)
        if k == every_code:
            finite = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)
            codes.reshape(-1)[:finite.size] = finite
        if scale_dtype == "BF16":
            scales = st.bf16_bits_to_f32(st.f32_to_bf16_bits(scales))
        fp8[k], fp8_names[k] = codes, "F8_E4M3"
        suffix = "_scale" if compressed else "_scale_inv"
        shape = {"tensor": (1,), "channel": (scales.shape[0], 1)}.get(compressed, scales.shape)
        fp8[k + suffix], fp8_names[k + suffix] = scales.reshape(shape), scale_dtype
        if compressed:
            fp8[k[:-len("weight")] + "input_scale"] = np.array([0.0625], np.float32)
        twin[k], twin_names[k] = stored(round_to(fp8_decode(codes, scales, b)))
        quantized.append(k)
    q = dict(FP8_QUANTIZATION_CONFIG, weight_block_size=list(block) if block is not None else None)
    if compressed:
        q = compressed_tensors_config(compressed, block)
    for d, tensors, names, config in ((fp8_dir, fp8, fp8_names, dict(cfg, quantization_config=q)),
                                      (twin_dir, twin, twin_names, cfg)):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(config, torch_dtype=dtype), f, indent=2)
        st.save(os.path.join(d, "model.safetensors"), tensors, metadata={"format": "pt"},
                dtype_names={k: n for k, n in names.items() if n in ("BF16", "F8_E4M3")})
    return quantized


def stack_experts(w):
    """DeepSeek-V3's / V2's per-expert tensors (mlp.experts.E.{gate,up,down}_proj.weight) of each sparse
    layer replaced by transformers 5's stacked parameters: mlp.experts.gate_up_proj [E, 2I, H] (each
    expert's gate_proj rows, then its up_proj rows) and mlp.experts.down_proj [E, H, I]."""
    out, layers = {}, {}
    for k, v in w.items():
        head, sep, tail = k.partition(".mlp.experts.")
        if not sep:
            out[k] = v
            continue
        e, name = tail.split(".", 1)
        layers.setdefault(head, {})[(int(e), name)] = v
    for head, t in layers.items():
        E = 1 + max(e for e, _ in t)
        m = head + ".mlp.experts."
        out[m + "gate_up_proj"] = np.stack([np.concatenate([t[(e, "gate_proj.weight")], t[(e, "up_proj.weight")]])
                                            for e in range(E)])
        out[m + "down_proj"] = np.stack([t[(e, "down_proj.weight")] for e in range(E)])
    return out


def write_checkpoint(ckpt_dir, cfg, seed=0, dtype="f32", sharded=0, stacked_experts=False):
    """Writes config.json + model.safetensors (or `sharded` shards + index). Returns the tensors
    as written (float32 numpy, after rounding to the storage dtype; bf16 as uint16 bits).

    stacked_experts (deepseek_v3 / deepseek_v2): the experts stored stacked, as transformers 5's parameters
    (stack_experts), instead of the Hub's per-expert tensors.

    A gpt_oss config with quantization_config mxfp4 (TINY["gpt_oss_mxfp4"], mxfp4_config) gets
    MXFP4 experts (_mxfp4_experts): their _blocks / _scales are stored uint8 whatever `dtype`, and
    returned so (mxfp4_unpacked gives the float matrices)."""
    os.makedirs(ckpt_dir, exist_ok=True)
    cfg = dict(cfg)
    layout = cfg.pop("_layout", None)
    c = reference.Config(cfg)
    w = random_weights(cfg, seed)
    if c.tie:
        del w["embed_out.weight" if c.arch == "gpt_neox" else "lm_head.weight"]
    if layout is not None:
        w = _gemma3_layout(w, layout, np.random.default_rng(seed + 1))
    if c.arch == "gpt_oss" and _is_mxfp4(cfg):
        w = _mxfp4_experts(w, seed)
    if stacked_experts:
        w = stack_experts(w)
    dtype_names = {}
    if dtype == "f16":
        w = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in w.items()}
    elif dtype == "bf16":
        dtype_names = {k: "BF16" for k, v in w.items() if v.dtype == np.float32}
        w = {k: st.f32_to_bf16_bits(v) if v.dtype == np.float32 else v for k, v in w.items()}
    elif dtype != "f32":
        raise ValueError(dtype)
    cfg["torch_dtype"] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]
    with open(os.path.join(ckpt_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if sharded:
        st.save_sharded(ckpt_dir, w, n_shards=sharded, dtype_names=dtype_names)
    else:
        st.save(os.path.join(ckpt_dir, "model.safetensors"), w, metadata={"format": "pt"},
                dtype_names=dtype_names)
    return w


# Qwen/Qwen3-0.6B's config.json as published on the Hugging Face Hub (transformers 4.51 layout):
# what `actcap init-model --arch qwen3 --preset qwen3-0.6b` must reproduce, and a real 4.x config
# for the parser (nulls included).
QWEN3_0_6B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


# allenai/OLMo-2-0425-1B's config.json (transformers 4.x layout): what `actcap init-model --arch
# olmo2 --preset olmo-2-1b` must reproduce. Not read from the repository itself: as quoted by a
# fine-tune's config.json (CodeAtCMU/OLMo-2-0425-1B_full_sft_..., transformers 4.52.1, bfloat16),
# fairseq2's OLMo config (defaults "correspond to allenai/OLMo-2-0425-1B": bos None, eos 100257,
# pad 100277) and the model card (16 layers, 2048 wide, 16 heads, 4096 context). No
# bos_token_id: OLMo 2 has none. torch_dtype of the release not seen.
OLMO2_1B_CONFIG = {
    "architectures": ["Olmo2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "eos_token_id": 100257,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "olmo2",
    "num_attention_heads": 16,
    "num_hidden_layers": 16,
    "num_key_value_heads": 16,
    "pad_token_id": 100277,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 500000,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 100352,
}


# A config of google/gemma-2b's sizes (Gemma 1, transformers 4.38 layout), which `actcap init-model
# --arch gemma --preset gemma-2b` must reproduce. Written from memory and third-party reports, not
# copied from the Hub: the legacy "hidden_act": "gelu" next to "hidden_activation":
# "gelu_pytorch_tanh" (the activation it was trained with, which actcap's rule picks; transformers
# 5.12 would run exact gelu), MQA (one kv head), head_dim 256 = 2048 / 8, no tie_word_embeddings key
# (GemmaConfig: tied).
GEMMA_2B_CONFIG = {
    "architectures": ["GemmaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "head_dim": 256,
    "hidden_act": "gelu",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 16384,
    "max_position_embeddings": 8192,
    "model_type": "gemma",
    "num_attention_heads": 8,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.38.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}


# google/gemma-2-2b's config.json (transformers 4.42 layout): what `actcap init-model --arch gemma2
# --preset gemma-2-2b` must reproduce. Every size, token id, soft-cap, window and scalar here is
# as kohya-ss/sd-scripts (library/lumina_util.py) quotes the file (there with transformers
# 4.44.2); no tie_word_embeddings key (Gemma2Config: tied).
GEMMA2_2B_CONFIG = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "initializer_range": 0.02,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.42.4",
    "use_cache": True,
    "vocab_size": 256000,
}


# google/gemma-3-1b-pt's config.json (transformers 4.50 layout): what `actcap init-model --arch
# gemma3_text --preset gemma-3-1b` must reproduce.
GEMMA3_1B_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "initializer_range": 0.02,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "use_cache": True,
    "vocab_size": 262144,
}


def gemma3_to_v5(cfg):
    """A Gemma 3 text config.json as transformers 5.x writes it: `dtype`, rope_parameters keyed by
    layer type (rope_scaling merged into full_attention, rope_theta and rope_local_base_freq moved
    in), explicit layer_types and no sliding_window_pattern."""
    cfg = dict(cfg)
    if "torch_dtype" in cfg:
        cfg["dtype"] = cfg.pop("torch_dtype")
    cfg["transformers_version"] = "5.0.0"
    full = dict(cfg.pop("rope_scaling", None) or {"rope_type": "default"})
    if "type" in full:
        full["rope_type"] = full.pop("type")
    full["rope_theta"] = float(cfg.pop("rope_theta", 1_000_000.0))
    local = {"rope_type": "default", "rope_theta": float(cfg.pop("rope_local_base_freq", 10_000.0))}
    cfg["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
    pattern = cfg.pop("sliding_window_pattern", 6)
    if cfg.get("layer_types") is None:
        cfg["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                              for i in range(cfg.get("num_hidden_layers", 26))]
    return cfg


def to_v5(cfg):
    """The same model's config.json as transformers 5.x writes it: `dtype` instead of
    `torch_dtype`; RoPE in `rope_parameters` (rope_theta folded in, `type` renamed rope_type, no
    top-level rope_theta / rope_scaling); Qwen2 / Qwen3 with an explicit `layer_types` list,
    computed from use_sliding_window / sliding_window / max_window_layers as Qwen2Config and
    Qwen3Config do (HF's defaults for absent fields); Qwen3-MoE with num_local_experts for
    num_experts, sliding_window null unless use_sliding_window and mlp_only_layers a list; Mixtral
    with head_dim (null when absent); gpt-oss with its default YaRN written out when the 4.x file
    had no rope_scaling, layer_types, head_dim and num_local_experts (as GptOssConfig saves them);
    Qwen2-MoE as Qwen2MoeConfig saves it: layer_types by its own rule (even layers below
    max_window_layers slide when use_sliding_window), sliding_window 0 unless use_sliding_window,
    mlp_only_layers a list, and qkv_bias written out; OLMo 3 with its layer_types written out (every
    4th layer full when the 4.x file had none, as Olmo3Config saves them).
    quantization_config is kept as it is."""
    cfg = dict(cfg)
    if "torch_dtype" in cfg:
        cfg["dtype"] = cfg.pop("torch_dtype")
    cfg["transformers_version"] = "5.0.0"
    if cfg.get("model_type") in ("gpt2", "gpt_neo", "opt"):  # no RoPE
        return cfg
    gpt_oss = cfg.get("model_type") == "gpt_oss"
    rs = cfg.pop("rope_scaling", None) or {}
    if gpt_oss and not rs:
        rs = reference.GPT_OSS_ROPE  # GptOssConfig's default, written out
    rp = dict(rs)
    if "type" in rp:
        rp.setdefault("rope_type", rp.pop("type"))
    rp.setdefault("rope_type", "default")
    theta = cfg.pop("rope_theta", None)
    if theta is None:
        theta = reference.GPT_OSS_DEFAULTS["rope_theta"] if gpt_oss else 10000.0
    rp["rope_theta"] = float(theta)
    cfg["rope_parameters"] = rp
    if gpt_oss:
        # GptOssConfig writes layer_types (even layers sliding by default), head_dim (default 64) and
        # num_experts as num_local_experts (num_experts wins when both are given)
        if cfg.get("layer_types") is None:
            cfg["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                  for i in range(cfg.get("num_hidden_layers", 36))]
        cfg.setdefault("head_dim", reference.GPT_OSS_DEFAULTS["head_dim"])
        if cfg.get("num_experts") is not None:
            cfg["num_local_experts"] = cfg.pop("num_experts")
    if cfg.get("model_type") == "olmo3" and cfg.get("layer_types") is None:
        # Olmo3Config writes its layer_types (every 4th layer full by default)
        n = cfg.get("num_hidden_layers", reference.OLMO3_DEFAULTS["num_hidden_layers"])
        cfg["layer_types"] = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
    if cfg.get("model_type") == "gemma2" and cfg.get("layer_types") is None:
        cfg["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                              for i in range(cfg["num_hidden_layers"])]
    if cfg.get("model_type") == "qwen3_moe":
        # Qwen3MoeConfig writes num_experts as num_local_experts (its attribute_map), the window
        # null unless use_sliding_window, and mlp_only_layers as a list
        if "num_experts" in cfg:
            cfg["num_local_experts"] = cfg.pop("num_experts")
        if not cfg.get("use_sliding_window", False):
            cfg["sliding_window"] = None
        if cfg.get("mlp_only_layers") is None:
            cfg["mlp_only_layers"] = []
    if cfg.get("model_type") == "qwen2_moe":
        d = reference.QWEN2_MOE_DEFAULTS
        use = cfg.get("use_sliding_window", d["use_sliding_window"])
        if not use:
            cfg["sliding_window"] = 0  # Qwen2MoeConfig.__post_init__
        if cfg.get("mlp_only_layers") is None:
            cfg["mlp_only_layers"] = []
        cfg.setdefault("qkv_bias", d["qkv_bias"])
        if cfg.get("layer_types") is None:
            mwl = cfg.get("max_window_layers", d["max_window_layers"])
            cfg["layer_types"] = ["sliding_attention" if (i + 1) % 2 and i < mwl and use else "full_attention"
                                  for i in range(cfg.get("num_hidden_layers", d["num_hidden_layers"]))]
    if cfg.get("model_type") == "mixtral":
        cfg.setdefault("head_dim", None)  # MixtralConfig writes its Optional head_dim
    if cfg.get("model_type") in ("qwen2", "qwen3") and cfg.get("layer_types") is None:
        sw = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
        mwl = cfg.get("max_window_layers", 28)
        cfg["layer_types"] = ["sliding_attention" if sw is not None and i >= mwl else "full_attention"
                              for i in range(cfg["num_hidden_layers"])]
    return cfg
