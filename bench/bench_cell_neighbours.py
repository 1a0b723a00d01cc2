"""Why a padded cell costs more in a server than offline (issue 48, item 3): the same batches, timed alone and
beside a server's own door work, in one process.

bench_serve.py splits serving ÷ offline into padding × seconds per cell × how busy the inference thread is; the
middle factor, the graph's time per padded cell inside the server against offline's, is the largest loss on two
cores (0.85 to 0.87). This script takes the server apart to find out why:

  batches    all-MiniLM-L6-v2's fp32 graph over the mixed-length corpus (loadtest/corpus.py), planned as the
             server plans them (the engine's calibrated batch budget), each padded as the engine pads it;
  alone      those batches through one onnxruntime session in a thread, nothing else running;
  beside     the same, while this process's event loop serves one-text requests through the real protocol-neutral
             core (server/core.py: validation, tokenizing, the batcher, the graph, the reply, OpenAI's JSON) of a
             tiny model (bench_front_door.py's: one layer, hidden 32), paced at --rate requests a second: the door's
             work of a serving run at that rate, with its GIL and its threads, and no graph cost of its own.

Each session variant (onnxruntime's spin-waiting, its dynamic block base, one intra-op thread, its two threads
pinned one to a CPU each) is timed alone and
beside, the rounds alternating; the best and the median round of each are printed, in microseconds a padded cell,
and beside ÷ alone. It measures; it exits 0.

    python bench/bench_cell_neighbours.py                  # 170 requests/s (bench_serve's fp32 rate), 4 rounds
    python bench/bench_cell_neighbours.py --rate 400 --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_front_door import TEXT, tiny_model  # noqa: E402
from machine import machine_lines  # noqa: E402

# name -> onnxruntime session config entries and intra-op threads (0: one per core, as serve and encode run)
VARIANTS: dict[str, tuple[dict[str, str], int]] = {
    "spin run (serve's default)": ({"session.force_spinning_stop": "1"}, 0),
    "spin on (encode's default)": ({}, 0),
    "spin off": ({"session.intra_op.allow_spinning": "0"}, 0),
    "spin run, dynamic_block_base 8": ({"session.force_spinning_stop": "1", "session.dynamic_block_base": "8"}, 0),
    "spin run, 1 intra-op thread": ({"session.force_spinning_stop": "1"}, 1),
    # the running thread on the first CPU, the pool's other thread on the second (1-based logical processors)
    "spin run, threads pinned": ({"session.force_spinning_stop": "1", "session.intra_op_thread_affinities": "2"}, 2),
}
PINNED = "spin run, threads pinned"


def serving_batches(texts: int) -> tuple[Path, list[dict[str, np.ndarray]], int]:
    """The default model's fp32 graph and the corpus's batches as the engine plans and pads them; their cells."""
    from attnserve.config import EngineConfig
    from attnserve.default_model import resolve_artifacts
    from attnserve.engine.engine import Engine
    from attnserve.loadtest.corpus import mixed_length_corpus

    artifacts = resolve_artifacts(None)
    engine = Engine.from_directory(artifacts, EngineConfig(precision="fp32", provider="cpu"))
    inputs = engine.tokenizer.encode_texts(mixed_length_corpus(texts))
    lengths = np.array([len(x) for x in inputs])
    feeds = [engine._feed([inputs[i] for i in batch])
             for batch in engine.plan(lengths)]
    return artifacts / engine.embeddings_variant.file, feeds, sum(f["input_ids"].size for f in feeds)


def session(path: Path, entries: dict[str, str], threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def timed(run_session, feeds: list[dict[str, np.ndarray]], pin: bool = False) -> float:
    """Seconds to run every batch; pin: on the first CPU (this thread only: Linux's affinity is per thread)."""
    before = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, {min(before)})
    try:
        start = time.perf_counter()
        for feed in feeds:
            run_session.run(["sentence_embedding"], feed)
        return time.perf_counter() - start
    finally:
        os.sched_setaffinity(0, before)


