"""The int8 candidate builder (export/int8_recipes.py) and the sensitivity probe, on tiny models: fast, real graphs;
and the feed-forwards' outlier units computed apart (export/int8_outliers.py), on MiniLM's real weights: which units,
and that the fp32 graph it writes computes what the fused graph does.

int8_recipes.build runs onnxruntime's dynamic quantizer with its shape inference done in place, not on a deep copy of
the model reloaded from disk (the copy held the fp32 weights three times: 7.1 GiB for the Qwen3-0.6B shape): the graph
it writes must be the one onnxruntime's own code writes, byte for byte, for fused attention (BERT), unfused attention
(MPNet) and rotary grouped-query attention (Qwen3, whose Reshapes take their shapes from small initializers), with the
weights in the graph or in a data file beside it."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.quantization import onnx_quantizer

from attnserve.engine.batching import pad
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.export import external_data, int8_recipes
from attnserve.export.artifacts import build_artifacts
from attnserve.export.int8_outliers import MOST_OUTLIERS, feed_forwards, side_path_nodes, split_outliers
from attnserve.export.int8_recipes import Int8Recipe, build, quantizable_nodes, same_shape
from attnserve.export.int8_sensitivity import cosine, node_drops, sentence_embeddings
from attnserve.export.optimize import FIRST_FFN_DOWN, INT8_COSINE_MEAN, INT8_COSINE_P1, op_counts, quiet
from attnserve.export.verify import TOLERANCES, calibration_feeds
from attnserve.loadtest.corpus import mixed_length_corpus

from . import tiny_graphs

fused_graph = tiny_graphs.fused_graph  # the session's fixture, in this module's scope


@pytest.fixture(scope="module")
def tiny_fused(fused_graph):
    """The tiny BERT's (tests/checkpoints.py: vocabulary 64, 2 layers) fused graph."""
    return fused_graph("bert")[1]


