"""audit: find the hooks that keep the tensors they are given.

The seed's hook, ``outputs[name] = output``, keeps a bare reference to memory that later layers,
the caching allocator or an offload hook reuse. ``audit(model)`` wraps every forward hook and
pre-hook already registered on the model's modules and, after each returns, compares the
reference counts of what it was given (the Python object, and for a tensor the use counts of its
TensorImpl and of its storage: the engine's bare-reference check) with those before the call. A
hook that still holds its input or output, a view or a ``detach()`` of it (``.cpu()`` and
``.to()`` of a tensor already there return it unchanged) raises them.

transformers' own output recording is left alone by default: from 5.x, ``output_hidden_states``
and ``output_attentions`` work through forward hooks (``output_capturing_hook``) that transformers
registers on first use and leaves on the modules, and that keep each output to return it in the
model's output, as the caller asked.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch

from . import _core
from ._core import InputError, RunError


class BareReferenceWarning(UserWarning):
    """A hook kept a reference to a tensor it was given (audit(mode="warn"))."""


@dataclass
class Finding:
    module: str  # the module's name in model.named_modules() ("" for the model itself)
    hook: str    # the hook function's qualified name
    kind: str    # "forward" or "pre"
    kept: str    # what it kept: "output", "output[1]", "input[0]", ...

    def __str__(self) -> str:
        where = f"module '{self.module}'" if self.module else "the model itself"
        return (f"{self.kind} hook {self.hook} on {where} kept a reference to its {self.kept} "
                "after returning: later computation can reuse that memory and change what it "
                "holds; copy inside the hook (.detach().clone(), then .to(device) if needed)")


def _watched(value: Any, label: str, out: List[Tuple[str, Any]]) -> None:
    """The objects whose counts are compared: the value itself, and the tensors directly in it."""
    if isinstance(value, torch.Tensor):
        out.append((label, value))
    elif isinstance(value, (tuple, list)):
        out.append((label, value))
        for i, v in enumerate(value):
            if isinstance(v, torch.Tensor):
                out.append((f"{label}[{i}]", v))
    elif hasattr(value, "values") and callable(value.values):  # model outputs, dicts
        out.append((label, value))
        for k, v in value.items() if hasattr(value, "items") else []:
            if isinstance(v, torch.Tensor):
                out.append((f"{label}.{k}", v))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # output dataclasses
        out.append((label, value))
        for f in dataclasses.fields(value):
            v = getattr(value, f.name, None)
            if isinstance(v, torch.Tensor):
                out.append((f"{label}.{f.name}", v))


def _storage_ptr(t: torch.Tensor) -> int:
    """Where t's storage starts, without making a Python object of the storage: on a LibTorch that
    keeps such a wrapper alive while the storage is shared, the wrapper would hold a use of it."""
    try:
        return t.data_ptr() - t.storage_offset() * t.element_size()
    except (RuntimeError, NotImplementedError):  # no data pointer (a tensor subclass, say)
        try:
            return t.untyped_storage().data_ptr()  # torch >= 2.0
        except AttributeError:
            return t.storage().data_ptr()


_PRESERVATION: Optional[Tuple[int, int]] = None


def _preservation() -> Tuple[int, int]:
    """What LibTorch itself adds to the counts, measured once in this process: (the Python
    references a tensor's object gains while other C++ references to its TensorImpl exist; the
    uses of a storage that a Python wrapper held only by LibTorch keeps). Both 0 on LibTorch 1.13;
    1 on a 2.x whose intrusive_ptr keeps a wrapper alive while C++ shares the object
    (c10/util/intrusive_ptr.h, "PyObject preservation"): there a hook that returns a view raises
    its output's Python count, and one that only looked at ``.untyped_storage()`` leaves a use of
    the storage behind, neither of which keeps anything."""
    global _PRESERVATION
    if _PRESERVATION is None:
        # Measured outside inference mode, whatever the caller's: an inference tensor's view keeps
        # no reference to its base, which would measure 0 and mismeasure every later audit.
        with torch.inference_mode(False):
            _PRESERVATION = _measure_preservation()
    return _PRESERVATION


def _measure_preservation() -> Tuple[int, int]:
    t = torch.empty(4)
    py_alone = _core.reference_counts(t)[0]
    view = t.view(4)  # a C++ reference to t's TensorImpl (the view's base) and its storage
    py_shared, _, storage_before, _ = _core.reference_counts(t)
    if hasattr(t, "untyped_storage"):
        t.untyped_storage()  # a wrapper, dropped at once
    else:
        t.storage()
    _, _, storage_after, only_libtorch = _core.reference_counts(t)
    del view
    return (max(0, py_shared - py_alone),
            max(0, storage_after - storage_before) if only_libtorch else 0)


def _counts(obj: Any) -> Tuple[int, int, int]:
    """(Python references, TensorImpl uses, storage uses) of obj, less LibTorch's own."""
    py, impl, storage, wrapper_only_libtorch = _core.reference_counts(obj)
    tensor_kept, storage_kept = _preservation()
    if impl >= 2:  # other C++ references than its Python object's: that object is preserved
        py -= tensor_kept
    if wrapper_only_libtorch:
        storage -= storage_kept
    return py, impl, storage


