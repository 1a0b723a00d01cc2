"""The int8 candidate builder (export/int8_recipes.py) and the sensitivity probe, on a tiny BERT: fast, real graphs."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

from attnserve.engine.batching import pad
from attnserve.export.artifacts import build_artifacts
from attnserve.export.int8_recipes import Int8Recipe, build, quantizable_nodes, same_shape
from attnserve.export.int8_sensitivity import cosine, node_drops, sentence_embeddings
from attnserve.export.optimize import INT8_COSINE_MEAN, INT8_COSINE_P1, fuse_attention, op_counts, quiet
from attnserve.export.torch_to_onnx import export_graph
from attnserve.export.verify import TOLERANCES
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.encoder import SentenceEncoder
from attnserve.model.sentence_head import load_head

from .checkpoints import save_sentence_transformer, save_tiny_bert


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny_bert")
    return read_checkpoint(save_sentence_transformer(save_tiny_bert(tmp / "bert"), tmp / "st", "mean", True))


@pytest.fixture(scope="module")
def tiny_fused(tmp_path_factory, tiny_checkpoint):
    tmp = tmp_path_factory.mktemp("tiny_int8")
    ckpt = tiny_checkpoint
    export_graph(SentenceEncoder(load_encoder(ckpt), load_head(ckpt.directory, ckpt.pipeline)), tmp / "plain.onnx")
    fuse_attention(tmp / "plain.onnx", tmp / "fused.onnx", ckpt.config)
    return tmp / "fused.onnx"


def feeds(seed: int, n_batches: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        ids, mask = pad([rng.integers(5, 64, size=n) for n in rng.integers(3, 30, size=6)])
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


@pytest.mark.parametrize("recipe, expected_ops", [
    (Int8Recipe("dynamic"), {"QAttention", "MatMulInteger"}),
    (Int8Recipe("static QDQ", static=True, dynamic_attention=True), {"QAttention", "QuantizeLinear"}),
    (Int8Recipe("static Entropy", static=True, calibrate_method="Entropy"), {"QuantizeLinear"}),
])
def test_each_recipe_builds_integer_ops_that_track_fp32(tiny_fused, tmp_path, recipe, expected_ops):
    with quiet():
        build(recipe, tiny_fused, tmp_path / "int8.onnx", feeds(seed=1))
    assert expected_ops <= set(op_counts(onnx.load(str(tmp_path / "int8.onnx"))))
    held_out = feeds(seed=2)
    cos = cosine(sentence_embeddings(tmp_path / "int8.onnx", held_out), sentence_embeddings(tiny_fused, held_out))
    assert cos.shape == (24,) and cos.min() > 0.9  # random tiny weights: close, not exact


def test_kept_nodes_stay_fp32_and_static_needs_texts(tiny_fused, tmp_path):
    model = onnx.load(str(tiny_fused))
    nodes = quantizable_nodes(model)
    assert len(nodes) == 2 * 4  # per layer: Attention, attention out, FFN up, FFN down
    keep = nodes[1]
    with quiet():
        build(Int8Recipe("dynamic").excluding([keep], "kept"), tiny_fused, tmp_path / "kept.onnx")
    kept = [n for n in onnx.load(str(tmp_path / "kept.onnx")).graph.node if n.name == keep]
    assert len(kept) == 1 and kept[0].op_type == "MatMul"
    with pytest.raises(ValueError, match="static and needs calibration feeds"):
        build(Int8Recipe("s", static=True), tiny_fused, tmp_path / "s.onnx")


def test_sensitivity_ranks_every_quantizable_node(tiny_fused):
    with quiet():
        drops = node_drops(Int8Recipe("probe"), tiny_fused, feeds(seed=3, n_batches=2))
    assert set(drops) == set(quantizable_nodes(onnx.load(str(tiny_fused))))
    values = list(drops.values())
    assert values == sorted(values, reverse=True) and values[0] > 0


def test_same_shape_pads_every_row_to_one_width():
    shaped = same_shape(feeds(seed=4, n_batches=2))
    assert len(shaped) == 12 and len({f["input_ids"].shape for f in shaped}) == 1
    assert all(f["attention_mask"].shape[0] == 1 for f in shaped)


def test_export_keeps_the_fewest_measured_nodes_in_fp32_that_reach_the_bar(tiny_checkpoint, tmp_path):
    lines: list[str] = []
    manifest = build_artifacts(tiny_checkpoint, tmp_path / "artifacts", log=lines.append)
    chosen = [line for line in lines if line.startswith("int8: ")]
    assert len(chosen) == 1, lines
    mean, p1 = (float(x) for x in re.findall(r"mean ([\d.]+), p1 ([\d.]+)", chosen[0])[0])
    assert mean >= INT8_COSINE_MEAN and p1 >= INT8_COSINE_P1
    parity = manifest.variants["embeddings_int8"].parity
    assert parity["mean_cosine_sentence_embedding_texts"] >= TOLERANCES["int8"].limit
