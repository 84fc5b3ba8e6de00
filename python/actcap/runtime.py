"""Process settings that make PyTorch forwards faster on CPU, as the actcap CLI sets for itself."""
from __future__ import annotations

import ctypes
import ctypes.util

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4


def keep_freed_memory(trim_threshold: int = 1 << 30, top_pad: int = 64 << 20) -> bool:
    """Tells glibc to keep freed memory for reuse instead of handing it back to the system
    (``mallopt``: no mmap'd chunks, a 1 GiB trim threshold, 64 MiB top pad), for the whole
    process and from now on. A CPU forward then stops faulting its temporaries in again on every
    call (BENCHMARKS.md item 10: a GPT-2-small forward took 15-22% less time here), and capturing with
    SafeCapturer no longer moves where they land. The cost: the process's resident memory stays
    at its peak. Same as the environment variables ``MALLOC_MMAP_MAX_=0
    MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864``. Returns False where the C
    library is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)) == 1
    ok &= mallopt(_M_TOP_PAD, int(top_pad)) == 1
    return bool(ok)
