#!/usr/bin/python3
"""Writes the committed seed corpora under fuzz/corpus/<target>/ (small valid and near-valid
inputs). Deterministic; re-run after changing it:  /usr/bin/python3 fuzz/make_seeds.py

Safetensors files are built by hand (struct + json), configs mirror `actcap init-model --preset
tiny` outputs, tokenizers are tiny hand-made tokenizer.json documents (not the 2 MB real ones).
"""
import json
import os
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def reset(target):
    """Empties fuzz/corpus/<target>/ of the seeds this script writes. Inputs libFuzzer found and
    someone committed (named by their SHA-1, 40 hex digits) are kept."""
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        if not re.fullmatch(r"[0-9a-f]{40}", name):
            os.remove(os.path.join(d, name))
    return d


def write(d, name, data):
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ------------------------------------------------------------------------------

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "F16": 2, "BF16": 2,
            "F32": 4, "F64": 8, "C64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4,
            "U64": 8}


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def safetensors(tensors, metadata=None, pad=True, header_override=None, extra=b""):
    """tensors: list of (name, dtype, shape). Data bytes are a deterministic pattern."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape in tensors:
        nbytes = numel(shape) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + nbytes]}
        data += bytes((len(data) + i) * 37 % 251 for i in range(nbytes))
    text = header_override if header_override is not None else json.dumps(header, separators=(",", ":"))
    text = text.encode() if isinstance(text, str) else text
    if pad:
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data + extra


def safetensors_seeds():
    d = reset("fuzz_safetensors")
    write(d, "empty_header.st", safetensors([]))
    write(d, "metadata_only.st", safetensors([], {"format": "pt", "note": "x"}))
    write(d, "f32_2x3.st", safetensors([("w", "F32", [2, 3])], {"format": "pt"}))
    write(d, "all_dtypes.st", safetensors(
        [(f"t_{dt.lower()}", dt, [3]) for dt in
         ["BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "BF16", "F32", "F64", "C64"]]))
    write(d, "scalar_and_empty.st", safetensors(
        [("scalar", "F32", []), ("empty", "F32", [0, 5]), ("empty_big", "I64", [0, 4611686018427387904]),
         ("v", "I16", [4])]))
    write(d, "misaligned.st", safetensors([("a", "F64", [2]), ("b", "F32", [1, 3])], pad=False))
    write(d, "gpt2_like.st", safetensors(
        [("transformer.wte.weight", "F32", [8, 4]), ("transformer.wpe.weight", "F32", [4, 4]),
         ("transformer.h.0.ln_1.weight", "F32", [4]), ("transformer.h.0.ln_1.bias", "F32", [4]),
         ("transformer.h.0.attn.c_attn.weight", "F16", [4, 12]),
         ("transformer.h.0.attn.c_attn.bias", "BF16", [12]),
         ("transformer.ln_f.weight", "F32", [4])], {"format": "pt"}))
    # Near-valid: each breaks one rule.
    ok = safetensors([("a", "F32", [2])])
    write(d, "bad_truncated.st", ok[:-3])
    write(d, "bad_trailing_bytes.st", ok + b"\0\0\0\0")
    write(d, "bad_header_len.st", struct.pack("<Q", 1 << 40) + ok[8:])
    write(d, "bad_not_object.st", safetensors([], header_override="[1,2,3]"))
    write(d, "bad_unknown_dtype.st", safetensors([], header_override=
          '{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}', extra=b"\0" * 16))
    write(d, "bad_f8.st", safetensors([("a", "F8_E4M3", [4])]))
    write(d, "bad_overlap.st", safetensors([], header_override=
          '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
          '"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}', extra=b"\1" * 6))
    write(d, "bad_hole.st", safetensors([], header_override=
          '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
          '"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}', extra=b"\1" * 6))
    write(d, "bad_duplicate.st", safetensors([], header_override=
          '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
          '"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', extra=b"\1" * 4))
    write(d, "bad_overflow_shape.st", safetensors([], header_override=
          '{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'))
    write(d, "bad_negative_dim.st", safetensors([], header_override=
          '{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', extra=b"\0" * 4))
    write(d, "bad_metadata.st", safetensors([], header_override='{"__metadata__":{"k":1}}'))


# ---- config.json --------------------------------------------------------------------------------

GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_embd": 64, "n_head": 4, "n_inner": None, "n_layer": 4, "n_positions": 128,
        "resid_pdrop": 0.1, "scale_attn_weights": True, "tie_word_embeddings": True,
        "torch_dtype": "float32", "vocab_size": 512}
LLAMA = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1,
         "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
         "initializer_range": 0.02, "intermediate_size": 160, "max_position_embeddings": 256,
         "mlp_bias": False, "model_type": "llama", "num_attention_heads": 4,
         "num_hidden_layers": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
         "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False,
         "torch_dtype": "float32", "vocab_size": 512}
MISTRAL = {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
           "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
           "intermediate_size": 160, "max_position_embeddings": 256, "model_type": "mistral",
           "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0,
           "sliding_window": 8, "tie_word_embeddings": False, "torch_dtype": "float32",
           "vocab_size": 512}
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
         "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
         "intermediate_size": 160, "max_position_embeddings": 256, "max_window_layers": 28,
         "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 4,
         "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
         "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
         "torch_dtype": "float32", "use_sliding_window": False, "vocab_size": 512}

GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "bos_token_id": 2, "eos_token_id": 1, "head_dim": 16,
          "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 64, "intermediate_size": 160,
          "max_position_embeddings": 256, "model_type": "gemma3_text", "num_attention_heads": 4,
          "num_hidden_layers": 4, "num_key_value_heads": 2, "query_pre_attn_scalar": 16,
          "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
          "rope_theta": 1000000.0, "sliding_window": 4, "sliding_window_pattern": 3,
          "tie_word_embeddings": True, "torch_dtype": "float32", "vocab_size": 512}


def config_seeds():
    d = reset("fuzz_config")
    for name, c in [("gpt2", GPT2), ("llama", LLAMA), ("mistral", MISTRAL), ("qwen2", QWEN2)]:
        write(d, f"{name}.json", json.dumps(c, indent=2, sort_keys=True) + "\n")

    def variant(name, base, **changes):
        c = dict(base)
        for k, v in changes.items():
            if v is KeyError:
                c.pop(k, None)
            else:
                c[k] = v
        write(d, name, json.dumps(c, separators=(",", ":")))

    variant("gpt2_aliases.json", {"model_type": "gpt2", "vocab_size": 10, "hidden_size": 8,
                                  "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "max_position_embeddings": 16, "n_inner": 32,
                                  "activation_function": "relu", "eos_token_id": [3, 4]}, )
    variant("gpt2_float_ints.json", GPT2, n_embd=64.0, n_layer=4.0)
    variant("llama3_rope.json", LLAMA, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, eos_token_id=[128001, 128008, 128009])
    variant("llama_linear_rope_v4.json", LLAMA, rope_scaling={"type": "linear", "factor": 2.0})
    variant("llama_rope_parameters_v5.json", LLAMA, rope_theta=KeyError, rope_scaling=KeyError,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    variant("llama_dynamic_rope_v4.json", LLAMA, rope_scaling={"type": "dynamic", "factor": 2.0})
    variant("qwen2_yarn_rope_v4.json", QWEN2, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    variant("llama_yarn_rope_parameters_v5.json", LLAMA, rope_theta=KeyError, rope_scaling=KeyError,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                             "original_max_position_embeddings": 4096, "beta_fast": 32,
                             "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "truncate": False, "attention_factor": 1.2})
    variant("mistral_longrope_phi3.json", MISTRAL, max_position_embeddings=131072,
            original_max_position_embeddings=4096, rope_scaling={
                "type": "longrope", "short_factor": [1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0],
                "long_factor": [1.1, 1.5, 2.0, 3.0, 5.0, 9.0, 17.0, 33.0]})
    variant("gpt2_scale_by_layer_reorder.json", GPT2, scale_attn_by_inverse_layer_idx=True,
            reorder_and_upcast_attn=True)
    variant("llama_no_head_dim.json", LLAMA, head_dim=KeyError, num_key_value_heads=KeyError,
            attention_bias=True, mlp_bias=True)
    variant("mistral_null_window.json", MISTRAL, sliding_window=None)
    variant("mistral_no_window.json", MISTRAL, sliding_window=KeyError)
    variant("qwen2_window.json", QWEN2, use_sliding_window=True, max_window_layers=2,
            sliding_window=16, hidden_act="gelu_pytorch_tanh")
    variant("gemma3.json", GEMMA3, rope_scaling={"rope_type": "linear", "factor": 8.0})
    variant("gemma3_rope_parameters_v5.json", GEMMA3, rope_theta=KeyError, rope_scaling=KeyError,
            rope_local_base_freq=KeyError, sliding_window_pattern=KeyError,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                                                "original_max_position_embeddings": 64},
                             "sliding_attention": {"rope_type": "linear", "factor": 2.0}})
    variant("gemma3_multimodal.json", {"model_type": "gemma3",
                                       "architectures": ["Gemma3ForConditionalGeneration"],
                                       "eos_token_id": [1, 106], "vision_config": {"hidden_size": 16},
                                       "text_config": {"hidden_size": 64, "intermediate_size": 160,
                                                       "num_hidden_layers": 4, "vocab_size": 512,
                                                       "head_dim": 16, "sliding_window": 4,
                                                       "rope_scaling": {"factor": 8.0,
                                                                        "rope_type": "linear"}}})
    # Gemma 1: the hub's layout (the legacy hidden_act beside hidden_activation) and GemmaConfig's
    # defaults (head_dim 256, 16 KV heads, gelu_pytorch_tanh, tied).
    gemma = {k: v for k, v in LLAMA.items() if k != "mlp_bias"}
    gemma.update(architectures=["GemmaForCausalLM"], model_type="gemma", bos_token_id=2,
                 eos_token_id=1, pad_token_id=0, hidden_act="gelu",
                 hidden_activation="gelu_pytorch_tanh", num_key_value_heads=1,
                 tie_word_embeddings=KeyError)
    variant("gemma.json", {k: v for k, v in gemma.items() if v is not KeyError})
    variant("gemma_defaults.json", gemma, tie_word_embeddings=KeyError, head_dim=KeyError,
            num_key_value_heads=KeyError, hidden_act=KeyError, hidden_activation=KeyError,
            num_attention_heads=16, attention_bias=True)
    # OLMo 1: non-parametric norms (no rms_norm_eps), no head_dim, no bos_token_id, clip_qkv set.
    olmo = {k: v for k, v in LLAMA.items()
            if k not in ("head_dim", "rms_norm_eps", "bos_token_id", "mlp_bias")}
    olmo.update(architectures=["OlmoForCausalLM"], model_type="olmo", eos_token_id=50279,
                pad_token_id=1, clip_qkv=8.0, attention_bias=False)
    variant("olmo.json", olmo)
    mixtral = dict(MISTRAL, architectures=["MixtralForCausalLM"], model_type="mixtral",
                   num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    variant("mixtral.json", mixtral)
    variant("mixtral_v5_window_num_experts.json", mixtral, num_local_experts=KeyError, num_experts=6,
            num_experts_per_tok=3, sliding_window=8, rope_theta=KeyError, rope_scaling=KeyError,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    qwen3_moe = {k: v for k, v in QWEN2.items() if k != "max_window_layers"}
    qwen3_moe.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=40, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[0])
    variant("qwen3_moe.json", qwen3_moe)
    variant("qwen3_moe_step_window_local_experts.json", qwen3_moe, num_experts=KeyError,
            num_local_experts=5, decoder_sparse_step=2, mlp_only_layers=None,
            use_sliding_window=True, sliding_window=KeyError, head_dim=KeyError)
    # Qwen2-MoE: transformers 5's saved form (sliding_window 0 without use_sliding_window,
    # explicit layer_types, qkv_bias) and a windowed one left to the default layer rule.
    qwen2_moe = dict(QWEN2, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                     shared_expert_intermediate_size=40, norm_topk_prob=False,
                     decoder_sparse_step=1, mlp_only_layers=[1], qkv_bias=True, sliding_window=0,
                     layer_types=["full_attention"] * 4)
    variant("qwen2_moe.json", qwen2_moe)
    variant("qwen2_moe_window_default_layers.json", qwen2_moe, use_sliding_window=True,
            sliding_window=8, max_window_layers=3, layer_types=KeyError, decoder_sparse_step=2,
            mlp_only_layers=None, qkv_bias=False)
    # gpt-oss: the hub's layout (rope_scaling YaRN, layer_types, an mxfp4 quantization_config) and
    # GptOssConfig's defaults (no rope field: YaRN; no head_dim: 64; no window: 128).
    gpt_oss = dict(LLAMA, architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                   num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=4,
                   attention_bias=True, layer_types=["sliding_attention", "full_attention"] * 2,
                   rope_theta=150000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                      "beta_fast": 32.0, "beta_slow": 1.0,
                                                      "truncate": False,
                                                      "original_max_position_embeddings": 64},
                   quantization_config={"quant_method": "mxfp4",
                                        "modules_to_not_convert": ["model.embed_tokens", "lm_head"]})
    variant("gpt_oss.json", gpt_oss)
    variant("gpt_oss_defaults.json", gpt_oss, rope_theta=KeyError, rope_scaling=KeyError,
            head_dim=KeyError, sliding_window=KeyError, layer_types=KeyError,
            quantization_config=KeyError, num_local_experts=KeyError, num_experts=6)
    # DeepSeek-V3: actcap's init-model form (q bottleneck, interleaved RoPE, one dense layer) and
    # the Hub's (plain q_proj, YaRN with mscale_all_dim, one group, the fields transformers ignores,
    # saved head_dim / qk_head_dim).
    deepseek_v3 = {k: v for k, v in LLAMA.items() if k not in ("head_dim", "mlp_bias")}
    deepseek_v3.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                       num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                       qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                       num_experts_per_tok=2, moe_intermediate_size=40, n_shared_experts=1,
                       routed_scaling_factor=2.5, norm_topk_prob=True, n_group=4, topk_group=2,
                       first_k_dense_replace=1, rope_interleave=True, attention_bias=False)
    variant("deepseek_v3.json", deepseek_v3)
    variant("deepseek_v3_hub.json", deepseek_v3, q_lora_rank=None, rope_interleave=KeyError,
            n_group=1, topk_group=1, head_dim=8, qk_head_dim=16, topk_method="noaux_tc",
            scoring_func="sigmoid", moe_layer_freq=1, num_nextn_predict_layers=1,
            max_position_embeddings=256, rope_scaling={"type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 64,
                                                       "mscale": 1.0, "mscale_all_dim": 1.0,
                                                       "beta_fast": 32, "beta_slow": 1})
    # DeepSeek-V2: V2-Lite's form (plain q_proj, greedy, YaRN) and V2's (q bottleneck, group-limited)
    deepseek_v2 = dict(deepseek_v3, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                       q_lora_rank=None, topk_method="greedy", n_group=None, topk_group=None,
                       n_shared_experts=2, routed_scaling_factor=1.0, mlp_bias=False)
    for k in ("rope_interleave", "norm_topk_prob"):
        deepseek_v2.pop(k)
    variant("deepseek_v2_lite.json", deepseek_v2, max_position_embeddings=256,
            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                          "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1})
    variant("deepseek_v2_group_limited.json", deepseek_v2, q_lora_rank=32,
            topk_method="group_limited_greedy", n_group=4, topk_group=2, mlp_bias=True)
    # GPT-J (its own field names, n_inner null, interleaved rotary on part of each head; one head
    # with rotary_dim null) and Phi (Phi-2's top-level partial_rotary_factor; transformers 5's rope
    # dict holding it, with linear scaling and GQA)
    gptj = {"model_type": "gptj", "architectures": ["GPTJForCausalLM"], "vocab_size": 64,
            "n_positions": 32, "n_embd": 16, "n_layer": 2, "n_head": 2, "rotary_dim": 4,
            "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1}
    variant("gptj.json", gptj)
    variant("gptj_one_head_null_rotary.json", gptj, n_head=1, rotary_dim=None, tie_word_embeddings=True)
    phi = {"model_type": "phi", "architectures": ["PhiForCausalLM"], "vocab_size": 64, "hidden_size": 16,
           "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 2, "hidden_act": "gelu_new", "max_position_embeddings": 32,
           "layer_norm_eps": 1e-5, "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
           "qk_layernorm": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    variant("phi.json", phi)
    variant("phi_rope_parameters_v5_gqa.json", phi, rope_theta=KeyError, partial_rotary_factor=KeyError,
            num_attention_heads=4, num_key_value_heads=2,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5})
    # GPT-Neo: the released layout (attention_types with the attention_layers it expands to);
    # the attribute_map aliases, a count of 0 and no attention_layers
    gpt_neo = {"model_type": "gpt_neo", "architectures": ["GPTNeoForCausalLM"], "vocab_size": 64,
               "max_position_embeddings": 32, "hidden_size": 16, "num_layers": 2, "num_heads": 2,
               "attention_types": [[["global", "local"], 1]], "attention_layers": ["global", "local"],
               "window_size": 4, "intermediate_size": None, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "bos_token_id": 0,
               "eos_token_id": 1}
    variant("gpt_neo.json", gpt_neo)
    variant("gpt_neo_aliases_local.json", gpt_neo, num_layers=KeyError, num_heads=KeyError,
            attention_layers=KeyError, num_hidden_layers=3, num_attention_heads=4,
            attention_types=[[["global"], 0], [["local"], 3]], intermediate_size=24,
            tie_word_embeddings=False)
    # OPT: pre-norm with narrower embeddings (project_in / project_out); opt-350m's post-norm
    # layers without biases or LayerNorm weights
    opt = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": 64,
           "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "ffn_dim": 40,
           "max_position_embeddings": 32, "word_embed_proj_dim": 8, "do_layer_norm_before": True,
           "enable_bias": True, "layer_norm_elementwise_affine": True, "activation_function": "relu",
           "tie_word_embeddings": True, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}
    variant("opt_projected.json", opt)
    variant("opt_post_norm_plain.json", opt, word_embed_proj_dim=KeyError, do_layer_norm_before=False,
            enable_bias=False, layer_norm_elementwise_affine=False, tie_word_embeddings=False,
            _remove_final_layer_norm=True)
    # OLMo 3: the released layout (layer_types listed, yarn RoPE in rope_scaling) and Olmo3Config's
    # defaults (no layer_types, no sliding_window; transformers 5's rope dict)
    olmo3 = {"model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], "vocab_size": 64,
             "hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 4,
             "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_act": "silu",
             "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "attention_bias": False,
             "rope_theta": 500000, "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                                   "original_max_position_embeddings": 8,
                                                   "attention_factor": 1.2079441541679836,
                                                   "beta_fast": 32, "beta_slow": 1},
             "sliding_window": 4, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
             "tie_word_embeddings": False, "eos_token_id": 1, "pad_token_id": 0}
    variant("olmo3.json", olmo3)
    variant("olmo3_defaults_bias.json", olmo3, layer_types=KeyError, sliding_window=KeyError,
            rope_theta=KeyError, rope_scaling=KeyError, attention_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    # SmolLM3: the released layout (no_rope_layers listed, no window) and a window on the NoPE
    # layers with SmolLM3Config's defaults (interval, kv heads, theta)
    smollm3 = {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], "vocab_size": 64,
               "hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
               "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0,
               "rope_scaling": None, "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0],
               "use_sliding_window": False, "sliding_window": None, "attention_bias": False,
               "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1}
    variant("smollm3.json", smollm3)
    variant("smollm3_window_defaults.json", smollm3, no_rope_layers=KeyError, num_key_value_heads=KeyError,
            rope_theta=KeyError, rope_scaling=KeyError, use_sliding_window=True, sliding_window=4,
            attention_bias=True, mlp_bias=True)
    # FP8 checkpoints: transformers' fp8 (DeepSeek-V3's blocks) and llm-compressor's
    # compressed-tensors (per channel; per block).
    variant("deepseek_v3_fp8.json", deepseek_v3, torch_dtype="bfloat16", quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128]})
    ct_weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                  "strategy": "channel", "group_size": None, "block_structure": None,
                  "actorder": None}
    ct = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": ct_weights,
                                        "input_activations": {"num_bits": 8, "type": "float",
                                                              "strategy": "tensor"}}},
          "ignore": ["lm_head"], "sparsity_config": None}
    variant("llama_compressed_tensors_fp8.json", LLAMA, torch_dtype="bfloat16",
            quantization_config=ct)
    variant("deepseek_v3_compressed_tensors_block.json", deepseek_v3, torch_dtype="bfloat16",
            quantization_config=dict(ct, config_groups={"group_0": {"weights": dict(
                ct_weights, strategy="block", block_structure=[128, 128])}}))
    # Near-valid.
    variant("bad_compressed_tensors_int4.json", LLAMA, quantization_config=dict(
        ct, format="pack-quantized"))
    variant("bad_deepseek_v3_groups.json", deepseek_v3, n_group=3)
    variant("bad_deepseek_v2_topk_method.json", deepseek_v2, topk_method="noaux_tc")
    variant("bad_gpt_oss_quantization.json", gpt_oss, quantization_config={"quant_method": "gptq"})
    variant("bad_missing_vocab.json", GPT2, vocab_size=KeyError)
    variant("bad_clip_qkv.json", olmo, clip_qkv=-1.0)
    variant("bad_moe_top_k.json", mixtral, num_experts_per_tok=5)
    variant("bad_moe_mlp_only_layers.json", qwen3_moe, mlp_only_layers=[0, "1"])
    variant("bad_heads.json", GPT2, n_head=5)
    variant("bad_kv_heads.json", LLAMA, num_key_value_heads=3)
    variant("bad_odd_head_dim.json", LLAMA, head_dim=15)
    variant("bad_rope_type.json", LLAMA, rope_scaling={"rope_type": "su", "factor": 4.0})
    variant("bad_longrope_length.json", LLAMA, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [2.0, 2.0]})
    variant("bad_partial_rotary.json", LLAMA, partial_rotary_factor=0.5)
    variant("bad_model_type.json", GPT2, model_type="bert")
    variant("bad_type.json", LLAMA, hidden_size="64")
    write(d, "bad_not_object.json", "[1, 2]")
    write(d, "bad_syntax.json", '{"model_type": "gpt2", ')


# ---- tokenizer.json ---------------------------------------------------------------------------

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def spell(raw):
    return "".join(B2U[b] for b in raw.encode("utf-8"))


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def added(i, content, special=True, **kw):
    t = {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": not special, "special": special}
    t.update(kw)
    return t


def bpe(vocab, merges, **kw):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
         "ignore_merges": False, "vocab": vocab, "merges": merges}
    m.update(kw)
    return m


def byte_level_vocab(full, merges_raw):
    alphabet = [B2U[b] for b in range(256)] if full else sorted({c for a, b in merges_raw for c in spell(a + b)})
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    for a, b in merges_raw:
        merges.append(spell(a) + " " + spell(b))
        vocab.setdefault(spell(a + b), len(vocab))
    return vocab, merges


MERGES = [("h", "e"), (" ", "t"), (" t", "he"), ("l", "l"), ("he", "ll"), ("hell", "o"),
          (" ", "w"), ("o", "r"), (" w", "or"), ("i", "n"), ("in", "g"), ("1", "2")]


def tokenizer_seeds():
    d = reset("fuzz_tokenizer_json")
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}

    vocab, merges = byte_level_vocab(True, MERGES)
    gpt2 = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [added(len(vocab), "<|endoftext|>")],
            "normalizer": None, "pre_tokenizer": bl, "post_processor": bl, "decoder": bl,
            "model": bpe(vocab, merges)}
    write(d, "gpt2_full_bytes.json", json.dumps(gpt2, ensure_ascii=False))

    vocab, merges = byte_level_vocab(False, MERGES)
    small = dict(gpt2, model=bpe(vocab, merges), added_tokens=[added(99, "<|endoftext|>")])
    write(d, "gpt2_small.json", json.dumps(small, ensure_ascii=False))

    llama3 = {"version": "1.0",
              "added_tokens": [added(100, "<|begin_of_text|>"), added(101, "<|end_of_text|>")],
              "normalizer": None,
              "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                  {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
                   "invert": False},
                  dict(bl, use_regex=False)]},
              "post_processor": {"type": "Sequence", "processors": [
                  dict(bl, trim_offsets=False),
                  {"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                              {"Sequence": {"id": "A", "type_id": 0}}],
                   "pair": [],
                   "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                            "ids": [100],
                                                            "tokens": ["<|begin_of_text|>"]}}}]},
              "decoder": bl,
              "model": bpe(vocab, [m.split(" ") for m in merges], ignore_merges=True)}
    write(d, "llama3_small.json", json.dumps(llama3, ensure_ascii=False))

    chars = ["<unk>", "a", "b", "e", "h", "l", "o", "w", "r", "d", " ", "1", "2", "é", "日"]
    cvocab = {c: i for i, c in enumerate(chars)}
    for b in (0x00, 0x41, 0xC3, 0xE6, 0xFF):
        cvocab[f"<0x{b:02X}>"] = len(cvocab)
    cmerges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("o", "r"), ("w", "or")]:
        cmerges.append(f"{a} {b}")
        cvocab.setdefault(a + b, len(cvocab))
    misc = {"version": "1.0",
            "added_tokens": [added(50, "[CLS]"), added(51, "[SEP]"),
                             added(52, "<mask>", lstrip=True, rstrip=True),
                             added(53, "hello", special=False, single_word=True),
                             added(54, "ﬁx", special=False, normalized=True)],
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "NFD"}]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext",
                 "invert": False},
                {"type": "Split", "pattern": {"Regex": r"\p{P}+"}, "behavior": "Contiguous",
                 "invert": True},
                {"type": "Split", "pattern": {"Regex": r"\s*\w+|\h"},
                 "behavior": "MergedWithPrevious", "invert": False},
                {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Removed", "invert": False}]},
            "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 50], "sep": ["[SEP]", 51]},
            "decoder": None,
            "model": bpe(cvocab, cmerges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)}
    write(d, "misc_normalizers.json", json.dumps(misc, ensure_ascii=False))
    roberta = dict(misc, normalizer={"type": "NFC"},
                   post_processor={"type": "RobertaProcessing", "cls": ["<s>", 1], "sep": ["</s>", 2]},
                   pre_tokenizer={"type": "Digits", "individual_digits": False})
    write(d, "roberta_nfc.json", json.dumps(roberta, ensure_ascii=False))
    # Near-valid.
    write(d, "bad_merge_missing.json", json.dumps(dict(small, model=bpe({"a": 0}, ["a b"]))))
    write(d, "bad_vocab_id.json", json.dumps(dict(small, model=bpe({"a": -1}, []))))
    write(d, "bad_regex.json", json.dumps(dict(llama3, pre_tokenizer={
        "type": "Split", "pattern": {"Regex": "(?<x"}, "behavior": "Isolated", "invert": False})))
    write(d, "bad_split_after_byte_level.json", json.dumps(dict(llama3, pre_tokenizer={
        "type": "Sequence", "pretokenizers": [bl, {"type": "Split", "pattern": {"String": "a"},
                                                   "behavior": "Removed", "invert": False}]})))
    write(d, "bad_model_type.json", json.dumps(dict(small, model={"type": "WordPiece", "vocab": {}})))
    write(d, "bad_template.json", json.dumps(dict(llama3, post_processor={
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>"}}], "special_tokens": {}})))
    sentencepiece_seeds(d)


# SentencePiece-style tokenizer.json files (Llama 2, Mistral, Gemma, Phi-3): spaces spelled U+2581,
# byte fallback over the 256 <0xXX> tokens, templates adding <s> / </s>.
META = "\u2581"


def sentencepiece_model(byte_tokens=range(256), **kw):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in byte_tokens:
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in [META, "a", "b", "e", "h", "l", "o", "w", "r", "1", "2", "é", "日"]:
        vocab[c] = len(vocab)
    merges = []
    for a, b in [(META, "h"), ("e", "l"), (META + "h", "el"), ("l", "o"), (META, META), (META, "w"),
                 ("o", "r"), (META + "w", "or"), ("1", "2"), (META, "日")]:
        merges.append([a, b])
        vocab.setdefault(a + b, len(vocab))
    return bpe(vocab, merges, unk_token="<unk>", **kw)


def template(eos, pair=False):
    single = [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    if eos:
        single.append({"SpecialToken": {"id": "</s>", "type_id": 0}})
    specials = {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in [("<s>", 1), ("</s>", 2)] if eos or i == 1}
    return {"type": "TemplateProcessing", "single": single,
            "pair": single + [{"Sequence": {"id": "B", "type_id": 1}}] if pair else [],
            "special_tokens": specials}


def metaspace(kind, scheme=None, split=None, **legacy):
    m = {"type": kind, "replacement": META}
    if scheme is not None:
        m["prepend_scheme"] = scheme
    if split is not None:
        m["split"] = split
    m.update(legacy)  # the older spelling: add_prefix_space instead of prepend_scheme
    return m


def sentencepiece_seeds(d):
    added_sp = [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")]
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_sp}
    # Llama 2: Prepend + Replace normalizers, no pre-tokenizer, its four decoders.
    llama2 = dict(base, normalizer={"type": "Sequence", "normalizers": [
                      {"type": "Prepend", "prepend": META},
                      {"type": "Replace", "pattern": {"String": " "}, "content": META}]},
                  pre_tokenizer=None, post_processor=template(False, pair=True),
                  decoder={"type": "Sequence", "decoders": [
                      {"type": "Replace", "pattern": {"String": META}, "content": " "},
                      {"type": "ByteFallback"}, {"type": "Fuse"},
                      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                  model=sentencepiece_model(fuse_unk=True, byte_fallback=True))
    write(d, "llama2_sentencepiece.json", json.dumps(llama2, ensure_ascii=False))
    # Mistral v0.3: Metaspace (first, no split) and its decoder, ignore_merges, <s> ... </s>.
    mistral = dict(base, normalizer=None, pre_tokenizer=metaspace("Metaspace", "first", False),
                   post_processor=template(True),
                   decoder={"type": "Sequence", "decoders": [
                       {"type": "ByteFallback"}, metaspace("Metaspace", "first", False)]},
                   model=sentencepiece_model(byte_fallback=True, ignore_merges=True))
    write(d, "mistral_metaspace_first.json", json.dumps(mistral, ensure_ascii=False))
    # Strip, Lowercase and a Replace regex before Metaspace (always, split); every decoder in one
    # Sequence, ByteLevel included.
    strip = dict(base, normalizer={"type": "Sequence", "normalizers": [
                     {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "Lowercase"},
                     {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "12"}]},
                 pre_tokenizer=metaspace("Metaspace", "always", True), post_processor=template(True),
                 decoder={"type": "Sequence", "decoders": [
                     {"type": "ByteFallback"}, metaspace("Metaspace", "always", True), {"type": "Fuse"},
                     {"type": "Strip", "content": " ", "start": 0, "stop": 1}, {"type": "ByteLevel"}]},
                 model=sentencepiece_model(byte_fallback=True))
    write(d, "metaspace_always_split_normalizers.json", json.dumps(strip, ensure_ascii=False))
    # Metaspace "first" after normalizers that move the input's start (NFKD, Prepend) and a Split
    # on Oniguruma classes regex.cpp rewrites (POSIX brackets, \W in a class, &&, nesting).
    first = dict(base, normalizer={"type": "Sequence", "normalizers": [
                     {"type": "NFKD"}, {"type": "Prepend", "prepend": "x "}, {"type": "NFC"}]},
                 pre_tokenizer={"type": "Sequence", "pretokenizers": [
                     {"type": "Split", "pattern": {"Regex": r"[[:punct:]\W&&[^\s[a-c]]]+"},
                      "behavior": "Isolated", "invert": False},
                     metaspace("Metaspace", "first", True)]},
                 post_processor=template(True), decoder=metaspace("Metaspace", "first", True),
                 model=sentencepiece_model(byte_fallback=True))
    write(d, "metaspace_first_after_normalizers.json", json.dumps(first, ensure_ascii=False))
    # Gemma: a Replace normalizer only, Metaspace never; older files' add_prefix_space spelling.
    gemma = dict(base, normalizer={"type": "Replace", "pattern": {"String": " "}, "content": META},
                 pre_tokenizer=metaspace("Metaspace", "never", False), post_processor=template(False),
                 decoder={"type": "Sequence", "decoders": [
                     {"type": "Replace", "pattern": {"String": META}, "content": " "},
                     {"type": "ByteFallback"}, {"type": "Fuse"}]},
                 model=sentencepiece_model(byte_fallback=True))
    write(d, "gemma_replace_metaspace_never.json", json.dumps(gemma, ensure_ascii=False))
    # The near-valid ones, and the older spelling, with a few byte tokens only (smaller seeds).
    llama2["model"] = mistral["model"] = sentencepiece_model(byte_tokens=(0x00, 0x41, 0xC3, 0xE6, 0xFF),
                                                             byte_fallback=True)
    legacy = dict(mistral, pre_tokenizer=metaspace("Metaspace", add_prefix_space=True),
                  decoder=metaspace("Metaspace", add_prefix_space=False))
    write(d, "metaspace_add_prefix_space_legacy.json", json.dumps(legacy, ensure_ascii=False))
    # Near-valid.
    write(d, "bad_metaspace_scheme.json", json.dumps(
        dict(mistral, pre_tokenizer=metaspace("Metaspace", "sometimes", False)), ensure_ascii=False))
    write(d, "bad_strip_decoder_content.json", json.dumps(dict(llama2, decoder={
        "type": "Strip", "content": "ab", "start": 1, "stop": 0}), ensure_ascii=False))
    write(d, "bad_prepend_missing.json", json.dumps(dict(llama2, normalizer={"type": "Prepend"}),
                                                    ensure_ascii=False))
    write(d, "bad_replace_pattern.json", json.dumps(dict(llama2, normalizer={
        "type": "Replace", "pattern": {"Glob": " "}, "content": META}), ensure_ascii=False))


def encode_seeds():
    d = reset("fuzz_tokenizer_encode")
    corpus = os.path.join(HERE, "..", "tests", "python", "data", "tokenizer_corpus.txt")
    lines = []
    if os.path.exists(corpus):
        with open(corpus, "rb") as f:
            lines = f.read().split(b"\n")
    for i in range(0, len(lines), 8):  # the tokenizer parity corpus, 8 lines a seed
        write(d, f"corpus_{i // 8:02d}.txt", b"\n".join(lines[i:i + 8]))
    samples = {
        "hello.txt": "hello world",
        "specials.txt": "<|endoftext|>Hello<|endoftext|> <|begin_of_text|>x<|end_of_text|>",
        "contractions.txt": "I'm here, you're there; they'll've it's DON'T",
        "digits.txt": "1234567890 12 123 3.14159 -42 1e10",
        "whitespace.txt": "  a\t\tb\n\n\r\n   c   \u00a0\u2003d\u3000",
        "unicode.txt": "café 日本語 한국어 😀 👨‍👩‍👧 e\u0301 Å ﬁ",
        "long_word.txt": "a" * 200 + " " + "ab" * 60 + " " + "ba" * 70,
        "merges.txt": "aaaa aaaaa aabaab bbbbab hello hellohello the he ll",
        # SentencePiece-style tokenizers: leading / repeated spaces, a literal U+2581, added
        # tokens inside text, upper case and digits (Lowercase, Replace), rare scripts (byte
        # fallback), whitespace that Strip removes.
        "sentencepiece.txt": " hello  world\u2581x<s>in</s>side<unk> a",
        "leading_spaces.txt": "   three spaces first, two  inside,  ",
        "upper_digits.txt": "HELLO World 1234567 Éé Straße İ",
        "byte_fallback.txt": "ж ꯍ 𝔸 ᚠ ☃ \u0301 日本",
        "strip_whitespace.txt": "\u3000\t padded \u00a0\n\u2028",
    }
    for name, text in samples.items():
        write(d, name, text)
    write(d, "invalid_utf8.bin", b"ok \xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end")
    write(d, "nul_bytes.bin", b"a\x00b\x00\x00c")
    write(d, "all_bytes.bin", bytes(range(256)))


# ---- device maps ------------------------------------------------------------------------------

GPT2_MODULES = ["transformer.wte", "transformer.wpe"] + [f"transformer.h.{i}" for i in range(4)] + \
    ["transformer.ln_f", "lm_head"]
LLAMA_MODULES = ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(4)] + \
    ["model.norm", "lm_head"]


def device_map_seeds():
    d = reset("fuzz_device_map")

    def seed(name, first, doc):
        write(d, name, first + "\n" + (doc if isinstance(doc, str) else json.dumps(doc)))

    seed("all_on_cpu0.txt", "4", {"": "cpu:0"})
    seed("gpt2_4dev.txt", "cpu:0,cpu:1,cpu:2,cpu:3",
         {m: f"cpu:{min(i // 2, 3)}" for i, m in enumerate(GPT2_MODULES)})
    seed("llama_2dev.txt", "2", {"model": "cpu:0", "model.layers.2": "cpu:1",
                                 "model.layers.3": "cpu:1", "model.norm": "cpu:1",
                                 "lm_head": "cpu:1"})
    seed("budgets.txt", "cpu:0=400KiB,cpu:1=1MiB,cpu:2=1.5MB,cpu:3=2000000",
         {"transformer": "cpu:1", "lm_head": "cpu:2"})
    seed("cuda_ints.txt", "cuda:0,cuda:1", {"transformer": 0, "lm_head": 1, "model": "cuda:1"})
    seed("plain_cpu.txt", "cpu", {"": "cpu"})
    seed("bad_split_block.txt", "4", {"transformer.h.0.attn": "cpu:1", "": "cpu:0"})
    seed("bad_unknown.txt", "4", {"transformer.h.9": "cpu:0", "": "cpu:0"})
    seed("bad_left_out.txt", "4", {"transformer.h.0": "cpu:0"})
    seed("bad_disk.txt", "4", {"": "disk"})
    seed("bad_not_object.txt", "4", "[\"cpu:0\"]")
    seed("bad_devices.txt", "cpu,cpu:0", {"": "cpu:5"})


def small_parser_seeds():
    d = reset("fuzz_small_parsers")
    seeds = {
        "devices.txt": ["cpu", "cpu:0", "cuda:3", " cpu:63 ", "7", "cpu:0,cpu:1,cuda:0", "64",
                        "cpu:64", "cuda:-1", "disk", "cpu:0,,cpu:1", "cpu,cpu:1"],
        "bytes.txt": ["300MiB", "1.5GiB", "2GB", "4096", "512KiB", "1TiB", "0.5 kb", "1.5B",
                      "18446744073709551615", "18446744073709551616", "16EiB", "-1MiB", "1."],
        "max_memory.txt": ["cpu:0=300MiB,cpu:1=1GiB", "cuda:0=1GB", "cpu:0=1,cpu:0=2", "cpu:0",
                           "cpu=10 MB"],
        "patterns.txt": ["transformer.h.*", "**:input", "transformer.h.*.mlp", "**.mlp.*",
                         "model.layers.*.self_attn.q_proj", "*.*", "transformer.h.1*", "**",
                         "lm_head", "model.layers.0:input", "transformr.h.0.mlp"],
        "positions.txt": ["all", "first", "last", "0:8,-4:,10", "-1", "5", "3:1", ":", "::2",
                          "9223372036854775806", "-9223372036854775808:", "1,,2"],
        "faults.txt": ["transfer:cpu:0->cpu:1:bitflip", "transfer:cpu:1->cpu:2:zeros-once;"
                       "transfer:cuda:0->cuda:1:bitflip-once", "transfer:cpu:0->cpu:1:melt",
                       "transfer:cpu:0-cpu:1:zeros"],
        "tokens.txt": ["1,2,3;4,5", " 7 , 8 ", "1;;2", "x", "-5", "9223372036854775806",
                       "1,2,"],
        "keywords.txt": ["error", "warn", "off", "keep", "f32", "f16", "bf16", "auto",
                         "balanced", "sequential"],
    }
    for name, lines in seeds.items():
        write(d, name, "\n".join(lines))


def output_folder_seeds():
    d = reset("fuzz_output_folder")
    entry = {"file": "shard-00000.safetensors", "rows": 3, "bytes": 4096, "first_line": 0,
             "last_line": 1, "documents": 2, "checksums": {"model.layers.0": "0123456789abcdef"}}
    head = {"format": "actcap/2", "complete": False, "model": {"fingerprint": "f" * 16},
            "points": {}, "rows": 0, "shards": []}

    def seed(name, manifest, journal=None):
        body = manifest if isinstance(manifest, str) else json.dumps(manifest)
        write(d, name, body + ("" if journal is None else "\0" + journal))

    line = json.dumps({"shard": entry, "xxh3": "0" * 16}) + "\n"
    seed("journal_one.txt", head, line)  # '{' is odd: the target fixes the checksums up
    seed("journal_torn.txt", head, line + line[:40])
    seed("journal_dup.txt", dict(head, shards=[entry]), line + line)
    seed("journal_hostile_name.txt", head, line.replace("shard-00000.safetensors", "../x"))
    seed("journal_unchecked.txt", " " + json.dumps(head), line)  # ' ' is even: checksums as given
    seed("complete_one_shard.txt", dict(head, complete=True, shards=[entry]))
    seed("shards_not_a_list.txt", dict(head, shards={"a": 1}), line)
    seed("not_an_object.txt", "[1, 2]", "")


def corpus_seeds():
    d = reset("fuzz_corpus")
    # First byte: flags (bit 0 skip bad lines, bit 1 .txt, bit 2 tokenizer, bits 3-4 vocab 1 /
    # 200 / 50257 / 2^31-1); then the corpus file.
    ids = '{"input_ids": [1, 2, 3]}\n{"input_ids": [199]}\n'
    mixed = ('{"text": "hello world"}\n\n   \n{"input_ids": []}\n{"input_ids": [-1]}\n'
             '{"input_ids": [1.5]}\n{"input_ids": 7}\n{"text": 5}\n[1, 2]\nnot json\n'
             '{"input_ids": [18446744073709551615]}\n{"input_ids": [2147483646]}\n')
    write(d, "jsonl_ids.bin", bytes([0b01000]) + ids.encode())
    write(d, "jsonl_mixed_skip.bin", bytes([0b11101]) + mixed.encode())
    write(d, "jsonl_mixed_strict.bin", bytes([0b10100]) + mixed.encode())
    write(d, "jsonl_text_no_tokenizer.bin", bytes([0b10001]) + b'{"text": "abc"}\n')
    write(d, "txt_lines.bin", bytes([0b10011]) + "one document\r\n\nsecond \xff line\n\u00e9\u4e2d".encode("utf-8", "surrogateescape"))
    write(d, "txt_small_vocab.bin", bytes([0b01011]) + b"\x00\x01 bytes above 200: \xfe\n")


def main():
    corpus_seeds()
    output_folder_seeds()
    safetensors_seeds()
    config_seeds()
    tokenizer_seeds()
    encode_seeds()
    device_map_seeds()
    small_parser_seeds()
    total = 0
    for root, _, files in os.walk(CORPUS):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"wrote seeds under {CORPUS} ({total} bytes)")


if __name__ == "__main__":
    main()
