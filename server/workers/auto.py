"""`serve --workers auto`: how many front-door processes to run in front of the engine, measured on the first
start on a machine and recorded for the next (as the graphs' calibration is).

A front door is one Python process: its requests' work (parsing, validation, tokenizing, the reply and its
serialization, the event loop) runs on one core. More of them help only where that core, not the engine, is what
limits a server: a small model, or a GPU that answers faster than one process can feed it. On a CPU, where the
graph takes every core, a second process takes cores from the graph and adds the link's cost.

Measured on the default model's own tokenizer and graph, per one-text request (a short sentence):
  door       the CPU seconds of a door's own work: the text tokenized and a reply vector written, times
             DOOR_STACK for what the wire stack, the event loop and the core's bookkeeping add;
  graph      the graph's wall seconds per request in a batch of such texts (the engine's capacity: 1 / graph);
  graph_cpu  its CPU seconds per request, onnxruntime's threads included (on a GPU: the host's share).
Requests/s predicted with N doors on C usable CPUs (predicted_rate):
  N = 1: min(1 / door, 1 / graph, C / (door + graph_cpu))
  N > 1: min(N / door_n, 1 / graph, C / (door_n + engine_side + graph_cpu)), door_n = door * WORKER_COST
auto is the fewest N within AUTO_MARGIN (30%) of the best N from 1 to C. The record is kept per machine signature (the
CPU, its instruction sets, onnxruntime's version, the threads, the provider and precision) in the attnserve cache,
named by the manifest's digest; a re-export or another machine measures again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from attnserve.config import EngineConfig, ServerConfig
from attnserve.engine.calibration import FORMAT_VERSION, read_record, signature, write_json
from attnserve.engine.machine import this_machine
from attnserve.engine.manifest import MANIFEST, load_manifest
from attnserve.engine.session import CPU, resolve_provider

from ..model_sources import model_sources

log = logging.getLogger("attnserve.server")

TEXT = "Request {}: the quick brown fox jumps over the lazy dog."
SAMPLES = 400  # one-text requests timed through the door's work
BATCH = 64  # texts in each timed batch of the graph
ROUNDS = 3  # timed batches; the fastest counts
# What a one-process door costs per request against its own work measured here (tokenizing and writing one
# vector): bench/bench_front_door.py, all-MiniLM-L6-v2's tokenizer on a 1-layer model, AMD EPYC with 2 CPUs: 0.29 ms
# of server CPU a request over HTTP, against 0.027 ms of that work (docs/performance.md, "The front door").
DOOR_STACK = 10.0
# With N > 1, one request's CPU in a worker against one process's door (its link to the engine: ZeroMQ, headers),
# and in the engine process (the link's other end, the batcher's share): the same bench, --workers 2 against 1,
# each process's threads read from /proc: 0.351 and 0.086 ms against 0.286 ms.
WORKER_COST, ENGINE_SIDE = 1.23, 0.30
# Fewer processes win unless more are predicted faster by more than this. The model is optimistic on a small
# machine: a 1-layer model on 2 CPUs was predicted 1.27x with two doors, and measured 1.02x to 1.24x
# (bench_front_door, its load generator on the same 2 CPUs).
AUTO_MARGIN = 0.30
# On a CPU, a model this large (its graphs, all variants) is not loaded a second time to be timed: its graph takes
# every core long before its door does (all-MiniLM-L6-v2, 90 MB of weights, already keeps one process).
LARGE_ON_CPU = 2**30


@dataclass(frozen=True)
class Measured:
    door: float  # CPU seconds a front door spends on a one-text request
    graph: float  # the graph's wall seconds per request in a batch
    graph_cpu: float  # its CPU seconds per request
    cpus: int


def predicted_rate(n: int, m: Measured) -> float:
    """Requests/s with n front-door processes (the model in the module's docstring)."""
    if n == 1:
        return min(1 / m.door, 1 / m.graph, m.cpus / (m.door + m.graph_cpu))
    door = m.door * WORKER_COST
    return min(n / door, 1 / m.graph, m.cpus / (door + m.door * ENGINE_SIDE + m.graph_cpu))


def choose(m: Measured) -> int:
    rates = {n: predicted_rate(n, m) for n in range(1, max(1, m.cpus) + 1)}
    best = max(rates.values())
    return min(n for n, rate in rates.items() if rate >= best * (1 - AUTO_MARGIN))


def why(n: int, m: Measured) -> str:
    one, chosen = predicted_rate(1, m), predicted_rate(n, m)
    line = (f"a door costs {m.door * 1e3:.3f} ms of CPU a request, the graph {m.graph * 1e3:.3f} ms "
            f"({m.graph_cpu * 1e3:.3f} ms of CPU) in batches of {BATCH}, on {m.cpus} CPUs: about {one:,.0f} "
            "requests/s with one process")
    return line + (f", {chosen:,.0f} with {n}" if n > 1 else "")


def measure(engine, config: EngineConfig) -> Measured:
    """The door's work and the graph, timed on the engine's own tokenizer and graph."""
    tokenizer = engine.tokenizer
    vector = np.ones(engine.manifest.embedding_size or 1, dtype=np.float32)
    texts = [TEXT.format(i) for i in range(SAMPLES)]
    tokenizer.encode_texts(texts[:8])  # warm
    started = time.process_time()
    for text in texts:
        tokenizer.encode_texts([text])
        orjson.dumps({"embedding": vector, "index": 0}, option=orjson.OPT_SERIALIZE_NUMPY)
    door = (time.process_time() - started) / SAMPLES * DOOR_STACK
    inputs = tokenizer.encode_texts(texts[:BATCH])
    rows = max(1, min(BATCH, config.max_batch_size, engine.batch_tokens // max(len(x) for x in inputs)))
    batch = inputs[:rows]
    engine.run(batch)  # warm
    walls, cpus = [], []
    for _ in range(ROUNDS):
        wall, cpu = time.perf_counter(), time.process_time()
        engine.run(batch)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return Measured(door, min(walls) / rows, min(cpus) / rows, this_machine().usable_cpus)


def auto_workers(engine_config: EngineConfig, config: ServerConfig) -> int:
    """--workers auto: the recorded choice for this machine and default model, else measured now and recorded.
    Nothing here fails a start: where it cannot measure, it says why and serves with one process."""
    from attnserve.engine.engine import Engine

    # A bad --artifacts or --model is the server's one-line refusal, here as there.
    directory = model_sources(engine_config.artifacts, config, engine_config.precision,
                              engine_config.provider)[0].directory
    try:
        manifest = load_manifest(directory, check_hashes=False)
        key = (f"{signature(engine_config.threads)} | provider {engine_config.provider} | precision "
               f"{engine_config.precision}")
        path = record_path(directory)
        entry = _read(path).get(key)
        if entry is not None:
            m = Measured(**entry["measured"])
            n = choose(m)
            log.info("workers auto: %d (recorded in %s): %s", n, path, why(n, m))
            return n
        weights = _graph_bytes(directory)
        if resolve_provider(engine_config.provider) == CPU and weights > LARGE_ON_CPU:
            log.info("workers auto: 1 (not measured: a model of %.1f GiB of graphs on a CPU, whose graph takes every "
                     "core; loading it twice to time it is not worth a first start's minutes)", weights / 2**30)
            return 1
        engine = Engine.from_directory(directory, dataclasses.replace(engine_config, spin_wait="run"),
                                       defer_calibration=True)
        m = measure(engine, engine_config)
        del engine  # its sessions' memory back before the server opens its own
        n = choose(m)
        choices = _read(path)
        choices[key] = {"model": manifest.model, "measured": dataclasses.asdict(m), "workers": n}
        try:
            write_json(path, {"format_version": FORMAT_VERSION, "choices": choices})
            where = f"recorded in {path}"
        except OSError as e:
            where = f"not recorded: {e.strerror or e}"
        log.info("workers auto: %d (measured on this machine's first start, %s): %s", n, where, why(n, m))
        return n
    except Exception as e:  # noqa: BLE001 (a start must not fail on a choice that has a safe default)
        log.warning("workers auto: serving with one process; the measurement failed (%s: %s)", type(e).__name__, e)
        return 1


def _graph_bytes(directory: Path) -> int:
    """The artifact directory's graphs and their external data, in bytes."""
    return sum(f.stat().st_size for f in Path(directory).iterdir() if f.suffix in (".onnx", ".data") and f.is_file())


def record_path(directory: Path) -> Path:
    from attnserve.default_model import cache_root

    digest = hashlib.sha256((Path(directory) / MANIFEST).read_bytes()).hexdigest()[:16]
    return cache_root() / "workers" / f"{digest}.json"


def _read(path: Path) -> dict:
    """The record's entries by key; one of another shape (a hand-edited file) is dropped, and measured again."""
    fields = {f.name for f in dataclasses.fields(Measured)}
    return {key: entry for key, entry in read_record(path, "workers record", "measuring again").items()
            if isinstance(entry.get("measured"), dict) and set(entry["measured"]) == fields}
