"""Parity of `actcap generate` (generation with a KV cache, capturing every token) against the
independent reference (reference.py) and against itself on other device maps.

For each checkpoint a batch of prompts of different lengths is generated from with
`actcap generate ... --json [--capture '**' '**:input' --out DIR]`, and:
  * the tokens equal the reference's greedy decoding (reference.Model.forward run again on the
    growing sequence, argmax of the last row of the model's logits: the head point, soft-capped
    for Gemma 2; np.argmax takes the lowest id among ties, as actcap's greedy does);
  * the rows are one per (sequence, position) of the final sequences, in that order, with
    __rows__.step 0 for the prompt pass and k for the token fed at decoding step k (the k-th
    generated token, at position prompt_length - 1 + k);
  * every captured point (the same name set as the reference's) equals the reference's full
    forward over the final sequence, max|diff| <= 1e-5 * max(1, max|ref|), and `actcap run` over
    the final sequences within the same bound (the figures, and how many points are bit-identical
    to `actcap run`, are printed: pytest -s);
  * `actcap verify DIR` passes, and a 3-device split (--devices 3) gives the same tokens and
    bit-identical shard tensors.
Sliding windows and Gemma 2's attention soft-cap are checked where they change the decoded rows;
sampling (seeded, top-k, top-p) and stop tokens have their own tests.
"""
import json

import numpy as np
import pytest
import torch

import actcap_helpers as H
import reference
import test_parity as P

ARCHS = P.ARCHS
CAPTURE = ("**", "**:input")
REL = 1e-5  # max|diff| <= REL * max(1, max|ref|) at every point
ROWS_STEP = "__rows__.step"
ROWS_TOKEN = "__rows__.token"
ROWS = {H.ROWS_SEQ, H.ROWS_POS, ROWS_STEP, ROWS_TOKEN}
LENGTHS = [3, 7, 5]  # prompt lengths of the per-arch batch
MAX_NEW = 6

pytestmark = pytest.mark.usefixtures("actcap_bin")


# ---------------------------------------------------------------------------------------------
# running actcap generate and the reference
# ---------------------------------------------------------------------------------------------

def generate(model, prompts, max_new, out=None, capture=CAPTURE, devices=None, extra=()):
    """Runs `actcap generate --json`; returns (json result, (manifest, tensors, meta) or None)."""
    args = ["generate", model, "--tokens", H.tokens_arg(prompts), "--max-new-tokens", max_new,
            "--json", *extra]
    if devices is not None:
        args += ["--devices", devices]
    if out is not None:
        args += ["--capture", *capture, "--out", out]
    proc = H.actcap(*args, check=True, timeout=300)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(f"actcap {' '.join(map(str, args))}: stdout is not JSON ({e}):\n"
                             f"{proc.stdout[-2000:]}")
    return result, (H.read_capture(out) if out is not None else None)


def tokens_of(result):
    return [s["tokens"] for s in result["sequences"]]


def logits_of(model, pts):
    """The model's logits from reference points: the head's output, soft-capped where the model
    caps it (Gemma 2's final_logit_softcapping, as reference.Model.final_logits computes it)."""
    head = "embed_out" if model.cfg.arch == "gpt_neox" else "lm_head"
    lm = torch.from_numpy(pts[head])
    cap = getattr(model.cfg, "final_softcap", None)
    return (torch.tanh(lm / cap) * cap if cap is not None else lm).numpy()


def ref_greedy(model, prompt, max_new, stops=()):
    """The reference's greedy decoding: the full forward over the growing sequence each step."""
    seq = [int(t) for t in prompt]
    for _ in range(max_new):
        t = int(np.argmax(logits_of(model, model.forward(seq))[-1]))
        seq.append(t)
        if t in stops:
            break
    return seq


def expected_rows(prompts, finals):
    seq = np.concatenate([np.full(len(f), i, dtype=np.int64) for i, f in enumerate(finals)])
    pos = np.concatenate([np.arange(len(f), dtype=np.int64) for f in finals])
    # the prompt pass computes positions 0..P-1; step k feeds the k-th generated token, at P-1+k
    step = np.concatenate([np.concatenate([np.zeros(len(p), dtype=np.int64),
                                           np.arange(1, len(f) - len(p) + 1, dtype=np.int64)])
                           for p, f in zip(prompts, finals)])
    tok = np.concatenate([np.asarray(f, dtype=np.int64) for f in finals])
    return {H.ROWS_SEQ: seq, H.ROWS_POS: pos, ROWS_STEP: step, ROWS_TOKEN: tok}


