"""CLI behaviour of the device options: plan, split runs, budgets, explicit maps, faults, doctor."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cli import one_error_line, run  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import st  # noqa: E402  minimal safetensors reader written from the spec


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    run("init-model", "--arch", "llama", "--preset", "tiny", "--seed", "5", "--out", d, check=0)
    return d


def test_plan_json_has_accelerate_map_and_table(llama):
    p = run("plan", llama, "--devices", "cpu:0,cpu:1,cpu:2", "--batch", "2", "--seq", "16", "--json", check=0)
    j = json.loads(p.stdout)
    dm = j["device_map"]
    assert dm["model.embed_tokens"] == "cpu:0" and dm["lm_head"] == "cpu:2"
    assert {f"model.layers.{i}" for i in range(4)} <= set(dm)
    assert set(dm.values()) == {"cpu:0", "cpu:1", "cpu:2"}
    assert [d["device"] for d in j["devices"]] == ["cpu:0", "cpu:1", "cpu:2"]
    for d in j["devices"]:
        assert d["total"] == d["weights"] + d["workspace"] + d["reserve"]


def test_split_run_files_identical_to_single_device(llama, tmp_path):
    outs = []
    for devices in ["cpu", "3", "cpu:0,cpu:1,cpu:2,cpu:3"]:
        out = tmp_path / devices.replace(",", "_").replace(":", "")
        run("run", llama, "--tokens", "1,2,3,4,5,6;7,8", "--capture", "**", "**:input", "--devices", devices,
            "--out", out, check=0)
        outs.append(out)
    shards = [open(o / "shard-00000.safetensors", "rb").read() for o in outs]
    assert shards[0] == shards[1] == shards[2]
    manifest = json.loads(open(outs[1] / "manifest.json").read())
    assert manifest["device_map"]["model.layers.3"] in {"cpu:1", "cpu:2"}


@pytest.mark.parametrize("arch,layers", [("gpt2", "transformer.h"), ("mistral", "model.layers"),
                                         ("qwen2", "model.layers"), ("qwen3", "model.layers"),
                                         ("olmo", "model.layers"), ("olmo2", "model.layers"),
                                         ("olmo3", "model.layers"), ("smollm3", "model.layers"),
                                         ("gemma", "model.layers"),
                                         ("gemma2", "model.layers"),
                                         ("gemma3_text", "model.layers"), ("gpt_neox", "gpt_neox.layers"),
                                         ("gptj", "transformer.h"), ("gpt_neo", "transformer.h"),
                                         ("opt", "model.decoder.layers"),
                                         ("phi", "model.layers"),
                                         ("phi3", "model.layers")])
def test_split_run_files_identical_to_single_device_per_arch(actcap_bin, tmp_path, arch, layers):
    """As above for the other families: 3 devices write the same shard bytes as one (every point,
    Qwen3's q_norm / k_norm included)."""
    m = tmp_path / "m"
    run("init-model", "--arch", arch, "--preset", "tiny", "--seed", "5", "--out", m, check=0)
    outs = []
    for devices in ["cpu", "3"]:
        out = tmp_path / f"o{devices}"
        run("run", m, "--tokens", "1,2,3,4,5,6,7,8,9,10,11;7,8", "--capture", "**", "**:input", "--devices", devices,
            "--out", out, check=0)
        outs.append(out)
    shards = [open(o / "shard-00000.safetensors", "rb").read() for o in outs]
    assert shards[0] == shards[1]
    manifest = json.loads(open(outs[1] / "manifest.json").read())
    assert set(manifest["device_map"].values()) == {"cpu:0", "cpu:1", "cpu:2"}
    assert manifest["device_map"][f"{layers}.3"] in {"cpu:1", "cpu:2"}
    if arch in ("qwen3", "gemma3_text"):
        assert "model.layers.3.self_attn.q_norm" in manifest["points"]


# `compare` over 3 devices for every family: tests/integration/test_families.py; Gemma 3's variants
# (a final cap that bites, a multimodal checkpoint) here.


def _gemma3_variant(tmp_path, variant):
    """init-model's tiny Gemma 3 (layers 0, 1, 3 local with window 4, layer 2 global), with a final
    soft-cap of 0.5 that bites ("capped"), or rewritten as a Gemma3ForConditionalGeneration
    checkpoint in the Hub's older key layout with a vision tensor beside it ("multimodal")."""
    m = tmp_path / "m"
    run("init-model", "--arch", "gemma3_text", "--preset", "tiny", "--seed", "5", "--out", m, check=0)
    cfg = json.loads((m / "config.json").read_text())
    if variant == "capped":
        cfg["final_logit_softcapping"] = 0.5
    else:
        text = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
        cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text}
        w = st.load_checkpoint(str(m))
        w = {k.replace("model.", "language_model.model.", 1): v for k, v in w.items()}
        w["vision_tower.vision_model.post_layernorm.weight"] = np.ones(8, np.float32)
        st.save(str(m / "model.safetensors"), w, metadata={"format": "pt"})
    (m / "config.json").write_text(json.dumps(cfg))
    return m


