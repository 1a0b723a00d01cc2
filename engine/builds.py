"""Graphs built when first needed: the artifact directory a run needs first, and the variants it asks for later.

Every build runs in a child process (export/build_process.py, started by the name attnserve/build_program.py
declares): the engine and the server never import export or torch, and what an export holds goes back to the system
when it exits. Its lines come to `log` as they come.

- export_in_child(): a new artifact directory, the graph the run needs first (serve and encode on a checkpoint).
- add_in_child(): variants added to a directory, in the foreground: a --precision whose graph is not built yet.
- BackgroundBuilds: in a server, a variant a request needs (the attention graphs, the quantized embeddings'
  ranges) is built in a thread that waits on the child, while the batcher goes on serving everything else.
  require() raises GraphBuildingError until it is built; the server's core holds such a request until then, within
  its deadline and --max-build-wait (server/build_wait.py), so that a first call is answered, more slowly. When the
  build ends, the engine reads the new manifest and the held requests run. A build that fails is not tried again
  by this process: its requests get GraphUnavailableError with the build's own message. serve --build starts the
  builds it names once the server serves (start()).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from attnserve.build_program import ERROR, command
from attnserve.errors import ArtifactError, GraphBuildingError, GraphUnavailableError

from .machine import this_machine
from .manifest import Manifest
from .session import CPU
from .variants import estimated_seconds as step_seconds
from .variants import fp32_weight_bytes, variants_of

# A child's start, its imports and the checkpoint's read, before the steps (engine/variants.py STEP_SECONDS).
START_SECONDS = 3.0
# The most a Retry-After says: a client polling a long build asks again at least this often.
MOST_RETRY_AFTER = 30.0


def run_child(args: list[str], log: Callable[[str], None]) -> None:
    """python -m attnserve.export.build_process ARGS, each line it writes to stderr passed to log; ArtifactError
    with its error line if it fails."""
    try:
        child = subprocess.Popen(command(args), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as e:
        raise ArtifactError(f"could not start the build: {e.strerror}") from None
    assert child.stderr is not None
    last = ""
    for line in child.stderr:
        line = line.rstrip("\n")
        if line.strip():
            last = line
            if not line.startswith(ERROR):
                log(line)
    code = child.wait()
    if code != 0:
        if last.startswith(ERROR):
            raise ArtifactError(last[len(ERROR):])
        raise ArtifactError(f"the build exited with status {code}" + (f": {last}" if last else "")
                            + (" (killed: out of memory?)" if code == -9 else ""))


def export_in_child(checkpoint: Path, name: str | None, out: Path, precision: str, provider: str,
                    log: Callable[[str], None]) -> None:
    """A new artifact directory at out: the graph a run of `precision` on `provider` needs first (run_variants,
    traced straight into fp16 for a half-precision run: trace_precision)."""
    run_child(["new", str(checkpoint), str(out), "--run", precision, "--provider", provider,
               *(["--name", name] if name else [])], log)


def add_in_child(directory: Path, variants: Iterable[str], provider: str, log: Callable[[str], None]) -> None:
    run_child(["add", str(directory), "--variants", ",".join(variants), "--provider", provider], log)


def has(manifest: Manifest, name: str) -> bool:
    """Whether the directory holds the variant, or "quantization" (the quantized embeddings' ranges)."""
    return manifest.quantization is not None if name == "quantization" else name in manifest.variants


def estimated_seconds(manifest: Manifest, names: Iterable[str], gpu: bool = False) -> float:
    """About how long building the variants takes, from the model's size, this machine's cores and how fast it
    runs now (engine/variants.py STEP_SECONDS, scaled by engine/speed.py's measure of this machine)."""
    from .speed import slowdown

    weights = fp32_weight_bytes(manifest.vocab_size, manifest.hidden_size, manifest.num_layers,
                                manifest.intermediate_size)
    table = variants_of(manifest.kind)
    steps = {table[n].step if n in table else n for n in names}
    cores, factor = this_machine().usable_cpus, slowdown()
    return START_SECONDS * factor + sum(step_seconds(step, weights, cores, gpu, manifest.max_seq_length, factor)
                                        for step in steps)


class BackgroundBuilds:
    """The builds of one artifact directory that a server's requests start (module docstring); one at a time.

    manifest(): the engine's current manifest; on_built(): called after a build, to read the new one."""

    def __init__(self, manifest: Callable[[], Manifest], provider: str, log: Callable[[str], None],
                 on_built: Callable[[], None]):
        self._manifest, self._provider, self._log, self._on_built = manifest, provider, log, on_built
        self._lock = threading.Lock()
        self._running: tuple[tuple[str, ...], float, threading.Thread] | None = None
        self._failed: dict[str, str] = {}  # variant -> why its build failed

    def require(self, names: Iterable[str], what: str) -> None:
        """Return if the directory holds every variant named; else start building the missing ones (unless a build
        runs) and raise GraphBuildingError, or GraphUnavailableError for one whose build failed. what: what
        needs them, for the message ("attention weights")."""
        manifest = self._manifest()
        missing = tuple(n for n in names if not has(manifest, n))
        if not missing:
            return
        with self._lock:
            failed = [n for n in missing if n in self._failed]
            if failed:
                raise GraphUnavailableError(f"{what} of {manifest.model} need {failed[0]}, which this server could "
                                            f"not build: {self._failed[failed[0]]}")
            building, started = self._start(missing, f"{what} were asked for")
        left = estimated_seconds(manifest, building, self._provider != CPU) - (time.monotonic() - started)
        raise GraphBuildingError(
            f"{what} of {manifest.model} need its {', '.join(missing)} graph, which is being built now (once; "
            f"{'about ' + str(round(left)) + ' s left' if left > 1 else 'finishing'})",
            retry_after=min(MOST_RETRY_AFTER, max(1.0, left)), needs=missing, what=what)

    def start(self, names: Iterable[str], why: str) -> None:
        """Build the variants named that the directory lacks, in the background, unless a build runs or failed:
        serve --build's graphs, once the server serves."""
        manifest = self._manifest()
        with self._lock:
            missing = tuple(n for n in names if not has(manifest, n) and n not in self._failed)
            if missing and self._running is None:
                self._start(missing, why)

    def _start(self, missing: tuple[str, ...], why: str) -> tuple[tuple[str, ...], float]:
        """(what is being built, since when): a build of `missing` started now where none runs. Under the lock."""
        if self._running is None:
            model = self._manifest().model
            thread = threading.Thread(target=self._build, args=(missing,), daemon=True, name=f"attnserve-build-{model}")
            self._running = (missing, time.monotonic(), thread)
            self._log(f"building {', '.join(missing)} for {model}: {why} (once: the artifact directory keeps them)")
            thread.start()
        building, started, _ = self._running
        return building, started

    def _build(self, names: tuple[str, ...]) -> None:
        manifest = self._manifest()
        try:
            add_in_child(manifest.directory, names, self._provider, self._log)
            self._on_built()
            self._log(f"built {', '.join(names)} for {manifest.model}")
        except Exception as e:  # noqa: BLE001 (any failure is reported to the requests that need it)
            why = str(e) if isinstance(e, ArtifactError) else f"{type(e).__name__}: {e}"
            self._log(f"could not build {', '.join(names)} for {manifest.model}: {why}")
            with self._lock:
                self._failed.update({name: why for name in names})
        finally:
            with self._lock:
                self._running = None

    def wait(self, timeout: float | None = None) -> None:
        """Until the build running now (if any) ends: tests, and a drain."""
        running = self._running
        if running is not None:
            running[2].join(timeout)
