"""Graphs with their weights in data files beside them (ONNX external data): the path a model past protobuf's 2 GB
takes, run on a tiny BERT forced onto it (ATTNSERVE_EXTERNAL_DATA_ABOVE=0), end to end: export, verification,
serving over HTTP, and the hash check that catches a changed data file."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.errors import ArtifactError
from attnserve.export.artifacts import VARIANTS, build_artifacts
from attnserve.export.external_data import THRESHOLD_ENV, external_files
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import save_sentence_transformer, save_tiny_bert
from .serving import ServerProcess, serving

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "x"]


@pytest.fixture(scope="module")
def forced(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, artifacts): a tiny BERT exported with every graph's weights in a data file."""
    root = tmp_path_factory.mktemp("external")
    checkpoint = save_sentence_transformer(save_tiny_bert(root / "bert", vocab_size=1000), root / "st")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(THRESHOLD_ENV, "0")
        build_artifacts(read_checkpoint(checkpoint, "tiny-external"), root / "artifacts", log=lambda m: None)
    return checkpoint, root / "artifacts"


def test_every_graph_keeps_its_weights_in_hashed_data_files(forced):
    _, out = forced
    manifest = json.loads((out / "manifest.json").read_text())
    for name, variant in manifest["variants"].items():
        data = variant["data_files"]
        assert data and set(data) == set(external_files(out / variant["file"])), name
        # The graph file itself holds no weight bigger than the size threshold: they are in the data files.
        graph = onnx.load(str(out / variant["file"]), load_external_data=False)
        assert max(len(t.raw_data) for t in graph.graph.initializer) <= 1024, name
    # The embeddings graph is the attention graph without its maps: it reads the attention graph's data file.
    assert manifest["variants"]["embeddings"]["data_files"] == manifest["variants"]["attention"]["data_files"]
    assert set(manifest["variants"]) == set(VARIANTS)
    load_manifest(out)  # every file's sha256, data files included


def test_graphs_with_external_data_encode_as_the_checkpoint_does(forced):
    from sentence_transformers import SentenceTransformer

    checkpoint, out = forced
    encoded = Engine.from_directory(out).encode(TEXTS)
    expected = SentenceTransformer(str(checkpoint), device="cpu").encode(TEXTS)
    assert np.abs(encoded.embeddings - expected).max() <= 1e-5


def test_a_server_serves_graphs_with_external_data(forced, tmp_path):
    _, out = forced
    with serving(ServerProcess(out, log_path=tmp_path / "server.log")) as server:
        reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": TEXTS, "model": "tiny-external"},
                           timeout=60)
    assert reply.status_code == 200, reply.text
    served = np.array([item["embedding"] for item in reply.json()["data"]], dtype=np.float32)
    assert np.abs(served - Engine.from_directory(out).encode(TEXTS).embeddings).max() <= 1e-6


def test_a_changed_data_file_is_refused(forced, tmp_path):
    import shutil

    _, out = forced
    copy = tmp_path / "artifacts"
    shutil.copytree(out, copy)
    data = json.loads((copy / "manifest.json").read_text())["variants"]["embeddings_fp16"]["data_files"]
    name = next(iter(data))
    with open(copy / name, "r+b") as f:  # one byte of one weight
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ArtifactError, match=rf"sha256 mismatch\): .*{name}"):
        load_manifest(copy)
    (copy / name).unlink()
    with pytest.raises(ArtifactError, match=rf"artifact file missing: .*{name}"):
        load_manifest(copy)


def test_save_streamed_gathers_tensors_and_inlines_attribute_tensors(tmp_path):
    """export/external_data.py save_streamed: initializers read from the data files they are in (converted where
    asked) into the graph's own data file, small ones and node attributes' tensors (the exporter writes a large
    Constant's value to a file of its own) into the graph, as onnx.load and save() leave them."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from attnserve.export import external_data

    source = tmp_path / "source"
    source.mkdir()
    big, small, constant = (np.arange(n, dtype=np.float32) for n in (4096, 4, 2048))
    weights = [numpy_helper.from_array(big, "big"), numpy_helper.from_array(small, "small")]
    value = numpy_helper.from_array(constant, "value")
    node = helper.make_node("Constant", [], ["c"], value=value)
    add = helper.make_node("Add", ["big", "c"], ["out"])
    graph = helper.make_graph([node, add], "g", [],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)], weights)
    model = helper.make_model(graph)
    # Every tensor in files of its own, as torch.onnx.export writes a graph past 2 GB.
    onnx.save_model(model, str(source / "g.onnx"), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0, convert_attribute=True)
    loaded = onnx.load(str(source / "g.onnx"), load_external_data=False)
    tensors = (*loaded.graph.initializer, loaded.graph.node[0].attribute[0].t)
    assert all(external_data.uses_external_data(t) for t in tensors)

    out = tmp_path / "out" / "g.onnx"
    out.parent.mkdir()
    double = {"big": lambda raw: (np.frombuffer(raw, np.float32) * 2).tobytes()}
    external_data.save_streamed(loaded, out, source, double)
    assert external_data.external_files(out) == ["g.onnx.data"]
    written = onnx.load(str(out))
    arrays = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}
    np.testing.assert_array_equal(arrays["big"], big * 2)
    np.testing.assert_array_equal(arrays["small"], small)
    np.testing.assert_array_equal(numpy_helper.to_array(written.graph.node[0].attribute[0].t), constant)
    bare = onnx.load(str(out), load_external_data=False)
    assert [external_data.uses_external_data(t) for t in bare.graph.initializer] == [True, False]
    assert not external_data.uses_external_data(bare.graph.node[0].attribute[0].t)
