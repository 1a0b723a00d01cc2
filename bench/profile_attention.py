"""Where the attention path's time goes: the attention graphs against the embeddings graph, and the server's work on
their outputs, at the batches a server runs.

The graphs, each opened as the engine opens it (the attention graphs without onnxruntime's memory arena):

  embeddings      the fp32 graph the engine runs on this CPU (calibrated: engine/calibration.py), and the plain
                  one where that is the fused one: the attention graphs are the plain graph's nodes and more;
  attention       every layer's maps [L, B, nh, T, T] and value norms [L, B, nh, T] (export/torch_to_onnx.py);
  attention_last  the last layer's maps and rollout alone (export/attention_last.py), where the artifacts have it;

and, to decide by: the attention graph fetching sentence_embedding alone (onnxruntime runs every node whatever a
run fetches: no output saves its nodes) and the attention graph with the arena on.

The batches: the bench corpus (loadtest/corpus.py, as bench_attention.py sends it) in groups of --concurrency texts,
as a server with that many clients waiting gets them, each group planned as the batcher plans (plan_batches at the
engine's batch budget); and a few fixed shapes of 512 padded tokens. Run times are the best of --repeats per batch,
summed, each graph running every batch in turn. Then one profiled pass per graph over the corpus batches
splits its run by op type (onnxruntime's profiler: each kernel's time), into the time outside kernels (allocating,
scheduling) and the time run() adds to the session's (its outputs copied into numpy arrays). Last, the server's
Python work on a batch's outputs (engine/outputs.py, and the bytes a door sends): one layer's weights of each row,
and rollout, from each graph.

    python bench/profile_attention.py --artifacts /tmp/art [--repeats 3] [--texts 320]

It measures, it does not test: read the ratios of a shared machine's numbers, not the numbers.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:  # run as a script: bench/ is on sys.path
    from machine import machine_lines
except ImportError:
    from bench.machine import machine_lines

from attnserve.loadtest.corpus import mixed_length_corpus

SHAPES = ((16, 32), (8, 64), (4, 128), (2, 256))  # (rows, tokens): 512 padded tokens each
# Op types shown on a line of their own when any graph spends this share of its kernel time in them.
OWN_LINE = 0.01


def batches(engine, texts: list[str], concurrency: int) -> list[tuple[dict, list[int]]]:
    """(feed, each row's length) of the server's batches of the corpus: groups of `concurrency`, planned."""

    inputs = engine.tokenizer.encode_texts(texts, truncate=True)
    out = []
    for start in range(0, len(inputs), concurrency):
        group = inputs[start:start + concurrency]
        for batch in engine.plan([len(x) for x in group]):
            rows = [group[i] for i in batch]
            out.append((engine._feed(rows), [len(x) for x in rows]))
    return out


def fixed(engine, rows: int, length: int) -> list[tuple[dict, list[int]]]:
    from attnserve.engine.tokenizer import TokenizedInput

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 2000, size=length)  # word pieces of any vocabulary past its special tokens
    return [(engine._feed([TokenizedInput(ids, False)] * rows), [length] * rows)]


def session(path: Path, arena: bool, profile_dir: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = arena
    if profile_dir:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / path.stem)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def graphs(engine) -> dict[str, tuple[Path, bool, list[str] | None]]:
    """name -> (file, arena, outputs fetched; None: all)."""
    from attnserve.engine.engine import ATTENTION_VARIANT, LAST_LAYER_VARIANT

    manifest = engine.manifest
    path = lambda name: manifest.path(manifest.variants[name].file)  # noqa: E731
    embeddings = ["last_hidden_state", "sentence_embedding"]
    out = {"embeddings": (path(engine.embeddings_variant.name), True, embeddings)}
    if engine.embeddings_variant.name != "embeddings":
        out["embeddings, plain"] = (path("embeddings"), True, embeddings)
    out["attention"] = (path(ATTENTION_VARIANT), False, None)
    if LAST_LAYER_VARIANT in manifest.variants:
        out["attention_last"] = (path(LAST_LAYER_VARIANT), False, None)
    out["attention, sentence only"] = (path(ATTENTION_VARIANT), False, ["sentence_embedding"])
    out["attention, arena on"] = (path(ATTENTION_VARIANT), True, None)
    return out


def run_times(opened: dict, feeds: list[tuple[dict, list[int]]], repeats: int) -> dict[str, float]:
    """Seconds of each graph over the batches: per batch the best of `repeats`. Each repeat runs each graph over
    every batch in turn, as a server under one load runs one graph batch after batch (graphs taking turns batch by
    batch evict each other's weights from the caches: every graph ran 1.6x slower so)."""
    best = {name: np.full(len(feeds), np.inf) for name in opened}
    for _ in range(repeats):
        for name, (sess, outputs) in opened.items():
            for i, (feed, _) in enumerate(feeds):
                start = time.perf_counter()
                sess.run(outputs, feed)
                best[name][i] = min(best[name][i], time.perf_counter() - start)
    return {name: float(b.sum()) for name, b in best.items()}


def op_profile(path: Path, arena: bool, outputs: list[str] | None, feeds: list[tuple[dict, list[int]]]) -> dict:
    """ms by op type, the session runs' ms, and run()'s wall ms, over one pass of the batches (after one warm
    batch, left out)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = session(path, arena, tmp)
        sess.run(outputs, feeds[0][0])
        start = time.perf_counter()
        for feed, _ in feeds:
            sess.run(outputs, feed)
        wall = time.perf_counter() - start
        events = json.loads(Path(sess.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][1:]
    first = runs[0]["ts"] if runs else 0
    by_op: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first:
            by_op[e["args"]["op_name"]] += e["dur"] / 1e3
    return {"by_op": dict(by_op), "runs": sum(e["dur"] for e in runs) / 1e3, "wall": wall * 1e3}


def post_processing(opened: dict, feeds: list[tuple[dict, list[int]]], layers: int) -> dict[str, float]:
    """ms of the server's work on each graph's outputs over the batches: each row cut from the batch
    (server/batcher.py), then the last layer's weights as a door sends them (RowOutput.layer_maps, tobytes), or
    rollout (attnserve/attention_analyses.py from the maps; the last-layer graph's cut and sent)."""
    from attnserve.attention_analyses import rollout
    from attnserve.engine.rows import RowOutput

    out: dict[str, float] = collections.defaultdict(float)
    for feed, lengths in feeds:
        attentions = opened["attention"][0].run(["attentions"], feed)[0]  # (L, B, nh, T, T)
        start = time.perf_counter()
        for row, n in enumerate(lengths):
            cut = RowOutput(None, None, attentions[:, row, :, :n, :n])
            cut.layer_maps([layers - 1]).tobytes()
        out["one layer, from attention"] += time.perf_counter() - start
        start = time.perf_counter()
        for row, n in enumerate(lengths):
            rollout(attentions[:, row, :, :n, :n]).tobytes()
        out["rollout, from attention"] += time.perf_counter() - start
        if "attention_last" not in opened:
            continue
        _, _, last, rolled = opened["attention_last"][0].run(None, feed)
        start = time.perf_counter()
        for row, n in enumerate(lengths):
            cut = RowOutput(None, None, last[None, row, :, :n, :n], map_layers=(layers - 1,))
            cut.layer_maps([layers - 1]).tobytes()
        out["one layer, from attention_last"] += time.perf_counter() - start
        start = time.perf_counter()
        for row, n in enumerate(lengths):
            np.ascontiguousarray(rolled[row, :n, :n]).tobytes()
        out["rollout, from attention_last"] += time.perf_counter() - start
    return {k: v * 1e3 for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", help="artifact directory (default: the default model's, built on first use)")
    parser.add_argument("--texts", type=int, default=320, help="corpus texts (default 320)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=16, help="clients waiting: the texts a batch is planned "
                                                                    "from (default 16, bench_attention.py's)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each batch; the best counts (default 3)")
    args = parser.parse_args(argv)
    from attnserve.config import EngineConfig
    from attnserve.default_model import resolve_artifacts
    from attnserve.engine.engine import Engine

    engine = Engine.from_directory(resolve_artifacts(args.artifacts), EngineConfig(provider="cpu", precision="fp32"))
    layers = engine.manifest.num_layers
    corpus = batches(engine, mixed_length_corpus(args.texts, args.seed), args.concurrency)
    shape_sets = {"server batches": corpus, **{f"{r} x {t}": fixed(engine, r, t) for r, t in SHAPES}}
    chosen = graphs(engine)
    opened = {name: (session(path, arena), outputs) for name, (path, arena, outputs) in chosen.items()}
    tokens = sum(sum(lengths) for _, lengths in corpus)
    print("\n".join([*machine_lines(), f"artifacts: {engine.manifest.directory}; embeddings graph "
                     f"{engine.embeddings_variant.name}; server batches: {args.texts} texts in groups of "
                     f"{args.concurrency}, {len(corpus)} batches (mean {tokens / len(corpus):.0f} tokens, "
                     f"{np.mean([len(lengths) for _, lengths in corpus]):.1f} rows), planned at "
                     f"{engine.batch_tokens} tokens; best of {args.repeats} per batch", ""]))

    times = {label: run_times(opened, feeds, args.repeats) for label, feeds in shape_sets.items()}
    print(f"{'graph run, ms (x embeddings)':<50}" + "".join(f"{label:>18}" for label in shape_sets))
    for name in opened:
        print(f"{name:<50}" + "".join(f"{t[name] * 1e3:>11.1f} ({t[name] / t['embeddings']:.2f})"
                                      for t in times.values()))

    profiles = {name: op_profile(path, arena, outputs, corpus) for name, (path, arena, outputs) in chosen.items()
                if name in ("embeddings", "embeddings, plain", "attention", "attention_last")}
    ops = sorted({op for p in profiles.values() for op in p["by_op"]},
                 key=lambda op: -max(p["by_op"].get(op, 0.0) for p in profiles.values()))
    own = [op for op in ops if any(p["by_op"].get(op, 0.0) >= OWN_LINE * sum(p["by_op"].values())
                                   for p in profiles.values())]
    print(f"\nserver batches, one profiled pass: ms by op type{'':<2}" + "".join(f"{n:>18}" for n in profiles))
    for op in own:
        print(f"  {op:<48}" + "".join(f"{p['by_op'].get(op, 0.0):>18.1f}" for p in profiles.values()))
    rows = {"  other op types": lambda p: sum(v for op, v in p["by_op"].items() if op not in own),
            "kernels": lambda p: sum(p["by_op"].values()),
            "outside kernels (allocation, scheduling)": lambda p: p["runs"] - sum(p["by_op"].values()),
            "session runs": lambda p: p["runs"],
            "run() beyond the session (outputs to numpy)": lambda p: p["wall"] - p["runs"]}
    for label, value in rows.items():
        print(f"{label:<50}" + "".join(f"{value(p):>18.1f}" for p in profiles.values()))

    print(f"\nthe server's work on the outputs, ms{'':<15}" + "".join(f"{label:>18}" for label in shape_sets))
    post = {label: post_processing(opened, feeds, layers) for label, feeds in shape_sets.items()}
    for what in next(iter(post.values())):
        print(f"{what:<50}" + "".join(f"{p[what]:>18.1f}" for p in post.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
