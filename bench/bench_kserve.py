"""KServe v2 benchmark: what Triton's protocol costs against attnserve's own, side by side in one run.

One real `attnserve serve` (default settings, free loopback ports) and --concurrency closed-loop clients (the load
test's own targets, loadtest/) work through the same mixed-length corpus (loadtest/corpus.py), one text per request,
truncate=True, in three loads:

  grpc         attnserve.v1 Encoder/Embed over gRPC;
  kserve       KServe v2 ModelInfer over gRPC, the text in raw_input_contents (as tritonclient.grpc sends it);
  kserve-http  KServe v2 POST /v2/models/NAME/infer with binary tensors (as tritonclient.http sends them).

The loads alternate within each round, so that a disturbance of the machine falls on all of them alike; the best
round of each is kept. tokens/s counts the num_tokens the replies carry over the wall time.

Then one ModelInfer of --big texts of mixed length: the padding the server's batches computed for it (its metrics'
cells against real tokens), beside the padding of the offline engine's own batch plan (engine/batching.py) for the
same texts. Triton batches only requests of equal shape; attnserve sorts one request's texts by length as the
offline engine does.

    python bench/bench_kserve.py                         # 2000 texts, 2 rounds, 64 clients, a 1000-text infer
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

try:  # run as a script: bench/ is on sys.path
    import bench_serve
    from bench_serve import check_answers, scrape
    from machine import machine_lines
    from report import target_line
except ImportError:
    from bench import bench_serve
    from bench.bench_serve import check_answers, scrape
    from bench.machine import machine_lines
    from bench.report import target_line

from attnserve.loadtest.corpus import mixed_length_corpus

LOADS = {"grpc": "attnserve.v1 Embed, gRPC", "kserve": "KServe v2 ModelInfer, gRPC",
         "kserve-http": "KServe v2 infer, HTTP, binary tensors"}
# Each load's request counter in the server's metrics: the handler's time, for the report.
LABELS = {"grpc": '{method="Embed",protocol="grpc"}', "kserve": '{method="ModelInfer",protocol="kserve-grpc"}',
          "kserve-http": '{method="/v2/models/{name}/infer",protocol="http"}'}
BIG_INFER_TIMEOUT_S = 600.0  # one request of every text: minutes on a small CPU
TARGETS = {"kserve_vs_grpc": (">=", 0.95, "0.95"), "kserve_http_vs_grpc": (">=", 0.9, "0.9"),
           "big_infer_padding": ("<=", 0.10, "10%")}


async def load(server, protocol: str, texts: list[str], concurrency: int) -> dict:
    """The closed loop through the load test's target for protocol, after one call on each connection."""
    from attnserve.config import ClientConfig, LoadTestConfig
    from attnserve.loadtest.run import TARGETS as LOAD_TARGETS

    config = LoadTestConfig(concurrency=concurrency, requests=len(texts), protocol=protocol, truncate=True)
    where = server.http_url if protocol == "kserve-http" else server.target
    async with LOAD_TARGETS[protocol](config, ClientConfig(target=where)) as target:
        requests = [target.serialize([text]) for text in texts]  # built before the load: the clients cost little
        timeout = bench_serve.REQUEST_TIMEOUT_S
        check_answers(await asyncio.gather(*(target.call(requests[i % len(requests)], timeout)
                                             for i in range(concurrency))), "warm-up")
        return await bench_serve.measured_load(server, target.call, requests, concurrency, http=False,
                                               label=LABELS[protocol])


def big_infer(server, texts: list[str]) -> dict:
    """One ModelInfer of every text: the padding the server computed for it."""
    from attnserve.config import ClientConfig, LoadTestConfig
    from attnserve.loadtest.run import TARGETS as LOAD_TARGETS

    async def once() -> dict:
        config = LoadTestConfig(concurrency=1, requests=1, protocol="kserve", truncate=True)
        async with LOAD_TARGETS["kserve"](config, ClientConfig(target=server.target)) as target:
            request = target.serialize(texts)
            before = scrape(server)
            answer = await target.call(request, BIG_INFER_TIMEOUT_S)
            check_answers([answer], "the big infer")
            delta = scrape(server) - before
            return {"texts": len(texts), "tokens": answer.tokens, "cells": delta.cells,
                    "padding": (delta.cells - delta.tokens) / delta.cells, "batches": delta.batches}

    return asyncio.run(once())


