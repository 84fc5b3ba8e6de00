"""Attention patterns as hook points: `NAME:scores` and `NAME:probs` of every attention module,
against the independent reference (reference.Model.forward(ids, patterns=True)).

Per architecture of test_parity.ARCHS (tiny `init-model` checkpoints from the `models` fixture):
  * run: a batch of three sequences of different lengths (12 > mistral's / phi3's window of 8 and
    Gemma's 4) captured with '**:scores' '**:probs' (and lm_head): rows [rows, heads, K], K the
    longest length; per sequence of length L, the first L key columns equal the reference within
    1e-5 (-inf in exactly the reference's masked places for scores, exactly 0 there for probs),
    columns L..K-1 are probs 0 and scores -inf exactly; the manifest shape is [heads, K];
  * --heads 1,0 gives the full capture's heads [1, 0], bit for bit (and, with GQA, head 3 of 4 query
    heads / 2 kv heads is valid); bad --heads values (99, 4 of 4, -1, 0,0, x) are exit 2 with one
    `actcap: error:` line naming the heads, for run, extract and generate;
  * capturing the patterns (with or without --heads) leaves lm_head (gpt_neox: embed_out)
    byte-identical to capturing it alone; '**' selects no pattern, 'transformer.h.*.attn:probs'
    the probs of every GPT-2 block;
  * sliding windows bite (keys older than the window are 0 / -inf, keys inside it are not) and
    Gemma 2's attention soft-cap bites (a synth.py Gemma 2 with attn_logit_softcapping 0.3: every
    finite score within the cap, which the uncapped reference's scores exceed);
  * extract --max-length 16 --batch-size 3 of documents of 5, 16, 9 and 1 tokens (layer 0's
    :probs and :scores): rows [rows, heads, 16], padded keys 0 / -inf, values per document;
  * generate --max-new-tokens 4 --ignore-eos: one row per (sequence, position) of the final
    sequences, K = longest prompt + 4, each row equal to the reference's forward over the final
    sequence, the remaining columns 0 / -inf;
  * `actcap points` lists both points of every attention module.
"""
import json

import numpy as np
import pytest

import actcap_helpers as H
import reference
import test_parity as P

ARCHS = P.ARCHS
TOL = 1e-5
RUN_LENGTHS = [12, 5, 9]
ROWS_STEP = "__rows__.step"
WINDOWED = ["mistral", "phi3", "gemma2", "gemma3_text", "gpt_oss"]  # tiny presets whose windows are < 12

pytestmark = pytest.mark.usefixtures("actcap_bin", "no_reexec")


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def pattern_names(ref_pts):
    """The attention module names (without suffix) of a reference forward with patterns=True."""
    return [k[:-len(":probs")] for k in ref_pts if k.endswith(":probs")]


