"""Attention-path benchmark: what asking for attention costs a server, against plain embeddings, in one run.

One real `attnserve serve` (the default settings, on free loopback ports) and --concurrency closed-loop gRPC clients
(the load test's, as bench_serve.py drives them) work through the same mixed-length corpus (loadtest/corpus.py),
one text per Embed request, truncate=True, in three loads:

  embeddings     sentence embeddings only: the embeddings graph;
  one_layer      attention { layers: [-1] }: the last layer's weights, every head, [1, nh, T, T] per reply;
  rollout_only   attention { analyses: ["rollout"] weights: false }: attention rollout
                 (attnserve/attention_analyses.py), [T, T] per reply, no weights.

Both attention loads run the last-layer graph (export/attention_last.py) where the artifacts have one, the attention
graph of every layer otherwise.

tokens/s counts the num_tokens the server replies with over the wall time. The loads alternate within each round,
so that a disturbance of the machine falls on all of them alike; the best round of each is reported. Where time goes
comes from the server's Prometheus counters over each load: the share of the wall time its inference thread was
busy, the seconds per cell computed, the mean batch; and which graphs ran the load's batches.

    python bench/bench_attention.py --artifacts /tmp/art                 # 600 texts, 2 rounds, 16 clients
"""

from __future__ import annotations

import argparse
import sys

try:  # run as a script: bench/ is on sys.path
    import bench_serve
    from machine import machine_lines
    from report import target_line
except ImportError:
    from bench import bench_serve
    from bench.machine import machine_lines
    from bench.report import target_line

from attnserve.loadtest.corpus import mixed_length_corpus

LOADS = {"embeddings": "sentence embeddings", "one_layer": "attention, the last layer's weights",
         "rollout_only": "attention rollout, no weights"}
TARGETS = {"one_layer_vs_embeddings": (">=", 0.6, "0.6"), "rollout_only_vs_embeddings": (">=", 0.6, "0.6")}


def requests_of(texts: list[str], load: str) -> list[bytes]:
    from attnserve.client.client import make_request

    options: dict = {}
    if load == "one_layer":
        options = {"attention_layers": [-1]}
    elif load == "rollout_only":
        options = {"attention_layers": [-1], "analyses": ["rollout"], "weights": False}
    return [make_request([t], truncate=True, **options).SerializeToString() for t in texts]


GRAPHS = ("embeddings", "attention", "attention_last")  # the batcher's graph labels (server/batcher.py)


def graph_counters(server) -> dict[str, float]:
    """Seconds in onnxruntime, batches and inputs batched, summed over the graphs, and each graph's batches
    (bench_serve's scrape reads the embeddings graph's alone)."""
    values = server.metrics()
    model = bench_serve.served_model_label(values)
    out = {"inference_s": 0.0, "batches": 0.0, "batch_inputs": 0.0}
    for graph in GRAPHS:
        labels = f'{{graph="{graph}",{model}}}'
        out["inference_s"] += values.get("attnserve_inference_duration_seconds_sum" + labels, 0.0)
        out[f"batches {graph}"] = values.get("attnserve_batch_size_count" + labels, 0.0)
        out["batches"] += out[f"batches {graph}"]
        out["batch_inputs"] += values.get("attnserve_batch_size_sum" + labels, 0.0)
    return out


def measured(server, requests: list[bytes], concurrency: int) -> dict:
    """One load, with the inference thread's busy share, its seconds per cell and the mean batch over both graphs."""
    before = graph_counters(server)
    result = bench_serve.serving_round(server, requests, concurrency, 1)
    after = graph_counters(server)
    delta = {k: after[k] - before[k] for k in after}
    result["inference_busy"] = delta["inference_s"] / result["seconds"]
    result["inference_s"] = delta["inference_s"]
    result["mean_batch_size"] = delta["batch_inputs"] / delta["batches"] if delta["batches"] else None
    result["graphs"] = {graph: int(delta[f"batches {graph}"]) for graph in GRAPHS if delta[f"batches {graph}"]}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_serve.load_flags(parser, texts=600, concurrency=16)
    return bench_serve.bench_main("bench_attention", run, parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from attnserve.default_model import resolve_artifacts

    artifacts = resolve_artifacts(args.artifacts)
    texts = mixed_length_corpus(args.texts, args.seed)
    requests = {load: requests_of(texts, load) for load in LOADS}
    server = bench_serve.start_server(artifacts)
    try:
        server.wait_serving(timeout=300)
        bench_serve.log(f"server serving on {server.target}")
        bench_serve.serving_round(server, requests["one_layer"][:32], args.concurrency, 1)  # warm the attention graph
        rounds, best = bench_serve.best_of_rounds(args.rounds, LOADS,
                                                  lambda load: measured(server, requests[load], args.concurrency))
    finally:
        status = bench_serve.stop_server(server)
    lines = [*machine_lines(), f"artifacts: {artifacts}; {len(texts)} texts, {best['embeddings']['tokens']} tokens, "
             f"{args.concurrency} clients over gRPC, best of {args.rounds} round(s)", "",
             f"{'load':<14} {'tokens/s':>9} {'vs embed':>9} {'busy':>6} {'us/cell':>8} {'batch':>6} {'handler ms':>11}"
             "  batches by graph"]
    numbers: dict = {"loads": best, "targets": {}}
    for load in LOADS:
        result = best[load]
        ratio = result["tokens_per_s"] / best["embeddings"]["tokens_per_s"]
        per_cell = 1e6 * result["inference_s"] / result["cells"] if result["cells"] else float("nan")
        lines.append(f"{load:<14} {result['tokens_per_s']:>9.0f} {ratio:>9.2f} {result['inference_busy']:>6.2f} "
                     f"{per_cell:>8.2f} {result['mean_batch_size'] or 0:>6.1f} {result['mean_handler_ms'] or 0:>11.1f}"
                     f"  {', '.join(f'{graph} {n}' for graph, n in result['graphs'].items())}")
    lines.append("")
    for load in ("one_layer", "rollout_only"):
        ratio = best[load]["tokens_per_s"] / best["embeddings"]["tokens_per_s"]
        line, verdict = target_line(TARGETS, f"{load} / embeddings tokens/s", f"{load}_vs_embeddings", ratio,
                                    f"{ratio:.2f}")
        lines.append(line)
        numbers["targets"][f"{load}_vs_embeddings"] = verdict
    bench_serve.print_report(lines, numbers | {"rounds": rounds}, args.json)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
