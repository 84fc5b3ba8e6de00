"""Argument conversions the public functions share: dtypes, devices, sizes, positions."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

import torch

from . import _core
from ._core import InputError

# safetensors dtype names (the manifest's) <-> torch dtypes
SAFETENSORS_DTYPES: Dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}

_CAPTURE_DTYPES = {None: "keep", "keep": "keep", "f32": "f32", "f16": "f16", "bf16": "bf16",
                   torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

PositionsArg = Union[None, str, int, Sequence[Sequence[int]]]


def capture_dtype(dtype: Any) -> str:
    """None/"keep", "f32"/"f16"/"bf16" or torch.float32/float16/bfloat16 -> the library's name."""
    try:
        return _CAPTURE_DTYPES[dtype]
    except (KeyError, TypeError):
        raise InputError(f"dtype {dtype!r} is not one of None ('keep'), torch.float32, "
                         "torch.float16, torch.bfloat16 (or 'f32', 'f16', 'bf16')") from None


def device(d: Any) -> str:
    if isinstance(d, torch.device):
        d = str(d)
    if not isinstance(d, str):
        raise InputError(f"device {d!r} is not a torch device (cpu, cuda, cuda:1, ...)")
    return _core.check_device(d)


def size_bytes(value: Union[None, int, str], what: str) -> Optional[int]:
    """An int of bytes or a size like "2GiB" / "500MB"."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{what} {value!r} is not a number of bytes or a size like '2GiB'")
    if isinstance(value, int):
        if value < 0:
            raise InputError(f"{what} must not be negative (got {value})")
        return value
    return _core.parse_bytes(value)


def cli_text(value: Any, what: str, hint: str) -> str:
    """An int or a string as the CLI's text for ``what``; InputError listing ``hint`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{what} {value!r}: give {hint}")
    return str(value)


def positions_spec(positions: PositionsArg) -> str:
    """The position syntax of the CLI: all | first | last | "0:8,-4:" ; an int is one position."""
    if positions is None:
        return "all"
    return cli_text(positions, "positions", "'all', 'first', 'last', an int or ranges like '0:8,-4:'")


def patterns(points: Union[str, Sequence[str]], what: str = "points") -> list:
    if isinstance(points, str):
        points = [points]
    try:
        out = list(points)
    except TypeError:
        raise InputError(f"{what} must be a pattern or a list of patterns, not {points!r}") from None
    if not out or not all(isinstance(p, str) and p for p in out):
        raise InputError(f"{what} must be one or more non-empty patterns (got {points!r})")
    return out
