#!/usr/bin/python3
"""actcap.SafeCapturer's cost from Python, side by side in one process (BENCHMARKS.md item 10).

1. Whole forward: a GPT-2-small-shaped PyTorch model (tests/python/hf_modules.py: 12 blocks,
   768 wide, 12 heads, vocabulary 50257, LM head; random weights), batch x tokens of input ids,
   every block output captured. Three arms, run in a rotated order each round:
     none   no hooks
     seed   the seed's hooks: outputs[name] = output[0].detach().clone().cpu()
     safe   actcap.SafeCapturer(model, "transformer.h.*") (copy, fingerprint, verified get())
   Reported: the median forward time per arm and the per-round ratios safe/none and safe/seed
   (median over rounds). The `safe` arm also reads every snapshot back through get() (verified)
   after its forward, inside its timing, as a user would.
2. Per-hook overhead: a chain of `--hooks` tiny modules (torch.nn.Identity on a [1, 8, 64] float
   tensor), each one captured; (time with capture - time without) / hooks, in microseconds, for
   the seed's hook and for SafeCapturer (nnsight publishes 30-80 us per saved value).

  PYTHONPATH=build/python /usr/bin/python3 bench/python_capture.py --rounds 25 [--keep-freed-memory]
"""
import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))

import actcap  # noqa: E402
from hf_modules import GPT2LMHeadModel  # noqa: E402


def seed_hooks(model, names):
    """The seed's capture: keep a detached CPU clone of each output."""
    outputs = {}
    modules = dict(model.named_modules())

    def make(name):
        def hook(module, args, output):
            t = output[0] if isinstance(output, tuple) else output
            outputs[name] = t.detach().clone().cpu()
        return hook

    return outputs, [modules[n].register_forward_hook(make(n)) for n in names]


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(arms, rounds):
    """One warm-up call of each arm, then `rounds` rounds of each, the order rotated every round;
    {arm: [seconds per round]}."""
    for fn in arms.values():
        fn()
    times = {k: [] for k in arms}
    order = list(arms)
    for r in range(rounds):
        for k in order[r % len(order):] + order[:r % len(order)]:
            times[k].append(timed(arms[k]))
    return times


def forward_bench(args):
    model = GPT2LMHeadModel.random(n_layer=12, n_embd=768, n_head=12, vocab_size=50257,
                                   n_positions=1024)
    ids = torch.randint(0, 50257, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0))
    names = [f"transformer.h.{i}" for i in range(12)]

    def none():
        with torch.inference_mode():
            model(ids)

    def seed():
        outputs, handles = seed_hooks(model, names)
        try:
            with torch.inference_mode():
                model(ids)
        finally:
            for h in handles:
                h.remove()
        assert len(outputs) == 12

    def safe():
        with torch.inference_mode(), actcap.SafeCapturer(model, "transformer.h.*") as cap:
            model(ids)
        got = [cap.get(n) for n in names]  # fenced, fingerprint-checked reads
        assert len(got) == 12 and got[0].shape == (args.batch, args.tokens, 768)

    times = alternate({"none": none, "seed": seed, "safe": safe}, args.rounds)
    arms = times
    med = {k: statistics.median(v) for k, v in times.items()}
    safe_none = statistics.median(s / n for s, n in zip(times["safe"], times["none"]))
    safe_seed = statistics.median(s / n for s, n in zip(times["safe"], times["seed"]))
    print(f"GPT-2-small-shaped forward, {args.batch}x{args.tokens} tokens, 12 block outputs "
          f"captured ({12 * args.batch * args.tokens * 768 * 4 / 2**20:.1f} MiB), "
          f"{args.rounds} rounds, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for k in arms:
        print(f"  {k:5s} median {med[k] * 1e3:8.1f} ms")
    print(f"  safe/none {safe_none:.3f}   safe/seed {safe_seed:.3f}  (median of per-round ratios)")
    return safe_none, safe_seed


def per_hook_bench(args):
    n = args.hooks
    model = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(n)])
    x = torch.randn(1, 8, 64)
    names = [str(i) for i in range(n)]
    reps = 20

    def none():
        with torch.inference_mode():
            for _ in range(reps):
                model(x)

    def seed():
        outputs, handles = seed_hooks(model, names)
        try:
            with torch.inference_mode():
                for _ in range(reps):
                    model(x)
        finally:
            for h in handles:
                h.remove()

    def safe():
        with torch.inference_mode(), actcap.SafeCapturer(model, "*") as cap:
            for _ in range(reps):
                model(x)
        cap.close()

    times = alternate({"none": none, "seed": seed, "safe": safe}, args.rounds)
    per = {k: statistics.median((t - b) / (n * reps) * 1e6 for t, b in zip(times[k], times["none"]))
           for k in ("seed", "safe")}
    print(f"per-hook overhead, {n} captured Identity modules on a [1, 8, 64] float32 tensor, "
          f"{reps} forwards x {args.rounds} rounds:")
    print(f"  seed hook (detach().clone().cpu())  {per['seed']:6.1f} us per captured value")
    print(f"  SafeCapturer                        {per['safe']:6.1f} us per captured value")
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hooks", type=int, default=200)
    ap.add_argument("--keep-freed-memory", action="store_true",
                    help="actcap.keep_freed_memory() first (glibc keeps freed memory, as actcap's CLI does)")
    args = ap.parse_args()
    if args.keep_freed_memory:
        assert actcap.keep_freed_memory()
        print("actcap.keep_freed_memory(): glibc keeps freed memory")
    forward_bench(args)
    per_hook_bench(args)


if __name__ == "__main__":
    main()
