"""A reranker's int8 graph against its fp32 graph, side by side in one run: pairs/s, tokens/s and score agreement.

The reranker is a cross-encoder artifact directory (`attnserve export` of a XForSequenceClassification checkpoint);
with none given, one is made and exported: all-MiniLM-L6-v2's real encoder weights under a random one-label
classifier (tests/tiny_cross_encoders.py save_minilm_cross_encoder), a real-size model whose int8 error is a
trained encoder's. Pairs are (query, passage) from the mixed-length corpus (loadtest/corpus.py): each query, a short
text, against the passages after it, tokenized by the engine's tokenizer. Each precision runs through its own
Engine (engine/engine.py score_tokenized: length-sorted batches under max_batch_tokens, the graph the engine
chooses on this CPU), once per round, in reversed order every other round; each one's best round is kept.

Agreement: the int8 scores against fp32's over every pair: the sigmoid scores' mean and largest absolute
difference, and Spearman's rank correlation (export/reranker_int8.py score_agreement).

    python bench/bench_rerank.py                               # makes and exports the MiniLM-size reranker
    python bench/bench_rerank.py --artifacts DIR --pairs 400 --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.export.reranker_int8 import score_agreement
from attnserve.loadtest.corpus import mixed_length_corpus

try:  # run as a script: bench/ is on sys.path
    from machine import machine_lines
except ImportError:
    from bench.machine import machine_lines

REPO = Path(__file__).resolve().parent.parent  # tests/tiny_cross_encoders.py makes the default reranker


def make_reranker(workdir: Path) -> Path:
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    sys.path.insert(0, str(REPO))
    from tests.tiny_cross_encoders import save_minilm_cross_encoder

    checkpoint = save_minilm_cross_encoder(workdir / "checkpoint")
    out = workdir / "artifacts"
    build_artifacts(read_checkpoint(checkpoint, "minilm-l6-reranker (random head)"), out,
                    log=lambda line: print(f"  export: {line}", flush=True))
    return out


def pairs(n: int) -> list[tuple[str, str]]:
    texts = mixed_length_corpus(n + n // 8 + 1, seed=3)
    queries = [t for t in texts if len(t.split()) <= 16]
    return [(queries[i % len(queries)], texts[i]) for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, help="a reranker's artifact directory (default: make one)")
    parser.add_argument("--pairs", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for line in machine_lines():
        print(line)
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = args.artifacts or make_reranker(Path(tmp))
        manifest = load_manifest(artifacts)
        if manifest.kind != "reranker" or "scores_int8" not in manifest.variants:
            print(f"{artifacts}: not a reranker with an int8 graph (kind {manifest.kind}, graphs "
                  f"{', '.join(manifest.variants)})", file=sys.stderr)
            return 2
        engines = {p: Engine.from_directory(artifacts, EngineConfig(provider="cpu", precision=p))
                   for p in ("fp32", "int8")}
        for engine in engines.values():
            print(f"engine: {engine.describe()}")
        inputs = engines["fp32"].tokenizer.encode_pairs(pairs(args.pairs))
        tokens = sum(len(x) for x in inputs)
        best = {p: float("inf") for p in engines}
        scores = {}
        for round_ in range(args.rounds):
            order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
            for precision in order:
                start = time.perf_counter()
                scores[precision] = engines[precision].score_tokenized(inputs)
                best[precision] = min(best[precision], time.perf_counter() - start)
        print(f"model: {manifest.model}, {manifest.num_layers} layers, hidden {manifest.hidden_size}; {len(inputs)} "
              f"pairs, {tokens} tokens (mean {tokens / len(inputs):.0f}), best of {args.rounds} rounds")
        for precision in engines:
            seconds = best[precision]
            print(f"  {precision}: {len(inputs) / seconds:.1f} pairs/s, {tokens / seconds:.0f} tokens/s")
        agreement = score_agreement(scores["int8"], scores["fp32"], "sigmoid")
        print(f"int8 / fp32 throughput: {best['fp32'] / best['int8']:.2f}x; int8 against fp32: sigmoid score error "
              f"mean {agreement['mean_score_error']:.4f}, max {agreement['max_score_error']:.4f}, Spearman "
              f"{agreement['spearman']:.4f}; logits spread (std) {np.std(scores['fp32']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
