"""SafeCapturer: safe capture of the activations of any torch.nn.Module.

A forward hook that keeps the tensor it is given (``outputs[name] = output``) keeps a reference
to memory that later layers, the caching allocator or an offload hook reuse, and the value changes
under it. SafeCapturer never keeps it: inside the hook, the C++ core (actcap._core.SnapshotStore)
copies the selected rows on the producing device and stream into fresh memory, moves the copy to
a stable device (an asynchronous copy into pinned host memory from an accelerator, fenced by an
event before anything reads it) and fingerprints it (XXH3); every read re-checks the fingerprint.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _convert, _core
from ._core import InputError, RunError

Selector = Union[None, int, str, Callable[[Any], torch.Tensor]]

_WITH_KWARGS = "with_kwargs" in torch.nn.Module.register_forward_pre_hook.__code__.co_varnames


def module_points(model: torch.nn.Module) -> List[str]:
    """Every point of `model`: each named submodule's output NAME and its first input NAME:input."""
    names = [n for n, _ in model.named_modules() if n]
    return [p for n in names for p in (n, n + ":input")]


def resolve_points(model: torch.nn.Module, points: Union[str, Sequence[str]]) -> List[str]:
    """The points `points` (names of model.named_modules(), `NAME:input`, `*` one segment, `**` any
    depth) select, in module order. InputError naming the nearest names when a pattern matches
    nothing."""
    pats = _convert.patterns(points)
    every = module_points(model)
    chosen = set()
    for pat in pats:
        hit = [p for p in every if _core.match_point(pat, p)]
        if not hit:
            near = _core.nearest_points(pat, every)
            hint = f"; nearest: {', '.join(near)}" if near else ""
            raise InputError(f"point pattern '{pat}' matches no module of "
                             f"{type(model).__name__}{hint}")
        chosen.update(hit)
    return [p for p in every if p in chosen]


