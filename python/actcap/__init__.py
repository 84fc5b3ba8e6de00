"""actcap: provably correct activation capture.

- ``SafeCapturer(model, points)``: safe capture of any torch.nn.Module's activations (Hugging Face
  models and accelerate device maps included): copies on the producing device and stream, fenced
  asynchronous copies to the host, fingerprints checked on every read, ``save()`` to the same
  verified safetensors folders as the CLI.
- ``audit(model)``: catches the hooks you already registered that keep the tensors they are given.
- ``load(path, devices=...)``: actcap's own engine (a checkpoint split over devices) with
  ``run``, ``plan``, ``compare``, ``generate`` (KV-cache generation capturing every token); ``extract(...)`` a corpus into a verified dataset;
  ``open(dir)`` a dataset as memory-mapped torch tensors, verified on read.

Errors: ``InputError`` (bad arguments or input; a ValueError) and ``RunError`` (the run or an
integrity check failed; a RuntimeError), each with the C++ core's message.
"""
import torch as _torch  # noqa: F401  (loads libtorch before the extension)

from ._core import InputError, RunError
from .audit import Audit, BareReferenceWarning, Finding, audit
from .capture import SafeCapturer, module_points, resolve_points
from .dataset import Dataset, merge, open, verify
from .engine import Comparison, Engine, GeneratedSequence, Generation, Plan, Point, extract, load
from .runtime import keep_freed_memory

__version__ = "0.1.0"

__all__ = [
    "InputError", "RunError", "SafeCapturer", "audit", "Audit", "Finding", "BareReferenceWarning",
    "load", "Engine", "Plan", "Point", "Comparison", "Generation", "GeneratedSequence", "extract", "open", "verify", "merge", "Dataset",
    "module_points", "resolve_points", "keep_freed_memory", "__version__",
]
