"""Minimal safetensors reader/writer in pure Python (json + numpy), for the actcap test-suite.

Format (https://github.com/huggingface/safetensors):
    [u64 little-endian N][N bytes of UTF-8 JSON header][data section]
The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
relative to the start of the data section; the optional "__metadata__" entry maps str -> str.

bf16 has no numpy dtype: it is read as uint16 and widened to float32 by shifting the bits left by 16
(exact), and written by rounding float32 to nearest-even on the upper 16 bits.

Besides the plain load/save API there is a raw API (read_raw / write_raw) that keeps the header dict
and the data bytes apart, so tests can corrupt a header without touching the data.
"""
import json
import os
import struct

import numpy as np

# safetensors dtype name -> numpy dtype used for storage (BF16 stored as uint16 bit patterns).
_NP_OF = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "F8_E4M3": np.dtype("u1"),  # the codes, as bytes (numpy has no 8-bit floats)
    "F8_E5M2": np.dtype("u1"),
}

_NAME_OF = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("int16"): "I16",
    np.dtype("int8"): "I8",
    np.dtype("uint64"): "U64",
    np.dtype("uint32"): "U32",
    np.dtype("uint16"): "U16",
    np.dtype("uint8"): "U8",
    np.dtype("bool"): "BOOL",
}


class SafetensorsError(ValueError):
    pass


def bf16_bits_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 -> uint16 bf16 bit patterns, round-to-nearest-even (NaN kept quiet)."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = x.view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


# ---------------------------------------------------------------------------------------------
# raw API
# ---------------------------------------------------------------------------------------------

