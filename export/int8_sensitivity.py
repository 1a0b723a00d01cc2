"""Which nodes cost the most accuracy in int8, measured: each quantizable node is quantized alone and the cosine of
the sentence embeddings against fp32 is taken on calibration texts. The worst few are the ones to keep in fp32."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx

from attnserve.engine.session import CPU, open_session

from .int8_recipes import Int8Recipe, build, quantizable_nodes

OUTPUT = "sentence_embedding"


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, D), (N, D) -> (N,), in float64: a drop of 1e-7 is below float32's resolution near 1."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def sentence_embeddings(path: Path, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The graph's sentence embeddings for every row of every feed, in feed order: (rows, D)."""
    session = open_session(path, CPU)
    # Graphs of models with token types take token_type_ids: zeros, as the engine feeds single texts.
    types = "token_type_ids" in {i.name for i in session.get_inputs()}
    return np.concatenate([session.run([OUTPUT], {**feed, "token_type_ids": np.zeros_like(feed["input_ids"])}
                                       if types else feed)[0] for feed in feeds])


def node_drops(recipe: Int8Recipe, src: Path, feeds: list[dict[str, np.ndarray]],
               calibration: list[dict[str, np.ndarray]] | None = None) -> dict[str, float]:
    """node -> 1 - mean cosine vs fp32 when only that node is quantized by the recipe, worst first (the nodes the
    recipe keeps in fp32 are not probed)."""
    reference = sentence_embeddings(src, feeds)
    model = onnx.load(str(src), load_external_data=False)
    nodes = [n for n in quantizable_nodes(model) if n not in recipe.keep_fp32]
    drops = {}
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.onnx"
        for node in nodes:
            build(recipe, src, probe, calibration, only=[node])
            drops[node] = float(1.0 - cosine(sentence_embeddings(probe, feeds), reference).mean())
    return dict(sorted(drops.items(), key=lambda kv: -kv[1]))


def fewest_fp32_nodes(recipe: Int8Recipe, src: Path, feeds: list[dict[str, np.ndarray]], mean_bar: float,
                      p1_bar: float, most: int) -> tuple[list[str], dict[str, float]]:
    """The shortest worst-first prefix of node_drops() whose fp32 keeps the whole int8 graph at cosine mean >=
    mean_bar and p1 >= p1_bar against fp32 on feeds, and those measures. The whole graph in int8 is tried first;
    the nodes are probed only if it misses. Raises ValueError past `most` nodes."""
    reference = sentence_embeddings(src, feeds)
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / "trial.onnx"

        def measured(kept: list[str]) -> dict[str, float]:
            build(recipe.excluding(kept, f"{recipe.name}, {len(kept)} kept"), src, trial)
            cos = cosine(sentence_embeddings(trial, feeds), reference)
            return {"mean": float(cos.mean()), "p1": float(np.percentile(cos, 1))}

        def holds(measures: dict[str, float]) -> bool:
            return measures["mean"] >= mean_bar and measures["p1"] >= p1_bar

        measures = measured([])
        if holds(measures):
            return [], measures
        worst = list(node_drops(recipe, src, feeds))
        for k in range(1, min(most, len(worst)) + 1):
            measures = measured(worst[:k])
            if holds(measures):
                return worst[:k], measures
    raise ValueError(f"int8 ({recipe.name}) misses cosine mean {mean_bar} / p1 {p1_bar} against fp32 even with "
                     f"its {most} most sensitive nodes in fp32 (mean {measures['mean']:.4f}, p1 {measures['p1']:.4f})")
