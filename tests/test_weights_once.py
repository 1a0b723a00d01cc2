"""Weights stored once (export/external_data.py): every graph reads its weights from data files in the artifact
directory, the graphs that hold the same tensor read it from the same file, and a graph built later stores only
the tensors it changed. Sizes against the checkpoint's weights, the hash check that catches a changed data file,
and save_streamed, which every step's graph is written with."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.errors import ArtifactError
from attnserve.export.artifacts import add_variants, all_variants, build_artifacts
from attnserve.export.external_data import ALIGN_ABOVE, ALIGNMENT, SharedWeights, external_files
from attnserve.model.checkpoint import read_checkpoint

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "x"]


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def grown(tmp_path_factory, checkpoint, artifacts) -> tuple[Path, Path, int]:
    """(the first export's directory as a run leaves it, a directory with every variant, the checkpoint's weights'
    bytes), all-MiniLM-L6-v2. The second is the run's export of every variant (tests/conftest.py `artifacts`), copied
    so that what a test writes beside its files stays here."""
    root = tmp_path_factory.mktemp("weights_once")
    first = root / "first"
    build_artifacts(checkpoint, first, log=lambda m: None, variants=["embeddings"])
    grown = root / "grown"
    shutil.copytree(artifacts, grown)
    return first, grown, (checkpoint.directory / "model.safetensors").stat().st_size


def test_a_variant_added_to_the_first_export_reads_the_weights_it_shares_from_its_file(grown, tmp_path):
    """add_variants on the directory a run left: the fused graph built later reads the weights it did not change
    from weights.fp32.data and writes only its packed Q, K, V."""
    first, _, weights = grown
    added = tmp_path / "added"
    shutil.copytree(first, added)
    manifest = add_variants(added, ["embeddings_fused"], log=lambda m: None)
    assert "weights.fp32.data" in manifest.variants["embeddings_fused"].data_files
    assert (added / "embeddings_fused.onnx.data").stat().st_size < 0.2 * weights
    assert (added / "weights.fp32.data").stat().st_mtime_ns == (first / "weights.fp32.data").stat().st_mtime_ns


def test_the_first_export_is_the_checkpoints_size(grown):
    first, _, weights = grown
    manifest = load_manifest(first)
    assert set(manifest.variants) == {"embeddings"}
    assert sorted(p.name for p in first.iterdir()) == ["embeddings.onnx", "manifest.json", "reference.npz",
                                                      "tokenizer.json", "weights.fp32.data"]
    assert _bytes(first) <= 1.3 * weights, _bytes(first) / weights


def test_every_graph_reads_the_weights_it_shares_from_one_file(grown):
    _, directory, weights = grown
    manifest = load_manifest(directory)  # every file's sha256, data files included
    assert set(manifest.variants) == set(all_variants(read_checkpoint(
        Path(manifest.source["checkpoint"]), manifest.model)))
    # The fp32 graphs read weights.fp32.data; what a graph built later changed is in a file of its own, and the
    # attention graphs add at most the output projections they read untransposed (value norms: W_O as it is).
    for name in ("embeddings", "attention", "attention_last", "embeddings_fused", "embeddings_int8"):
        assert "weights.fp32.data" in manifest.variants[name].data_files, name
    fused_own = (directory / "embeddings_fused.onnx.data").stat().st_size  # the packed Q, K, V of every layer
    assert fused_own < 0.2 * weights
    # A tensor the int8 graph kept in fp32 (the word embeddings) is read from weights.fp32.data, not copied.
    int8 = onnx.load(str(directory / "embeddings_int8.onnx"), load_external_data=False)
    kept = next(t for t in int8.graph.initializer if t.name == "encoder.embeddings.word.weight")
    assert ExternalDataInfo(kept).location == "weights.fp32.data"
    # `export --all`: at most 2.5x the checkpoint's weights, where every graph held its own copy before.
    assert _bytes(directory) <= 2.5 * weights, _bytes(directory) / weights


def test_large_tensors_start_aligned_so_runtimes_can_map_them(grown):
    _, directory, _ = grown
    model = onnx.load(str(directory / "embeddings.onnx"), load_external_data=False)
    large = [ExternalDataInfo(t) for t in model.graph.initializer
             if uses_external_data(t) and ExternalDataInfo(t).length >= ALIGN_ABOVE]
    assert large and all(info.offset % ALIGNMENT == 0 for info in large)


def test_a_graph_built_later_stores_only_what_it_changed(tmp_path, grown):
    """SharedWeights finds a tensor by its bytes: saving the fused graph again next to the others writes nothing
    new."""
    _, directory, _ = grown
    shared = SharedWeights.of_graphs([directory / "embeddings.onnx", directory / "embeddings_fused.onnx"])
    model = onnx.load(str(directory / "embeddings_fused.onnx"), load_external_data=False)
    copy = directory / "copy_of_fused.onnx"
    try:
        from attnserve.export.external_data import data_file, save_streamed

        save_streamed(model, copy, directory, shared=shared)
        assert not data_file(copy).exists()
        assert set(external_files(copy)) == {"weights.fp32.data", "embeddings_fused.onnx.data"}
    finally:
        copy.unlink(missing_ok=True)


def test_graphs_that_share_weights_encode_as_the_checkpoint_does(grown, checkpoint):
    from sentence_transformers import SentenceTransformer

    _, directory, _ = grown
    expected = SentenceTransformer(str(checkpoint.directory), device="cpu").encode(TEXTS)
    for graph in ("embeddings", "embeddings_fused"):
        from attnserve.config import EngineConfig

        encoded = Engine.from_directory(directory, EngineConfig(graph=graph), build=False).encode(TEXTS)
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, graph


def test_a_changed_data_file_is_refused(grown, tmp_path):
    _, directory, _ = grown
    copy = tmp_path / "artifacts"
    shutil.copytree(directory, copy)
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
    assert all(uses_external_data(t) for t in tensors)

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
    assert [uses_external_data(t) for t in bare.graph.initializer] == [True, False]
    assert not uses_external_data(bare.graph.node[0].attribute[0].t)


def test_a_mapped_data_files_pages_are_handed_back_and_read_again_alike(grown):
    """engine/mapped_pages.py: a runtime that packed a graph's weights hands back the data file's mapped pages (the
    OpenVINO session does, tests/test_openvino.py); they leave the process's resident set and read back the same."""
    import mmap

    from attnserve.engine import mapped_pages

    if mapped_pages._MADVISE is None:
        pytest.skip("madvise: Linux only")
    _, directory, _ = grown
    data = directory / "weights.fp32.data"
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        first = hashlib.sha256(mapped).digest()  # every page read: resident
        assert mapped_pages.mapped_ranges([data]) and resident_bytes(data) >= 0.9 * data.stat().st_size
        assert mapped_pages.page_out([data]) >= data.stat().st_size
        assert resident_bytes(data) <= 0.1 * data.stat().st_size
        assert hashlib.sha256(mapped).digest() == first
    assert mapped_pages.page_out([data]) == 0  # unmapped: nothing to hand back


def resident_bytes(file: Path) -> int:
    """The bytes of file this process has mapped and resident (/proc/self/smaps: Rss of each of its mappings)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line: range perms offset dev inode [path]
            inside = len(fields) == 6 and fields[5] == str(file.resolve())
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total
