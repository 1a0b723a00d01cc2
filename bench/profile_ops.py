"""Where an encode's time goes: onnxruntime's profiler by op type, and the Python side around it.

Runs the engine's batches of the bench corpus (loadtest/corpus.py, as bench_encode.py) through one graph
variant with onnxruntime's profiler on, and sums the kernels' time by op type: how much is matrix
multiplication (MatMul, the fused Attention, Gemm) and how much everything else (LayerNorm, Gelu, Add,
Reshape, copies). Beside it, the wall of the same `Engine.encode_tokenized` split into tokenizing, padding
and the session runs, so the share of the Python side is measured too.

    python bench/profile_ops.py --artifacts /tmp/art [--variant embeddings_fused] [--texts 1000]

It measures, it does not test: numbers from a shared machine are noisy, read the fractions.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

from attnserve.loadtest.corpus import mixed_length_corpus

# The op types whose kernels are the model's matrix multiplications (onnxruntime names; Attention holds
# the Q/K/V projection and QK^T, PV).
GEMM_OPS = {"MatMul", "FusedMatMul", "Gemm", "Attention", "MultiHeadAttention", "MatMulInteger",
            "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention"}


def profile_by_op(artifacts: Path, variant: str, texts: list[str], threads: int, batch_tokens: int = 0) -> dict:
    """Kernel microseconds by op type over every batch of texts, and the session runs' wall."""
    import onnxruntime as ort

    from attnserve.config import EngineConfig
    from attnserve.engine.batching import plan_batches
    from attnserve.engine.engine import Engine
    from attnserve.engine.manifest import load_manifest

    manifest = load_manifest(artifacts)
    # The variant's precision, so that the batch budget is the one the engine calibrates for it on this CPU.
    engine = Engine(manifest, EngineConfig(provider="cpu", precision=manifest.variants[variant].precision,
                                           threads=threads))
    inputs = engine.tokenizer.encode_texts(texts)
    lengths = [len(x) for x in inputs]
    batches = plan_batches(lengths, batch_tokens or engine.batch_tokens, engine.config.max_batch_size,
                           engine.config.batch_cost_tokens)
    feeds = [engine._feed([inputs[i] for i in batch]) for batch in batches]

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        if threads:
            options.intra_op_num_threads = threads
        graph = manifest.variants[variant]
        session = ort.InferenceSession(str(manifest.path(graph.file)), options, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=list(graph.disabled_optimizers))
        output = [o.name for o in session.get_outputs() if o.name in ("sentence_embedding", "scores")]
        session.run(output, feeds[0])  # warm-up, profiled like the rest: one batch of hundreds
        start = time.perf_counter()
        for feed in feeds:
            session.run(output, feed)
        wall = time.perf_counter() - start
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = collections.defaultdict(float)
    runs = 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            runs += event["dur"]
    return {"by_op_us": dict(by_op), "model_run_us": runs, "wall_s": wall, "batches": len(feeds),
            "tokens": sum(lengths), "batch_tokens": batch_tokens or engine.batch_tokens}


def python_side(artifacts: Path, texts: list[str], threads: int) -> dict:
    """Seconds of one Engine.encode split into tokenizing and the batches (padding + session.run)."""
    from attnserve.config import EngineConfig
    from attnserve.engine.batching import pad
    from attnserve.engine.engine import Engine

    engine = Engine.from_directory(artifacts, EngineConfig(provider="cpu", precision="fp32", threads=threads))
    engine.encode(texts[:8])
    start = time.perf_counter()
    inputs = engine.tokenizer.encode_texts(texts)
    tokenize = time.perf_counter() - start
    pad_s = 0.0
    for _ in range(3):
        t = time.perf_counter()
        pad([x.ids for x in inputs[:256]])
        pad_s += time.perf_counter() - t
    start = time.perf_counter()
    encoded = engine.encode_tokenized(inputs)
    return {"tokenize_s": tokenize, "encode_s": time.perf_counter() - start, "tokens": encoded.stats.tokens,
            "pad_256_s": pad_s / 3}


def report(profile: dict, side: dict) -> str:
    by_op, runs = profile["by_op_us"], profile["model_run_us"]
    kernels = sum(by_op.values())
    lines = [f"{profile['batches']} batches of at most {profile['batch_tokens']} padded tokens, {profile['tokens']} "
             f"tokens, {profile['tokens'] / runs * 1e6:,.0f} tokens/s; session runs {runs / 1e3:.0f} ms "
             f"(wall {profile['wall_s'] * 1e3:.0f} ms); kernels {kernels / 1e3:.0f} ms",
             f"{'op type':<28}{'ms':>10}{'of kernels':>12}{'of runs':>10}"]
    for op, us in sorted(by_op.items(), key=lambda kv: -kv[1]):
        lines.append(f"{op:<28}{us / 1e3:>10.1f}{us / kernels:>12.1%}{us / runs:>10.1%}")
    tokenize_share = side["tokenize_s"] / (side["tokenize_s"] + side["encode_s"])
    gemm = sum(us for op, us in by_op.items() if op in GEMM_OPS)
    lines += [f"{'GEMM (' + ', '.join(sorted(GEMM_OPS & by_op.keys())) + ')':<28}",
              f"  {gemm / 1e3:.0f} ms = {gemm / kernels:.1%} of kernels, {gemm / runs:.1%} of session runs",
              f"outside kernels (onnxruntime's scheduling, allocation, copies): {(runs - kernels) / 1e3:.0f} ms "
              f"= {(runs - kernels) / runs:.1%} of session runs",
              f"python side: tokenizing {side['tokenize_s'] * 1e3:.0f} ms, encode_tokenized "
              f"{side['encode_s'] * 1e3:.0f} ms (tokenizing = {tokenize_share:.1%} of tokenize + encode); "
              f"pad() of 256 inputs {side['pad_256_s'] * 1e3:.2f} ms"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", required=True, help="artifact directory")
    parser.add_argument("--variant", default="embeddings_fused", help="graph variant (default embeddings_fused)")
    parser.add_argument("--texts", type=int, default=1000, help="corpus size (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (default: its own)")
    parser.add_argument("--batch-tokens", type=int, default=0,
                        help="plan batches at this budget (default: the engine's, as calibrated on this CPU)")
    args = parser.parse_args(argv)
    texts = mixed_length_corpus(args.texts, args.seed)
    profile = profile_by_op(Path(args.artifacts), args.variant, texts, args.threads, args.batch_tokens)
    print(report(profile, python_side(Path(args.artifacts), texts, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
