"""Handing back the pages of a graph's weight files once a runtime has read them into a layout of its own.

OpenVINO maps a graph's data files (ONNX external data, export/external_data.py) and, on a graph's first run, packs
each matrix product's weights into a private copy in its own layout. The mapped pages it read stay in the process's
resident set afterwards, clean and never read again, until memory runs short: a compiled model holds its weights
twice in RSS. Measured with OpenVINO 2026.4 on 3-layer proxies of the 7B and 8B shapes compiled for bf16 (the half
trace read as compressed weights, engine/openvino_session.py), after one batch: 1.50 GB packed beside 1.53 GB of
resident file pages, and 1.36 GB beside 2.30 GB; 0.07 GB of file pages each (the libraries') once handed back. On a
24 GiB machine, a 7B model's export peaked at 1.72x its weights, its pages reclaimed only as memory ran out.

MADV_PAGEOUT (Linux 5.4 and later) asks the kernel to reclaim a mapping's pages now: a clean file page is dropped,
and read back from the file if it is touched again (an embedding table's rows, gathered per batch), as any mapped
page is. The outputs do not change (the same bits: tests/test_openvino.py). Elsewhere (another OS, an older kernel)
nothing is paged out and the process holds what it held before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

log = logging.getLogger("attnserve.engine")

MADV_PAGEOUT = 21  # <linux/mman.h>
# While a first run packs a large graph's weights (minutes for a 7B model on 2 cores), what it has read is handed
# back this often, so that the packed copy grows while the mapped pages do not: the peak is the packed weights and
# at most this long's reading beside them.
PAGE_OUT_EVERY_S = 0.5


def external_files(path: Path) -> list[str]:
    """The file names, relative to the graph's folder, that the graph at path reads its tensors from (sorted;
    none for a self-contained graph)."""
    # Initializers only: export's graphs keep no tensor in node attributes outside the graph (save_streamed puts
    # them inside, as onnx does by default).
    model = onnx.load(str(path), load_external_data=False)
    return sorted({ExternalDataInfo(t).location for t in model.graph.initializer if uses_external_data(t)})


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _madvise()


def mapped_ranges(files: Iterable[Path]) -> list[tuple[int, int]]:
    """The address ranges [start, end) at which this process maps any of files (/proc/self/maps)."""
    wanted = {os.path.realpath(f) for f in files}
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") in wanted:
                    start, end = fields[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
    except OSError:  # no /proc: nothing known to be mapped
        return []
    return ranges


def page_out(files: Iterable[Path]) -> int:
    """Ask the kernel to reclaim this process's mapped pages of files now; the bytes of the ranges advised (0 where
    the kernel or the OS cannot)."""
    if _MADVISE is None:
        return 0
    advised = 0
    for start, end in mapped_ranges(files):
        if _MADVISE(start, end - start, MADV_PAGEOUT) == 0:
            advised += end - start
        else:  # EINVAL before Linux 5.4: nothing to hand back this way
            log.debug("madvise(MADV_PAGEOUT) failed: %s", os.strerror(ctypes.get_errno()))
            return advised
    return advised


@contextmanager
def paging_out(files: list[Path], every_s: float = PAGE_OUT_EVERY_S) -> Iterator[None]:
    """Around a graph's first run: its files' mapped pages handed back every every_s while it runs, and once as it
    ends."""
    if not files or _MADVISE is None:
        yield
        return
    done = threading.Event()

    def keep_paging_out() -> None:
        while not done.wait(every_s):
            page_out(files)

    pager = threading.Thread(target=keep_paging_out, name="attnserve-page-out", daemon=True)
    pager.start()
    try:
        yield
    finally:
        done.set()
        pager.join()
        page_out(files)