def check_rows(name, got, ref, L, K, label, tol=TOL, ref_scores=None):
    """got: actcap rows [L, heads, K] of one sequence; ref: the reference's [L, heads, L]. Returns
    failure strings. ref_scores: the reference's scores (the mask) when name is a :probs point."""
    f = []
    kind = name.rsplit(":", 1)[1]
    if got.dtype != np.float32:
        return [f"{label}{name}: dtype {got.dtype}"]
    if got.shape != (L, ref.shape[1], K):
        return [f"{label}{name}: shape {got.shape}, expected {(L, ref.shape[1], K)}"]
    head, pad = got[:, :, :L], got[:, :, L:]
    if np.isnan(got).any():
        f.append(f"{label}{name}: NaN")
    if kind == "scores":
        masked = np.isneginf(ref)
        if not np.array_equal(np.isneginf(head), masked):
            bad = np.argwhere(np.isneginf(head) != masked)[:4].tolist()
            f.append(f"{label}{name}: -inf at other places than the reference's mask, "
                     f"e.g. [query, head, key] {bad}")
        if np.isposinf(got).any():
            f.append(f"{label}{name}: +inf")
        if not np.all(np.isneginf(pad)):
            f.append(f"{label}{name}: padding key columns {L}..{K - 1} not all -inf "
                     f"(e.g. {pad[np.isfinite(pad)][:4].tolist()})")
    else:
        masked = np.isneginf(ref_scores) if ref_scores is not None else (ref == 0)
        if not np.all(head[masked] == 0):
            f.append(f"{label}{name}: masked keys not exactly 0 (max {float(np.abs(head[masked]).max()):.3g})")
        if not np.all(pad == 0):
            f.append(f"{label}{name}: padding key columns {L}..{K - 1} not all 0 "
                     f"(max {float(np.abs(pad).max()):.3g})")
    fin = ~masked
    both = fin & np.isfinite(head)
    if both.any():
        d = float(np.max(np.abs(head[both].astype(np.float64) - ref[both].astype(np.float64))))
        if d > tol:
            diff = np.where(both, np.abs(head.astype(np.float64) - ref.astype(np.float64)), -1.0)
            idx = list(np.unravel_index(int(np.argmax(diff)), diff.shape))
            f.append(f"{label}{name}: max abs diff {d:.3e} > {tol:g} at [query, head, key] {idx} "
                     f"(got {head[tuple(idx)]:.6g}, reference {ref[tuple(idx)]:.6g})")
    return f


def check_sequences(tensors, refs, lengths, K, names, label="", sel_of=None):
    failures = []
    for i, L in enumerate(lengths):
        sel = tensors[H.ROWS_SEQ] == i if sel_of is None else sel_of(i)
        for n in names:
            for kind in ("scores", "probs"):
                name = f"{n}:{kind}"
                if name not in tensors:
                    continue
                failures += check_rows(name, tensors[name][sel], refs[i][name], L, K,
                                       f"{label}seq {i} (L={L}): ",
                                       ref_scores=refs[i][f"{n}:scores"])
    return failures


_RUNS = {}
_HEADS = {}


def full_run(models, tmp_path_factory, arch):
    """Cached: `actcap run MODEL --capture lm_head '**:scores' '**:probs'` (gpt_neox: embed_out) on
    RUN_LENGTHS, and the
    reference per sequence. Returns (model dir, seqs, manifest, tensors, refs)."""
    if arch not in _RUNS:
        m = models(arch)
        seqs = P.tokens_for(m, RUN_LENGTHS, seed=11)
        out = tmp_path_factory.mktemp(f"patterns-{arch}")
        manifest, tensors, _ = H.run_capture(m, out, seqs, capture=(head_name(arch), "**:scores", "**:probs"))
        model = reference.Model(str(m))
        refs = [model.forward(s, patterns=True) for s in seqs]
        _RUNS[arch] = (m, seqs, manifest, tensors, refs)
    return _RUNS[arch]


def heads_run(models, tmp_path_factory, arch):
    """Cached: the same run as full_run with lm_head '**:probs' '**:scores' --heads 1,0."""
    if arch not in _HEADS:
        m, seqs = full_run(models, tmp_path_factory, arch)[:2]
        out = tmp_path_factory.mktemp(f"heads-{arch}")
        _HEADS[arch] = H.run_capture(m, out, seqs, capture=(head_name(arch), "**:probs", "**:scores"),
                                     extra=("--heads", "1,0"))
    return _HEADS[arch]


def head_name(arch):
    return "embed_out" if arch == "gpt_neox" else "lm_head"


