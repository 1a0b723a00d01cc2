"""Which of the exact candidate graphs of a precision runs fastest on this machine, and at which batch size in
tokens: timed once, then remembered.

Export keeps candidates that compute the same thing (fused attention and SkipLayerNorm or not, ...), each verified
against PyTorch. Which one is fastest depends on the CPU: a fusion that wins with AVX2 can lose with AVX-512. On
the first start on a machine the engine times every candidate on a few made-up batches at the shapes it will run
and keeps the fastest. It then times the chosen graph at batch token budgets of max_batch_tokens, its half and its
quarter (none below the longest input served), and batches at the fastest: on some CPUs a smaller batch keeps the
products' operands in cache. The choice is recorded per CPU signature (CPU model, the instruction sets that matter,
onnxruntime's version, the thread count) in calibration.json beside the artifacts, or, where that directory is
read-only, in the attnserve cache; the next start on the same machine reads it instead of timing again, and a
start with another thread count reads the same CPU's record too (its line says at how many threads it was timed).
manifest.json and the sha256-checked files are never touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnserve.cache import cache_root
from attnserve.config import EngineConfig
from attnserve.progress import Progress, progress_log

from .machine import this_machine
from .manifest import MANIFEST, GraphVariant, Manifest
from .openvino_session import openvino_version
from .session import Session
from .token_ids import made_up_token_ids

log = logging.getLogger("attnserve.engine")

CALIBRATION = "calibration.json"
FORMAT_VERSION = 1
# Sequence lengths timed, each in batches of budget // length rows (as the batcher packs them): a short-text batch,
# where the per-op overhead weighs, and a long one, where attention's T² weighs.
LENGTHS = (64, 256)
ROUNDS = 2  # timed runs per candidate and shape; the fastest counts (runs are interleaved)
# A candidate other than the default is chosen only when faster by more than this: closer than that is noise on
# a shared machine, and a tie should give the same graph on every machine of a kind.
MARGIN = 0.03
# The batch token budgets timed, as divisors of max_batch_tokens (which stays the most a batch holds). Measured on a
# 2-core AVX-512 Xeon, MiniLM, made-up batches, tokens/s against 2048: fp32 at 512 1.13x (T 64) and 1.07x (T 256);
# int8 at 1024 1.16x and 1.17x. On the mixed-length corpus: fp32 at 512 1.15x, int8 at 1024 1.22x.
BUDGET_DIVISORS = (1, 2, 4)


@dataclass(frozen=True)
class Choice:
    graph: GraphVariant
    how: str  # for the start-up line: how it was chosen
    batch_tokens: int  # the padded-token budget of a batch: max_batch_tokens or less, as timed
    session: Session | None = None  # the chosen graph's session when calibration opened it; None: open it


def budgets(manifest: Manifest, config: EngineConfig) -> list[int]:
    """The batch token budgets to time, max_batch_tokens (the default) first."""
    cap = config.max_batch_tokens
    return sorted({cap // d for d in BUDGET_DIVISORS if cap // d >= manifest.served_max_length}, reverse=True)


def signature(threads: int) -> str:
    """What makes timings on one machine hold on another: equal signatures, equal choices."""
    import onnxruntime

    machine = this_machine()
    thread_word = str(threads) if threads else f"auto of {machine.usable_cpus} CPUs"
    openvino = f" | openvino {openvino_version()}" if openvino_version() else ""
    return (f"{machine.cpu_model} | {' '.join(machine.instruction_sets) or 'no known instruction sets'} | "
            f"onnxruntime {onnxruntime.__version__}{openvino} | threads {thread_word}")


def record_paths(manifest: Manifest) -> tuple[Path, Path]:
    """(beside the artifacts, in the cache): the second for read-only artifact directories, named by the
    manifest's digest so that a copy of the same artifacts elsewhere finds it too."""
    digest = hashlib.sha256(manifest.path(MANIFEST).read_bytes()).hexdigest()[:16]
    return manifest.path(CALIBRATION), cache_root() / "calibration" / f"{digest}.json"


def _read(path: Path) -> dict:
    """This record file's choices by signature."""
    return read_record(path, "graph calibration record", "timing the graphs again")


def read_record(path: Path, what: str, again: str) -> dict:
    """A record file's choices by key (format_version 1: this one's, and server/workers/auto.py's); {} with a
    warning naming `what` and what happens `again` when it is unreadable or not one."""
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("format_version") != FORMAT_VERSION or not isinstance(raw.get("choices"), dict):
            raise ValueError(f"not a {what} of format_version {FORMAT_VERSION}")
        # Entries of another shape (a hand-edited file) are dropped, so that they are timed and written anew.
        return {key: entry for key, entry in raw["choices"].items() if isinstance(entry, dict)}
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        log.warning("ignoring the %s %s (%s: %s); %s", what, path, type(e).__name__, e, again)
        return {}


def _key(candidates: Sequence[GraphVariant]) -> dict[str, str]:
    return {v.name: v.sha256 for v in candidates}