def feeds(seed: int, n_batches: int = 4, vocab: int = 64) -> list[dict[str, np.ndarray]]:
    """Batches of 6 rows of 3 to 29 random ids of the vocabulary (past its 5 first, the special tokens)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        ids, mask = pad([rng.integers(5, vocab, size=n) for n in rng.integers(3, 30, size=6)])
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
    nodes = quantizable_nodes(onnx.load(str(tiny_fused)))
    assert len(nodes) == 2 * 4  # per layer: Attention, attention out, FFN up, FFN down
    with quiet():
        build(Int8Recipe("dynamic").excluding([nodes[1]], "kept"), tiny_fused, tmp_path / "kept.onnx")
    kept = [n for n in onnx.load(str(tmp_path / "kept.onnx")).graph.node if n.name == nodes[1]]
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


def test_export_keeps_the_fewest_measured_nodes_in_fp32_that_reach_the_bar(fused_graph, tmp_path):
    lines: list[str] = []
    manifest = build_artifacts(fused_graph("bert")[0], tmp_path / "artifacts", log=lines.append)
    chosen = [line for line in lines if line.startswith("int8: ")]
    assert len(chosen) == 1, lines
    mean, p1 = (float(x) for x in re.findall(r"mean ([\d.]+), p1 ([\d.]+)", chosen[0])[0])
    assert mean >= INT8_COSINE_MEAN and p1 >= INT8_COSINE_P1
    assert manifest.variants["embeddings_int8"].parity["mean_cosine_sentence_embedding_texts"] >= TOLERANCES[
        "int8"].limit


def _written(path) -> tuple[bytes, dict[str, bytes]]:
    """The graph's protobuf with every weight's values in it, and the data files' bytes. A weight's location is
    left unset where it is the default (onnxruntime's reload sets it explicitly: the same tensor)."""
    model = onnx.load(str(path))
    for weight in model.graph.initializer:
        if weight.data_location == onnx.TensorProto.DEFAULT:
            weight.ClearField("data_location")
    return model.SerializeToString(), {f: (path.parent / f).read_bytes() for f in external_data.external_files(path)}


@pytest.mark.parametrize("external", [False, True], ids=["weights-in-graph", "external-data"])
@pytest.mark.parametrize("family", ["bert", "mpnet", "qwen3"])
def test_the_int8_graph_is_onnxruntimes_own(fused_graph, family, external, tmp_path, monkeypatch):
    src = tmp_path / "src" / "fused.onnx"
    src.parent.mkdir()
    external_data.save(onnx.load(str(fused_graph(family)[1])), src, external=external)
    nodes = quantizable_nodes(onnx.load(str(src), load_external_data=False))
    recipe = Int8Recipe("as export's", fast_gelu=True, keep_fp32=(nodes[-1],))
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    copying = onnx_quantizer.save_and_reload_model_with_shape_infer
    with quiet():
        build(recipe, src, tmp_path / "ours" / "int8.onnx")
        assert onnx_quantizer.save_and_reload_model_with_shape_infer is copying  # put back after the build
        monkeypatch.setattr(int8_recipes, "_shapes_reloaded_without_a_copy", contextlib.nullcontext)
        build(recipe, src, tmp_path / "theirs" / "int8.onnx")  # onnxruntime's own deep copy and reload
    ours, theirs = _written(tmp_path / "ours" / "int8.onnx"), _written(tmp_path / "theirs" / "int8.onnx")
    assert {"MatMulInteger"} <= {n.op_type for n in onnx.load(str(tmp_path / "ours" / "int8.onnx")).graph.node}
    assert bool(ours[1]) == external and ours == theirs


# --- the outlier units apart, on MiniLM ----------------------------------------------------------------------------


def _tokenizer(artifacts) -> TextTokenizer:
    return TextTokenizer(artifacts / "tokenizer.json", 256, 30522)


def _run(path, feed, outputs):
    session = open_session(path, CPU)
    if "token_type_ids" in {i.name for i in session.get_inputs()}:
        feed = {**feed, "token_type_ids": np.zeros_like(feed["input_ids"])}
    return session.run(outputs, feed)


@pytest.fixture(scope="module")
def split(artifacts, tmp_path_factory):
    """(the calibration feeds, the units split apart per down-projection, the graph written with them apart)."""
    feeds = calibration_feeds(_tokenizer(artifacts))
    path = tmp_path_factory.mktemp("outliers") / "split.onnx"
    return feeds, split_outliers(artifacts / "embeddings_fused.onnx", path, feeds), path


def test_the_split_graph_computes_what_the_fused_graph_does(artifacts, split):
    _, units, path = split
    # MiniLM's massive activations: at least the first layer's, a few units per layer at most.
    assert FIRST_FFN_DOWN in units and all(1 <= len(u) <= MOST_OUTLIERS for u in units.values())
    assert {n.name for n in onnx.load(str(path)).graph.node} >= set(side_path_nodes(units))
    # Texts the calibration never saw, in one padded batch: the same sentence embeddings and hidden states.
    inputs = _tokenizer(artifacts).encode_texts(mixed_length_corpus(48, seed=11))
    ids, mask = pad([x.ids for x in inputs])
    feed = {"input_ids": ids, "attention_mask": mask}
    names = ["last_hidden_state", "sentence_embedding"]
    before = _run(artifacts / "embeddings_fused.onnx", feed, names)
    after = _run(path, feed, names)
    real = mask.astype(bool)
    assert np.abs(before[0][real] - after[0][real]).max() <= 1e-4
    assert np.abs(before[1] - after[1]).max() <= 1e-5


def test_the_units_apart_are_switched_off_exactly_in_the_main_path(split, tmp_path):
    """Their GELU output is 0.0 in the main path: the int8 down-projection's input range is the other units'."""
    feeds, units_apart, path = split
    model = onnx.load(str(path))
    downs = {ff.down.name: ff.down.input[0] for ff in feed_forwards(model)}
    model.graph.output.extend(helper.make_tensor_value_info(downs[name], onnx.TensorProto.FLOAT, None)
                              for name in units_apart)
    onnx.save(model, str(tmp_path / "probe.onnx"))
    outputs = _run(tmp_path / "probe.onnx", feeds[0], [downs[name] for name in units_apart])
    real = feeds[0]["attention_mask"].astype(bool)
    for units, gelu in zip(units_apart.values(), outputs, strict=True):  # (B, T, F) each
        assert np.all(gelu[real][:, units] == 0.0)
        others = np.delete(gelu[real], units, axis=1)
        assert np.abs(others).max() > 0.5  # the rest is untouched


def test_graphs_without_the_pattern_are_left_as_they_are(artifacts, tmp_path):
    """The unfused graph's GELU is erf arithmetic, not BiasGelu: nothing to split, the same graph written."""
    split = split_outliers(artifacts / "embeddings.onnx", tmp_path / "same.onnx", calibration_feeds(
        _tokenizer(artifacts))[:1])
    assert split == {}
    assert len(onnx.load(str(tmp_path / "same.onnx")).graph.node) == len(
        onnx.load(str(artifacts / "embeddings.onnx")).graph.node)
