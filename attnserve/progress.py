"""Progress lines of the long jobs that draw no bar: an export (a minute or more: a first `attnserve encode` or
`serve` runs one before anything else) and a first start's graph calibration (seconds to tens of seconds).

Each step says when it starts, with the time since the job began; while a step runs on without a line (one
torch.onnx.export, one optimizer pass, one verification), a heartbeat line says it still runs every
HEARTBEAT_SECONDS, so a person never watches the terminal for longer than that and wonders whether it hangs.

    with Progress(log) as progress:
        progress.plan([("trace", 12.0), ("fuse", 6.0)])       # stages with their estimated seconds
        progress.stage("trace")                                 # "stage 1 of 2: trace (about 12 s of 18 s)"
        progress.step("tracing the embeddings graph")
        ...
        progress.log("fused attention: 6 Attention nodes")   # a result line, as it is
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

# A line at least this often (the target is 10 s of silence at most, with room for a slow machine's scheduling).
HEARTBEAT_SECONDS = 5.0
# The logger of the calibration's lines: serve's log carries them; the other commands show them on stderr.
progress_log = logging.getLogger("attnserve.progress")


class Progress:
    """The steps of one job, and a heartbeat thread while it runs (as a context manager)."""

    def __init__(self, log: Callable[[str], None], heartbeat: float = HEARTBEAT_SECONDS):
        self._log, self._heartbeat = log, heartbeat
        self._started = self._last_line = time.monotonic()
        self._step: str | None = None
        self._step_started = self._started
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._plan: list[tuple[str, float]] = []

    def plan(self, stages: list[tuple[str, float]]) -> None:
        """The job's stages in order, each with its estimated seconds (a model of the job, not a measurement: the
        lines say "about")."""
        self._plan = list(stages)

    def stage(self, name: str) -> None:
        """A planned stage begins: "[  1.2s] stage 2 of 5: name (about 6 s; about 30 s left in all)"."""
        names = [n for n, _ in self._plan]
        if name not in names:
            self.step(name)
            return
        i = names.index(name)
        seconds = self._plan[i][1]
        left = sum(s for _, s in self._plan[i:])
        self.step(f"stage {i + 1} of {len(names)}: {name} (about {_seconds(seconds)}; about {_seconds(left)} left "
                  "in all)")

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._beat, name="attnserve-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def step(self, what: str) -> None:
        """A new step begins (the one before has ended): "[  12.3s] what"."""
        with self._lock:
            self._step, self._step_started = what, time.monotonic()
        self.log(f"[{self._elapsed()}] {what}")

    def log(self, line: str) -> None:
        """A line as it is (a step's result); it counts as a sign of life."""
        with self._lock:
            self._last_line = time.monotonic()
        self._log(line)

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self._started:5.1f}s"

    def _beat(self) -> None:
        while not self._done.wait(min(1.0, self._heartbeat / 2)):
            with self._lock:
                quiet = time.monotonic() - self._last_line
                step, running = self._step, time.monotonic() - self._step_started
            if step is not None and quiet >= self._heartbeat:
                self.log(f"[{self._elapsed()}] ... still {step} ({running:.0f}s)")


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def show_on_stderr() -> None:
    """For the commands other than serve: progress_log's lines on stderr as "attnserve: ..." lines (serve's own
    log configuration carries them as its other lines instead)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("attnserve: %(message)s"))
    progress_log.handlers[:] = [handler]
    progress_log.setLevel(logging.INFO)
    progress_log.propagate = False
