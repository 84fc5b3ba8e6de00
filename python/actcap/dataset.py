"""actcap.open: an output folder (``actcap run``/``extract``, ``SafeCapturer.save``) as torch
tensors, memory-mapped lazily and verified on read, with a seeded shuffled batch iterator."""
from __future__ import annotations

import builtins
import json
import mmap
import os
import struct
import warnings
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from . import _convert, _core
from ._core import InputError, RunError

ROW_TENSORS = ("__rows__.seq", "__rows__.pos", "__rows__.token", "__rows__.step")


def _unsigned(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


class _Shard:
    """One file of the folder. ``header_xxh3`` and ``checksums`` (tensor name -> 16 hex digits)
    are what the manifest says; None / a missing name where it says nothing."""

    def __init__(self, dir: str, file: str, rows: int, header_xxh3: Optional[str],
                 checksums: Dict[str, str]):
        self.file = file
        self.rows = int(rows)
        self.header_xxh3 = header_xxh3
        self.checksums = checksums
        self.path = os.path.join(dir, str(self.file))
        self._mm: Optional[mmap.mmap] = None
        self._header: Optional[dict] = None
        self._data_start = 0
        self._checked: Dict[str, torch.Tensor] = {}

    def _open(self) -> None:
        if self._mm is not None:
            return
        try:
            with builtins.open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise RunError(f"{self.path}: cannot map the shard: {e}") from None
        mm = self._mm
        if len(mm) < 8:
            raise RunError(f"{self.path}: truncated (no safetensors header)")
        (n,) = struct.unpack("<Q", mm[:8])
        if n > len(mm) - 8:
            raise RunError(f"{self.path}: header length {n} is past the end of the file")
        head = mm[: 8 + n]
        want = self.header_xxh3
        if want is not None and _core.xxh3_bytes(bytes(head)) != want:
            raise RunError(f"{self.path}: header bytes do not match the manifest's header_xxh3 "
                           "(the file was changed or replaced); run actcap verify")
        self._header = json.loads(bytes(head[8:]).decode("utf-8"))
        self._data_start = 8 + n

    def tensor(self, name: str) -> torch.Tensor:
        """The named tensor, zero-copy over the mapped file, checked once against the manifest's
        checksum."""
        t = self._checked.get(name)
        if t is not None:
            return t
        self._open()
        info = self._header.get(name)
        if info is None:
            raise RunError(f"{self.path}: has no tensor '{name}'")
        dtype = _convert.SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise RunError(f"{self.path}: tensor '{name}' has dtype {info['dtype']}, which torch "
                           "cannot read")
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        count = 1
        for d in shape:
            count *= d
        if count == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            with warnings.catch_warnings():  # the mapping is read-only; the tensor must stay so
                warnings.simplefilter("ignore", UserWarning)
                t = torch.frombuffer(self._mm, dtype=dtype, count=count,
                                     offset=self._data_start + begin).view(shape)
        want = self.checksums.get(name)
        if want is None:
            raise RunError(f"{self.path}: the manifest has no checksum for tensor '{name}'")
        got = _core.xxh3(t)
        if got != want:
            raise RunError(f"{self.path}: tensor '{name}' has checksum {got}, the manifest says "
                           f"{want}: the file was damaged after it was written")
        self._checked[name] = t
        return t


class _ShardList:
    """The manifest's shard entries as _core.manifest_index keeps them (files, rows, checksums in
    tensors); a _Shard is made when first used."""

    def __init__(self, dir: str, index: dict):
        self.dir = dir
        self._names: bytes = index["file_names"]
        self._ends: torch.Tensor = index["file_ends"]
        self.rows: torch.Tensor = index["rows"]
        self.total_rows = int(self.rows.sum())
        self._index = index
        self._made: Dict[int, _Shard] = {}

    def __len__(self) -> int:
        return int(self._ends.numel())

    def __iter__(self) -> Iterator[_Shard]:
        return (self[i] for i in range(len(self)))

    def file(self, i: int) -> str:
        return self._names[int(self._ends[i - 1]) if i else 0:int(self._ends[i])].decode("utf-8")

    def __getitem__(self, i: int) -> _Shard:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"shard {i} is outside 0..{len(self) - 1}")
        s = self._made.get(i)
        if s is None:
            x = self._index
            state = int(x["header_state"][i])
            header = (f"{_unsigned(int(x['header'][i])):016x}" if state == 1 else
                      x["header_text"].get(i) if state == 2 else None)
            checksums: Dict[str, str] = {}
            states = x["checksum_state"][:, i].tolist()
            values = x["checksums"][:, i].tolist()
            for c, name in enumerate(x["names"]):
                if states[c] == 1:
                    checksums[name] = f"{_unsigned(values[c]):016x}"
                elif states[c] == 2:
                    checksums[name] = x["checksum_text"][(i, name)]
            s = _Shard(self.dir, self.file(i), int(self.rows[i]), header, checksums)
            self._made[i] = s
        return s