def default_select(value: Any) -> Optional[torch.Tensor]:
    """The tensor a hook point stands for: a tensor itself; element 0 of a tuple or list (Hugging
    Face attention and decoder layers return tuples); `last_hidden_state` of a model output, else
    its first tensor field."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return value[0] if value and isinstance(value[0], torch.Tensor) else None
    hidden = getattr(value, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor):
        return hidden
    if isinstance(value, Mapping):
        for v in value.values():
            if isinstance(v, torch.Tensor):
                return v
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if isinstance(v, torch.Tensor):
                return v
    return None


def _apply_select(select: Selector, value: Any, point: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):  # select picks among outputs that are not tensors
        return value
    if select is None:
        t = default_select(value)
    elif callable(select):
        t = select(value)
    elif isinstance(select, (int, str)) and not isinstance(select, bool):
        try:
            if isinstance(select, int) or isinstance(value, Mapping):
                t = value[select]
            else:
                t = getattr(value, select)
        except (IndexError, KeyError, AttributeError, TypeError):
            raise InputError(f"select={select!r} for point '{point}': its "
                             f"{type(value).__name__} output has no such element") from None
    else:
        raise InputError(f"select {select!r} for point '{point}' is not an int, a name or a callable")
    if not isinstance(t, torch.Tensor):
        raise InputError(f"hook point '{point}' gives a {type(value).__name__}, not a tensor; pass "
                         "select= (an index, a field name or a callable) to pick one")
    return t


class SafeCapturer:
    """Capture hook points of any torch.nn.Module, safely.

    ``points``: names of ``model.named_modules()`` (``NAME`` = the module's output, ``NAME:input``
    its first input), with ``*`` (one dot-separated segment) and ``**`` (any depth) patterns. The
    plan is resolved here, before anything runs; a pattern matching nothing raises InputError
    listing the nearest names.

    ``positions``: which token positions to keep ('all', 'first', 'last', an int, ranges like
    '0:8,-4:'); with an ``attention_mask`` (passed to ``run``/``__call__``, set on
    ``attention_mask``, or seen as the model's keyword argument on torch >= 2.0) padding is never
    captured, left or right, and positions count each sequence's real tokens. Without either,
    every call's tensor is kept whole (until a forward has captured rows: from then on every
    [batch, seq, ...] tensor is kept as rows, so that the calls stack). ``dtype`` casts floating snapshots (None keeps them);
    ``device`` is where snapshots live; ``budget`` (bytes or '2GiB') bounds what is kept;
    ``select`` picks the tensor of outputs that are not tensors (default: element 0 of a tuple,
    ``last_hidden_state`` of a model output), or a dict {pattern: select}.

    Use it as a context manager: hooks are registered on entry and removed on exit, also when
    the forward raises. Snapshots stay readable after exit until ``close()``::

        with actcap.SafeCapturer(model, "model.layers.*") as cap:
            model(input_ids, attention_mask=mask)
        h = cap.get("model.layers.3")       # [rows, hidden], verified
        seq, pos = cap.rows()               # where each row came from
    """

    def __init__(self, model: torch.nn.Module, points: Union[str, Sequence[str]], *,
                 positions: _convert.PositionsArg = None, dtype: Any = None,
                 device: Any = "cpu", fingerprint: bool = True,
                 budget: Union[None, int, str] = None,
                 select: Union[Selector, Dict[str, Selector]] = None):
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        self.model = model
        self.points: List[str] = resolve_points(model, points)
        self._positions = _convert.positions_spec(positions)
        self._positions_given = positions is not None
        _core.RowSelection.dense(1, 1, self._positions)  # checks the spec now
        self._store = _core.SnapshotStore(_convert.device(device), _convert.capture_dtype(dtype),
                                          _convert.size_bytes(budget, "budget"), bool(fingerprint))
        self._select: Dict[str, Selector] = {}
        for p in self.points:
            self._select[p] = select
        if isinstance(select, dict):
            for p in self.points:
                self._select[p] = None
                for pat, s in select.items():
                    if _core.match_point(pat, p):
                        self._select[p] = s
        # Points that may run on every token flattened to [batch * seq, ...] in token order: the
        # direct children of a transformers mixture-of-experts block (a module with `experts` and
        # a router, `gate` or gpt-oss's `router`, as children: the router, the stacked experts,
        # Qwen2-MoE's shared expert and its gate), called on hidden_states.view(-1, hidden), and
        # every module below those children except under `experts` (the layers inside Qwen2-MoE's
        # shared expert). Modules inside `experts` (an expert's own layers) see the tokens
        # regrouped by expert, and are not read so. A point here whose tensor is not flattened
        # (DeepSeek-style shared experts run on [batch, seq, hidden]) is read as it comes.
        modules = dict(model.named_modules())
        blocks = {}  # module name -> whether it is a mixture-of-experts block

        def moe_block(name):
            if name not in blocks:
                m = modules.get(name)  # "" is the model itself
                kids = dict(m.named_children()) if m is not None else {}
                blocks[name] = ("gate" in kids or "router" in kids) and "experts" in kids
            return blocks[name]

        self._flat_tokens = set()
        for p in self.points:
            parts = (p[:-6] if p.endswith(":input") else p).split(".")
            for i in range(len(parts) - 1, -1, -1):  # the point's module, then its ancestors
                if moe_block(".".join(parts[:i])):
                    if i == len(parts) - 1 or parts[i] != "experts":
                        self._flat_tokens.add(p)
                    break
        self.attention_mask: Optional[torch.Tensor] = None
        self._handles: list = []
        self._closed = False
        self._step = -1
        self._forward_mask: Optional[torch.Tensor] = None
        # The root call's token ids (keyword input_ids, or a first positional integer tensor):
        # each row's __rows__.token when their [batch, seq] matches the rows'.
        self._forward_ids: Optional[torch.Tensor] = None
        self._run_ids: Optional[torch.Tensor] = None  # run()'s input_ids keyword
        self._rows = None  # this forward's RowSelection, made at its first capture
        self._row_mode = False
        self._rows_key = None
        self._in_root = False  # between the root module's pre-hook and its forward hook

    # ---- hooks ----------------------------------------------------------------------------------
    def __enter__(self) -> "SafeCapturer":
        self.attach()
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def attach(self) -> "SafeCapturer":
        """Registers the hooks (what entering the ``with`` block does)."""
        self._check_open()
        if self._handles:
            raise InputError("this SafeCapturer is already attached")
        modules = dict(self.model.named_modules())
        try:
            if _WITH_KWARGS:
                self._handles.append(self.model.register_forward_pre_hook(self._begin, with_kwargs=True))
            else:
                self._handles.append(self.model.register_forward_pre_hook(self._begin))
            self._handles.append(self.model.register_forward_hook(self._end))
            for p in self.points:
                name, is_input = (p[:-6], True) if p.endswith(":input") else (p, False)
                mod = modules[name]
                if is_input:
                    h = mod.register_forward_pre_hook(self._pre_hook(p))
                else:
                    h = mod.register_forward_hook(self._hook(p))
                self._handles.append(h)
        except BaseException:
            self.detach()
            raise
        return self

    def detach(self) -> None:
        """Removes every hook this capturer registered (exiting the ``with`` block does)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def close(self) -> None:
        """Detaches and drops every snapshot; the capturer cannot be used afterwards."""
        self.detach()
        if not self._closed:
            self._store.clear()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise InputError("this SafeCapturer is closed; make a new one")

    def _begin(self, module, args, kwargs=None):
        self._step += 1
        self._rows = None
        self._in_root = True
        mask = kwargs.get("attention_mask") if kwargs else None
        self._forward_mask = mask if isinstance(mask, torch.Tensor) else None
        ids = kwargs.get("input_ids") if kwargs else None
        if ids is None and args:
            ids = args[0]
        if not (isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()
                and not ids.is_complex()):
            ids = None
        if ids is None and self._run_ids is not None:
            ids = self._run_ids
        self._forward_ids = ids
        return None

    def _end(self, module, args, output):
        self._in_root = False
        return None

    def _selection(self, t: torch.Tensor):
        mask = self._forward_mask if self._forward_mask is not None else self.attention_mask
        if self._rows is not None and t.dim() >= 2:
            # A submodule called by itself (no root forward began): a new mask or a new
            # [batch, seq] is a new forward.
            key = (id(mask), tuple(t.shape[:2]))
            if key != self._rows_key and not self._in_root:
                self._rows = None
                self._step += 1
        if self._rows is None:
            self._rows_key = (id(mask), tuple(t.shape[:2])) if t.dim() >= 2 else None
            ids = self._forward_ids
            if mask is not None:
                # A decoding step with a KV cache (transformers' generate): the forward's input
                # ids are the new tokens only, the mask covers the cached ones too; the new ones
                # are its last columns.
                window = 0
                if (ids is not None and mask.dim() == 2 and ids.shape[0] == mask.shape[0]
                        and ids.shape[1] < mask.shape[1]):
                    window = ids.shape[1]
                elif ids is not None and tuple(ids.shape) != tuple(mask.shape):
                    ids = None
                self._rows = _core.RowSelection.from_mask(mask, self._positions, ids, window)
            elif self._positions_given or self._row_mode:
                if t.dim() < 2:
                    raise InputError(f"positions need [batch, seq, ...] tensors; got {list(t.shape)}")
                if ids is not None and tuple(ids.shape) != tuple(t.shape[:2]):
                    ids = None
                self._rows = _core.RowSelection.dense(t.shape[0], t.shape[1], self._positions, ids)
            else:
                self._rows = False  # whole tensors
            if self._rows:
                self._row_mode = True  # once rows, rows in every later forward: the calls stack
        return self._rows or None

    def _token_view(self, point, t):
        """The tensor of a point in self._flat_tokens, every token flattened to
        [batch * seq, ...], viewed [batch, seq, ...] so that its rows are taken as any other
        point's; only where rows are taken (an attention mask or positions) and the tensor is not
        [batch, seq, ...] already, i.e. where it would otherwise be refused. [batch, seq] is the
        forward's input ids' (the new tokens of a decoding step), else the attention mask's."""
        mask = self._forward_mask if self._forward_mask is not None else self.attention_mask
        if point not in self._flat_tokens or not isinstance(t, torch.Tensor) or t.dim() < 1 or not (
                mask is not None or self._positions_given or self._row_mode):
            return t
        for ref in (self._forward_ids, mask):
            if isinstance(ref, torch.Tensor) and ref.dim() == 2:
                b, s = ref.shape
                if b * s > 0 and t.shape[0] == b * s and tuple(t.shape[:2]) != (b, s):
                    return t.view(b, s, *t.shape[1:])  # splitting a dimension never copies
        return t

    def _take(self, point: str, value: Any) -> None:
        t = self._token_view(point, _apply_select(self._select[point], value, point))
        self._store.capture(point, t, self._selection(t), max(self._step, 0))

    def _hook(self, point: str):
        def hook(module, args, output):
            self._take(point, output)
        hook.__qualname__ = f"SafeCapturer[{point}]"
        return hook

    def _pre_hook(self, point: str):
        def pre_hook(module, args):
            if not args:
                raise InputError(f"module '{point[:-6]}' was called without positional arguments: "
                                 f"its input is not visible to a pre-hook; capture the output "
                                 "of the module before it instead")
            self._take(point, args[0])
        pre_hook.__qualname__ = f"SafeCapturer[{point}]"
        return pre_hook

    # ---- running --------------------------------------------------------------------------------
    def run(self, *args, **kwargs):
        """``model(*args, **kwargs)`` with the hooks attached for this call (if they are not
        already); its ``attention_mask`` keyword (if any) decides the rows. Returns the model's
        output."""
        self._check_open()
        mask = kwargs.get("attention_mask")
        saved = self.attention_mask
        if isinstance(mask, torch.Tensor):
            self.attention_mask = mask
        ids = kwargs.get("input_ids")
        self._run_ids = ids if isinstance(ids, torch.Tensor) else None
        attached_here = not self._handles
        try:
            if attached_here:
                self.attach()
            with torch.inference_mode():
                return self.model(*args, **kwargs)
        finally:
            if attached_here:
                self.detach()
            self.attention_mask = saved
            self._run_ids = None

    __call__ = run

    # ---- reading --------------------------------------------------------------------------------
    def get(self, point: str, call: Optional[int] = None) -> torch.Tensor:
        """The snapshot of ``call`` of ``point`` (None: every call, concatenated in order), after
        the fence and a fingerprint check. RunError when its bytes changed since capture. A single
        call's tensor is the snapshot itself, not a copy: ``.clone()`` it before writing to it
        in place (otherwise later reads, ``verify()`` and ``save()`` report it changed)."""
        self._check_open()
        if point not in self.points:
            raise InputError(f"'{point}' is not a planned point of this capturer "
                             f"(planned: {', '.join(self.points[:8])}{' ...' if len(self.points) > 8 else ''})")
        if self._store.calls(point) == 0:
            raise RunError(f"nothing captured at hook point '{point}': its module did not run in "
                           f"the forwards since this capturer was made (a model may use a module's "
                           f"weights without calling it, as transformers' DeepSeek-V2 does with its "
                           f"router `mlp.gate`: capture the module that calls it instead)")
        return self._store.get(point, -1 if call is None else int(call))

    def calls(self, point: str) -> int:
        """How many times ``point`` fired since the capturer was made."""
        self._check_open()
        return self._store.calls(point)

    def rows(self, point: Optional[str] = None, call: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(sequence, position) of every row of ``get(point, call)`` (default: the first planned
        point, every call). Sequences are numbered within each forward."""
        self._check_open()
        point = point or self.points[0]
        seqs, poss = [], []
        for p, c, _step, sel in self._store.index():
            if p != point or (call is not None and c != call):
                continue
            if sel is None:
                t = self._store.get(p, c)
                if t.dim() < 2:
                    raise InputError(f"point '{p}' was captured whole ({list(t.shape)}): it has no rows")
                sel = _core.RowSelection.dense(t.shape[0], t.shape[1], "all")
            seqs.append(sel.row_seq)
            poss.append(sel.row_pos)
        if not seqs:
            raise RunError(f"nothing captured at hook point '{point}'")
        return torch.cat(seqs), torch.cat(poss)

    def verify(self) -> None:
        """Re-hashes every snapshot; RunError naming the first whose bytes changed."""
        self._check_open()
        self._store.verify()

    @property
    def nbytes(self) -> int:
        """Bytes of the snapshots kept."""
        self._check_open()
        return self._store.bytes

    def clear(self) -> None:
        """Drops the snapshots kept so far (call indices keep counting)."""
        self._check_open()
        self._store.clear()

    def save(self, out: str, *, overwrite: bool = False) -> List[dict]:
        """Writes the capture as ``actcap run`` does: ``shard-00000.safetensors`` with one
        ``[rows, ...]`` tensor per point plus ``__rows__.seq`` / ``__rows__.pos`` / ``__rows__.token``
        (-1 unless every forward's token ids were seen: ``input_ids`` or a first positional
        integer [batch, seq] tensor of the model's call), and a checksummed
        ``manifest.json`` (``actcap verify DIR`` checks it). Each point must have fired once per
        forward. Returns the written tensors (name, shape, dtype, xxh3)."""
        self._check_open()
        cfg = getattr(self.model, "config", None)
        path = str(getattr(cfg, "_name_or_path", "") or type(self.model).__qualname__)
        model_type = str(getattr(cfg, "model_type", "") or type(self.model).__name__)
        device_map = getattr(self.model, "hf_device_map", None)
        if not isinstance(device_map, dict):
            first = next(self.model.parameters(), None)
            device_map = {"": str(first.device) if first is not None else "cpu"}
        device_map = {str(k): str(v) for k, v in device_map.items()}
        return self._store.save(str(out), overwrite, path, model_type,
                                parameters_fingerprint(self.model), device_map,
                                [p for p in self.points if self._store.calls(p)])


def parameters_fingerprint(model: torch.nn.Module) -> str:
    """XXH3 over every parameter and buffer's name, dtype, shape and the XXH3 of its bytes."""
    parts = []
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        t = t.detach()
        # offloaded (meta) tensors have no bytes here: their name, dtype and shape only
        digest = "meta" if t.device.type == "meta" else _core.xxh3(t.cpu())
        parts.append(f"{name}|{t.dtype}|{list(t.shape)}|{digest}")
    return _core.xxh3_bytes("\n".join(parts).encode())
