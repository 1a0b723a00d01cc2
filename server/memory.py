"""Memory freed after large replies, handed back to the operating system once the server is idle.

An attention reply is tens of MiB, built as numpy arrays, a protobuf message and its bytes. glibc's malloc keeps
what they freed in its heaps for reuse, so after a burst of them the process stayed hundreds of MiB larger than it
needs, for good; malloc_trim returns the free pages. It runs only when no request has been in progress for a while
after at least TRIM_AFTER_BYTES of replies, so it costs nothing under load. Tokenizing a long text leaves its heaps
larger in the same way, and counts too. A door frees a reply's bytes only once the client has taken them, seconds
after the request was done for a slow client or a large burst (a trim before that found the heap still full, and the
CI run where it did kept 1.36x the memory), so trims follow at TRIM_DELAYS for as long as the server stays idle.
Where there is no malloc_trim (musl, macOS, Windows) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from concurrent.futures import Executor

log = logging.getLogger("attnserve.server")

# Replies built since the last trim before the next is worth a call: a few attention replies, or a
# hundred thousand sentence embeddings.
TRIM_AFTER_BYTES = 64 * 2**20
# What tokenizing a text costs its heaps, per character, counted with the replies: the tokenizers library keeps an
# alignment (two machine words) per byte of a text it normalizes, in the heap of the thread that ran it, so a 4 MiB
# text left the server 100 to 180 MB larger until a trim (tests/test_tokenizer_cut.py). Requests of long texts
# are then followed by trims as large replies are.
TEXT_HEAP_BYTES_PER_CHAR = 16
# Seconds of no request in progress before each trim, each after the one before: the first when a burst is over,
# not between two requests; the later ones after the doors have sent the burst's replies and freed them. Doubling
# from 1 s (trims at 1, 3, 7, 15 and 31 s): replies a client took between two trims are handed back within about
# as long again (with 1, 4 and 16, those taken just after the 5 s trim waited until 21 s, and a CI run measured
# 1.23x the memory 10 s after its client was done).
TRIM_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0)


def _malloc_trim():
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, where it is the libc
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


MALLOC_TRIM = _malloc_trim()


class MemoryReturn:
    """The service calls busy() when a request starts and done(reply bytes, text characters) when it ends, on the
    event loop."""

    def __init__(self, executor: Executor):
        self._executor = executor  # malloc_trim walks the heaps: off the event loop
        self._in_progress = 0
        self._since_trim = 0
        self._timer: asyncio.TimerHandle | None = None

    def busy(self) -> None:
        self._in_progress += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def done(self, reply_bytes: int, text_chars: int = 0) -> None:
        self._in_progress -= 1
        self._since_trim += reply_bytes + TEXT_HEAP_BYTES_PER_CHAR * text_chars
        if self._in_progress == 0 and self._since_trim >= TRIM_AFTER_BYTES and MALLOC_TRIM is not None:
            self._schedule(0)  # a request in between starts the trims over: its own reply is freed later too

    def _schedule(self, step: int) -> None:
        self._timer = asyncio.get_running_loop().call_later(TRIM_DELAYS[step], self._trim, step)

    def _trim(self, step: int) -> None:
        self._timer = None
        try:
            asyncio.get_running_loop().run_in_executor(self._executor, MALLOC_TRIM, 0)
        except RuntimeError:  # the executor is shut down: the server is stopping
            return
        log.debug("memory trimmed", extra={"fields": {"event": "memory_trimmed", "step": step}})
        if step + 1 < len(TRIM_DELAYS):
            self._schedule(step + 1)
        else:
            self._since_trim = 0