def compare_rel(ref, got, label, stats=None):
    """H.compare_points per point with the bound REL * max(1, max|ref|); stats receives the worst
    relative difference and the names of the bit-identical points."""
    failures = []
    for name, r in ref.items():
        scale = float(np.max(np.abs(r))) if r.size and r.dtype != np.int64 else 0.0
        failures += H.compare_points({name: r}, {name: got[name]} if name in got else {},
                                     tol=REL * max(1.0, scale), label=label)
        if stats is not None and name in got and got[name].shape == r.shape:
            if np.array_equal(got[name], r):
                stats.setdefault("identical", set()).add(name)
            elif r.dtype != np.int64 and r.size:
                d = float(np.max(np.abs(got[name].astype(np.float64) - r.astype(np.float64))))
                stats["rel"] = max(stats.get("rel", 0.0), d / max(1.0, scale))
                stats.setdefault("differ", set()).add(name)
    return failures


def check_generation(model_dir, prompts, result, cap, expected=None, ref=None, label=""):
    """Checks one `actcap generate` result with its capture (see the module docstring); expected:
    the final sequences it must have produced. Returns (finals, reference points per sequence)."""
    ref = ref or reference.Model(str(model_dir))
    seqs = result["sequences"]
    assert len(seqs) == len(prompts), f"{label}{len(seqs)} sequences for {len(prompts)} prompts"
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        assert s["prompt_length"] == len(p), f"{label}seq {i}: {s}"
        assert s["tokens"][:len(p)] == list(p), f"{label}seq {i}: tokens do not start with the prompt"
        assert s["generated"] == len(s["tokens"]) - len(p), f"{label}seq {i}: {s}"
        assert s["finish"] in ("stop", "length"), f"{label}seq {i}: finish {s['finish']!r}"
    finals = tokens_of(result)
    if expected is not None:
        assert finals == expected, (
            f"{label}generated tokens differ from the reference's greedy decoding:\n"
            + "\n".join(f"  seq {i}: actcap {f[len(p):]} reference {e[len(p):]}"
                        for i, (p, f, e) in enumerate(zip(prompts, finals, expected)) if f != e))
    if cap is None:
        return finals, None
    manifest, tensors, meta = cap
    exp = expected_rows(prompts, finals)
    n_rows = len(exp[H.ROWS_SEQ])
    for key in (H.ROWS_SEQ, H.ROWS_POS, ROWS_STEP) + ((ROWS_TOKEN,) if ROWS_TOKEN in tensors else ()):
        assert key in tensors, f"{label}shard lacks {key}"
        assert tensors[key].dtype == np.int64, f"{label}{key} dtype {tensors[key].dtype}"
        assert np.array_equal(tensors[key], exp[key]), (
            f"{label}{key} = {tensors[key].tolist()}\n  expected {exp[key].tolist()}")
    n_gen = max(s["generated"] for s in seqs)
    assert result["forwards"] == 1 + n_gen, (
        f"{label}forwards {result['forwards']}: expected the prompt pass and {n_gen} decoding steps")

    refs = [ref.forward(f) for f in finals]
    names = set(tensors) - ROWS
    assert names == set(refs[0]), (
        f"{label}point sets differ:\n  only in actcap: {sorted(names - set(refs[0]))}\n"
        f"  only in reference: {sorted(set(refs[0]) - names)}")
    failures = []
    for i in range(len(finals)):
        sel = tensors[H.ROWS_SEQ] == i
        failures += compare_rel(refs[i], {k: tensors[k][sel] for k in names}, f"{label}seq {i}: ")
    assert not failures, f"{len(failures)} mismatches with the reference:\n" + "\n".join(failures[:40])

    assert manifest.get("format") == H.FORMAT and manifest.get("complete") is True, manifest.get("format")
    assert [s["file"] for s in manifest["shards"]] == ["shard-00000.safetensors"]
    assert manifest["shards"][0]["rows"] == n_rows
    assert set(manifest["points"]) == names, (
        f"{label}manifest points vs shard: only in manifest {sorted(set(manifest['points']) - names)}, "
        f"only in shard {sorted(names - set(manifest['points']))}")
    for name in names:
        assert tensors[name].shape[0] == n_rows, f"{label}{name}: {tensors[name].shape[0]} rows"
        assert manifest["points"][name]["shape"] == list(tensors[name].shape[1:]), name
    gen = manifest.get("generation")
    assert isinstance(gen, dict), f"{label}manifest lacks the generation object: {sorted(manifest)}"
    assert gen.get("sequences") == len(prompts), f"{label}manifest generation {gen}"
    return finals, refs


