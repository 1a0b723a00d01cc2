"""Handing freed memory back to the system between export's steps.

Each step loads a graph (hundreds of MB to GB), builds another and frees both; glibc keeps much of what was freed
in its heaps (onnxruntime's threads each have their own), so the process's resident memory only grew, step after
step: all-mpnet-base-v2 (0.41 GiB of fp32 weights) went 0.74 GiB after loading, 1.97 after tracing, 3.14 after
fusing, 5.29 after fp16, 5.74 at its peak in verification, 14x its weights. malloc_trim(0) returns the free
pages of every heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def release_freed_memory() -> None:
    """Collect Python's cycles, then have glibc return its free pages (a no-op where libc is not glibc)."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return
    trim(0)