@pytest.mark.parametrize("variant", ["capped", "multimodal"])
def test_compare_3_devices_bit_identical_gemma3(actcap_bin, tmp_path, variant):
    """Gemma 3 over 3 devices: every point and the model's logits (capped after lm_head in the head
    stage) bit-identical to one device; a multimodal checkpoint places HF's module names
    (model.language_model.layers.N, lm_head)."""
    m = _gemma3_variant(tmp_path, variant)
    p = run("compare", m, "--tokens", "1,2,3,4,5,6,7,8,9,10,11;7,8", "--capture", "**", "**:input",
            "--devices", "3", "--json", check=0)
    j = json.loads(p.stdout)
    assert j["equal"] and all(r["equal"] for r in j["points"])
    assert set(j["device_map"].values()) == {"cpu:0", "cpu:1", "cpu:2"}
    base = "model.language_model" if variant == "multimodal" else "model"
    assert {"logits", "lm_head", f"{base}.layers.3.self_attn.k_norm"} <= {r["point"] for r in j["points"]}
    assert {f"{base}.embed_tokens", f"{base}.layers.2", f"{base}.norm", "lm_head"} <= set(j["device_map"])


def test_impossible_budget_is_exit_2_with_per_device_needs(llama, tmp_path):
    p = run("run", llama, "--tokens", "1,2,3", "--capture", "lm_head", "--devices", "2",
            "--max-memory", "cpu:0=10KiB,cpu:1=10KiB", "--out", tmp_path / "o")
    assert p.returncode == 2
    line = one_error_line(p)
    assert "does not fit" in line and "cpu:0" in line and "cpu:1" in line
    assert not (tmp_path / "o" / "manifest.json").exists()


@pytest.mark.parametrize("mapping,needle", [
    ({"model.embed_tokens": "cpu:0", "model.layers": "cpu:1", "model.norm": "cpu:1", "lm_head": "cpu:1",
      "model.bogus": "cpu:0"}, "model.bogus"),
    ({"model.embed_tokens": "cpu:0", "model.layers": "cpu:1", "lm_head": "cpu:1"}, "model.norm"),
    ({"": "cpu:0", "model.layers.1.mlp": "cpu:1"}, "model.layers.1.mlp"),
    ({"": "cpu:7"}, "cpu:7"),
])
def test_bad_explicit_maps_are_exit_2_naming_them(llama, tmp_path, mapping, needle):
    f = tmp_path / "map.json"
    f.write_text(json.dumps(mapping))
    p = run("plan", llama, "--devices", "cpu:0,cpu:1", "--device-map", f)
    assert p.returncode == 2
    assert needle in one_error_line(p)


def test_scrambled_explicit_map_runs(llama, tmp_path):
    f = tmp_path / "map.json"
    f.write_text(json.dumps({"model.embed_tokens": "cpu:2", "model.layers.0": "cpu:0", "model.layers.1": "cpu:2",
                             "model.layers.2": "cpu:1", "model.layers.3": "cpu:0", "model.norm": "cpu:1",
                             "lm_head": "cpu:2"}))
    ref = tmp_path / "ref"
    out = tmp_path / "out"
    run("run", llama, "--tokens", "9,8,7,6", "--capture", "**", "--out", ref, check=0)
    run("run", llama, "--tokens", "9,8,7,6", "--capture", "**", "--device-map", f, "--out", out, check=0)
    assert open(ref / "shard-00000.safetensors", "rb").read() == open(out / "shard-00000.safetensors", "rb").read()


def test_injected_transfer_fault_is_exit_1_naming_pair(llama, tmp_path):
    p = run("run", llama, "--tokens", "1,2,3", "--capture", "model.layers.*", "--devices", "3", "--out",
            tmp_path / "o", env={"ACTCAP_FAULT": "transfer:cpu:1->cpu:2:bitflip"})
    assert p.returncode == 1
    line = one_error_line(p)
    assert "cpu:1" in line and "cpu:2" in line
    assert not (tmp_path / "o" / "manifest.json").exists()
    # Skipping verification lets the damage through silently: that is what the check is for.
    run("run", llama, "--tokens", "1,2,3", "--capture", "lm_head", "--out", tmp_path / "r", check=0)
    run("run", llama, "--tokens", "1,2,3", "--capture", "lm_head", "--devices", "3", "--no-verify-transfers",
              "--out", tmp_path / "b", env={"ACTCAP_FAULT": "transfer:cpu:1->cpu:2:bitflip"}, check=0)
    assert open(tmp_path / "r" / "shard-00000.safetensors", "rb").read() != \
        open(tmp_path / "b" / "shard-00000.safetensors", "rb").read()