def verify(out):
    H.actcap("verify", out, check=True)


def assert_same_capture(a, b, label):
    """Bit-identical shard tensors (names, dtypes, shapes, bytes)."""
    ta, tb = a[1], b[1]
    assert set(ta) == set(tb), (f"{label}tensor sets differ: only in first {sorted(set(ta) - set(tb))}, "
                                f"only in second {sorted(set(tb) - set(ta))}")
    bad = [k for k in sorted(ta) if ta[k].dtype != tb[k].dtype or not np.array_equal(ta[k], tb[k])]
    worst = {k: float(np.max(np.abs(ta[k].astype(np.float64) - tb[k].astype(np.float64))))
             for k in bad if ta[k].shape == tb[k].shape and ta[k].size}
    assert not bad, (f"{label}{len(bad)} of {len(ta)} tensors differ, e.g. "
                     + ", ".join(f"{k} (max diff {worst.get(k, 'shape/dtype')})" for k in bad[:8]))


def split_used(manifest, n=3):
    devices = set(manifest["device_map"].values())
    assert len(devices) == n, f"--devices {n} placed the model on {sorted(devices)}"


def decode_rows_differ(dir_a, dir_b, finals, prompts, min_diff=1e-4):
    """The reference points of two checkpoints differ (by more than min_diff) at a row that
    decoding computes (position >= the prompt's length): the feature bites during decoding."""
    a = reference.run(str(dir_a), finals)
    b = reference.run(str(dir_b), finals)
    worst = 0.0
    for x, y, p in zip(a, b, prompts):
        for k in x:
            if x[k].dtype == np.float32 and k in y and x[k].shape == y[k].shape:
                worst = max(worst, float(np.max(np.abs(x[k][len(p):] - y[k][len(p):]))))
    return worst > min_diff


def arch_prompts(model_dir, lengths=LENGTHS, seed=0):
    return P.tokens_for(model_dir, lengths, seed=seed)


