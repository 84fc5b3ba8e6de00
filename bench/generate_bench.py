#!/usr/bin/python3
"""Decoding with the KV cache against the same greedy decoding without one (a full forward of the
growing sequence per new token, timed around the forward alone), in one process, alternated round by
round.

  /usr/bin/python3 bench/generate_bench.py --model build/bench-models/gpt2-small --prompt 32 \\
      --new 32 --batch 1 --rounds 3

Arms: `cached` (Engine.generate, greedy), `cached+capture` (the same, capturing every block
output), `no cache` (one forward of the whole sequence per step: the prompt pass of a one-token
generate(), whose time excludes placement; argmax). Reports the
per-new-token time of each (median over rounds) and the ratio no cache / cached; checks that both
decodings produce the same tokens. Needs the Python package (make build) and torch.
"""
import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
import actcap  # noqa: E402


def blocks(engine):
    return "transformer.h.*" if engine.config["arch"] == "gpt2" else "model.layers.*"


def no_cache(engine, prompts, new):
    """Greedy decoding by a full forward of the growing sequences per token: generate() of one
    token from each length, timing its prompt pass (the forward alone: placement is outside)."""
    seqs = [list(p) for p in prompts]
    total = 0.0
    for _ in range(new):
        g = engine.generate(seqs, max_new_tokens=1, stop_at_eos=False)
        total += g.prompt_seconds
        seqs = [s.tokens for s in g.sequences]
    return total / new, seqs


def cached(engine, prompts, new, capture=None):
    g = engine.generate(prompts, capture, max_new_tokens=new, stop_at_eos=False)
    return g.decode_seconds / max(1, new - (0 if capture else 1)) if new > 1 else g.decode_seconds, \
        [s.tokens for s in g.sequences]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--devices", default=None)
    a = ap.parse_args()
    engine = actcap.load(a.model, devices=a.devices)
    vocab = engine.config["vocab_size"]
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, min(vocab, 256), (a.batch, a.prompt), generator=g).tolist()
    times = {"cached": [], "cached+capture": [], "no cache": []}
    for _ in range(a.rounds):
        t, tok_a = cached(engine, prompts, a.new)
        times["cached"].append(t)
        t, tok_c = cached(engine, prompts, a.new, blocks(engine))
        times["cached+capture"].append(t)
        t, tok_b = no_cache(engine, prompts, a.new)
        times["no cache"].append(t)
        assert tok_a == tok_b == tok_c, "cached and uncached greedy decoding differ"
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model}: batch {a.batch}, prompt {a.prompt}, {a.new} new tokens, {a.rounds} rounds, "
          f"{torch.get_num_threads()} threads; same tokens in every arm")
    print("| arm | ms per new token (median) | min | max |")
    print("| --- | --- | --- | --- |")
    for k, v in times.items():
        print(f"| {k} | {1e3 * med[k]:.2f} | {1e3 * min(v):.2f} | {1e3 * max(v):.2f} |")
    print(f"no cache / cached: {med['no cache'] / med['cached']:.2f}x; "
          f"capture of every block output while decoding: {100 * (med['cached+capture'] / med['cached'] - 1):+.1f}%")


if __name__ == "__main__":
    main()