def _cpu_part(sig: str) -> str:
    """A signature without its thread count: the machine and the runtimes."""
    return sig.rsplit(" | threads ", 1)[0]


def _recorded(manifest: Manifest, config: EngineConfig, sig: str, key: str,
              candidates: Sequence[GraphVariant]) -> tuple[GraphVariant, int, Path, str | None] | None:
    """The recorded choice for this signature, else for the same CPU at another thread count (a server of two
    models gives each one thread, `encode` all of them: which graph is fastest and at which batch size does not
    turn on that, and timing again took 31 s for all-mpnet-base-v2). (graph, batch tokens, record file, the
    thread count it was recorded at where it is another)."""
    by_name = {v.name: v for v in candidates}

    def valid(entry) -> bool:
        # Valid only for exactly these graphs and budgets: a re-export, a new candidate or another
        # max_batch_tokens is timed again.
        return (isinstance(entry, dict) and entry.get("candidates") == _key(candidates)
                and entry.get("graph") in by_name and entry.get("budgets") == budgets(manifest, config)
                and entry.get("batch_tokens") in entry["budgets"])

    for path in record_paths(manifest):
        choices = _read(path)
        entry = choices.get(sig, {}).get(key)
        if valid(entry):
            return by_name[entry["graph"]], entry["batch_tokens"], path, None
        for other, entries in sorted(choices.items()):
            if other != sig and _cpu_part(other) == _cpu_part(sig) and valid(entries.get(key)):
                entry = entries[key]
                return by_name[entry["graph"]], entry["batch_tokens"], path, other.rsplit(" | threads ", 1)[-1]
    return None