# ---------------------------------------------------------------------------------------------
# every architecture: greedy parity, rows, verify; a 3-device split
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def greedy_runs(models, tmp_path_factory):
    """greedy_runs(arch) -> dict(model, prompts, result, cap, out): one cached single-device
    greedy generation with capture of the tiny checkpoint, --ignore-eos."""
    root = tmp_path_factory.mktemp("generate")
    cache = {}

    def get(arch):
        if arch not in cache:
            m = models(arch)
            prompts = arch_prompts(m, seed=ARCHS.index(arch) + 100)
            out = root / f"{arch}-1"
            result, cap = generate(m, prompts, MAX_NEW, out=out, extra=["--ignore-eos"])
            cache[arch] = dict(model=m, prompts=prompts, result=result, cap=cap, out=out)
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_greedy_parity(greedy_runs, tmp_path, arch):
    g = greedy_runs(arch)
    m, prompts = g["model"], g["prompts"]
    ref = reference.Model(str(m))
    expected = [ref_greedy(ref, p, MAX_NEW) for p in prompts]
    finals, refs = check_generation(m, prompts, g["result"], g["cap"], expected=expected, ref=ref,
                                    label=f"{arch}: ")
    assert all(s["finish"] == "length" for s in g["result"]["sequences"])
    verify(g["out"])

    # one full forward of actcap itself over the final sequences (a padded batch)
    _, run_t, _ = H.run_capture(m, tmp_path / "run", finals, capture=CAPTURE)
    _, tensors, _ = g["cap"]
    names = set(tensors) - ROWS
    failures, stats_prompt, stats_decode = [], {}, {}
    for i, (p, f) in enumerate(zip(prompts, finals)):
        sel_g = tensors[H.ROWS_SEQ] == i
        sel_r = run_t[H.ROWS_SEQ] == i
        for part, rows, stats in (("prompt", slice(0, len(p)), stats_prompt),
                                  ("decoded", slice(len(p), len(f)), stats_decode)):
            failures += compare_rel({k: run_t[k][sel_r][rows] for k in names},
                                    {k: tensors[k][sel_g][rows] for k in names},
                                    f"{arch} vs actcap run, seq {i} {part} rows: ", stats)
    assert not failures, f"{len(failures)} mismatches with actcap run:\n" + "\n".join(failures[:40])
    for part, stats in (("prompt", stats_prompt), ("decoded", stats_decode)):
        same = stats.get("identical", set()) - stats.get("differ", set())
        print(f"figures generate {arch} {part} rows vs actcap run: {len(same)} of {len(names)} points "
              f"bit-identical, worst diff / max(1, |ref|) {stats.get('rel', 0.0):.3e}")


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_split_3_devices_identical(greedy_runs, tmp_path, arch):
    g = greedy_runs(arch)
    result, cap = generate(g["model"], g["prompts"], MAX_NEW, out=tmp_path / "o3", devices="3",
                           extra=["--ignore-eos"])
    split_used(cap[0])
    assert tokens_of(result) == tokens_of(g["result"]), (
        f"{arch}: --devices 3 generated {tokens_of(result)}, one device {tokens_of(g['result'])}")
    assert [s["finish"] for s in result["sequences"]] == [s["finish"] for s in g["result"]["sequences"]]
    assert_same_capture(g["cap"], cap, f"{arch} --devices 3 vs one device: ")
    verify(tmp_path / "o3")


# ---------------------------------------------------------------------------------------------
# sliding windows and soft-caps during decoding
# ---------------------------------------------------------------------------------------------

WINDOWED = {
    # arch: (config changes giving a window of 4, changes removing it)
    "mistral": (dict(sliding_window=4), dict(sliding_window=64)),
    "phi3": (dict(sliding_window=4), dict(sliding_window=64)),
    "qwen2": (dict(use_sliding_window=True, sliding_window=4, max_window_layers=2),
              dict(use_sliding_window=False)),
    "qwen3": (dict(use_sliding_window=True, sliding_window=4, max_window_layers=2),
              dict(use_sliding_window=False)),
}
WINDOW_LENGTHS = [2, 6, 3]  # one prompt past the window, two inside it: the window bites in decoding
WINDOW_NEW = 8


def windowed_checkpoints(models, tmp_path, case):
    if case in WINDOWED:
        on, off = WINDOWED[case]
        src = models(case)
        return P.with_config(src, tmp_path / "m", **on), P.with_config(src, tmp_path / "nowin", **off)
    if case == "gemma2":  # layers 0 and 2 slide (window 4), attention soft-cap 50
        return P._gemma2_synth(tmp_path, "m"), P._gemma2_synth(tmp_path, "nowin", sliding_window=64)
    if case == "gemma3_text":  # layers 0 and 2 local (window 4, their own RoPE base)
        return P._gemma3_synth(tmp_path, "m"), P._gemma3_synth(tmp_path, "nowin", sliding_window=64)
    raise AssertionError(case)


def check_variant(m, prompts, max_new, tmp_path, label, differs_from=None, what=""):
    """Greedy generation with capture on one device and on three: reference parity, verify,
    bit-identical split; differs_from: a checkpoint without the feature, whose reference must
    differ on the decoded rows (else the test proves nothing)."""
    ref = reference.Model(str(m))
    expected = [ref_greedy(ref, p, max_new) for p in prompts]
    if differs_from is not None:
        assert decode_rows_differ(m, differs_from, expected, prompts), (
            f"{label}: {what} does not change the reference's decoded rows")
    one = generate(m, prompts, max_new, out=tmp_path / "o1", extra=["--ignore-eos"])
    check_generation(m, prompts, *one, expected=expected, ref=ref, label=f"{label}: ")
    verify(tmp_path / "o1")
    three = generate(m, prompts, max_new, out=tmp_path / "o3", devices="3", extra=["--ignore-eos"])
    split_used(three[1][0])
    assert tokens_of(three[0]) == tokens_of(one[0]), f"{label}: --devices 3 generated other tokens"
    assert_same_capture(one[1], three[1], f"{label} --devices 3 vs one device: ")


