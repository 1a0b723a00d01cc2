"""The most this process's resident memory grew while a block ran, sampled from /proc: a test's own bound, which the
process's lifetime peak (getrusage's ru_maxrss) is not when xdist runs other files' tests in the same worker."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class Growth:
    bytes: int = 0  # the peak over the RSS at the start, once the block has run


@contextlib.contextmanager
def rss_growth(every_s: float = 0.005) -> Iterator[Growth]:
    """Within it, a thread samples the RSS; growth.bytes is its peak less the RSS at entry."""
    growth, start, stop = Growth(), rss_bytes(), threading.Event()
    peak = [start]

    def sample() -> None:
        while not stop.wait(every_s):
            peak[0] = max(peak[0], rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield growth
    finally:
        stop.set()
        sampler.join()
        growth.bytes = max(peak[0], rss_bytes()) - start
