"""actcap.SafeCapturer and actcap.audit on HF-shaped torch modules (hf_modules.py): each hazard
that bites on CPU shows naive hook capture wrong and SafeCapturer exact; the seed's four cases;
padding, selection, errors, save + verify."""
import warnings

import pytest
import torch

import actcap_helpers as H
import reference as R
from hf_modules import GPT2LMHeadModel

BLOCKS = [f"transformer.h.{i}" for i in range(4)]


def ids_batch(B=2, T=12, seed=0, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


def true_block_outputs(ids, seed=0, mask=None):
    """Every block's output, from a model without hazards, cloned inside the hook."""
    model = GPT2LMHeadModel.random(seed=seed)
    out = {}
    hs = [b.register_forward_hook(lambda m, a, o, n=n: out.__setitem__(n, o[0].clone()))
          for n, b in zip(BLOCKS, model.transformer.h)]
    with torch.inference_mode():
        model(ids, attention_mask=mask)
    for h in hs:
        h.remove()
    return out


def naive_capture(model, how):
    """The seed's hook in its common spellings: the output itself, .detach(), .to(same device)."""
    kept = {}
    keep = {"bare": lambda t: t, "detach": lambda t: t.detach(), "to": lambda t: t.to("cpu"),
            "clone": lambda t: t.detach().clone()}[how]
    hs = [b.register_forward_hook(lambda m, a, o, n=n: kept.__setitem__(n, keep(o[0])))
          for n, b in zip(BLOCKS, model.transformer.h)]
    return kept, hs


# ---- hazards: naive wrong, SafeCapturer exact -------------------------------------------------
@pytest.mark.parametrize("how", ["bare", "detach", "to"])
def test_a_later_block_writing_its_input_in_place_corrupts_naive_capture_not_safe(ac, how):
    ids = ids_batch()
    truth = true_block_outputs(ids)
    model = GPT2LMHeadModel.random(inplace_residual=True)
    kept, hs = naive_capture(model, how)
    with torch.inference_mode(), ac.SafeCapturer(model, "transformer.h.*") as cap:
        model(ids)
    for h in hs:
        h.remove()
    wrong = [n for n in BLOCKS if not torch.equal(kept[n], truth[n])]
    # every block but the last is written by the next one
    assert wrong == BLOCKS[:-1], f"naive '{how}' capture unexpectedly right for {set(BLOCKS) - set(wrong)}"
    for n in BLOCKS:
        assert torch.equal(cap.get(n), truth[n]), n
    cap.verify()


def test_clone_inside_the_hook_is_the_control(ac):
    ids = ids_batch()
    truth = true_block_outputs(ids)
    model = GPT2LMHeadModel.random(inplace_residual=True)
    kept, hs = naive_capture(model, "clone")
    with torch.inference_mode():
        model(ids)
    assert all(torch.equal(kept[n], truth[n]) for n in BLOCKS)


def test_an_output_buffer_reused_across_steps_corrupts_naive_capture_not_safe(ac):
    model = GPT2LMHeadModel.random(static_output=True)
    plain = GPT2LMHeadModel.random()
    a, b = ids_batch(seed=1), ids_batch(seed=2)
    with torch.inference_mode():
        truth = [plain(x).last_hidden_state for x in (a, b)]
    naive = []
    h = model.transformer.ln_f.register_forward_hook(lambda m, i, o: naive.append(o))
    with torch.inference_mode(), ac.SafeCapturer(model, "transformer.ln_f") as cap:
        model(a)
        model(b)
    h.remove()
    assert torch.equal(naive[0], truth[1]) and not torch.equal(naive[0], truth[0])
    assert cap.calls("transformer.ln_f") == 2
    assert torch.equal(cap.get("transformer.ln_f", call=0), truth[0])
    assert torch.equal(cap.get("transformer.ln_f", call=1), truth[1])
    assert torch.equal(cap.get("transformer.ln_f"), torch.cat(truth))


# ---- the seed's four cases, in spirit -----------------------------------------------------------
def test_seed_copy_isolation(ac):
    """The captured copy does not follow later writes to the tensor the hook was given."""
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    seq = torch.nn.Sequential(layer)
    with torch.no_grad(), ac.SafeCapturer(seq, "0") as cap:
        y = seq(x)
    expected = y.clone()
    y.mul_(-999)  # the producer's buffer is reused
    assert torch.equal(cap.get("0"), expected)


class ArenaDispatch:
    """A 3-device split simulated on CPU the way an engine with per-device arenas (or a
    device_map with buffer reuse) runs it: each block's output is written into one of its
    device's two ping-pong slots, and a block whose input comes from another device first gets it
    copied into that device's transfer-in slot. Slots are reused by later blocks."""

    def __init__(self, model, devices=3, slots=2):
        blocks = list(model.transformer.h)
        per = -(-len(blocks) // devices)
        self.device_of = [i // per for i in range(len(blocks))]
        self.slots = {}
        self.used = {d: 0 for d in range(devices)}
        self.handles = []
        for i, blk in enumerate(blocks):
            self.handles.append(blk.register_forward_pre_hook(self._pre(i)))
            self.handles.append(blk.register_forward_hook(self._post(i, slots)))

    def _slot(self, key, like):
        t = self.slots.get(key)
        if t is None or t.shape != like.shape:
            t = self.slots[key] = torch.empty_like(like)
        return t

    def _pre(self, i):
        def pre(module, args):
            if i == 0 or self.device_of[i] != self.device_of[i - 1]:
                x = args[0]
                return (self._slot((self.device_of[i], "in"), x).copy_(x),) + tuple(args[1:])
        return pre

    def _post(self, i, slots):
        def post(module, args, output):
            d = self.device_of[i]
            k = self.used[d] % slots
            self.used[d] += 1
            return (self._slot((d, k), output[0]).copy_(output[0]),)
        return post

    def remove(self):
        for h in self.handles:
            h.remove()


def test_seed_no_corruption_with_modules_spread_over_three_devices(ac):
    """9 blocks over 3 (simulated) devices, each device ping-ponging two output slots: block i's
    slot is rewritten by block i + 2. Naive hooks read the later block; SafeCapturer is exact."""
    ids = ids_batch(T=10)
    truth = {}
    plain = GPT2LMHeadModel.random(n_layer=9)  # same seed: the same weights, no slots
    hs = [b.register_forward_hook(lambda m, a, o, i=i: truth.__setitem__(i, o[0].clone()))
          for i, b in enumerate(plain.transformer.h)]
    with torch.inference_mode():
        expected_final = plain(ids).last_hidden_state
    for h in hs:
        h.remove()
    model = GPT2LMHeadModel.random(n_layer=9)
    dispatch = ArenaDispatch(model, devices=3, slots=2)
    naive = {}
    nh = [b.register_forward_hook(lambda m, a, o, i=i: naive.__setitem__(i, o[0]))
          for i, b in enumerate(model.transformer.h)]
    with torch.inference_mode(), ac.SafeCapturer(model, "transformer.h.*") as cap:
        out = model(ids).last_hidden_state
    dispatch.remove()
    for h in nh:
        h.remove()
    assert torch.equal(out, expected_final)  # the dispatch itself computes correctly
    wrong = [i for i in range(9) if not torch.equal(naive[i], truth[i])]
    assert wrong == [0, 3, 6], wrong  # the first block of each device: its slot was reused
    for i in range(9):
        assert torch.equal(cap.get(f"transformer.h.{i}"), truth[i]), i


def test_seed_captured_equals_the_layers_true_output(ac, gpt2_ckpt):
    """On a real checkpoint: SafeCapturer over the HF-shaped module equals the independent
    reference (written from HF's modeling code) and actcap's own engine."""
    model = GPT2LMHeadModel.from_checkpoint(gpt2_ckpt)
    seqs = [[5, 17, 300, 42, 7, 99, 1], [8, 9, 10, 11, 12, 13, 14]]
    ids = torch.tensor(seqs)
    points = ["transformer.h.*", "transformer.h.1.attn", "transformer.ln_f", "transformer.h.2:input"]
    with torch.inference_mode(), ac.SafeCapturer(model, points) as cap:
        model(ids)
    ref = R.Model(gpt2_ckpt)
    for b, seq in enumerate(seqs):
        pts = ref.forward(seq)
        for name in cap.points:
            got = cap.get(name)[b]
            assert torch.allclose(got, torch.as_tensor(pts[name]), atol=H.TOL, rtol=0), name
    engine = ac.load(gpt2_ckpt, devices=3)
    out = engine.run(seqs, points)
    for name in cap.points:
        flat = cap.get(name).flatten(0, 1)
        assert torch.allclose(flat, out[name], atol=H.TOL, rtol=0), name


def test_seed_verify_catches_a_snapshot_changed_behind_its_back(ac):
    model = GPT2LMHeadModel.random()
    with torch.inference_mode(), ac.SafeCapturer(model, "transformer.h.1") as cap:
        model(ids_batch())
    t = cap.get("transformer.h.1")  # the snapshot itself, no copy
    cap.verify()
    t.view(-1)[5] += 1.0
    with pytest.raises(ac.RunError, match=r"transformer.h.1.*changed after capture"):
        cap.verify()
    with pytest.raises(ac.RunError, match="changed after capture"):
        cap.get("transformer.h.1")


# ---- rows: padding and positions ------------------------------------------------------------------
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_never_captured_and_rows_match_unpadded_runs(ac, side):
    model = GPT2LMHeadModel.random()
    seqs = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24]]
    ids, mask = H.padded(seqs, side=side)
    with ac.SafeCapturer(model, ["transformer.h.3", "transformer.h.0.mlp"]) as cap:
        cap(ids, attention_mask=mask)
    seq_idx, pos = cap.rows()
    assert seq_idx.tolist() == [b for b, s in enumerate(seqs) for _ in s]
    assert pos.tolist() == [p for s in seqs for p in range(len(s))]
    rows = cap.get("transformer.h.3")
    assert rows.shape == (sum(map(len, seqs)), 32)
    start = 0
    for s in seqs:
        alone = true_block_outputs(torch.tensor([s]))["transformer.h.3"][0]
        assert torch.allclose(rows[start:start + len(s)], alone, atol=1e-5, rtol=0)
        start += len(s)


def test_positions_count_real_tokens(ac):
    model = GPT2LMHeadModel.random()
    ids = ids_batch(B=2, T=6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with ac.SafeCapturer(model, "transformer.h.2", positions="last") as cap:
        cap(ids, attention_mask=mask)
    assert cap.rows()[1].tolist() == [3, 5]
    full = ac.SafeCapturer(model, "transformer.h.2")
    full(ids, attention_mask=mask)
    whole = full.get("transformer.h.2")
    assert torch.equal(cap.get("transformer.h.2"), whole[[3, 9]])
    with ac.SafeCapturer(model, "transformer.h.2", positions="0:2") as first:
        model(ids)  # no mask: every position is real
    assert first.rows()[1].tolist() == [0, 1, 0, 1]


def test_the_mask_can_be_set_when_the_user_calls_the_model(ac):
    model = GPT2LMHeadModel.random()
    ids = ids_batch(B=2, T=5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    cap = ac.SafeCapturer(model, "transformer.h.0")
    cap.attention_mask = mask
    with cap, torch.inference_mode():
        model(ids, attention_mask=mask)
    assert cap.get("transformer.h.0").shape == (8, 32)


# ---- what a hook point stands for --------------------------------------------------------------
def test_tuple_and_model_outputs_and_select(ac):
    model = GPT2LMHeadModel.random()
    ids = ids_batch()
    with torch.inference_mode():
        ref_hidden = model(ids).last_hidden_state
    with ac.SafeCapturer(model, ["transformer.h.0.attn", "transformer"]) as cap:
        cap(ids)
    assert cap.get("transformer.h.0.attn").shape == (2, 12, 32)  # element 0 of (out, weights)
    assert torch.equal(cap.get("transformer"), ref_hidden)  # last_hidden_state
    with ac.SafeCapturer(model, "transformer.h.1", select=lambda o: o[0] * 2) as doubled:
        doubled(ids)
    with ac.SafeCapturer(model, "transformer.h.1") as plain:
        plain(ids)
    assert torch.equal(doubled.get("transformer.h.1"), plain.get("transformer.h.1") * 2)
    with ac.SafeCapturer(model, "transformer.h.0.attn", select=1) as bad:
        with pytest.raises(ac.InputError, match="not a tensor.*select="):
            bad(ids)


def test_input_points_and_patterns(ac):
    model = GPT2LMHeadModel.random()
    ids = ids_batch()
    with ac.SafeCapturer(model, ["transformer.h.*:input", "transformer.h.0"]) as cap:
        cap(ids)
    assert cap.points[:3] == ["transformer.h.0", "transformer.h.0:input", "transformer.h.1:input"]
    assert torch.equal(cap.get("transformer.h.1:input"), cap.get("transformer.h.0"))
    deep = ac.SafeCapturer(model, "**.c_proj")
    assert deep.points == [f"transformer.h.{i}.{m}.c_proj" for i in range(4) for m in ("attn", "mlp")]


def test_hooks_are_removed_on_exit_also_when_the_forward_raises(ac):
    model = GPT2LMHeadModel.random()
    before = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    with pytest.raises(RuntimeError):
        with ac.SafeCapturer(model, "transformer.h.*"):
            model(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(2, 2))  # bad mask: raises
    after = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    assert before == after


# ---- bad arguments: clear typed errors ----------------------------------------------------------
def test_bad_arguments_raise_typed_errors(ac):
    model = GPT2LMHeadModel.random()
    with pytest.raises(ac.InputError, match=r"matches no module.*nearest: transformer.h.0"):
        ac.SafeCapturer(model, "transformer.h.0.attnn")
    with pytest.raises(ac.InputError, match="dtype"):
        ac.SafeCapturer(model, "transformer.h.0", dtype=torch.int32)
    with pytest.raises(ac.InputError, match="positions"):
        ac.SafeCapturer(model, "transformer.h.0", positions="1:2:3")
    with pytest.raises(ac.InputError, match="torch device"):
        ac.SafeCapturer(model, "transformer.h.0", device="gpu7")
    with pytest.raises(ac.InputError, match="torch.nn.Module"):
        ac.SafeCapturer("model", "x")
    with pytest.raises(ac.InputError):
        ac.SafeCapturer(model, [])
    cap = ac.SafeCapturer(model, "transformer.h.0")
    cap(ids_batch())
    with pytest.raises(ac.InputError, match="not a planned point"):
        cap.get("transformer.h.1")
    with pytest.raises(ac.RunError, match="no call 5"):
        cap.get("transformer.h.0", call=5)
    cap.close()
    with pytest.raises(ac.InputError, match="closed"):
        cap.get("transformer.h.0")
    with pytest.raises(ac.InputError, match="closed"):
        with cap:
            pass
    # InputError is a ValueError, RunError a RuntimeError: generic handlers catch them too
    assert issubclass(ac.InputError, ValueError) and issubclass(ac.RunError, RuntimeError)


def test_budget_and_mask_shape_errors(ac):
    model = GPT2LMHeadModel.random()
    ids = ids_batch()
    with ac.SafeCapturer(model, "transformer.h.*", budget=2 * 12 * 32 * 4 * 2) as cap:
        with pytest.raises(ac.RunError, match="over the capture budget"):
            cap(ids)
    assert len(cap.get("transformer.h.1")) == 2  # what fit is kept, verified
    with ac.SafeCapturer(model, "transformer.h.0.attn.c_attn", positions="last") as cap:
        cap(ids, attention_mask=torch.ones(2, 12))
    with ac.SafeCapturer(model, "transformer.wte") as cap:
        with pytest.raises(ac.InputError, match=r"not \[batch, seq, \.\.\.\] = \[3, 12"):
            cap(ids, attention_mask=torch.ones(3, 12))


# ---- dtype, save, verify ------------------------------------------------------------------------
def test_save_writes_what_actcap_verify_checks(ac, actcap_bin, tmp_path):
    model = GPT2LMHeadModel.random()
    ids = ids_batch()
    mask = torch.tensor([[1] * 12, [0] * 4 + [1] * 8])
    with ac.SafeCapturer(model, ["transformer.h.*", "transformer.wte:input"], dtype=torch.bfloat16) as cap:
        cap(ids, attention_mask=mask)
        cap(ids[:1])
    out = tmp_path / "cap"
    written = cap.save(out)
    names = [w["name"] for w in written]
    assert names == ["transformer.wte:input"] + BLOCKS + ["__rows__.seq", "__rows__.pos", "__rows__.token"]
    assert H.actcap("verify", out).returncode == 0
    ds = ac.open(out)
    assert ds.rows == 20 + 12
    for n in BLOCKS:
        assert ds.dtypes[n] == torch.bfloat16
        assert torch.equal(ds[n], cap.get(n))
    seq, pos = ds.rows_of()
    assert seq.tolist() == [0] * 12 + [1] * 8 + [2] * 12  # sequences numbered across forwards
    # the token of every row: the call's input ids (the real ones of the left-padded row)
    assert ds.tokens.tolist() == ids[0].tolist() + ids[1, 4:].tolist() + ids[0].tolist()
    assert pos.tolist() == list(range(12)) + list(range(8)) + list(range(12))
    assert ds["transformer.wte:input"].dtype == torch.int64  # ids stay integers
    with pytest.raises(ac.InputError, match="not empty"):
        cap.save(out)
    cap.save(out, overwrite=True)
    # a damaged byte: verify fails, and so does reading that tensor
    shard = out / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x10
    shard.write_bytes(bytes(data))
    assert H.actcap("verify", out).returncode == 1
    with pytest.raises(ac.RunError):
        ac.open(out).verify()


def test_save_refuses_points_that_fired_twice_in_a_forward(ac, tmp_path):
    shared = torch.nn.Linear(8, 8)

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.f = shared

        def forward(self, x):
            return self.f(self.f(x))

    m = Twice()
    with torch.no_grad(), ac.SafeCapturer(m, "f") as cap:
        m(torch.randn(2, 3, 8))
    assert cap.calls("f") == 2
    with pytest.raises(ac.RunError, match="fired 2 times"):
        cap.save(tmp_path / "x")


# ---- audit -------------------------------------------------------------------------------------
def _storage_of(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def test_audit_catches_the_seeds_hook_and_names_it(ac):
    model = GPT2LMHeadModel.random()
    outputs = {}

    def seed_hook(module, inputs, output):
        outputs["layer"] = output  # the seed's bug: a bare reference

    model.transformer.h[2].register_forward_hook(seed_hook)
    with ac.audit(model) as a:
        with pytest.raises(ac.RunError, match=r"seed_hook on module 'transformer.h.2' kept a reference to its output"):
            model(ids_batch())
    assert a.hooks == 1 and len(a.findings) == 1
    assert model.transformer.h[2]._forward_hooks[next(iter(model.transformer.h[2]._forward_hooks))] is seed_hook


@pytest.mark.parametrize("keep,caught", [
    (lambda o: o, True),
    (lambda o: o[0], True),
    (lambda o: o[0].detach(), True),
    (lambda o: o[0].cpu(), True),
    (lambda o: o[0][:, -1], True),
    (lambda o: o[0].detach().clone(), False),
    (lambda o: o[0].sum().item(), False),
    (lambda o: o[0].mean(-1), False),
    # the storage kept, or only looked at: on a LibTorch 2.x that keeps a storage's Python wrapper
    # alive while the storage is shared, looking leaves a use of it behind that is LibTorch's own
    (lambda o: _storage_of(o[0]), True),
    (lambda o: _storage_of(o[0]).data_ptr(), False),
])
def test_audit_warn_mode_reports_what_keeps_a_reference(ac, keep, caught):
    model = GPT2LMHeadModel.random()
    store = []
    model.transformer.h[0].register_forward_hook(lambda m, i, o: store.append(keep(o)))
    with ac.audit(model, mode="warn") as a, warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with torch.inference_mode():
            model(ids_batch())
            model(ids_batch())
    assert bool(a.findings) == caught
    assert len([x for x in w if issubclass(x.category, ac.BareReferenceWarning)]) == int(caught)


def test_audit_allows_hooks_that_return_a_replacement_and_pre_hooks(ac):
    model = GPT2LMHeadModel.random()
    model.transformer.h[1].register_forward_hook(lambda m, i, o: (o[0] * 1,))
    model.transformer.h[1].register_forward_hook(lambda m, i, o: o)  # returns it unchanged
    kept = []
    model.transformer.h[3].register_forward_pre_hook(lambda m, args: kept.append(args[0]))
    with ac.audit(model) as a:
        with pytest.raises(ac.RunError, match=r"pre hook .* on module 'transformer.h.3' kept a reference to its input"):
            model(ids_batch())
    assert [f.kind for f in a.findings] == ["pre"]
    with pytest.raises(ac.InputError, match="mode"):
        ac.audit(model, mode="loud")


# ---- edge cases found in review ----------------------------------------------------------------
def test_select_applies_only_to_outputs_that_are_not_tensors(ac):
    model = GPT2LMHeadModel.random()
    ids = ids_batch()
    with torch.inference_mode(), ac.SafeCapturer(
            model, ["transformer.h.0", "transformer.h.0.mlp", "transformer.h.1:input"], select=0) as cap:
        model(ids)
    assert cap.get("transformer.h.0").shape == (2, 12, 32)       # element 0 of the block's tuple
    assert cap.get("transformer.h.0.mlp").shape == (2, 12, 32)   # a tensor: kept whole
    assert cap.get("transformer.h.1:input").shape == (2, 12, 32)
    with ac.SafeCapturer(model, "transformer.h.0", select=5) as cap:
        with pytest.raises(ac.InputError, match=r"select=5 for point 'transformer.h.0'"):
            cap(ids)
    with ac.SafeCapturer(model, "transformer.h.0.attn", select="nope") as cap:
        with pytest.raises(ac.InputError, match="select='nope'"):
            cap(ids)


def test_a_scalar_output_reads_back(ac):
    class Loss(torch.nn.Module):
        def forward(self, y):
            return y.pow(2).mean()

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Loss())
    with torch.no_grad(), ac.SafeCapturer(model, "1") as cap:
        a = model(torch.randn(3, 4))
        b = model(torch.randn(3, 4))
    assert torch.equal(cap.get("1", call=0), a) and torch.equal(cap.get("1", call=1), b)
    with pytest.raises(ac.RunError, match="do not stack"):
        cap.get("1")


def test_calling_a_submodule_directly_starts_a_new_forward_per_mask(ac):
    model = GPT2LMHeadModel.random()
    ids = ids_batch(T=5)
    full = torch.ones(2, 5, dtype=torch.long)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with torch.inference_mode(), ac.SafeCapturer(model, "transformer.h.3", positions="last") as cap:
        cap.attention_mask = full
        model.transformer(ids, attention_mask=full)
        cap.attention_mask = right
        model.transformer(ids, attention_mask=right)
    seq, pos = cap.rows("transformer.h.3")
    assert pos.tolist() == [4, 4, 2, 4]  # the second forward's last real tokens, not position 4
    assert cap.calls("transformer.h.3") == 2


def test_save_of_a_model_with_offloaded_meta_tensors(ac, actcap_bin, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model.register_buffer("offloaded", torch.empty(4, device="meta"))
    with torch.no_grad(), ac.SafeCapturer(model, "0") as cap:
        model(torch.randn(2, 3, 4))
    cap.save(tmp_path / "o")
    assert H.actcap("verify", tmp_path / "o").returncode == 0


def test_a_failing_save_leaves_the_previous_output_as_it_was(ac, actcap_bin, tmp_path):
    model = GPT2LMHeadModel.random()
    out = tmp_path / "o"
    with ac.SafeCapturer(model, "transformer.h.0") as cap:
        cap(ids_batch())
    cap.save(out)
    before = sorted(p.name for p in out.iterdir())
    cap.clear()
    with pytest.raises((ac.RunError, ac.InputError)):
        cap.save(out, overwrite=True)  # nothing captured any more
    assert sorted(p.name for p in out.iterdir()) == before
    assert H.actcap("verify", out).returncode == 0
    assert not list(tmp_path.glob("o.partial-*"))
    with ac.SafeCapturer(model, "transformer.h.1") as cap2:
        cap2(ids_batch())
    cap2.save(out, overwrite=True)  # a good save replaces it
    assert ac.open(out).points == ["transformer.h.1"]


def test_audit_allows_a_returned_view_and_looks_inside_dataclass_outputs(ac):
    model = GPT2LMHeadModel.random()
    h = model.transformer.h[0].register_forward_hook(lambda m, i, o: (o[0].view(o[0].shape),))
    # a returned view holds its base from C++; a LibTorch 2.x that then preserves the base's Python
    # object adds a Python reference as well, which is LibTorch's, not the hook's
    for mode in (torch.no_grad, torch.inference_mode, torch.enable_grad):
        with mode(), ac.audit(model, mode="error") as a:
            model(ids_batch())
        assert a.findings == [], mode.__name__
    h.remove()
    kept = {}
    h = model.transformer.register_forward_hook(
        lambda m, i, o: kept.__setitem__("h", o.last_hidden_state))
    with torch.no_grad(), ac.audit(model, mode="warn") as a, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(ids_batch())
    h.remove()
    assert [f.kept for f in a.findings] == ["output.last_hidden_state"]


def recorder_hook(module_name, store):
    """A hook as transformers 5 installs for output_hidden_states (transformers.utils.
    output_capturing's output_capturing_hook: it keeps each output to return it to the caller),
    defined in a module of that name."""
    def output_capturing_hook(module, args, output):
        store.append(output)
    output_capturing_hook.__module__ = module_name
    output_capturing_hook.__qualname__ = "output_capturing_hook"
    return output_capturing_hook


def test_audit_leaves_transformers_output_recorder_alone_unless_asked(ac):
    model = GPT2LMHeadModel.random()
    store = []
    h = model.transformer.h[1].register_forward_hook(
        recorder_hook("transformers.utils.output_capturing", store))
    with torch.no_grad(), ac.audit(model, mode="error") as a:
        model(ids_batch())
    assert a.findings == [] and len(store) == 1
    assert a.skipped == ["transformer.h.1: transformers.utils.output_capturing.output_capturing_hook"]
    with torch.no_grad(), ac.audit(model, mode="error", trust_transformers=False) as a:
        with pytest.raises(ac.RunError, match="output_capturing_hook on module 'transformer.h.1'"):
            model(ids_batch())
    assert a.skipped == []
    h.remove()
    # the same name outside transformers is audited as any hook
    h = model.transformer.h[1].register_forward_hook(recorder_hook("mytools.capture", store))
    with torch.no_grad(), ac.audit(model, mode="error"):
        with pytest.raises(ac.RunError, match="output_capturing_hook"):
            model(ids_batch())
    h.remove()


class CachedLM(torch.nn.Module):
    """A causal model that decodes with a cache as transformers' generate drives one: the prompt's
    forward gets every token, each later forward only the new one, with the mask of the whole
    sequence so far (padding included)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.block = torch.nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask=None):
        return self.block(self.embed(input_ids))


def test_decoding_steps_with_a_cache_give_the_new_tokens_rows(ac):
    model = CachedLM()
    prompt = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    steps = [torch.tensor([[7], [8]]), torch.tensor([[9], [10]])]
    with torch.no_grad(), ac.SafeCapturer(model, ["block"]) as cap:
        cap(prompt, attention_mask=mask)
        for new in steps:
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
            cap.attention_mask = mask  # torch < 2.0 shows hooks no keyword arguments
            model(new, attention_mask=mask)
    assert cap.calls("block") == 3
    seq, pos = cap.rows("block", 0)
    assert seq.tolist() == [0, 0, 1, 1, 1, 1] and pos.tolist() == [0, 1, 0, 1, 2, 3]
    for k, new in enumerate(steps, start=1):
        seq, pos = cap.rows("block", k)
        assert seq.tolist() == [0, 1] and pos.tolist() == [1 + k, 3 + k], (k, pos)
        with torch.no_grad():
            want = model.block(model.embed(new))[:, 0]
        assert torch.equal(cap.get("block", call=k), want)
    # 'first' selects each sequence's first token: only the prompt's forward has it
    with torch.no_grad(), ac.SafeCapturer(model, ["block"], positions="first") as cap:
        cap(prompt, attention_mask=torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
        cap.attention_mask = torch.ones(2, 5, dtype=torch.long)
        model(steps[0], attention_mask=cap.attention_mask)
    assert [cap.get("block", call=c).shape[0] for c in range(cap.calls("block"))] == [2, 0]


def test_audit_measures_libtorchs_own_references_outside_inference_mode(ac):
    """The first audit of a process may run under inference_mode, where a view keeps no reference
    to its base: measured there, LibTorch 2.x's own references came out 0 and every later audit
    reported hooks returning views (in a fresh process: the measurement is made once)."""
    code = ("import sys, torch, actcap\n"
            "A = sys.modules['actcap.audit']  # the module (actcap.audit is the function)\n"
            "with torch.inference_mode():\n"
            "    first = A._preservation()\n"
            "print(first == A._measure_preservation(), first)\n")
    run = H.run_python("-c", code)
    assert run.returncode == 0 and run.stdout.startswith("True"), run.stdout + run.stderr


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x)


class SparseBlock(torch.nn.Module):
    """transformers' mixture-of-experts block in miniature: its router (`gate`) and experts run on
    the batch flattened to [batch * seq, hidden] (hidden_states.view(-1, hidden)), and the result is
    put back as [batch, seq, hidden]. The router is `gate` (Mixtral, Qwen3-MoE, OLMoE) or `router`
    (gpt-oss)."""

    def __init__(self, router="gate", shared=False):
        super().__init__()
        self.router_name = router
        setattr(self, router, torch.nn.Linear(8, 4, bias=False))
        self.experts = Experts()
        if shared:  # Qwen2-MoE's shared expert (an MLP of its own) and its gate
            self.shared_expert = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 8))
            self.shared_expert_gate = torch.nn.Linear(8, 1, bias=False)

    def forward(self, h):
        flat = h.view(-1, h.shape[-1])
        shared = self.shared_expert(flat) if hasattr(self, "shared_expert") else 0
        weights = torch.softmax(getattr(self, self.router_name)(flat), -1)[:, :1]
        out = self.experts(flat) * weights
        if hasattr(self, "shared_expert"):
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * shared
        return out.view(h.shape)


class RoutedLM(torch.nn.Module):
    def __init__(self, router="gate", shared=False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.mlp = SparseBlock(router, shared)

    def forward(self, input_ids, attention_mask=None):
        return self.mlp(self.embed(input_ids))


@pytest.mark.parametrize("router", ["gate", "router"])
def test_token_flattened_points_give_the_real_tokens_rows(ac, router):
    """The router and experts of a mixture-of-experts block (the direct children of a module with
    `experts` and a router child: `gate`, or gpt-oss's `router`) see every token flattened
    ([batch * seq, ...]): where rows are taken, they are read as [batch, seq, ...] instead of
    being refused; without a mask or positions they are kept whole, as the module returned them. Decoding steps use the new tokens'
    [batch, seq]. A module inside the experts is not read so (transformers regroups the tokens by
    expert there): refused as before."""
    model = RoutedLM(router)
    gate = f"mlp.{router}"  # the router's point
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad():
        flat = model.embed(ids).view(-1, 8)
        logits, experts = getattr(model.mlp, router)(flat), model.mlp.experts(flat)
    real = mask.reshape(-1).bool()
    points = [gate, "mlp.experts", "mlp.experts:input"]
    with torch.no_grad(), ac.SafeCapturer(model, points) as cap:
        cap(ids, attention_mask=mask)
    assert torch.equal(cap.get(gate), logits[real])
    assert torch.equal(cap.get("mlp.experts"), experts[real])
    assert torch.equal(cap.get("mlp.experts:input"), flat[real])
    seq, pos = cap.rows(gate)
    assert seq.tolist() == [0, 0, 1, 1, 1, 1] and pos.tolist() == [0, 1, 0, 1, 2, 3]
    with torch.no_grad(), ac.SafeCapturer(model, [gate], positions="last") as last:
        last(ids, attention_mask=mask)
    assert torch.equal(last.get(gate), logits[[3, 7]])
    with torch.no_grad(), ac.SafeCapturer(model, [gate]) as whole:
        model(ids)
    assert torch.equal(whole.get(gate), logits)  # [batch * seq, experts] as returned
    # a decoding step: one new token per sequence, the mask covers the cached ones
    new = torch.tensor([[7], [8]])
    step_mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        want = getattr(model.mlp, router)(model.embed(new).view(-1, 8))
    with torch.no_grad(), ac.SafeCapturer(model, [gate]) as dec:
        dec.attention_mask = step_mask
        model(new, attention_mask=step_mask)
    assert torch.equal(dec.get(gate), want)
    assert dec.rows(gate)[1].tolist() == [2, 4]
    with torch.no_grad(), ac.SafeCapturer(model, ["mlp.experts.proj"]) as inner:
        with pytest.raises(ac.InputError, match=r"mlp.experts.proj.*not \[batch, seq"):
            inner(ids, attention_mask=mask)


def test_shared_expert_points_give_the_real_tokens_rows(ac):
    """Qwen2-MoE's shared expert, its gate and the modules inside the shared expert all run on
    the flattened tokens in token order: each point gives the real tokens' rows. Inside `experts`
    the tokens are regrouped, still refused."""
    model = RoutedLM(shared=True)
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad():
        flat = model.embed(ids).view(-1, 8)
        inner = model.mlp.shared_expert[0](flat)
        want = {"mlp.shared_expert": model.mlp.shared_expert(flat), "mlp.shared_expert.0": inner,
                "mlp.shared_expert.1:input": inner,
                "mlp.shared_expert_gate": model.mlp.shared_expert_gate(flat)}
    real = mask.reshape(-1).bool()
    with torch.no_grad(), ac.SafeCapturer(model, list(want)) as cap:
        cap(ids, attention_mask=mask)
    for name, t in want.items():
        assert torch.equal(cap.get(name), t[real]), name
        assert cap.rows(name)[1].tolist() == [0, 1, 0, 1, 2, 3], name
    with torch.no_grad(), ac.SafeCapturer(model, ["mlp.experts.proj"]) as regrouped:
        with pytest.raises(ac.InputError, match=r"mlp.experts.proj.*not \[batch, seq"):
            regrouped(ids, attention_mask=mask)