@pytest.mark.parametrize("case", ["mistral", "phi3", "qwen2", "qwen3", "gemma2", "gemma3_text"])
def test_generate_sliding_window_in_decoding(models, tmp_path, case):
    """A window of 4 over sequences of 10 to 14 tokens; the 2- and 3-token prompts fit in it, so
    only the decoding steps see keys fall out of the window."""
    m, nowin = windowed_checkpoints(models, tmp_path, case)
    windows = reference.Config(H.load_config(m)).windows
    assert 4 in windows, f"{case}: windows {windows}"
    prompts = arch_prompts(m, WINDOW_LENGTHS, seed=200 + len(case))
    check_variant(m, prompts, WINDOW_NEW, tmp_path, f"{case} window 4", differs_from=nowin,
                  what="the sliding window")


def test_generate_gemma2_softcap_bites_in_decoding(actcap_bin, tmp_path):
    """attn_logit_softcapping 0.3 (scores of several units: tanh saturates) with the window of 4 on
    layers 0 and 2: the cap changes the decoded rows, and generation matches the reference."""
    m = P._gemma2_synth(tmp_path, "m", attn_logit_softcapping=0.3)
    nocap = P._gemma2_synth(tmp_path, "nocap", attn_logit_softcapping=None)
    assert reference.Config(H.load_config(m)).windows == [4, None, 4]
    prompts = arch_prompts(m, [3, 7, 5], seed=71)
    check_variant(m, prompts, 7, tmp_path, "gemma2 softcap 0.3", differs_from=nocap,
                  what="the attention soft-cap")


# ---------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------

SAMPLE = ["--temperature", "0.8", "--top-k", "5", "--ignore-eos"]
SAMPLE_NEW = 10


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_generate_sampling(models, tmp_path, arch):
    m = models(arch)
    prompts = arch_prompts(m, [4, 6], seed=300)
    ref = reference.Model(str(m))
    greedy = [ref_greedy(ref, p, SAMPLE_NEW) for p in prompts]

    a, _ = generate(m, prompts, SAMPLE_NEW, extra=SAMPLE + ["--seed", "3"])
    b, _ = generate(m, prompts, SAMPLE_NEW, extra=SAMPLE + ["--seed", "3"])
    assert tokens_of(a) == tokens_of(b), "the same seed sampled different tokens"
    c, _ = generate(m, prompts, SAMPLE_NEW, devices="3", extra=SAMPLE + ["--seed", "3"])
    assert tokens_of(c) == tokens_of(a), "--devices 3 sampled other tokens than one device"
    d, _ = generate(m, prompts, SAMPLE_NEW, extra=SAMPLE + ["--seed", "4"])
    # 20 tokens drawn among 5 each: seeds 3 and 4 agreeing everywhere would be a broken generator
    assert tokens_of(d) != tokens_of(a), "seeds 3 and 4 sampled the same 20 tokens"
    assert tokens_of(a) != greedy, "temperature 0.8, top-k 5 sampled exactly the greedy tokens"
    assert all(s["finish"] == "length" and s["generated"] == SAMPLE_NEW for s in a["sequences"])

    # every sampled token is among the 5 most likely of the reference's logits at its position
    for i, (p, f) in enumerate(zip(prompts, tokens_of(a))):
        logits = logits_of(ref, ref.forward(f))
        for t in range(len(p), len(f)):
            row = logits[t - 1]
            fifth = np.sort(row)[-5]
            assert row[f[t]] >= fifth - 1e-4, (
                f"seq {i} position {t}: sampled {f[t]} (logit {row[f[t]]:.6g}) is not in the top 5 "
                f"(5th largest {fifth:.6g})")

    # capturing does not change what is sampled, and the capture matches the reference
    e = generate(m, prompts, SAMPLE_NEW, out=tmp_path / "cap", extra=SAMPLE + ["--seed", "3"])
    assert tokens_of(e[0]) == tokens_of(a), "--capture changed the sampled tokens"
    check_generation(m, prompts, *e, ref=ref, label=f"{arch} sampled: ")
    verify(tmp_path / "cap")

    # top-k 1, or a top-p keeping only the most likely token, is greedy
    k1, _ = generate(m, prompts, SAMPLE_NEW,
                     extra=["--temperature", "0.8", "--top-k", "1", "--seed", "3", "--ignore-eos"])
    assert tokens_of(k1) == greedy, "--top-k 1 is not greedy"
    p0, _ = generate(m, prompts, SAMPLE_NEW,
                     extra=["--temperature", "0.8", "--top-p", "1e-6", "--seed", "3", "--ignore-eos"])
    assert tokens_of(p0) == greedy, "--top-p 1e-6 is not greedy"