def test_doctor(tmp_path):
    ok = run("doctor", "--devices", "3", "--json", check=0)
    assert json.loads(ok.stdout)["ok"] is True
    bad = run("doctor", "--devices", "cpu:0,cpu:1,cpu:2", "--json",
              env={"ACTCAP_FAULT": "transfer:cpu:2->cpu:1:zeros"})
    assert bad.returncode == 1
    links = {(l["src"], l["dst"]): l["ok"] for l in json.loads(bad.stdout)["links"]}
    assert links[("cpu:2", "cpu:1")] is False
    assert sum(not v for v in links.values()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--devices", "cpu:0,cpu:0"], "cpu:0"),
    (["--devices", "gpu:1"], "gpu:1"),
    (["--max-memory", "cpu:0=12XB", "--devices", "2"], "12XB"),
    (["--device-map", "/nonexistent.json"], "/nonexistent.json"),
])
def test_bad_device_options_are_exit_2(args, needle):
    p = run("plan", "demo", *args)
    assert p.returncode == 2
    assert needle in one_error_line(p)


def test_plan_reserves_logits_only_when_the_head_runs(llama, tmp_path):
    # run/extract skip an uncaptured lm_head, so `plan --capture` (their plan) reserves no logits
    # workspace for it; a plain plan (a full forward) and a capture of lm_head do.
    dm = {"model.embed_tokens": "cpu:0", "model.norm": "cpu:0", "lm_head": "cpu:1"}
    dm.update({f"model.layers.{i}": "cpu:0" for i in range(4)})
    path = tmp_path / "map.json"
    path.write_text(json.dumps(dm))
    vocab = json.loads((llama / "config.json").read_text())["vocab_size"]

    def head_workspace(*capture):
        p = run("plan", llama, "--devices", "cpu:0,cpu:1", "--device-map", path, "--batch", "2", "--seq", "16",
                *(["--capture", *capture] if capture else []), "--json", check=0)
        return {d["device"]: d["workspace"] for d in json.loads(p.stdout)["devices"]}["cpu:1"]

    full = head_workspace()
    assert head_workspace("model.layers.0") == full - 2 * 16 * vocab * 4
    assert head_workspace("lm_head") == full
    assert head_workspace("lm_head:input") == full


def test_doctor_and_plan_route_a_link_that_corrupts_direct_copies_through_the_host(tmp_path):
    env = {"ACTCAP_FAULT": "transfer:cpu:1->cpu:2:bitflip-direct"}
    d = run("doctor", "--devices", "cpu:0,cpu:1,cpu:2", "--json", env=env, check=0)
    assert d.returncode == 0, d.stderr
    routes = {(l["src"], l["dst"]): l["route"] for l in json.loads(d.stdout)["links"]}
    assert routes[("cpu:1", "cpu:2")] == "host"
    assert sum(r != "direct" for r in routes.values()) == 1
    text = run("doctor", "--devices", "cpu:0,cpu:1,cpu:2", env=env, check=0).stdout
    assert "OK via host" in text and "route them through the host" in text
    plan = run("plan", "demo", "--devices", "3", env=env, check=0)
    assert "link cpu:1 -> cpu:2: through host memory" in plan.stdout, plan.stdout + plan.stderr
    # The run: exact (same shard as without the fault), copies over the link staged through the host.
    base = run("run", "demo", "--tokens", "1,2,3;4,5", "--capture", "transformer.h.*", "--devices", "3",
               "--out", tmp_path / "a", "--json")
    routed = run("run", "demo", "--tokens", "1,2,3;4,5", "--capture", "transformer.h.*", "--devices", "3",
                 "--out", tmp_path / "b", "--json", env=env)
    t = json.loads(routed.stdout)["transfers"]
    assert t["via_host"] == 1 and t["retried"] == 0 and t["faults_injected"] == 0
    assert json.loads(base.stdout)["transfers"]["via_host"] == 0
    assert open(tmp_path / "a" / "shard-00000.safetensors", "rb").read() == \
        open(tmp_path / "b" / "shard-00000.safetensors", "rb").read()


def test_copy_window_zero_copies_in_the_hook_and_changes_no_byte(tmp_path):
    args = ["run", "demo", "--tokens", "1,2,3;4,5", "--capture", "transformer.h.*", "--devices", "3"]
    run(*args, "--out", tmp_path / "a", check=0)
    run(*args, "--out", tmp_path / "b", "--copy-window", "0", check=0)
    run(*args, "--out", tmp_path / "c", "--copy-window", "1", check=0)  # a hook waits for each copy
    a = open(tmp_path / "a" / "shard-00000.safetensors", "rb").read()
    for other in ("b", "c"):
        assert open(tmp_path / other / "shard-00000.safetensors", "rb").read() == a
    bad = run(*args, "--out", tmp_path / "d", "--copy-window", "lots")
    assert bad.returncode == 2 and "--copy-window" in one_error_line(bad)