class Dataset:
    """An actcap output folder. ``ds[point]`` is every row of a point (zero-copy when the folder
    has one shard), ``ds.rows_of()`` their provenance, ``ds.batches(...)`` a seeded shuffled
    iterator for training (SAEs, probes). Every tensor read is checked against the manifest's
    checksums; ``verify()`` checks the whole folder as ``actcap verify`` does. Tensors share the
    mapped file: treat them as read-only (copy before writing to them)."""

    def __init__(self, dir: Union[str, os.PathLike], *, allow_incomplete: bool = False):
        self.dir = os.fspath(dir)
        path = os.path.join(self.dir, "manifest.json")
        if not os.path.isdir(self.dir):
            raise InputError(f"{self.dir} is not a folder")
        if not os.path.isfile(path):
            raise InputError(f"{self.dir} is not an actcap output folder (no manifest.json)")
        # The shard list is read as a stream and kept as tensors (_ShardList): a folder of 1M
        # shards has a manifest of about a gigabyte, several gigabytes as Python objects.
        index = _core.manifest_index(path)
        manifest = index["outline"]
        fmt = manifest.get("format") if isinstance(manifest, dict) else None
        if not isinstance(fmt, str) or not fmt.startswith("actcap/"):
            raise InputError(f"{path}: not an actcap manifest (format {fmt!r})")
        if not manifest.get("complete", False) and not allow_incomplete:
            raise InputError(f"{self.dir}: the run that wrote it did not complete; resume it "
                             "(actcap extract --resume) or pass allow_incomplete=True to read the "
                             "shards the manifest lists")
        # The manifest without its shard list ("shards" is []): the shards are ds.shard(i).
        self.manifest = manifest
        self.points: List[str] = list(manifest.get("points", {}))
        self.dtypes = {p: _convert.SAFETENSORS_DTYPES.get(v.get("dtype"))
                       for p, v in manifest.get("points", {}).items()}
        self.shapes = {p: list(v.get("shape", [])) for p, v in manifest.get("points", {}).items()}
        self._shards = _ShardList(self.dir, index)
        # The row tensors this folder's format has: __rows__.token since actcap/3, __rows__.step
        # in a generation's output.
        self.row_tensors = ["__rows__.seq", "__rows__.pos"]
        if fmt not in ("actcap/1", "actcap/2"):
            self.row_tensors.append("__rows__.token")
        if "generation" in manifest:
            self.row_tensors.append("__rows__.step")
        self.rows = self._shards.total_rows

    def __repr__(self) -> str:
        return (f"actcap.Dataset({self.dir!r}: {self.rows} rows, {len(self._shards)} shards, "
                f"points {self.points})")

    def __len__(self) -> int:
        return self.rows

    @property
    def shards(self) -> int:
        return len(self._shards)

    def _check_point(self, point: str) -> None:
        if point in ROW_TENSORS and point not in self.row_tensors:
            raise InputError(f"{self.dir} has no {point} (format {self.manifest.get('format')}"
                             + (": token ids came with actcap/3; write it again"
                                if point == "__rows__.token" else ": not a generation") + ")")
        if point not in self.points and point not in ROW_TENSORS:
            near = _core.nearest_points(point, self.points)
            raise InputError(f"'{point}' is not a point of {self.dir}"
                             + (f"; nearest: {', '.join(near)}" if near else ""))

    def shard(self, index: int) -> Dict[str, torch.Tensor]:
        """Every tensor of shard ``index``, zero-copy, verified."""
        if not 0 <= index < len(self._shards):
            raise InputError(f"shard {index} is outside 0..{len(self._shards) - 1}")
        s = self._shards[index]
        return {name: s.tensor(name) for name in list(self.points) + self.row_tensors}

    def __getitem__(self, point: str) -> torch.Tensor:
        self._check_point(point)
        parts = [s.tensor(point) for s in self._shards]
        if not parts:
            return torch.empty([0] + self.shapes.get(point, []), dtype=self.dtypes.get(point, torch.int64))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def rows_of(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(sequence or document line, position) of every row."""
        return self["__rows__.seq"], self["__rows__.pos"]

    def stats(self) -> Dict[str, Dict[str, torch.Tensor]]:
        """The run's statistics (``extract(..., stats=True)``): {point: {count, mean, m2, var, min,
        max, top_value, top_seq, top_pos, top_token}}, float64 / int64, each checked against the
        manifest's checksum. InputError when the run kept none."""
        entry = self.manifest.get("stats")
        if not isinstance(entry, dict) or "file" not in entry:
            raise InputError(f"{self.dir} has no statistics (extract it with stats=True)")
        checksums = entry.get("checksums")
        f = _Shard(self.dir, str(entry["file"]), 0, entry.get("header_xxh3"),
                   checksums if isinstance(checksums, dict) else {})
        out: Dict[str, Dict[str, torch.Tensor]] = {}
        for p in self.points:
            prefix = f"__stats__.{p}."
            names = ["count", "mean", "m2", "var", "min", "max"]
            if int(entry.get("top_k", 0)) > 0:
                names += ["top_value", "top_seq", "top_pos", "top_token"]
            out[p] = {n: f.tensor(prefix + n) for n in names}
        return out

    @property
    def tokens(self) -> torch.Tensor:
        """The token id of every row (``__rows__.token``; -1 where the writer did not know it)."""
        return self["__rows__.token"]

    def verify(self) -> dict:
        """Checks the whole folder as ``actcap verify`` does; RunError listing the problems."""
        report = _core.verify(self.dir)
        if not report["ok"]:
            lines = [f"{f}{' ' + t if t else ''}: {p}" for f, t, p in report["issues"][:10]]
            raise RunError(f"{self.dir} failed verification:\n  " + "\n  ".join(lines))
        return report

    def batches(self, points: Union[str, Sequence[str]], batch_size: int, *, shuffle: bool = True,
                seed: int = 0, drop_last: bool = False,
                dtype: Optional[torch.dtype] = None) -> Iterator:
        """Batches of rows across every shard: a tensor [batch_size, ...] for one point, a dict for
        several. ``shuffle``: a permutation of all rows from ``seed`` (the same seed gives the
        same batches); otherwise rows in order. ``dtype`` converts (e.g. torch.float32 from bf16)."""
        single = isinstance(points, str)
        names = [points] if single else list(points)
        for p in names:
            self._check_point(p)
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1 (got {batch_size})")
        counts = self._shards.rows
        total = self._shards.total_rows
        starts_t = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
        starts = starts_t.tolist()
        if shuffle:
            g = torch.Generator()
            g.manual_seed(int(seed))
            order = torch.randperm(total, generator=g)
        else:
            order = torch.arange(total)
        for b in range(0, total, batch_size):
            idx = order[b:b + batch_size]
            if drop_last and idx.numel() < batch_size:
                break
            shard_of = torch.searchsorted(starts_t, idx, right=True) - 1
            out = {}
            for p in names:
                rows = None
                for si in torch.unique(shard_of).tolist():
                    sel = (shard_of == si).nonzero().flatten()
                    src = self._shards[si].tensor(p)
                    part = src.index_select(0, idx[sel] - starts[si])
                    if rows is None:
                        rows = torch.empty((idx.numel(),) + tuple(part.shape[1:]), dtype=part.dtype)
                    rows[sel] = part
                out[p] = rows if dtype is None else rows.to(dtype)
            yield out[names[0]] if single else out


def open(dir: Union[str, os.PathLike], *, allow_incomplete: bool = False) -> Dataset:  # noqa: A001
    """An actcap output folder as a Dataset (InputError when it is not one)."""
    return Dataset(dir, allow_incomplete=allow_incomplete)


def verify(dir: Union[str, os.PathLike]) -> dict:
    """``actcap verify DIR``: the report (ok, shards, tensors, bytes, issues)."""
    return _core.verify(os.fspath(dir))


def merge(dir: Union[str, os.PathLike]) -> dict:
    """``actcap merge DIR``: assembles manifest.json from the rank manifests of a ranked extract
    (docs/scale.md); the summary (manifest, world_size, shards, rows). RunError naming the ranks
    that have not finished; InputError for a folder without rank manifests."""
    return _core.merge(os.fspath(dir))
