"""A reranker's int8 graph, and how close its scores stay to fp32's: measured as the embedders' int8 is, on scores.

The recipe is the embedders' (export/optimize.py quantize_int8_measured): dynamic per-channel s8 weights (u8 where
u8s8 kernels saturate) against u8 activations, GELU as onnxruntime's FastGelu, each feed-forward's outlier units
computed apart in fp32 where the feed-forward has the BiasGelu shape (export/int8_outliers.py), and the nodes whose
quantization costs the most kept in fp32, fewest first, until the bar holds. Two things differ, both because the
output is a score, not an embedding:
- the head (dense and out projections) stays in fp32: its products are one row per pair, nothing to gain in
  speed, and the score is its last dot product;
- the measure is not a cosine (of one number it is only a sign) but what a reranker's user sees: the scores after
  the CrossEncoder's activation (a sigmoid's probabilities; raw logits relative to the largest, at least 1, where
  the activation is the identity), their largest absolute difference, and the order of the pairs, as Spearman's
  rank correlation of the first label's scores.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from attnserve.engine.session import CHECK_SPIN, CPU, open_session

from .int8_outliers import side_path_nodes, split_outliers
from .int8_recipes import Int8Recipe, build, quantizable_nodes, weight_type
from .optimize import INT8_MOST_FP32, op_counts, quiet

# The bars against PyTorch at verification, on the 256 real text pairs (export/reranker.py): the mean error of the
# scores a user gets (a sigmoid score off by 0.01 on average moves a pair by a hundredth of the whole scale) and the
# order, Spearman 0.98. Means, as the embedders' bar is a mean cosine: the largest error is recorded, not held to a
# bar. The choice of the nodes kept in fp32 is made on other pairs (calibration) and asks half the error and half
# the rank disagreement of them, as the embedders' asks a margin (INT8_CHOICE_MARGIN), so that it holds on the
# verified pairs too. Where even INT8_MOST_FP32 nodes kept do not reach it, the export writes no int8 graph.
INT8_MEAN_SCORE_ERROR, INT8_MIN_SPEARMAN = 0.01, 0.98
CHOICE_FACTOR = 0.5
# The head's nodes (model/cross_encoder.py: Reranker.head), kept in fp32 by name.
HEAD_NODES = "/head/"


def activated(logits: np.ndarray, reference: np.ndarray, activation: str) -> np.ndarray:
    """(N, labels) logits -> the scores a user gets (sigmoid), or logits relative to the reference's largest."""
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    return logits.astype(np.float64) / max(1.0, float(np.abs(reference).max()))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two (N,) score vectors (ties broken by position: scores are floats)."""
    if len(a) < 2:
        return 1.0
    ranks_a, ranks_b = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def score_agreement(got: np.ndarray, want: np.ndarray, activation: str) -> dict[str, float]:
    """got, want: (N, labels) logits -> the largest activated score error and the rank correlation."""
    error = np.abs(activated(got, want, activation) - activated(want, want, activation))
    return {"max_score_error": float(error.max()), "mean_score_error": float(error.mean()),
            "spearman": spearman(got[:, 0], want[:, 0])}


def graph_scores(path: Path, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The graph's raw logits for every row of every feed, in feed order: (rows, labels)."""
    session = open_session(path, CPU, spin=CHECK_SPIN)
    return np.concatenate([session.run(["scores"], feed)[0] for feed in feeds])


def quantize_reranker_int8(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]], activation: str,
                           log: Callable[[str], None]) -> dict[str, float]:
    """src (the fused fp32 scores graph) -> dst in int8, by the recipe of the module docstring. Returns the
    measures on the calibration pairs against src. ValueError when INT8_MOST_FP32 nodes kept do not suffice."""
    mean_error, min_spearman = INT8_MEAN_SCORE_ERROR * CHOICE_FACTOR, 1 - (1 - INT8_MIN_SPEARMAN) * CHOICE_FACTOR
    reference = graph_scores(src, calibration)
    with quiet(), tempfile.TemporaryDirectory() as tmp:
        split_graph, trial = Path(tmp) / src.name, Path(tmp) / "trial.onnx"
        split = split_outliers(src, split_graph, calibration)
        nodes = quantizable_nodes(onnx.load(str(split_graph), load_external_data=False))
        recipe = Int8Recipe("dynamic per-channel, FastGelu, outlier units apart, head in fp32", fast_gelu=True,
                            keep_fp32=tuple(side_path_nodes(split)) + tuple(n for n in nodes if HEAD_NODES in n),
                            weight_type=weight_type())

        def measured(built: Int8Recipe, only: list[str] | None = None) -> dict[str, float]:
            build(built, split_graph, trial, only=only)
            return score_agreement(graph_scores(trial, calibration), reference, activation)

        def holds(measures: dict[str, float]) -> bool:
            return measures["mean_score_error"] <= mean_error and measures["spearman"] >= min_spearman

        kept: list[str] = []
        measures = measured(recipe)
        if not holds(measures):
            # Each node quantized alone: the worst mean score error first.
            probed = [n for n in nodes if n not in recipe.keep_fp32]
            drops = {n: measured(recipe, only=[n])["mean_score_error"] for n in probed}
            worst = sorted(drops, key=lambda n: -drops[n])
            for k in range(1, min(INT8_MOST_FP32, len(worst)) + 1):
                kept = worst[:k]
                measures = measured(recipe.excluding(kept, f"{recipe.name}, {k} kept"))
                if holds(measures):
                    break
            else:
                raise ValueError(f"int8 ({recipe.name}) misses mean score error {mean_error:g} / Spearman "
                                 f"{min_spearman:g} against fp32 even with {len(kept)} nodes in fp32 (error "
                                 f"{measures['mean_score_error']:.3g}, Spearman {measures['spearman']:.4f})")
        build(recipe.excluding(kept, recipe.name), split_graph, dst)
    units = sum(len(u) for u in split.values())
    counts = op_counts(onnx.load(str(dst), load_external_data=False))
    log(f"int8: {counts.get('MatMulInteger', 0) + counts.get('QAttention', 0)} nodes in int8; {units} outlier units "
        f"of {len(split)} feed-forwards computed apart in fp32; the head and {len(kept)} most sensitive nodes in fp32 "
        f"({', '.join(kept) or 'none'}); calibration pairs against fp32: score error mean "
        f"{measures['mean_score_error']:.3g}, max {measures['max_score_error']:.3g}, Spearman "
        f"{measures['spearman']:.4f}")
    return measures
