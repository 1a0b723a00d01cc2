"""The feed-forwards' outlier units computed apart (export/int8_outliers.py), on MiniLM's real weights: which units,
and that the fp32 graph it writes computes what the fused graph does."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from attnserve.engine.batching import pad
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.export.int8_outliers import MOST_OUTLIERS, feed_forwards, side_path_nodes, split_outliers
from attnserve.export.optimize import FIRST_FFN_DOWN
from attnserve.export.verify import calibration_feeds
from attnserve.loadtest.corpus import mixed_length_corpus


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