# ---------------------------------------------------------------------------------------------
# stop tokens
# ---------------------------------------------------------------------------------------------

STOP_NEW = 6


def stop_case(ref, vocab):
    """Prompts [3, 7, 5] (the first seed that works) and two stop tokens: sequence 0's 2nd greedy
    token (not its 1st), sequence 2's 4th (not among its first three), neither in sequence 1's
    continuation (it runs to the length)."""
    for seed in range(400, 450):
        prompts = H.random_tokens(vocab, [3, 7, 5], seed=seed)
        g = [ref_greedy(ref, p, STOP_NEW)[len(p):] for p in prompts]
        s0, s2 = g[0][1], g[2][3]
        if s0 != g[0][0] and s2 not in g[2][:3] and s0 not in g[2][:4] and not {s0, s2} & set(g[1]):
            return prompts, [s0, s2]
    raise AssertionError("no prompt seed gives a usable stop-token case")


def test_generate_stop_tokens(models, tmp_path):
    m = models("llama")
    ref = reference.Model(str(m))
    prompts, stops = stop_case(ref, ref.cfg.vocab_size)
    expected = [ref_greedy(ref, p, STOP_NEW, stops=set(stops)) for p in prompts]
    assert [len(e) - len(p) for e, p in zip(expected, prompts)] == [2, STOP_NEW, 4]

    stop_args = ["--stop-token", *map(str, stops), "--ignore-eos"]
    one = generate(m, prompts, STOP_NEW, out=tmp_path / "o1", extra=stop_args)
    check_generation(m, prompts, *one, expected=expected, ref=ref, label="llama stop tokens: ")
    seqs = one[0]["sequences"]
    assert [s["finish"] for s in seqs] == ["stop", "length", "stop"], seqs
    assert [s["generated"] for s in seqs] == [2, STOP_NEW, 4], seqs
    assert seqs[0]["tokens"][-1] == stops[0] and seqs[2]["tokens"][-1] == stops[1]
    verify(tmp_path / "o1")

    three = generate(m, prompts, STOP_NEW, out=tmp_path / "o3", devices="3", extra=stop_args)
    assert tokens_of(three[0]) == expected, "--devices 3 with stop tokens"
    assert_same_capture(one[1], three[1], "stop tokens, --devices 3 vs one device: ")

    # without a capture the last tokens are not fed back: the same tokens
    plain, _ = generate(m, prompts, STOP_NEW, extra=stop_args)
    assert tokens_of(plain) == expected
    assert [s["finish"] for s in plain["sequences"]] == ["stop", "length", "stop"]

    # the config's eos_token_id stops a sequence the same way (unless --ignore-eos)
    eos = P.with_config(m, tmp_path / "eos", eos_token_id=stops[0])
    by_eos, _ = generate(eos, prompts, STOP_NEW)
    assert tokens_of(by_eos) == [ref_greedy(ref, p, STOP_NEW, stops={stops[0]}) for p in prompts]
    assert by_eos["sequences"][0]["finish"] == "stop" and by_eos["sequences"][0]["generated"] == 2
    ignored, _ = generate(eos, prompts, STOP_NEW, extra=["--ignore-eos"])
    assert tokens_of(ignored) == [ref_greedy(ref, p, STOP_NEW) for p in prompts]
