"""How fast this machine builds graphs now, against the machine engine/variants.py's STEP_SECONDS were measured on:
the factor a build's estimates are scaled by (an export's stage lines, a server's Retry-After while it builds).

The table alone was 3 to 10 times too low on a busy 2-core machine ("about 6 s" took 17 s): its seconds are one
quiet machine's. Two measures of this one, multiplied:

  probe       a fixed piece of work timed now (probe_seconds: some 40 ms), against its time on the reference:
              how fast this CPU is, and how much of it other processes leave, at the moment.
  correction  what the probe misses of how this machine runs an export's steps: how far the last export's stages
              ran from their estimates (probe included), recorded in the cache (build-speed.json) for the next.

Within an export, the stages already run also set the pace of those left (attnserve/progress.py Progress.pace).
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
import time

import numpy as np

from attnserve.cache import cache_root

log = logging.getLogger("attnserve.engine")

# The probe's seconds on the machine STEP_SECONDS describe: measured beside the default model's first export on a
# 2-core Xeon (AVX-512) at a load of about 1, whose trace stage took 3.2 s of the table's 6 while the probe took
# 10.3 ms, so 10.3 x 6 / 3.2 ms. On a busy machine (other processes on the cores) the probe takes 2 to 3 times longer,
# as the export's steps do.
REFERENCE_PROBE_SECONDS = 0.0193
# The factor's bounds: a probe descheduled at a bad moment, or a record from a very different export, must not make
# an estimate absurd.
FACTOR_LIMITS = (0.1, 20.0)
# An export this short (in estimated seconds) teaches no correction: its stages are mostly fixed costs (a tiny test
# model's trace takes half a second), which say little of a real model's.
LEARN_FROM_SECONDS = 10.0
RECORD = "build-speed.json"
FORMAT_VERSION = 1


def _work() -> int:
    """The probe's work: numpy's element-wise passes (one thread whatever BLAS is set to) and a Python loop, as an
    export is both: onnxruntime's and torch's kernels, and the Python that traces, optimizes and checks."""
    values = np.arange(1 << 16, dtype=np.float32)
    for _ in range(150):
        values = np.sqrt(values * np.float32(1.0001) + np.float32(1.0))
    total = 0
    for i in range(150_000):
        total += i * i % 7
    return total


def probe_seconds() -> float:
    """The probe's time now: the median of three runs after a warm one, so that one descheduling does not decide
    it, while a busy machine's steady share of its cores does."""
    _work()
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        _work()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


@functools.cache
def _probed_once() -> float:
    """probe_seconds, once per process: a server asks for an estimate with every request refused while it builds."""
    return probe_seconds()


def _bounded(factor: float) -> float:
    low, high = FACTOR_LIMITS
    return min(high, max(low, factor))


def _record_path():
    return cache_root() / RECORD


def recorded_correction() -> float:
    """The correction the last export recorded (learn()); 1.0 where none was, or it cannot be read."""
    try:
        record = json.loads(_record_path().read_text())
        return _bounded(float(record["correction"])) if record.get("format_version") == FORMAT_VERSION else 1.0
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return 1.0


def slowdown(probe: float | None = None) -> float:
    """This machine's seconds per second of STEP_SECONDS now: the probe's time (`probe`; None: measured now, once
    per process) against the reference's, times the recorded correction."""
    seconds = _probed_once() if probe is None else probe
    return _bounded(seconds / REFERENCE_PROBE_SECONDS * recorded_correction())


def learn(estimated: float, pace: float) -> None:
    """An export's stages, estimated at `estimated` seconds in all, ran at `pace` (seconds taken per second
    estimated: Progress.pace): the correction is moved by it for the next estimate, where the export was long enough
    to say something (LEARN_FROM_SECONDS). A cache that cannot be written keeps the old one: estimates only."""
    if estimated < LEARN_FROM_SECONDS:
        return
    path = _record_path()
    correction = _bounded(recorded_correction() * pace)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{time.monotonic_ns()}")
        temporary.write_text(json.dumps({"format_version": FORMAT_VERSION, "correction": round(correction, 4)}))
        temporary.replace(path)  # whole or not at all: other processes read it
    except OSError as e:
        log.debug("build speed not recorded in %s: %s", path, e.strerror or e)
