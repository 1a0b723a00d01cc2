"""Handing freed memory back to the system between export's steps.

Each step loads a graph (hundreds of MB to GB), builds another and frees both; glibc keeps much of what was freed
in its heaps (onnxruntime's threads each have their own), so the process's resident memory only grew, step after
step: all-mpnet-base-v2 (0.41 GiB of fp32 weights) went 0.74 GiB after loading, 1.97 after tracing, 3.14 after
fusing, 5.29 after fp16, 5.74 at its peak in verification, 14x its weights. malloc_trim(0) returns the free
pages of every heap.

Within a step glibc keeps what it frees too: an allocation above its mmap threshold is mapped and unmapped on free,
but the threshold rises with each such free, up to 32 MiB, and what is freed below it stays in the heap of the
thread that freed it. A session's runs over long inputs (activations of tens of MB, freed on onnxruntime's
threads) so grew the export's process by 3-4 GiB in one step: a 0.6B model's fp32 session peaked at 7.64 GiB
running cases it needs 3.96 GiB for. small_heaps() fixes the threshold at 1 MiB while verification's sessions run.

Only there: a mapping per large allocation costs its page faults on every use, and PyTorch allocates each op's
output anew (all-mpnet-base-v2's reference pass took 27% longer at 1 MiB, a session's runs without an arena 12-15%
longer). PyTorch allocates on one thread, so its heap reuses what it frees; onnxruntime's optimizer, fp16 converter
and quantizer (export/isolated.py's children) run on one thread too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_frozen_lock = threading.Lock()
_frozen_depth = 0


@contextmanager
def collections_of_its_own() -> Iterator[None]:
    """Within the block, Python's cycle collections pass over the objects made before it (gc.freeze): an export
    collects after each of its ~30 steps a graph set, and a full collection costs by the objects the process holds,
    not by what the export freed: 0.25 s each in a process with transformers loaded (44 of a 60 s export of a tiny
    model). What the export makes and drops is collected as before; at the block's end the objects from before it
    go back to the oldest generation. Nested blocks freeze once."""
    global _frozen_depth
    with _frozen_lock:
        if _frozen_depth == 0:
            gc.freeze()
        _frozen_depth += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen_depth -= 1
            if _frozen_depth == 0:
                gc.unfreeze()


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


MMAP_THRESHOLD = 2**20
# What glibc's own threshold rises to as large blocks are freed (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): once the
# threshold is set it no longer moves, so after small_heaps() it is set here.
MMAP_THRESHOLD_RISEN = 32 * 2**20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


@contextmanager
def small_heaps(threshold: int = MMAP_THRESHOLD) -> Iterator[None]:
    """Within the block, glibc maps every allocation of `threshold` bytes or more apart and unmaps it when freed;
    after it, the threshold is MMAP_THRESHOLD_RISEN and the freed pages go back. A no-op where libc is not glibc."""
    _set_mmap_threshold(threshold)
    try:
        yield
    finally:
        _set_mmap_threshold(MMAP_THRESHOLD_RISEN)
        release_freed_memory()


def _set_mmap_threshold(size: int) -> None:
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, size)
