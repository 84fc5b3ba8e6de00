"""The Python package on transformers' own models, on the CPU (the hf_modules.py stand-ins of
test_package_*.py are shaped like them; these are them). Skipped where transformers >= 5 is not
importable (as test_transformers_parity.py, whose models it builds); `make torch2-check` runs it
in a sid root with transformers 5.12 and accelerate 1.14.

* SafeCapturer on eight architectures' transformers models, a right-padded batch with its mask:
  every layer's output, attention output and MLP input equal, bit for bit, what a clone inside a
  hook of the same forward saw on the real tokens, rows in (sequence, position) order; the logits
  are bit-identical to a forward without capture (H5);
* SafeCapturer on Mixtral and Qwen3-MoE: the router's logits and the experts' output, which
  transformers computes on the batch flattened to [batch * seq, ...], give the real tokens' rows;
* the audit over transformers' own output recording (output_hidden_states / output_attentions,
  forward hooks transformers leaves on the modules): nothing reported, the recorder listed in
  `skipped`, reported with trust_transformers=False; the seed's hook on the same model is caught;
* accelerate offloading blocks to disk (meta weights streamed in by its hooks): captures equal the
  plain model's, `save()` writes what `actcap verify` checks;
* the engine (`actcap.load`) on a checkpoint transformers wrote: every layer equals transformers'
  hidden_states, over two virtual devices."""
import pytest

import actcap_helpers as H
import test_transformers_parity as TP  # skips this module where transformers >= 5 is missing

torch = TP.torch
transformers = TP.transformers

def layout(model_type):
    """(decoder layers, attention module, MLP module) of a transformers model."""
    return {"gpt2": ("transformer.h", "attn", "mlp"),
            "gpt_neox": ("gpt_neox.layers", "attention", "mlp")}.get(
        model_type, ("model.layers", "self_attn", "mlp"))


def model_of(variant, tmp_path):
    model_type, fields = TP.VARIANTS[variant]
    m = TP.build_hf_model(model_type, fields, tmp_path / "model")
    model, _ = TP.hf_load(m)
    return model, m, layout(model_type)


def batch():
    return H.padded(TP.tokens(512))


@pytest.mark.parametrize("variant", ["gpt2", "llama-bias-headdim", "qwen3", "olmo2",
                                     "gemma2-softcaps", "gemma3_text", "gpt_neox-partial-rotary",
                                     "phi3-window"])
