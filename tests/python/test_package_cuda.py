"""SafeCapturer on a GPU: asynchronous device->host copies read before they landed, and a real
transformers model dispatched by accelerate over cuda:0 + cpu (blocks running on each, checked),
naive capture against safe.
Skipped where torch sees no CUDA device; the GPU check kit runs them on a GPU machine with
ACTCAP_REQUIRE_CUDA=1, where what would skip them (no device, no transformers or accelerate) fails
instead, so that a broken setup cannot pass as a clean run."""
import importlib
import os

import pytest
import torch

from hf_modules import GPT2LMHeadModel

REQUIRE = os.environ.get("ACTCAP_REQUIRE_CUDA") == "1"

if not torch.cuda.is_available():
    if REQUIRE:
        raise RuntimeError(f"ACTCAP_REQUIRE_CUDA=1 but torch {torch.__version__} sees no CUDA device "
                           f"(built with CUDA {torch.version.cuda})")
    pytestmark = pytest.mark.skip(reason="needs a CUDA device")


def need(module):
    """The module, or a skip (a failure under ACTCAP_REQUIRE_CUDA=1)."""
    if not REQUIRE:
        return pytest.importorskip(module)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"ACTCAP_REQUIRE_CUDA=1 but {module} cannot be imported: {e}")


def hidden(output):
    """A block's hidden states: transformers 4.x blocks return a tuple, 5.x the tensor itself."""
    return output[0] if isinstance(output, tuple) else output


def test_a_non_blocking_copy_read_early_is_wrong_and_safe_capture_fences(ac):
    model = GPT2LMHeadModel.random(n_embd=256, n_layer=4).cuda()
    ids = torch.randint(0, 256, (8, 64), device="cuda")
    naive = {}

    def early(module, args, output):
        torch.cuda._sleep(200_000_000)  # the stream is busy: the copy below lands late
        naive[module] = output[0].to("cpu", non_blocking=True)

    hs = [b.register_forward_hook(early) for b in model.transformer.h]
    with torch.inference_mode(), ac.SafeCapturer(model, "transformer.h.*") as cap:
        model(ids)
        read_now = [t.clone() for t in naive.values()]  # read before any synchronize
    for h in hs:
        h.remove()
    torch.cuda.synchronize()
    truth = [t for t in naive.values()]  # landed by now
    early_wrong = sum(not torch.equal(a, b) for a, b in zip(read_now, truth))
    print(f"naive non_blocking copies read early: {early_wrong}/{len(truth)} wrong")
    # H3: the GPU sleeps 0.1 s before each block's copy, so the reads above ran before most landed.
    assert early_wrong > 0, "every non_blocking copy had landed before it was read: the test shows nothing"
    for i, t in enumerate(truth):
        assert torch.equal(cap.get(f"transformer.h.{i}"), t)
    cap.verify()


def test_transformers_model_dispatched_over_cuda_and_cpu_naive_vs_safe(ac):
    transformers = need("transformers")
    accelerate = need("accelerate")
    cfg = transformers.GPT2Config(n_layer=6, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.load_state_dict(ref.state_dict())
    device_map = {"transformer.wte": 0, "transformer.wpe": 0, "transformer.drop": 0,
                  **{f"transformer.h.{i}": (0 if i < 3 else "cpu") for i in range(6)},
                  "transformer.ln_f": "cpu", "lm_head": "cpu"}
    # main_device="cpu": otherwise accelerate runs the "cpu" blocks on cuda:0 (their weights
    # offloaded to the host and streamed in), and nothing runs on the CPU
    model = accelerate.dispatch_model(model, device_map=device_map, main_device="cpu")
    ids = torch.randint(0, 1000, (4, 32))
    truth = {}
    hs = [b.register_forward_hook(lambda m, a, o, i=i: truth.__setitem__(i, hidden(o).detach().clone()))
          for i, b in enumerate(ref.transformer.h)]
    with torch.inference_mode():
        ref(ids)
    for h in hs:
        h.remove()
    naive, ran_on = {}, {}

    def keep(i, o):
        naive[i] = hidden(o)
        ran_on[i] = hidden(o).device.type
    hs = [b.register_forward_hook(lambda m, a, o, i=i: keep(i, o)) for i, b in enumerate(model.transformer.h)]
    with torch.inference_mode(), ac.SafeCapturer(model, "transformer.h.*") as cap:
        model(ids.to("cuda:0"))
        model(torch.randint(0, 1000, (4, 32)).to("cuda:0"))  # a second step reuses memory
    for h in hs:
        h.remove()
    # the model really is split: each block's output is where the device map put it
    assert ran_on == {i: "cuda" if i < 3 else "cpu" for i in range(6)}, ran_on
    wrong = sum(not torch.allclose(naive[i].float().cpu(), truth[i], atol=1e-4) for i in range(6))
    print(f"naive bare references after two steps: {wrong}/6 differ from step 0's true outputs")
    # H6: the naive dict keeps one tensor per block, the second step's; SafeCapturer keeps both calls.
    assert wrong > 0
    for i in range(6):
        got = cap.get(f"transformer.h.{i}", call=0)
        assert got.device.type == "cpu"
        assert torch.allclose(got, truth[i], atol=1e-4, rtol=1e-4), i
    cap.verify()
