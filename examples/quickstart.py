"""The Python quick start (README.md, docs/python.md):  PYTHONPATH=build/python python3 examples/quickstart.py"""
import sys
import tempfile

import torch

import actcap

# 1. Your own model: every block's output, padding left out, verified.
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
                              for _ in range(4)])
x = torch.randn(2, 5, 16)                       # [batch, seq, hidden]
mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # sequence 0 is left-padded
with actcap.SafeCapturer(model, "*") as cap:
    cap.attention_mask = mask                   # HF models: cap(ids, attention_mask=mask) instead
    model(x)
print(cap.points, cap.get("3").shape)           # 3 + 5 real tokens -> 8 rows
seq, pos = cap.rows("3")
print(seq.tolist(), pos.tolist())
out = tempfile.mkdtemp()
cap.save(out)                                   # same files as `actcap run`; `actcap verify` checks them

# 2. The seed's hook, caught.
kept = {}
model[1].register_forward_hook(lambda m, i, o: kept.__setitem__("1", o))
with actcap.audit(model, mode="warn") as a:
    model(x)
print(a.findings[0])

# 3. actcap's engine: the demo GPT-2 split over 3 devices, as a dict of tensors.
engine = actcap.load("demo", devices=3)
acts = engine.run(["Hello, world", "activations"], capture="transformer.h.*", positions="last")
print({k: tuple(v.shape) for k, v in acts.items()})
print(engine.compare(["Hello, world"]).equal)
