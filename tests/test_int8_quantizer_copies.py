"""int8_recipes.build runs onnxruntime's dynamic quantizer with its shape inference done in place, not on a deep
copy of the model reloaded from disk (the copy held the fp32 weights three times: 7.1 GiB for the Qwen3-0.6B
shape). The graph it writes must be the one onnxruntime's own code writes, byte for byte, for graphs with fused
attention (BERT), unfused attention (MPNet) and rotary grouped-query attention (Qwen3, whose Reshapes take their
shapes from small initializers), with the weights in the graph or in a data file beside it."""

from __future__ import annotations

import contextlib

import onnx
import pytest
from onnxruntime.quantization import onnx_quantizer

from attnserve.export import external_data, int8_recipes
from attnserve.export.int8_recipes import Int8Recipe, build, quantizable_nodes
from attnserve.export.optimize import quiet

from . import tiny_graphs

fused_graph = tiny_graphs.fused_graph  # the session's fixture, in this module's scope


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
    assert bool(ours[1]) == external
    assert ours == theirs