def _held_by(result: Any, obj: Any) -> Tuple[int, int, int]:
    """References the hook's return value itself holds on `obj` (it replaces the output, so the
    forward keeps it, not the hook): (python references, TensorImpl uses, storage uses)."""
    py = impl = storage = 0
    items = result if isinstance(result, (tuple, list)) else (result,)
    if result is obj:
        py += 1
    for r in items:
        if r is obj and r is not result:
            py += 1
        elif (isinstance(r, torch.Tensor) and isinstance(obj, torch.Tensor) and r.numel()
              and obj.numel() and r.device == obj.device and _storage_ptr(r) == _storage_ptr(obj)):
            storage += 1
            if r is not obj and r._base is obj:  # a view of it: the view holds it as its base
                impl += 1
    return py, impl, storage


def _transformers_recorder(fn: Callable) -> bool:
    """Whether fn is transformers' own output recorder (transformers.utils.output_capturing's
    ``output_capturing_hook``, installed for output_hidden_states / output_attentions)."""
    return (str(getattr(fn, "__module__", None) or "").startswith("transformers.")
            and "output_capturing" in str(getattr(fn, "__name__", None) or ""))


class Audit:
    """The wrapped hooks of one model; restore() (or leaving the ``with`` block) puts the
    originals back. ``findings`` lists every hook caught; ``skipped`` the hooks left unwrapped
    (transformers' output recorder, "module: hook")."""

    def __init__(self, model: torch.nn.Module, mode: str, trust_transformers: bool = True):
        if mode not in ("error", "warn"):
            raise InputError(f"audit mode {mode!r} is not 'error' or 'warn'")
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        self.mode = mode
        self.findings: List[Finding] = []
        self.skipped: List[str] = []
        self.hooks = 0
        self._restore: List[Callable[[], None]] = []
        self._reported = set()
        for name, module in model.named_modules():
            for kind, table in (("forward", module._forward_hooks), ("pre", module._forward_pre_hooks)):
                for key, fn in list(table.items()):
                    if trust_transformers and _transformers_recorder(fn):
                        self.skipped.append(f"{name or '<model>'}: {fn.__module__}.{fn.__qualname__}")
                        continue
                    table[key] = self._wrap(name, kind, fn)
                    self._restore.append(lambda t=table, k=key, f=fn: t.__setitem__(k, f) if k in t else None)
                    self.hooks += 1

    def __enter__(self) -> "Audit":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        for undo in self._restore:
            undo()
        self._restore = []

    def _wrap(self, module_name: str, kind: str, fn: Callable) -> Callable:
        hook_name = getattr(fn, "__qualname__", None) or repr(fn)

        def audited(*args):
            # forward: (module, args, output) or (module, args, kwargs, output); pre: (module,
            # args) or (module, args, kwargs)
            watched: List[Tuple[str, Any]] = []
            if kind == "forward":
                _watched(args[-1], "output", watched)
            _watched(args[1], "input", watched)
            before = [_counts(o) for _, o in watched]
            result = fn(*args)
            for (label, obj), b in zip(watched, before):
                py, impl, storage = _counts(obj)
                held_py, held_impl, held_storage = _held_by(result, obj)
                if py - held_py > b[0] or impl - held_impl > b[1] or storage - held_storage > b[2]:
                    self._report(Finding(module_name, hook_name, kind, label))
                    break
            return result

        audited.__wrapped__ = fn
        audited.__qualname__ = f"audited({hook_name})"
        return audited

    def _report(self, finding: Finding) -> None:
        self.findings.append(finding)
        if self.mode == "error":
            raise RunError(str(finding))
        key = (finding.module, finding.hook, finding.kind)
        if key not in self._reported:
            self._reported.add(key)
            warnings.warn(str(finding), BareReferenceWarning, stacklevel=3)


def audit(model: torch.nn.Module, mode: str = "error", *, trust_transformers: bool = True) -> Audit:
    """Wraps the hooks already registered on ``model``'s modules (forward hooks and pre-hooks) so
    that each hook that still holds a reference to its input or output tensor, or a view or
    detach() of it, after it returns is reported: ``mode="error"`` raises RunError naming the
    module and the hook (stopping the forward), ``mode="warn"`` warns once per hook
    (BareReferenceWarning) and records it in ``findings``. Use as a context manager, or call
    ``restore()``. Run the audited forward under ``torch.no_grad()`` or ``inference_mode()``: with
    autograd recording, what a hook computes from the output (``o.norm()``) saves the output for
    backward, and that reference counts as kept.

    ``trust_transformers`` (default True) leaves transformers' own output recorder unwrapped (the
    forward hooks transformers 5 registers for ``output_hidden_states`` / ``output_attentions``,
    which keep each output to return it to the caller) and lists it in ``skipped``; False audits
    it like any other hook (it is then reported whenever hidden states or attentions are asked
    for)."""
    return Audit(model, mode, trust_transformers)