def write_json(path: Path, data: dict) -> None:
    """Atomically: replicas starting together each write a whole file, never a mixture."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _record(manifest: Manifest, sig: str, key: str, entry: dict) -> Path | None:
    """Add the entry beside the artifacts, else in the cache; None (with a warning) when neither is writable."""
    errors = []
    for path in record_paths(manifest):
        choices = _read(path)
        choices.setdefault(sig, {})[key] = entry
        try:
            write_json(path, {"format_version": FORMAT_VERSION, "choices": choices})
            return path
        except OSError as e:
            errors.append(f"{path}: {e.strerror or e}")
    log.warning("could not record the graph calibration (%s); the next start times the graphs again",
                "; ".join(errors))
    return None


def calibration_batches(manifest: Manifest, config: EngineConfig, takes_token_types: bool, budget: int
                        ) -> list[dict[str, np.ndarray]]:
    """Made-up feeds at the shapes the engine runs: (budget // T, T) int64 inputs per length T."""
    ids_range = made_up_token_ids(manifest.vocab_size)
    rng = np.random.default_rng(0)
    feeds = []
    for length in sorted({min(t, manifest.served_max_length) for t in LENGTHS}):
        rows = max(1, min(config.max_batch_size, budget // length))
        ids = rng.integers(ids_range.start, ids_range.stop, size=(rows, length), dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if takes_token_types:
            feed["token_type_ids"] = np.zeros_like(ids)
        feeds.append(feed)
    return feeds


class CalibrationStopped(Exception):
    """The timing was stopped (a server draining while it timed its graphs): nothing was chosen or recorded."""


def time_runs(runs: dict[Any, tuple[Session, list[dict[str, np.ndarray]]]], outputs: list[str],
              stop: threading.Event | None = None) -> dict[Any, float]:
    """Seconds per token of each run (a session and its feeds): per feed, the fastest of ROUNDS runs over its
    tokens, summed over the feeds. Runs are interleaved so that a disturbance of the machine falls on all alike.
    stop: checked before each run (CalibrationStopped once set)."""
    def run(session: Session, feed: dict[str, np.ndarray]) -> None:
        if stop is not None and stop.is_set():
            raise CalibrationStopped
        session.run(outputs, feed)

    if not runs:
        return {}
    # Warm-up on the first feed only: the first run loads and allocates. A later shape's first run may allocate
    # more, but of its ROUNDS runs the fastest counts.
    for session, feeds in runs.values():
        run(session, feeds[0])
    best = {name: [float("inf")] * len(feeds) for name, (_, feeds) in runs.items()}
    for _ in range(ROUNDS):
        for i in range(max(len(feeds) for _, feeds in runs.values())):
            for name, (session, feeds) in runs.items():
                if i < len(feeds):
                    start = time.perf_counter()
                    run(session, feeds[i])
                    best[name][i] = min(best[name][i], (time.perf_counter() - start) / feeds[i]["input_ids"].size)
    return {name: sum(per_token) for name, per_token in best.items()}


def fastest(seconds: dict[Any, float], default: Any) -> Any:
    name = min(seconds, key=lambda n: seconds[n])
    return name if seconds[name] < seconds[default] * (1 - MARGIN) else default


def _ratios(seconds: dict[Any, float], chosen: Any) -> str:
    ratios = ", ".join(f"{name} took {seconds[name] / seconds[chosen]:.2f}x as long" for name in seconds
                       if name != chosen)
    if min(seconds.values()) < seconds[chosen]:
        ratios += f" (within the {MARGIN:.0%} margin: the default stays)"
    return ratios


def calibrated_graph(manifest: Manifest, config: EngineConfig, precision: str, candidates: Sequence[GraphVariant],
                     open_graph: Callable[[GraphVariant], Session], record_key: str | None = None,
                     notes: Sequence[str] = ()) -> Choice:
    """The recorded choice for this machine, or the fastest candidate and batch budget timed now (and recorded).

    candidates: the exact graphs to choose from, the default first (one is fine: its budget is still timed); with
    --precision auto on a CPU with native bf16, the fp32 graphs and the bf16 one (OpenVINO's).
    record_key: where the choice is recorded under the CPU signature; the precision by default, so that a graph
    forced by name keeps its own entry instead of replacing the choice among candidates.
    notes: why a candidate one might expect is not among them (bf16 on a CPU without it), recorded and said."""
    recorded = recorded_choice(manifest, config, precision, candidates, record_key, notes)
    return recorded if recorded is not None else timed_choice(manifest, config, precision, candidates, open_graph,
                                                              record_key, notes)


def recorded_choice(manifest: Manifest, config: EngineConfig, precision: str, candidates: Sequence[GraphVariant],
                    record_key: str | None = None, notes: Sequence[str] = ()) -> Choice | None:
    """The choice recorded for this machine (calibrated_graph's arguments), None where none is."""
    recorded = _recorded(manifest, config, signature(config.threads), record_key or precision, candidates)
    if recorded is None:
        return None
    graph, batch_tokens, found, threads = recorded
    at = f" (timed at {threads} threads)" if threads else ""
    return Choice(graph, f"calibrated for this CPU{at}, batches of {batch_tokens} tokens, recorded in {found}"
                  + "".join(f"; {n}" for n in notes), batch_tokens)


def timed_choice(manifest: Manifest, config: EngineConfig, precision: str, candidates: Sequence[GraphVariant],
                 open_graph: Callable[[GraphVariant], Session], record_key: str | None = None,
                 notes: Sequence[str] = (), stop: threading.Event | None = None) -> Choice:
    """The fastest candidate and batch budget, timed now, and recorded (calibrated_graph's arguments). stop: see
    time_runs."""
    sig = signature(config.threads)
    key = record_key or precision
    start = time.perf_counter()
    with Progress(progress_log.info) as progress:  # seconds to tens of seconds, once per machine: say so
        progress.step(f"calibration (first start on this CPU; recorded for the next): opening {len(candidates)} "
                      f"{precision} graph(s)")
        sessions = {v.name: open_graph(v) for v in candidates}
        first = next(iter(sessions.values()))
        takes_types = "token_type_ids" in {i.name for i in first.get_inputs()}
        outputs = [candidates[0].outputs[-1]]  # sentence_embedding or scores: what the engine asks for
        cap, *smaller = budgets(manifest, config)
        feeds = calibration_batches(manifest, config, takes_types, cap)
        default = candidates[0].name
        progress.step(f"calibration: timing {', '.join(sessions)}")
        graph_seconds = time_runs({name: (session, feeds) for name, session in sessions.items()}, outputs, stop)
        chosen = fastest(graph_seconds, default)
        if smaller:
            progress.step(f"calibration: timing {chosen} in batches of {', '.join(map(str, smaller))} tokens")
        budget_seconds = {cap: graph_seconds[chosen]} | time_runs(
            {b: (sessions[chosen], calibration_batches(manifest, config, takes_types, b)) for b in smaller}, outputs,
            stop)
        batch_tokens = fastest(budget_seconds, cap)
    # Timings as seconds per 1,000 tokens, summed over the LENGTHS: what the choices compared.
    entry = {"graph": chosen, "candidates": _key(candidates), "batch_tokens": batch_tokens,
             "budgets": [cap, *smaller],
             "seconds_per_1k_tokens": {name: round(s * 1e3, 6) for name, s in graph_seconds.items()},
             "budget_seconds_per_1k_tokens": {str(b): round(s * 1e3, 6) for b, s in budget_seconds.items()},
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             **({"notes": list(notes)} if notes else {})}
    path = _record(manifest, sig, key, entry)
    timed = [_ratios(graph_seconds, chosen)] if len(graph_seconds) > 1 else []
    if smaller:
        timed.append(f"batches of {batch_tokens} tokens: " + _ratios(budget_seconds, batch_tokens))
    how = (f"calibrated now in {time.perf_counter() - start:.1f}s: {'; '.join(timed)}"
           + (f", recorded in {path}" if path else ", not recorded") + "".join(f"; {n}" for n in notes))
    return Choice(next(v for v in candidates if v.name == chosen), how, batch_tokens, sessions[chosen])