# ---------------------------------------------------------------------------------------------
# run: parity, --heads, no effect on other points
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_run_patterns_match_reference(models, tmp_path_factory, arch):
    m, seqs, manifest, tensors, refs = full_run(models, tmp_path_factory, arch)
    names = pattern_names(refs[0])
    cfg = reference.Config(H.load_config(m))
    assert len(names) == cfg.layers
    K = max(RUN_LENGTHS)
    want = {f"{n}:{k}" for n in names for k in ("scores", "probs")}
    got = {k for k in tensors if k.endswith(":scores") or k.endswith(":probs")}
    assert got == want, f"only in actcap {sorted(got - want)}, only in reference {sorted(want - got)}"
    for name in want:
        assert manifest["points"][name]["shape"] == [cfg.heads, K], (name, manifest["points"][name])
        assert manifest["points"][name]["dtype"] == "F32", (name, manifest["points"][name])
    exp_seq = np.concatenate([np.full(L, i) for i, L in enumerate(RUN_LENGTHS)])
    assert np.array_equal(tensors[H.ROWS_SEQ], exp_seq)
    failures = check_sequences(tensors, refs, RUN_LENGTHS, K, names, f"{arch} run: ")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])
    # the probabilities are a distribution over the visible keys
    for n in names:
        s = tensors[n + ":probs"].astype(np.float64).sum(-1)
        if arch == "gpt_oss":  # each head's sink takes a share: the rest sums to less than 1
            assert (s < 1.0).all() and (s > 0).all(), (n, float(s.max()))
        else:
            assert np.allclose(s, 1.0, atol=1e-5), (n, float(np.abs(s - 1).max()))


@pytest.mark.parametrize("arch", ARCHS)
def test_heads_select_and_order(models, tmp_path_factory, tmp_path, arch):
    m, seqs, manifest, full, refs = full_run(models, tmp_path_factory, arch)
    man, t, _ = heads_run(models, tmp_path_factory, arch)
    K = max(RUN_LENGTHS)
    names = [k for k in full if k.endswith(":scores") or k.endswith(":probs")]
    assert set(names) | {head_name(arch)} == {k for k in t if k not in H.ROWS}, sorted(t)
    for name in names:
        assert t[name].shape == (sum(RUN_LENGTHS), 2, K), (name, t[name].shape)
        assert man["points"][name]["shape"] == [2, K], (name, man["points"][name])
        # same bits as the full capture's heads 1 and 0 (-inf compares equal to -inf)
        assert np.array_equal(t[name], full[name][:, [1, 0]]), (
            f"{arch} --heads 1,0: {name} differs from the full capture's heads [1, 0]")


def _one_error(proc, label):
    assert proc.returncode == 2, f"{label}: exit {proc.returncode}, expected 2\n{proc.stderr[-2000:]}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("actcap: error: "), f"{label}: stderr {proc.stderr!r}"
    assert "head" in lines[0].lower(), f"{label}: the error does not name the heads: {lines[0]}"
    for marker in H.CRASH_MARKERS:
        assert marker not in proc.stderr, f"{label}: {marker!r} on stderr"
    return lines[0]


@pytest.mark.parametrize("bad", ["99", "4", "-1", "0,0", "x"])
def test_bad_heads_exit_2_one_line(models, tmp_path, bad):
    """gpt2 tiny has 4 heads: 4 and 99 are out of range, -1 negative, 0,0 repeated, x not a number."""
    m = models("gpt2")
    out = tmp_path / "o"
    p = H.actcap("run", m, "--tokens", "1,2,3", "--capture", "**:probs", "--heads", bad, "--out", out)
    _one_error(p, f"run --heads {bad!r}")
    assert not (out / "manifest.json").exists()


