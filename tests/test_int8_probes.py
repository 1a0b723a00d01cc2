"""The sensitivity probe's graphs cut from one whole int8 graph (export/int8_sensitivity.py) are the graphs
onnxruntime's quantizer gives with that one node quantized: the same outputs, bit for bit, for every node of a
tiny BERT (fused Attention -> QAttention) and a tiny MPNet (unfused attention: MatMuls only)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from attnserve.export.int8_recipes import Int8Recipe, build, quantizable_nodes
from attnserve.export.int8_sensitivity import _with_recipe_gelu, one_node_quantized, sentence_embeddings
from attnserve.export.optimize import quiet

from . import tiny_graphs
from .test_int8_recipes import feeds

fused_graph = tiny_graphs.fused_graph  # the session's fixture, in this module's scope


@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_a_probe_cut_from_the_whole_int8_graph_is_the_quantizers_one_node_graph(fused_graph, family, tmp_path):
    ckpt, fused = fused_graph(family)
    fp32 = onnx.load(str(fused))
    nodes = quantizable_nodes(fp32)
    # As export's recipe: FastGelu, and a node kept in fp32 (export keeps the outlier side paths so).
    recipe = Int8Recipe("probe", fast_gelu=True, keep_fp32=(nodes[-1],))
    batches = feeds(seed=0, n_batches=3, vocab=ckpt.config.vocab_size)
    with quiet():
        build(recipe, fused, tmp_path / "whole.onnx")
        whole, fp32 = onnx.load(str(tmp_path / "whole.onnx")), _with_recipe_gelu(recipe, fp32)
        assert {"MatMulInteger"} <= {n.op_type for n in whole.graph.node}
        for node in nodes[:-1]:
            build(recipe, fused, tmp_path / "quantizer.onnx", only=[node])
            onnx.save(one_node_quantized(fp32, whole, node), str(tmp_path / "cut.onnx"))
            expected = sentence_embeddings(tmp_path / "quantizer.onnx", batches)
            assert np.array_equal(sentence_embeddings(tmp_path / "cut.onnx", batches), expected), node
            cut = onnx.load(str(tmp_path / "cut.onnx"))
            assert sorted(n.op_type for n in cut.graph.node) == sorted(
                n.op_type for n in onnx.load(str(tmp_path / "quantizer.onnx")).graph.node), node