async def main_async(args: argparse.Namespace) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from attnserve.config import EngineConfig, ServerConfig
    from attnserve.server.app import start_models
    from attnserve.server.core import Core
    from attnserve.server.http.openai import render
    from attnserve.server.http.wire import BASE64_FLOAT_BYTES
    from attnserve.server.metrics import Metrics
    from attnserve.server.model_sources import ModelSource
    from attnserve.server.models import Models
    from attnserve.server.requests import EncodeRequest

    path, feeds, cells = serving_batches(args.texts)
    print(f"batches: {len(feeds)} of the {args.texts}-text corpus, {cells:,} padded cells, mean batch "
          f"{np.mean([len(f['input_ids']) for f in feeds]):.1f} inputs")
    root = Path(args.tmp) / "bench-front-door"
    root.mkdir(parents=True, exist_ok=True)
    config = ServerConfig()
    models = Models.load([ModelSource("tiny", tiny_model(root))], EngineConfig(precision="fp32", provider="cpu"),
                         config, Metrics())
    core = Core(models, config, ThreadPoolExecutor(4), 4)
    await start_models(models)
    sessions = {name: session(path, entries, threads) for name, (entries, threads) in VARIANTS.items()}
    loop = asyncio.get_running_loop()
    graph = ThreadPoolExecutor(1, thread_name_prefix="graph")  # the server's inference thread
    for s in sessions.values():
        await loop.run_in_executor(graph, timed, s, feeds[:10])
    answered = 0

    async def one() -> None:
        nonlocal answered
        await core.encode(EncodeRequest(inputs=[TEXT], normalize=True), None,
                          lambda reply: render(reply, "tiny", True), BASE64_FLOAT_BYTES)
        answered += 1

    async def neighbour(stop: asyncio.Event) -> None:
        """--rate one-text requests a second, each its own task, as a server's clients send them."""
        tasks: set[asyncio.Task] = set()
        start, n = time.perf_counter(), 0
        while not stop.is_set():
            n += 1
            task = loop.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(max(0.0, start + n / args.rate - time.perf_counter()))
        await asyncio.gather(*tasks)

    stop = asyncio.Event()  # the neighbour by itself: its own CPU, with no graph beside it
    answered, started, cpu = 0, time.perf_counter(), time.process_time()
    load = loop.create_task(neighbour(stop))
    await asyncio.sleep(3.0)
    stop.set()
    await load
    own = (time.process_time() - cpu) / (time.perf_counter() - started)
    print(f"the neighbour by itself: {answered / (time.perf_counter() - started):.0f} requests/s, {own:.3f} cores "
          f"({own / max(answered, 1) * (time.perf_counter() - started) * 1e3:.2f} ms of CPU a request)")
    seconds: dict[tuple[str, str], list[float]] = {}
    rates: list[float] = []
    for round_ in range(args.rounds):
        for name, s in sessions.items():
            for where in ("alone", "beside"):
                stop = asyncio.Event()
                answered, started = 0, time.perf_counter()
                load = loop.create_task(neighbour(stop)) if where == "beside" else None
                took = await loop.run_in_executor(graph, timed, s, feeds, name == PINNED)
                stop.set()
                if load is not None:
                    await load
                    rates.append(answered / (time.perf_counter() - started))
                seconds.setdefault((name, where), []).append(took / cells * 1e6)
        print(f"bench: round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for batcher in models.default.batchers:
        batcher.close()
        await batcher.join()
    models.default.inference.shutdown()
    graph.shutdown()
    print(f"beside the graph the neighbour answered {statistics.median(rates):.0f} requests/s (median; asked "
          f"{args.rate:g})")
    print(f"{'session':34s} {'alone us/cell':>22s} {'beside us/cell':>22s} {'beside / alone':>15s}")
    print(f"{'':34s} {'best':>10s} {'median':>11s} {'best':>10s} {'median':>11s} {'best':>7s} {'median':>7s}")
    base = min(seconds[(next(iter(VARIANTS)), 'alone')])
    for name in VARIANTS:
        alone, beside = seconds[(name, "alone")], seconds[(name, "beside")]
        print(f"{name:34s} {min(alone):10.1f} {statistics.median(alone):11.1f} {min(beside):10.1f} "
              f"{statistics.median(beside):11.1f} {min(beside) / min(alone):7.2f} "
              f"{statistics.median(beside) / statistics.median(alone):7.2f}")
    print(f"(serve's default alone, best: {base:.1f} us a cell; each row's own ratio is beside ÷ its own alone)")


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=170.0, help="the neighbour's requests a second")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    args.tmp = os.environ.get("BENCH_TMP", tempfile.gettempdir())
    for line in machine_lines():
        print(line)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