def test_bad_heads_extract_generate_and_gqa_boundary(models, tmp_path):
    """extract and generate refuse a head >= the number of query heads; with GQA (llama: 4 query
    heads, 2 kv heads) head 3 is a valid query head, equal to the full capture's head 3."""
    m = models("gpt2")
    corpus = tmp_path / "in.jsonl"
    corpus.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    _one_error(H.actcap("extract", m, "--input", corpus, "--capture", "**:probs", "--heads", "4",
                        "--max-length", "8", "--out", tmp_path / "e", "--quiet"), "extract --heads 4")
    _one_error(H.actcap("generate", m, "--tokens", "1,2", "--max-new-tokens", "2", "--capture",
                        "**:probs", "--heads", "0,4", "--out", tmp_path / "g"), "generate --heads 0,4")
    ll = models("llama")
    cfg = reference.Config(H.load_config(ll))
    assert cfg.kv_heads < 3 < cfg.heads
    seqs = P.tokens_for(ll, [6, 4], seed=3)
    _, full, _ = H.run_capture(ll, tmp_path / "full", seqs, capture=("model.layers.0.self_attn:probs",))
    _, t, _ = H.run_capture(ll, tmp_path / "h3", seqs, capture=("model.layers.0.self_attn:probs",),
                            extra=("--heads", "3"))
    n = "model.layers.0.self_attn:probs"
    assert t[n].shape == (10, 1, 6) and np.array_equal(t[n], full[n][:, [3]])
    _one_error(H.actcap("run", ll, "--tokens", "1,2", "--capture", n, "--heads", "4",
                        "--out", tmp_path / "h4"), "llama run --heads 4")


@pytest.mark.parametrize("arch", ARCHS)
def test_patterns_do_not_change_other_captures(models, tmp_path_factory, tmp_path, arch):
    m, seqs, _, full, _ = full_run(models, tmp_path_factory, arch)
    """lm_head (gpt_neox: embed_out) alone vs with '**:scores' '**:probs' (full_run) and with
    '**:probs' '**:scores' --heads 1,0 (heads_run): byte-identical."""
    head = head_name(arch)
    _, alone, _ = H.run_capture(m, tmp_path / "a", seqs, capture=(head,))
    with_heads = heads_run(models, tmp_path_factory, arch)[1]
    assert set(alone) - H.ROWS == {head}
    for label, other in (("**:scores **:probs", full), ("**:probs **:scores --heads 1,0", with_heads)):
        assert other[head].dtype == alone[head].dtype and other[head].shape == alone[head].shape
        assert other[head].tobytes() == alone[head].tobytes(), (
            f"{arch}: {head} captured with {label} differs from {head} alone "
            f"(max diff {float(np.max(np.abs(other[head] - alone[head]))):.3g})")


def test_pattern_selection_gpt2(models, tmp_path):
    """'transformer.h.*.attn:probs' selects the four probs points, '**' none of the patterns."""
    m = models("gpt2")
    _, t, _ = H.run_capture(m, tmp_path / "a", [[1, 2, 3]], capture=("transformer.h.*.attn:probs",))
    assert set(t) - H.ROWS == {f"transformer.h.{i}.attn:probs" for i in range(4)}
    _, t, _ = H.run_capture(m, tmp_path / "b", [[1, 2, 3]], capture=("**", "**:input"))
    assert not [k for k in t if k.endswith(":probs") or k.endswith(":scores")]


# ---------------------------------------------------------------------------------------------
# sliding windows and Gemma 2's soft-cap
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", WINDOWED)
def test_sliding_window_bites(models, tmp_path_factory, arch):
    m, seqs, _, t, refs = full_run(models, tmp_path_factory, arch)
    cfg = reference.Config(H.load_config(m))
    names = pattern_names(refs[0])
    L = RUN_LENGTHS[0]
    sel = t[H.ROWS_SEQ] == 0
    slid = 0
    for layer, (n, win) in enumerate(zip(names, cfg.windows)):
        probs, scores = t[n + ":probs"][sel], t[n + ":scores"][sel]  # [L, heads, K]
        q = np.arange(L)[:, None]
        k = np.arange(probs.shape[-1])[None, :]
        visible = (k <= q) & ((k > q - win) if win is not None else True)
        outside = ~visible
        assert np.all(probs[np.broadcast_to(outside[:, None, :], probs.shape)] == 0), (
            f"{arch} layer {layer} (window {win}): probability on a key outside the window")
        assert np.all(np.isneginf(scores[np.broadcast_to(outside[:, None, :], scores.shape)])), (
            f"{arch} layer {layer} (window {win}): finite score for a key outside the window")
        assert np.all(probs[np.broadcast_to(visible[:, None, :], probs.shape)] > 0), (
            f"{arch} layer {layer} (window {win}): zero probability on a visible key")
        if win is not None and win < L:
            slid += 1
            # the window removes causal keys: k <= q - win, e.g. query L-1, key 0
            assert np.all(probs[L - 1, :, 0] == 0) and np.all(np.isneginf(scores[L - 1, :, 0]))
    assert slid > 0, f"{arch}: no layer has a window shorter than {L}: the test proves nothing"