def read_raw(path):
    """Returns (header dict incl. __metadata__ if present, data bytes). Minimal validation."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise SafetensorsError(f"{path}: header length {n} past end of file")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    return header, blob[8 + n:]


def encode_header(header, align=8):
    """JSON-encodes a header dict and pads it with spaces to a multiple of `align` bytes."""
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if align:
        hb += b" " * ((-len(hb)) % align)
    return hb


def write_raw(path, header, data, header_bytes=None, header_len=None):
    """Writes a safetensors file from a header dict (or explicit header bytes) and data bytes.

    header_len overrides the u64 length prefix (to build broken files)."""
    hb = header_bytes if header_bytes is not None else encode_header(header)
    n = len(hb) if header_len is None else header_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.write(hb)
        f.write(data)


# ---------------------------------------------------------------------------------------------
# high-level API
# ---------------------------------------------------------------------------------------------

def _validate(path, header, data_len):
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
                raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
            continue
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"{path}: tensor {name}: bad entry {info!r}")
        dt = info["dtype"]
        if dt not in _NP_OF:
            raise SafetensorsError(f"{path}: tensor {name}: unknown dtype {dt}")
        shape = info["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{path}: tensor {name}: bad shape {shape!r}")
        b, e = info["data_offsets"]
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if e < b or e - b != numel * _NP_OF[dt].itemsize:
            raise SafetensorsError(f"{path}: tensor {name}: {e - b} bytes for shape {shape} {dt}")
        if e > data_len:
            raise SafetensorsError(f"{path}: tensor {name}: offsets outside the data section")
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            raise SafetensorsError(f"{path}: tensor {name}: hole or overlap at {b} (expected {pos})")
        pos = e
    if pos != data_len:
        raise SafetensorsError(f"{path}: data section has {data_len - pos} trailing bytes")


def load(path, upcast_bf16=True):
    """Loads every tensor. Returns (dict name -> numpy array, metadata dict).

    BF16 tensors are returned as float32 when upcast_bf16 (default), else as uint16 bit patterns."""
    header, data = read_raw(path)
    _validate(path, header, len(data))
    meta = header.get("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(data, dtype=_NP_OF[info["dtype"]], count=(e - b) // _NP_OF[info["dtype"]].itemsize,
                            offset=b).reshape(info["shape"]).copy()
        if info["dtype"] == "BF16" and upcast_bf16:
            arr = bf16_bits_to_f32(arr)
        out[name] = arr
    return out, meta


def dtypes(path):
    """name -> safetensors dtype name as written in the file."""
    header, _ = read_raw(path)
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def save(path, tensors, metadata=None, dtype_names=None):
    """Writes tensors (dict name -> numpy array, insertion order kept) to `path`.

    dtype_names optionally maps a name to "BF16": that float32 array is then stored as bf16
    (a uint16 array given for a "BF16" name is taken as raw bits); or to "F8_E4M3" / "F8_E5M2":
    that uint8 array holds the codes."""
    dtype_names = dtype_names or {}
    header = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    pos = 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if dtype_names.get(name) == "BF16":
            bits = arr if arr.dtype == np.uint16 else f32_to_bf16_bits(arr)
            raw = np.ascontiguousarray(bits.astype("<u2")).tobytes()
            dt = "BF16"
        elif dtype_names.get(name) in ("F8_E4M3", "F8_E5M2"):
            if arr.dtype != np.uint8:
                raise SafetensorsError(f"{name}: 8-bit float codes must be uint8, not {arr.dtype}")
            raw = np.ascontiguousarray(arr).tobytes()
            dt = dtype_names[name]
        else:
            if arr.dtype not in _NAME_OF:
                raise SafetensorsError(f"cannot store dtype {arr.dtype} ({name})")
            dt = _NAME_OF[arr.dtype]
            raw = np.ascontiguousarray(arr.astype(_NP_OF[dt])).tobytes()
        header[name] = {"dtype": dt, "shape": [int(d) for d in arr.shape],
                        "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    tmp = str(path) + ".tmp"
    write_raw(tmp, header, b"".join(chunks))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# checkpoints (single file or sharded with model.safetensors.index.json)
# ---------------------------------------------------------------------------------------------

def checkpoint_files(ckpt_dir):
    """Paths of the safetensors files of a HF checkpoint dir, plus the weight_map (or None)."""
    idx = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
        return [os.path.join(ckpt_dir, f) for f in files], weight_map
    single = os.path.join(ckpt_dir, "model.safetensors")
    if os.path.exists(single):
        return [single], None
    raise FileNotFoundError(f"{ckpt_dir}: no model.safetensors or model.safetensors.index.json")


def load_checkpoint(ckpt_dir):
    """All tensors of a checkpoint dir as numpy arrays (bf16 widened to f32)."""
    files, weight_map = checkpoint_files(ckpt_dir)
    out = {}
    for p in files:
        tensors, _ = load(p)
        for k, v in tensors.items():
            if k in out:
                raise SafetensorsError(f"tensor {k} appears in two shards")
            if weight_map is not None and os.path.join(ckpt_dir, weight_map.get(k, "")) != p:
                raise SafetensorsError(f"tensor {k} in {p} but index says {weight_map.get(k)}")
            out[k] = v
    if weight_map is not None:
        missing = set(weight_map) - set(out)
        if missing:
            raise SafetensorsError(f"index lists tensors absent from shards: {sorted(missing)}")
    return out


def save_sharded(ckpt_dir, tensors, n_shards=2, dtype_names=None):
    """Splits tensors into n_shards files model-0000i-of-0000n.safetensors + index json."""
    names = list(tensors)
    per = (len(names) + n_shards - 1) // n_shards
    weight_map = {}
    total = 0
    for i in range(n_shards):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[i * per:(i + 1) * per]}
        dn = {k: v for k, v in (dtype_names or {}).items() if k in part}
        save(os.path.join(ckpt_dir, fname), part, metadata={"format": "pt"}, dtype_names=dn)
        for k, v in part.items():
            weight_map[k] = fname
            item = 2 if dn.get(k) == "BF16" else np.asarray(v).dtype.itemsize
            total += int(np.asarray(v).size) * item
    with open(os.path.join(ckpt_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