def test_safe_capture_of_transformers_models_equals_clones_in_the_same_forward(ac, tmp_path,
                                                                                variant):
    model, _, (layers, attn, mlp) = model_of(variant, tmp_path)
    ids, mask = batch()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
    mods = dict(model.named_modules())
    n = len(mods[layers])
    points = [f"{layers}.{i}{suffix}" for i in range(n) for suffix in ("", f".{attn}")]
    inputs = [f"{layers}.{i}.{mlp}" for i in range(n)]
    clones = {}

    def keep(name, value):
        value = value[0] if isinstance(value, tuple) else value
        clones[name] = value.detach().clone()

    handles = [mods[p].register_forward_hook(lambda m, a, o, p=p: keep(p, o)) for p in points]
    handles += [mods[p].register_forward_pre_hook(lambda m, a, p=p: keep(p + ":input", a[0]))
                for p in inputs]
    try:
        with torch.no_grad(), ac.SafeCapturer(
                model, [f"{layers}.*", f"{layers}.*.{attn}", f"{layers}.*.{mlp}:input"]) as cap:
            out = cap(input_ids=ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(out.logits, plain), "capturing changed the logits"
    real = mask.bool()
    want_seq = torch.cat([torch.full((L,), i) for i, L in enumerate(TP.LENGTHS)])
    want_pos = torch.cat([torch.arange(L) for L in TP.LENGTHS])
    assert sorted(clones) == sorted(points + [p + ":input" for p in inputs])
    for name, clone in clones.items():
        got = cap.get(name)
        assert torch.equal(got, clone[real]), f"{variant}: {name} differs from the hook's clone"
        seq, pos = cap.rows(name)
        assert torch.equal(seq, want_seq) and torch.equal(pos, want_pos), name
    cap.verify()


@pytest.mark.parametrize("variant", ["mixtral-window-top3", "qwen3_moe", "qwen2_moe", "deepseek_v3"])
def test_safe_capture_of_a_transformers_mixture_of_experts(ac, tmp_path, variant):
    """The router (`mlp.gate`: a tuple whose logits are [batch * seq, experts]; DeepSeek-V3's a
    float32 tensor), the experts (`mlp.experts`: [batch * seq, hidden]), Qwen2-MoE's shared expert,
    a layer inside it and its gate (flattened like the router), DeepSeek-V3's shared experts and a
    layer inside them ([batch, seq, hidden]: not flattened), and the block (`mlp`) of every sparse
    layer: rows of the real tokens equal clones taken in the same forward, bit for bit."""
    model, _, _ = model_of(variant, tmp_path)
    ids, mask = batch()
    mods = dict(model.named_modules())
    points = sorted(n for n in mods if n.endswith((".mlp.gate", ".mlp.experts", ".mlp.shared_expert",
                                                   ".mlp.shared_expert.up_proj",
                                                   ".mlp.shared_expert_gate", ".mlp.shared_experts",
                                                   ".mlp.shared_experts.up_proj"))
                    or n.endswith(".mlp") and n + ".gate" in mods)
    assert len(points) >= 6, points
    clones = {}

    def keep(name, value):
        value = value[0] if isinstance(value, tuple) else value
        clones[name] = value.detach().clone()

    handles = [mods[p].register_forward_hook(lambda m, a, o, p=p: keep(p, o)) for p in points]
    try:
        with torch.no_grad(), ac.SafeCapturer(model, points) as cap:
            cap(input_ids=ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    real = mask.bool()
    for name, clone in clones.items():
        want = clone[real] if clone.dim() == 3 else clone[real.reshape(-1)]
        assert torch.equal(cap.get(name), want), f"{variant}: {name} differs from the hook's clone"
    cap.verify()


def test_a_module_that_never_runs_says_so(ac, tmp_path):
    """transformers' DeepSeek-V2 uses its router's weight without calling `mlp.gate`: capturing it
    gives nothing, and get() says why in one RunError (the block beside it is captured)."""
    model, _, _ = model_of("deepseek_v2", tmp_path)
    ids, mask = batch()
    with torch.no_grad(), ac.SafeCapturer(model, ["model.layers.1.mlp", "model.layers.1.mlp.gate"]) as cap:
        cap(input_ids=ids, attention_mask=mask)
    assert cap.get("model.layers.1.mlp").shape[0] == int(mask.sum())
    assert cap.calls("model.layers.1.mlp.gate") == 0
    with pytest.raises(ac.RunError, match="did not run"):
        cap.get("model.layers.1.mlp.gate")


def recorder_hooks(model):
    return [(name, fn) for name, m in model.named_modules() for fn in m._forward_hooks.values()
            if fn.__module__.startswith("transformers.") and "output_capturing" in fn.__name__]


def test_audit_over_transformers_output_recording_and_the_seeds_hook(ac, tmp_path):
    model, _, _ = model_of("llama", tmp_path)
    ids, mask = batch()
    ask = dict(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        first = model(**ask)  # transformers 5 installs its recorder here (and keeps it)
    recorders = recorder_hooks(model)
    assert recorders, "transformers 5 installed no output recorder: what does this test test?"
    with torch.no_grad(), ac.audit(model, mode="error") as a:
        again = model(**ask)
    assert a.findings == []
    assert len(a.skipped) == len(recorders)
    for x, y in zip(first.hidden_states + first.attentions, again.hidden_states + again.attentions):
        assert torch.equal(x, y)
    # transformers' recorder keeps what it returns: reported when audited
    with torch.no_grad(), ac.audit(model, mode="error", trust_transformers=False):
        with pytest.raises(ac.RunError, match="output_capturing_hook on module"):
            model(**ask)
    # the seed's hook on a transformers model: caught, named
    outputs = {}
    h = model.model.layers[1].register_forward_hook(lambda m, i, o: outputs.__setitem__("l1", o))
    with torch.no_grad(), ac.audit(model, mode="error"):
        with pytest.raises(ac.RunError, match="on module 'model.layers.1' kept a reference"):
            model(input_ids=ids, attention_mask=mask)
    h.remove()


def test_accelerate_disk_offload_capture_and_save(ac, actcap_bin, tmp_path):
    accelerate = pytest.importorskip("accelerate")
    model, m, _ = model_of("llama", tmp_path)
    offloaded, _ = TP.hf_load(m)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.layers.2": "disk", "model.norm": "cpu",
                  "lm_head": "cpu"}
    offloaded = accelerate.dispatch_model(offloaded, device_map=device_map, main_device="cpu",
                                          offload_dir=str(tmp_path / "offload"))
    assert offloaded.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    ids, mask = batch()
    caps = []
    for mdl in (model, offloaded):
        with torch.no_grad(), ac.SafeCapturer(mdl, ["model.layers.*", "model.norm"]) as cap:
            cap(input_ids=ids, attention_mask=mask)
        caps.append(cap)
    for name in [f"model.layers.{i}" for i in range(3)] + ["model.norm"]:
        assert torch.equal(caps[0].get(name), caps[1].get(name)), name
    out = tmp_path / "acts"
    caps[1].save(str(out))
    H.actcap("verify", out, check=True)
    read = ac.open(str(out))
    assert torch.equal(read["model.layers.2"], caps[0].get("model.layers.2"))


@pytest.mark.parametrize("variant", ["llama-rope-llama3", "gemma3_text", "gpt_neox-partial-rotary"])
def test_engine_on_a_transformers_checkpoint_equals_its_hidden_states(ac, tmp_path, variant):
    model, m, (layers, _, _) = model_of(variant, tmp_path)
    seqs = TP.tokens(512, seed=5)
    engine = ac.load(str(m), devices=2)
    acts = engine.run(seqs, capture=f"{layers}.*")
    ids, mask = H.padded(seqs)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    n = len(hidden) - 1
    real = mask.bool()
    # hidden_states[i + 1] is layer i's output, except the last, which has the final norm applied
    for i in range(n - 1):
        got, want = acts[f"{layers}.{i}"], hidden[i + 1][real]
        scale = max(1.0, float(want.abs().max()))
        assert float((got - want).abs().max()) <= TP.REL * scale, f"{variant}: layer {i}"


@pytest.mark.parametrize("variant", ["llama", "gemma3_text", "gpt2"])
def test_safe_capture_around_transformers_generate(ac, tmp_path, variant):
    """SafeCapturer around transformers' generate (left padding, KV cache): the prompt's forward
    gives every real token's rows, each decoding step one row per sequence at its position in the
    sequence, all equal to clones in the same forwards; positions='last' keeps the last prompt
    token and every generated one."""
    model, _, (layers, _, _) = model_of(variant, tmp_path)
    prompts = TP.tokens(512, [6, 3], seed=4)
    ids, mask = H.padded(prompts, side="left")  # as for generation
    point = f"{layers}.1"
    clones = []
    block = dict(model.named_modules())[point]
    h = block.register_forward_hook(lambda m, a, o: clones.append(
        (o[0] if isinstance(o, tuple) else o).detach().clone()))
    gen = transformers.GenerationConfig(max_new_tokens=4, min_new_tokens=4, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
    try:
        with torch.no_grad(), ac.SafeCapturer(model, [point]) as cap:
            out = model.generate(ids, attention_mask=mask, generation_config=gen)
        with torch.no_grad(), ac.SafeCapturer(model, [point], positions="last") as last:
            model.generate(ids, attention_mask=mask, generation_config=gen)
    finally:
        h.remove()
    steps = cap.calls(point)
    assert steps == 4 and len(clones) == 8, (steps, len(clones))
    seq, pos = cap.rows(point, 0)
    assert seq.tolist() == [0] * 6 + [1] * 3 and pos.tolist() == list(range(6)) + list(range(3))
    assert torch.equal(cap.get(point, call=0), clones[0][mask.bool()])
    for k in range(1, steps):
        seq, pos = cap.rows(point, k)
        assert seq.tolist() == [0, 1] and pos.tolist() == [5 + k, 2 + k], (k, pos)
        assert torch.equal(cap.get(point, call=k), clones[k][:, -1]), k
    assert [last.get(point, call=k).shape[0] for k in range(steps)] == [2] * steps
    for k in range(steps):
        assert torch.equal(last.get(point, call=k), clones[steps + k][:, -1]), k
    assert out.shape == (2, 10)