def test_gemma2_softcap_and_window_bite(actcap_bin, tmp_path):
    m = P._gemma2_synth(tmp_path, "m", attn_logit_softcapping=0.3)
    nocap = P._gemma2_synth(tmp_path, "nocap", attn_logit_softcapping=None)
    lengths = [14, 9]
    seqs = P.tokens_for(m, lengths, seed=71)
    cfg = reference.Config(H.load_config(m))
    assert cfg.windows == [4, None, 4]
    _, t, _ = H.run_capture(m, tmp_path / "out", seqs, capture=("**:scores", "**:probs"))
    model = reference.Model(str(m))
    refs = [model.forward(s, patterns=True) for s in seqs]
    names = pattern_names(refs[0])
    # the cap bites: the uncapped scores exceed it, the capped ones stay within it
    raw = reference.Model(str(nocap)).forward(seqs[0], patterns=True)
    raw_max = max(float(np.abs(raw[n + ":scores"][np.isfinite(raw[n + ":scores"])]).max()) for n in names)
    # 0.3 * tanh(s / 0.3) <= 0.3 and, from |s| = 0.45 on, lower than |s| by a third or more
    assert raw_max > 0.45, f"uncapped scores reach only {raw_max}: the cap would not bite"
    for n in names:
        s = t[n + ":scores"]
        fin = s[np.isfinite(s)]
        assert fin.size and float(np.abs(fin).max()) <= 0.3 + 1e-6, (n, float(np.abs(fin).max()))
    failures = check_sequences(t, refs, lengths, max(lengths), names, "gemma2 softcap: ")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])
    # the window of layer 0 (4) bites over 14 tokens: query 13 sees keys 10..13 only
    p0 = t[names[0] + ":probs"][t[H.ROWS_SEQ] == 0]
    assert np.all(p0[13, :, :10] == 0) and np.all(p0[13, :, 10:14] > 0)
    p1 = t[names[1] + ":probs"][t[H.ROWS_SEQ] == 0]
    assert np.all(p1[13, :, :14] > 0)


def test_gpt2_scale_by_layer_and_reorder(models, tmp_path):
    """GPT-2 with scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn: the scores of
    block N are divided by N + 1 as well (HF's _upcast_and_reordered_attn), which changes them."""
    src = models("gpt2")
    m = H.copy_model(src, tmp_path / "m")
    H.save_config(m, dict(H.load_config(src), scale_attn_by_inverse_layer_idx=True,
                          reorder_and_upcast_attn=True))
    lengths = [10, 4]
    seqs = P.tokens_for(m, lengths, seed=38)
    _, t, _ = H.run_capture(m, tmp_path / "out", seqs, capture=("**:scores", "**:probs"))
    model = reference.Model(str(m))
    refs = [model.forward(s, patterns=True) for s in seqs]
    plain = reference.Model(str(src)).forward(seqs[0], patterns=True)
    last = "transformer.h.3.attn:scores"
    fin = np.isfinite(plain[last])
    assert np.max(np.abs(plain[last][fin] - refs[0][last][fin])) > 1e-3, "the option has no effect"
    failures = check_sequences(t, refs, lengths, max(lengths), pattern_names(refs[0]), "gpt2 options: ")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


