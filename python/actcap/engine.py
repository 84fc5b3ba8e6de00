"""actcap's own engine from Python: load a Hugging Face checkpoint split over devices, capture
verified activations as torch tensors, prove a split run equals a single-device run, extract a
corpus into a verified dataset."""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch

from . import _convert, _core
from ._core import InputError

Inputs = Union[str, Sequence[str], torch.Tensor, Sequence[Sequence[int]]]


@dataclass
class Point:
    name: str
    shape: List[int]    # per token: the tensor is [batch, seq, *shape]
    dtype: torch.dtype


@dataclass
class Plan:
    device_map: Dict[str, str]  # accelerate's format: module -> device
    devices: List[dict]         # per device: weights, workspace, reserve, total, budget, stages
    table: str                  # the same as `actcap plan` prints

    def __str__(self) -> str:
        return self.table


@dataclass
class Comparison:
    equal: bool                 # every tensor bit-identical, or, with a tolerance, within it
    rows: List[dict]            # point, equal, within_tolerance, max_abs_diff, max_abs_reference,
                                # rel_rms, reference_xxh3, split_xxh3
    device_map: Dict[str, str]  # the split run's
    tolerance: float = 0.0

    @property
    def mismatched(self) -> int:
        return sum(not r["within_tolerance"] for r in self.rows)


@dataclass
class GeneratedSequence:
    tokens: List[int]   # the prompt, then what was generated
    prompt_length: int
    finish: str         # "stop" (a stop token or EOS, kept as the last token) or "length"

    @property
    def generated(self) -> List[int]:
        return self.tokens[self.prompt_length:]


@dataclass
class Generation:
    sequences: List[GeneratedSequence]
    activations: Dict[str, torch.Tensor]  # {point: [rows, ...]} + __rows__.seq/pos/token/step
    forwards: int                         # the prompt pass and the decoding steps
    prompt_seconds: float
    decode_seconds: float


def _heads(heads: Optional[Sequence[int]]) -> List[int]:
    if heads is None:
        return []
    if isinstance(heads, int):
        return [heads]
    try:
        return [int(h) for h in heads]
    except (TypeError, ValueError):
        raise InputError("heads: a list of head indices, e.g. [0, 3, 7]") from None


def _devices_arg(devices: Any) -> str:
    if devices is None:
        return ""
    if isinstance(devices, (list, tuple)):
        return ",".join(str(d) for d in devices)
    return _convert.cli_text(devices, "devices", "a count, 'cpu:0,cpu:1,cuda:0' or a list")


def _max_memory_arg(max_memory: Any) -> str:
    if max_memory is None:
        return ""
    if isinstance(max_memory, str):
        return max_memory
    if isinstance(max_memory, Mapping):
        return ",".join(f"{k}={v}" for k, v in max_memory.items())
    raise InputError(f"max_memory {max_memory!r}: give {{'cpu:0': '300MiB', ...}} or "
                     "'cpu:0=300MiB,cpu:1=1GiB'")


def _device_map_arg(device_map: Any) -> str:
    if isinstance(device_map, Mapping):
        return json.dumps(dict(device_map))
    if isinstance(device_map, (str, os.PathLike)):
        return os.fspath(device_map)
    raise InputError(f"device_map {device_map!r}: give 'auto', 'balanced', 'sequential', a dict "
                     "(accelerate's format) or a JSON file")


