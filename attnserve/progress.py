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
import re
import sys
import threading
import time
from collections.abc import Callable

# A line at least this often (the target is 10 s of silence at most, with room for a slow machine's scheduling).
HEARTBEAT_SECONDS = 5.0
# The logger of the calibration's lines: serve's log carries them; the other commands show them on stderr.
progress_log = logging.getLogger("attnserve.progress")
# An export's lines (attnserve/default_model.py): a child of progress_log, so that they go where its lines go.
export_log = progress_log.getChild("export")
# How far the stages already run may move the estimates of those left, either way: a first stage of a tiny model is
# mostly fixed costs, and a pace measured over a second must not make a minute's stage read as a second.
PACE_LIMITS = (0.1, 10.0)

# The lines Progress writes, read back into fields (line_fields): a JSON log carries them as data.
_STEP = re.compile(r"^\[ *(?P<elapsed>\d+(?:\.\d+)?)s\] (?P<what>.*)$")
_STAGE = re.compile(r"^stage (?P<stage>\d+) of (?P<of>\d+): (?P<name>.*) \(about (?P<seconds>\d+) (?P<unit>s|min); "
                    r"about (?P<left>\d+) (?P<left_unit>s|min) left in all\)$")
_STILL = re.compile(r"^\.\.\. still (?P<step>.*) \((?P<running>\d+)s\)$")


class Progress:
    """The steps of one job, and a heartbeat thread while it runs (as a context manager)."""

    def __init__(self, log: Callable[[str], None], heartbeat: float = HEARTBEAT_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        """clock: seconds, as time.monotonic (a test's own)."""
        self._log, self._heartbeat, self._clock = log, heartbeat, clock
        self._started = self._last_line = clock()
        self._step: str | None = None
        self._step_started = self._started
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._plan: list[tuple[str, float]] = []
        self._stage: tuple[float, float] | None = None  # the planned stage running: (its estimate, its start)
        self._stages_run: list[tuple[float, float]] = []  # (estimate, seconds taken) of each planned stage ended

    def plan(self, stages: list[tuple[str, float]]) -> None:
        """The job's stages in order, each with its estimated seconds (a model of the job, not a measurement: the
        lines say "about"). Once stages have run, those left are estimated at the pace they were run (pace())."""
        self._plan = list(stages)

    def stage(self, name: str) -> None:
        """A planned stage begins: "[  1.2s] stage 2 of 5: name (about 6 s; about 30 s left in all)"."""
        names = [n for n, _ in self._plan]
        if name not in names:
            self.step(name)
            return
        i = names.index(name)
        now = self._clock()
        self._end_stage(now)
        pace = self.pace()
        seconds = self._plan[i][1] * pace
        left = sum(s for _, s in self._plan[i:]) * pace
        self._stage = (self._plan[i][1], now)
        self.step(f"stage {i + 1} of {len(names)}: {name} (about {_seconds(seconds)}; about {_seconds(left)} left "
                  "in all)")

    def pace(self, running: bool = False) -> float:
        """Seconds taken per second estimated, over the planned stages run so far (running: and the one running
        now, up to now), within PACE_LIMITS; 1.0 before any. How fast this machine is now, against the plan."""
        runs = list(self._stages_run)
        if running and self._stage is not None:
            runs.append((self._stage[0], self._clock() - self._stage[1]))
        estimated = sum(e for e, _ in runs)
        if estimated <= 0:
            return 1.0
        low, high = PACE_LIMITS
        return min(high, max(low, sum(t for _, t in runs) / estimated))

    def _end_stage(self, now: float) -> None:
        if self._stage is not None:
            self._stages_run.append((self._stage[0], now - self._stage[1]))
            self._stage = None

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
            self._step, self._step_started = what, self._clock()
        self.log(f"[{self._elapsed()}] {what}")

    def log(self, line: str) -> None:
        """A line as it is (a step's result); it counts as a sign of life."""
        with self._lock:
            self._last_line = self._clock()
        self._log(line)

    def _elapsed(self) -> str:
        return f"{self._clock() - self._started:5.1f}s"

    def _beat(self) -> None:
        while not self._done.wait(min(1.0, self._heartbeat / 2)):
            with self._lock:
                quiet = self._clock() - self._last_line
                step, running = self._step, self._clock() - self._step_started
            if step is not None and quiet >= self._heartbeat:
                self.log(f"[{self._elapsed()}] ... still {step} ({running:.0f}s)")


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _in_seconds(number: str, unit: str) -> int:
    return int(number) * (60 if unit == "min" else 1)


def line_fields(line: str) -> dict[str, object]:
    """A Progress line's data, for a JSON log: elapsed_seconds and step of a step's line; stage, of, seconds and
    left_seconds of a stage's; running_seconds of a heartbeat's. {} for any other line (a result, as it is)."""
    step = _STEP.match(line)
    if step is None:
        return {}
    what = step["what"]
    fields: dict[str, object] = {"elapsed_seconds": float(step["elapsed"]), "step": what}
    if stage := _STAGE.match(what):
        fields.update(step=stage["name"], stage=int(stage["stage"]), of=int(stage["of"]),
                      seconds=_in_seconds(stage["seconds"], stage["unit"]),
                      left_seconds=_in_seconds(stage["left"], stage["left_unit"]))
    elif still := _STILL.match(what):
        fields.update(step=still["step"], running_seconds=int(still["running"]))
    return fields


class _StderrFormatter(logging.Formatter):
    """Lines as "attnserve: message", a warning's as "attnserve: warning: message": a person sees which is which."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"attnserve: {level}{record.getMessage()}"


def show_on_stderr() -> None:
    """For the commands other than serve: progress_log's lines (and its child export_log's) on stderr as
    "attnserve: ..." lines (serve's own log configuration carries them as its other lines instead)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_StderrFormatter())
    progress_log.handlers[:] = [handler]
    progress_log.setLevel(logging.INFO)
    progress_log.propagate = False