def offline_padding(artifacts: Path, texts: list[str]) -> float:
    """The padding of the offline engine's batch plan for the texts, at its own batch limits."""
    import numpy as np

    from attnserve.engine.batching import plan_batches
    from attnserve.engine.engine import Engine

    engine = Engine.from_directory(artifacts)
    lengths = np.array([len(ids) for ids in engine.tokenizer.encode_texts(texts, truncate=True)])
    batches = plan_batches(lengths, engine.config.max_batch_tokens, engine.config.max_batch_size)
    cells = sum(len(batch) * int(lengths[batch].max()) for batch in batches)
    return float((cells - lengths.sum()) / cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_serve.load_flags(parser, texts=2000, concurrency=64)
    parser.add_argument("--big", type=int, default=1000, help="texts in the one big ModelInfer (default 1000)")
    return bench_serve.bench_main("bench_kserve", run, parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from attnserve.default_model import resolve_artifacts

    artifacts = resolve_artifacts(args.artifacts)
    texts = mixed_length_corpus(args.texts, args.seed)
    big_texts = mixed_length_corpus(args.big, args.seed + 1)
    server = bench_serve.start_server(artifacts)
    try:
        server.wait_serving(timeout=300)
        bench_serve.log(f"server serving on {server.target} and {server.http_url}")
        rounds, best = bench_serve.best_of_rounds(
            args.rounds, LOADS, lambda protocol: asyncio.run(load(server, protocol, texts, args.concurrency)))
        big = big_infer(server, big_texts)
    finally:
        status = bench_serve.stop_server(server)
    big["offline_padding"] = offline_padding(artifacts, big_texts)
    lines = [*machine_lines(), f"artifacts: {artifacts}; {len(texts)} texts, {best['grpc']['tokens']} tokens, one "
             f"per request, {args.concurrency} clients, best of {args.rounds} round(s)", "",
             f"{'load':<12} {'tokens/s':>9} {'vs grpc':>8} {'busy':>6} {'batch':>6} {'handler ms':>11} "
             f"{'client cores':>13}  what"]
    for protocol, what in LOADS.items():
        result = best[protocol]
        ratio = result["tokens_per_s"] / best["grpc"]["tokens_per_s"]
        lines.append(f"{protocol:<12} {result['tokens_per_s']:>9.0f} {ratio:>8.2f} {result['inference_busy']:>6.2f} "
                     f"{result['mean_batch_size'] or 0:>6.1f} {result['mean_handler_ms'] or 0:>11.1f} "
                     f"{result['client_cores']:>13.2f}  {what}")
    lines += ["", f"one ModelInfer of {big['texts']} mixed-length texts: {big['tokens']} tokens in "
              f"{big['batches']:.0f} batches, padding {big['padding']:.1%} (the offline engine's plan for the same "
              f"texts: {big['offline_padding']:.1%})", ""]
    numbers: dict = {"loads": best, "big_infer": big, "targets": {}}
    for key, label, value in (
            ("kserve_vs_grpc", "kserve grpc / v1 grpc tokens/s",
             best["kserve"]["tokens_per_s"] / best["grpc"]["tokens_per_s"]),
            ("kserve_http_vs_grpc", "kserve http / v1 grpc tokens/s",
             best["kserve-http"]["tokens_per_s"] / best["grpc"]["tokens_per_s"])):
        line, numbers["targets"][key] = target_line(TARGETS, label, key, value, f"{value:.2f}")
        lines.append(line)
    line, numbers["targets"]["big_infer_padding"] = target_line(
        TARGETS, "big infer padding", "big_infer_padding", big["padding"], f"{big['padding']:.1%}")
    lines.append(line)
    bench_serve.print_report(lines, numbers | {"rounds": rounds}, args.json)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