class Engine:
    """A checkpoint loaded by actcap (``actcap.load``), placed on its devices for each run."""

    def __init__(self, core: "_core.Engine"):
        self._core = core

    @property
    def path(self) -> str:
        return self._core.path

    @property
    def fingerprint(self) -> str:
        """XXH3 of the weights as loaded (the manifest's model fingerprint)."""
        return self._core.fingerprint

    @property
    def config(self) -> dict:
        return self._core.config

    def __repr__(self) -> str:
        c = self.config
        return f"actcap.Engine({self.path!r}, {c['arch']}, {c['num_hidden_layers']} layers)"

    def points(self) -> List[Point]:
        """Every hook point in execution order (outputs and ``:input``s)."""
        return [Point(n, list(s), _convert.SAFETENSORS_DTYPES[d]) for n, s, d in self._core.points()]

    def resolve(self, capture: Union[str, Sequence[str]], dtype: Any = None) -> List[Point]:
        """The points ``capture`` selects, in model order, with the dtype they are stored in."""
        return [Point(n, list(s), _convert.SAFETENSORS_DTYPES[d]) for n, s, d in
                self._core.resolve(_convert.patterns(capture, "capture"), _convert.capture_dtype(dtype))]

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` with the checkpoint's tokenizer.json (InputError without one)."""
        return self._core.encode(text)

    def sequences(self, inputs: Inputs, attention_mask: Optional[torch.Tensor] = None) -> List[List[int]]:
        """Token id lists from text(s), a [batch, seq] tensor (with an optional attention mask:
        padding dropped, either side) or lists of ids."""
        if isinstance(inputs, str):
            return [self.encode(inputs)]
        if isinstance(inputs, torch.Tensor):
            if inputs.dim() == 1:
                inputs = inputs.unsqueeze(0)
                if attention_mask is not None and attention_mask.dim() == 1:
                    attention_mask = attention_mask.unsqueeze(0)
            if inputs.dim() != 2 or inputs.is_floating_point():
                raise InputError(f"input_ids must be an integer [batch, seq] tensor, got "
                                 f"{inputs.dtype} {list(inputs.shape)}")
            if attention_mask is not None:
                if attention_mask.shape != inputs.shape:
                    raise InputError(f"attention_mask {list(attention_mask.shape)} does not match "
                                     f"input_ids {list(inputs.shape)}")
                keep = attention_mask.to(torch.bool).cpu()
                return [row[k].tolist() for row, k in zip(inputs.cpu(), keep)]
            return inputs.cpu().tolist()
        try:
            items = list(inputs)
        except TypeError:
            raise InputError(f"inputs of type {type(inputs).__name__}: give text(s), a tensor of "
                             "ids or lists of ids") from None
        if items and all(isinstance(i, str) for i in items):
            return [self.encode(t) for t in items]
        seqs = []
        for i, s in enumerate(items):
            try:
                seq = [int(v) for v in s]
            except (TypeError, ValueError):
                raise InputError(f"sequence {i} is not a list of token ids") from None
            seqs.append(seq)
        return seqs

    def plan(self, capture: Union[None, str, Sequence[str]] = None, *, batch: int = 1,
             seq: Optional[int] = None, dtype: Any = None) -> Plan:
        """Where each stage goes for a ``batch`` x ``seq`` run capturing ``capture``."""
        pats = [] if capture is None else _convert.patterns(capture, "capture")
        seq = seq or self.config["max_positions"]
        text, table = self._core.plan(pats, _convert.capture_dtype(dtype), int(batch), int(seq))
        j = json.loads(text)
        return Plan(j["device_map"], j["devices"], table)

    def run(self, inputs: Inputs, capture: Union[str, Sequence[str]], *,
            attention_mask: Optional[torch.Tensor] = None,
            positions: Union[_convert.PositionsArg, Sequence[Sequence[int]]] = None,
            dtype: Any = None, budget: Union[None, int, str] = None,
            logits: bool = False, heads: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
        """One forward capturing ``capture`` (patterns). Returns {point: [rows, ...]} — the
        verified snapshots themselves, no copy — plus ``__rows__.seq`` and ``__rows__.pos`` (each
        row's sequence and position) and, with ``logits=True``, ``logits`` [batch, seq, vocab].
        ``positions``: 'all', 'first', 'last', ranges like '0:8,-4:', or one list of positions per
        sequence. Attention patterns (``NAME:scores``, ``NAME:probs``) are ``[rows, heads, keys]``
        with keys = the longest sequence given; ``heads`` keeps some heads (docs/hook-points.md)."""
        seqs = self.sequences(inputs, attention_mask)
        explicit = None
        spec = "all"
        if positions is not None and not isinstance(positions, (str, int)):
            try:
                explicit = [[int(p) for p in ps] for ps in positions]
            except TypeError:
                raise InputError("positions: 'all', 'first', 'last', an int, ranges like '0:8,-4:', "
                                 "or one list of positions per sequence (e.g. [[0, 3], [1]])") from None
            if len(explicit) != len(seqs):
                raise InputError(f"positions gives {len(explicit)} lists for {len(seqs)} sequences")
        else:
            spec = _convert.positions_spec(positions)
        return self._core.run(seqs, _convert.patterns(capture, "capture"),
                              _convert.capture_dtype(dtype), spec, explicit,
                              _convert.size_bytes(budget, "budget"), bool(logits),
                              _heads(heads))

    def compare(self, inputs: Inputs, capture: Union[str, Sequence[str]] = "**", *,
                tolerance: float = 0.0) -> Comparison:
        """A single-device run (on the CPU) and the split run of ``inputs``, every captured point
        and the logits compared bit for bit (what ``actcap compare`` prints); with ``tolerance``
        above 0 (at most 1), each within that fraction of its largest magnitude (a split with a
        GPU)."""
        tol = float(tolerance)  # checked by the library: InputError outside [0, 1]
        rows, plan = self._core.compare(self.sequences(inputs), _convert.patterns(capture, "capture"), tol)
        return Comparison(all(r["within_tolerance"] for r in rows), rows,
                          json.loads(plan)["device_map"], tol)

    def generate(self, inputs: Inputs, capture: Union[None, str, Sequence[str]] = None, *,
                 max_new_tokens: int = 16, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop_tokens: Sequence[int] = (),
                 stop_at_eos: bool = True, attention_mask: Optional[torch.Tensor] = None,
                 dtype: Any = None, budget: Union[None, int, str] = None,
                 out: Union[None, str, os.PathLike] = None, overwrite: bool = False,
                 heads: Optional[Sequence[int]] = None) -> Generation:
        """Generates from ``inputs`` (one batch) with a KV cache on each layer's device, greedy
        unless ``temperature`` > 0 (then sampled after ``top_k`` and ``top_p``, seeded by
        ``seed``). A sequence stops at one of ``stop_tokens`` or the config's EOS (unless
        ``stop_at_eos`` is False), or after ``max_new_tokens``. With ``capture`` (patterns), every
        token of the final sequences, prompt and generated, has one row per point in
        ``Generation.activations``, with ``__rows__.seq``, ``__rows__.pos``, ``__rows__.token`` and
        ``__rows__.step`` (0: the prompt pass; k: the k-th decoding step); ``out`` also writes
        them as a verified dataset (``actcap generate --out``). docs/generate.md."""
        seqs = self.sequences(inputs, attention_mask)
        pats = [] if capture is None else _convert.patterns(capture, "capture")
        if out is not None and not pats:
            raise InputError("out needs capture (the points written there)")
        r = self._core.generate(seqs, pats, _convert.capture_dtype(dtype), int(max_new_tokens),
                                float(temperature), int(top_k), float(top_p), int(seed),
                                [int(t) for t in stop_tokens], bool(stop_at_eos),
                                _convert.size_bytes(budget, "budget"),
                                "" if out is None else os.fspath(out), bool(overwrite),
                                _heads(heads))
        return Generation([GeneratedSequence(s["tokens"], s["prompt_length"], s["finish"])
                           for s in r["sequences"]],
                          r.get("activations", {}), r["forwards"], r["prompt_seconds"],
                          r["decode_seconds"])

    def device_stats(self) -> List[dict]:
        """Per device, since the model was last placed (each ``run`` places it): ``device``,
        ``weight_bytes``, ``arena_bytes`` and ``peak_bytes`` (weights + largest arena), ``slot_reuses``
        (arena memory handed out again), ``transfers_in`` / ``bytes_in`` (boundary copies
        received), ``capture_copies`` / ``capture_bytes`` (capture copies queued on the device's copy
        queue; 0 with ``copy_window=0``, where each is copied inside its hook) and ``copy_waits``
        (hooks that waited for room in the copy window)."""
        return self._core.device_stats()

    def transfer_stats(self) -> dict:
        """Counters of the boundary copies since the model was placed: ``transfers``, ``verified``,
        ``retried`` (repaired by a copy through host memory), ``via_host`` (sent through host
        memory because their link corrupted a direct copy, docs/devices.md), ``faults_injected``
        (tests) and ``bytes``."""
        return self._core.transfer_stats()


def load(path: Union[str, os.PathLike], *, devices: Any = None, device_map: Any = "auto",
         max_memory: Any = None, weights_dtype: str = "keep",
         verify_transfers: bool = True, compute_dtype: str = "f32",
         copy_window: Union[None, int, str] = None) -> Engine:
    """Loads a Hugging Face checkpoint folder (or "demo") into actcap's engine.

    ``devices``: a count N (virtual CPU devices cpu:0..N-1), "cpu:0,cpu:1,cuda:0" or a list;
    ``device_map``: "auto" | "balanced" | "sequential" | a dict in accelerate's format | a JSON file;
    ``max_memory``: {"cpu:0": "300MiB", ...}; ``weights_dtype``: "keep" (16-bit weights stay
    16-bit, widened per layer) or "f32"; ``compute_dtype``: "f32" (default), "bf16" or "f16" (the
    forward in 16 bits: docs/execution.md; "f16" needs float16 kernels on the devices);
    ``copy_window``: capture copies in flight per device, bytes or a size like "256MiB" (None: the
    default, 256 MiB); 0 copies each capture inside its hook, blocking (``--copy-window``)."""
    core = _core.Engine(os.fspath(path), _devices_arg(devices), _device_map_arg(device_map),
                        _max_memory_arg(max_memory), str(weights_dtype), bool(verify_transfers),
                        str(compute_dtype), _convert.size_bytes(copy_window, "copy_window"))
    return Engine(core)


class _Progress:
    """A tqdm bar when tqdm is installed, otherwise a plain line every few seconds on stderr."""

    def __init__(self, mode: Union[bool, str, Callable[[dict], None]]):
        self.callback = mode if callable(mode) else None
        self.bar = None
        self.lines = mode is True or mode == "lines"
        if mode is True:
            try:
                from tqdm import tqdm  # noqa: F401
                self.lines = False
                self.tqdm = tqdm
            except ImportError:
                self.tqdm = None
        elif mode == "tqdm":
            from tqdm import tqdm
            self.tqdm = tqdm
        else:
            self.tqdm = None
        self.last = 0.0

    def __call__(self, p: dict) -> None:
        if self.callback:
            self.callback(p)
            return
        if self.tqdm is not None:
            if self.bar is None:
                self.bar = self.tqdm(total=p["documents_total"], unit="doc", desc="actcap extract")
            self.bar.n = p["documents_done"]
            rate = p["tokens_done"] / p["seconds"] if p["seconds"] > 0 else 0.0
            self.bar.set_postfix_str(f"{rate:.0f} tok/s, {p['shards_written']} shards", refresh=False)
            self.bar.refresh()
        elif self.lines:
            now = time.monotonic()
            if now - self.last >= 5.0 or p["documents_done"] >= p["documents_total"]:
                self.last = now
                rate = p["tokens_done"] / p["seconds"] if p["seconds"] > 0 else 0.0
                print(f"actcap: {p['documents_done']}/{p['documents_total']} docs  {rate:.0f} tok/s  "
                      f"{p['bytes_written']} bytes written  {p['shards_written']} shards",
                      file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def extract(model: Union[str, os.PathLike, Engine], input: Union[str, os.PathLike],
            out: Union[str, os.PathLike], capture: Union[str, Sequence[str]], *,
            devices: Any = None, device_map: Any = "auto", max_memory: Any = None,
            weights_dtype: str = "keep", compute_dtype: str = "f32",
            copy_window: Union[None, int, str] = None, batch_size: int = 8, max_length: int = 0,
            stride: int = 0, shard_size: Union[int, str] = "256MiB",
            positions: _convert.PositionsArg = None, dtype: Any = None,
            budget: Union[None, int, str] = None, resume: bool = False, overwrite: bool = False,
            skip_bad_lines: bool = False, heads: Optional[Sequence[int]] = None,
            stats: bool = False, stats_only: bool = False, top_k: int = 8,
            skip_special: bool = False, rank: Optional[int] = None,
            world_size: Optional[int] = None,
            progress: Union[bool, str, Callable[[dict], None]] = True) -> dict:
    """``actcap extract`` from Python: a corpus (.txt, one document per line, or .jsonl with
    "text" or "input_ids") through the model into a verified, resumable dataset in ``out``
    (``actcap.open(out)`` reads it). ``progress``: True (tqdm when installed, plain lines
    otherwise), "lines", False, or a callable given each progress dict. ``stats``: also
    per-feature statistics and the ``top_k`` rows of largest value per feature
    (``actcap.open(out).stats()``, docs/stats.md); ``stats_only``: only them; ``skip_special``:
    special tokens are not stored or counted. ``rank``/``world_size`` (default: from torchrun's
    RANK/WORLD_SIZE, srun or mpirun): this process extracts its share of the corpus and the last
    rank to finish assembles manifest.json (docs/scale.md); choose ``devices`` per rank (e.g.
    ``f"cuda:{os.environ['LOCAL_RANK']}"``). Returns the summary."""
    engine = model if isinstance(model, Engine) else load(
        model, devices=devices, device_map=device_map, max_memory=max_memory,
        weights_dtype=weights_dtype, compute_dtype=compute_dtype, copy_window=copy_window)
    shard_bytes = _convert.size_bytes(shard_size, "shard_size")
    if not shard_bytes:
        raise InputError("shard_size must be positive")
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1 (got {batch_size})")
    bar = _Progress(progress)
    try:
        return engine._core.extract(
            os.fspath(input), os.fspath(out), _convert.patterns(capture, "capture"),
            _convert.capture_dtype(dtype), _convert.positions_spec(positions), int(batch_size),
            int(max_length), int(stride), shard_bytes, bool(resume), bool(overwrite),
            bool(skip_bad_lines), _convert.size_bytes(budget, "budget"),
            bar if progress else None, _heads(heads), bool(stats), bool(stats_only), int(top_k),
            bool(skip_special), -1 if rank is None else int(rank),
            -1 if world_size is None else int(world_size))
    finally:
        bar.close()