# ---------------------------------------------------------------------------------------------
# extract and generate
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_extract_patterns(models, tmp_path, arch):
    m = models(arch)
    lengths = [5, 16, 9, 1]
    docs = P.tokens_for(m, lengths, seed=21)
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in docs))
    model = reference.Model(str(m))
    refs = [model.forward(d, patterns=True) for d in docs]
    n0 = pattern_names(refs[0])[0]
    out = tmp_path / "out"
    H.actcap("extract", m, "--input", corpus, "--capture", f"{n0}:probs", f"{n0}:scores",
             "--max-length", "16", "--batch-size", "3", "--out", out, "--quiet", check=True)
    manifest, t = H.read_all_shards(out)
    heads = reference.Config(H.load_config(m)).heads
    for kind in ("probs", "scores"):
        assert manifest["points"][f"{n0}:{kind}"]["shape"] == [heads, 16], manifest["points"]
        assert t[f"{n0}:{kind}"].shape == (sum(lengths), heads, 16)
    exp = [(i, p) for i, L in enumerate(lengths) for p in range(L)]
    assert list(zip(t[H.ROWS_SEQ].tolist(), t[H.ROWS_POS].tolist())) == exp
    failures = check_sequences(t, refs, lengths, 16, [n0], f"{arch} extract: ")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_patterns(models, tmp_path, arch):
    m = models(arch)
    prompts = P.tokens_for(m, [3, 6], seed=31)
    new = 4
    out = tmp_path / "out"
    proc = H.actcap("generate", m, "--tokens", H.tokens_arg(prompts), "--max-new-tokens", new,
                    "--ignore-eos", "--json", "--capture", "**:probs", "**:scores", "--out", out,
                    check=True)
    result = json.loads(proc.stdout)
    finals = [s["tokens"] for s in result["sequences"]]
    assert [len(f) for f in finals] == [len(p) + new for p in prompts], finals
    manifest, t, _ = H.read_capture(out)
    K = max(len(p) for p in prompts) + new
    exp_seq = np.concatenate([np.full(len(f), i) for i, f in enumerate(finals)])
    exp_pos = np.concatenate([np.arange(len(f)) for f in finals])
    exp_step = np.concatenate([np.r_[np.zeros(len(p), dtype=np.int64), np.arange(1, new + 1)]
                               for p in prompts])
    assert np.array_equal(t[H.ROWS_SEQ], exp_seq) and np.array_equal(t[H.ROWS_POS], exp_pos)
    assert np.array_equal(t[ROWS_STEP], exp_step), t[ROWS_STEP].tolist()
    model = reference.Model(str(m))
    refs = [model.forward(f, patterns=True) for f in finals]
    names = pattern_names(refs[0])
    heads = reference.Config(H.load_config(m)).heads
    for n in names:
        for kind in ("probs", "scores"):
            assert manifest["points"][f"{n}:{kind}"]["shape"] == [heads, K], manifest["points"][f"{n}:{kind}"]
    failures = check_sequences(t, refs, [len(f) for f in finals], K, names, f"{arch} generate: ")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])


# ---------------------------------------------------------------------------------------------
# points
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_points_lists_patterns(models, arch):
    m = models(arch)
    listed = H.actcap("points", m, check=True).stdout
    rows = {line.split()[0]: line.split()[1:] for line in listed.splitlines()[1:] if line.strip()}
    names = pattern_names(reference.Model(str(m)).forward([1, 2], patterns=True))
    heads = reference.Config(H.load_config(m)).heads
    for n in names:
        for kind in ("scores", "probs"):
            assert f"{n}:{kind}" in rows, f"{arch}: `actcap points` lacks {n}:{kind}"
            assert rows[f"{n}:{kind}"][0].startswith(f"[{heads},"), rows[f"{n}:{kind}"]
