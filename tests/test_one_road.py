"""One road (issue 46): every output a server's core gives and offline `encode` writes is assembled by one module
(engine/outputs.py), so the same input through both comes back byte for byte the same: dense embeddings (normalised
or not, cut to `dimensions`, each quantized type), SPLADE's sparse weights, ColBERT's vectors, bge-m3's three outputs
and late chunks, against the file `encode` writes. The server's own outputs (token embeddings, request-time pooling,
attention and its analyses) are checked against the engine's batch assembly that offline encoding runs
(engine/batch_outputs.py). Rerank scores and --long-inputs chunk's windows have no offline counterpart (test_core.py
and test_long_inputs.py hold them). An input's values depend on the padded batch it ran in, so each runs alone on both
roads: a request of one input to an otherwise idle server, and an offline run of one row a chunk (--chunk-rows 1).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from attnserve.engine.batch_outputs import assemble_batches
from attnserve.engine.engine import Engine
from attnserve.engine.output_options import SparseOptions
from attnserve.engine.outputs import EncodeReply
from attnserve.offline.encode import encode_file
from attnserve.offline.job import EncodeJob
from attnserve.offline.rows import LateChunks
from attnserve.server.requests import AttentionOptions, EncodeRequest, LateChunking

from .test_core import encode, running

TEXTS = ["The quick brown fox jumps over the lazy dog.", "a", "Ünïcödé: naïve café, façade, Straße."]
# Late chunking's text: longer than MiniLM's 256 tokens, so that it runs in windows, of several sentences.
LONG = " ".join(f"Sentence {i} tells of the number {i} and of what follows it." for i in range(40))


def server_replies(engine: Engine, texts: list[str], **asked) -> list[EncodeReply]:
    """Each text in a request of its own, one after the other: each a batch of its own."""
    async def main() -> list[EncodeReply]:
        async with running(("m", engine)) as core:
            return [await encode(core, EncodeRequest([text], **asked)) for text in texts]
    return asyncio.run(main())


def offline_table(engine: Engine, texts: list[str], path: Path, **job):
    """`attnserve encode` of the texts, a row a chunk: each a batch of its own."""
    source = path.with_suffix(".txt")
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    encode_file(engine, EncodeJob(source, path, progress=False, chunk_rows=1, **job))
    return pq.read_table(path)


def same(got: np.ndarray, want: np.ndarray) -> None:
    """Byte for byte: the same dtype, shape and bytes."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"max difference {np.abs(got.astype(float) - want).max()}"


def column(table, name: str, dtype) -> list[np.ndarray]:
    return [np.asarray(row, dtype=dtype) for row in table.column(name).to_pylist()]


def same_sparse(pairs: list[dict], sparse) -> None:
    assert sparse is not None
    same(np.array([p["index"] for p in pairs], np.int32), sparse.indices)
    same(np.array([p["value"] for p in pairs], np.float32), sparse.values)


@pytest.mark.parametrize("asked,job", [
    ({}, {}),  # the model's own: normalised
    ({"normalize": False}, {"normalize": False}),
    ({"dimensions": 128}, {"dimensions": 128}),
    ({"dimensions": 100, "normalize": False}, {"dimensions": 100, "normalize": False}),
    *(({"embedding_types": [kind]}, {"embedding_type": kind}) for kind in ("int8", "uint8", "binary", "ubinary")),
    ({"embedding_types": ["int8"], "dimensions": 64}, {"embedding_type": "int8", "dimensions": 64}),
], ids=["normalised", "not-normalised", "dimensions", "dimensions-not-normalised", "int8", "uint8", "binary",
        "ubinary", "int8-dimensions"])
def test_dense_embeddings_are_the_same_bytes_on_both_roads(engine, tmp_path, asked, job):
    replies = server_replies(engine, TEXTS, **asked)
    kind = job.get("embedding_type", "float")
    table = offline_table(engine, TEXTS, tmp_path / "out.parquet", **job)
    dtype = replies[0].typed[kind].dtype
    for reply, written in zip(replies, column(table, "embedding", dtype), strict=True):
        same(written, reply.typed[kind][0])


def test_late_chunks_are_the_same_bytes_on_both_roads(engine, tmp_path):
    [reply] = server_replies(engine, [LONG], late_chunking=LateChunking(chunker="sentences"), dimensions=128)
    table = offline_table(engine, [LONG], tmp_path / "out.parquet", late_chunking=LateChunks("sentences"),
                          dimensions=128)
    chunks = reply.inputs[0].chunks
    assert chunks is not None and reply.inputs[0].windows > 1 and len(chunks) == len(table) > 1
    assert table.column("start").to_pylist() == [c.start for c in chunks]
    for chunk, written in zip(chunks, column(table, "embedding", np.float32), strict=True):
        same(written, chunk.embedding)


@pytest.mark.parametrize("asked", [
    {"token_embeddings": True},
    {"pooling": "mean", "normalize": False},
    {"pooling": "cls", "dimensions": 64},
    {"attention": AttentionOptions()},  # the last layer's: the last-layer graph
    {"attention": AttentionOptions(layers=[0, -1], heads=[1], analyses=["rollout", "head_stats", "norms"])},
    {"attention": AttentionOptions(average_heads=True, analyses=["rollout"], weights=False)},
], ids=["token-embeddings", "mean-pooling", "cls-pooling-dimensions", "attention-last-layer", "attention-analyses",
        "rollout-alone"])
def test_what_the_server_alone_offers_is_the_engines_batch_assembly(engine, asked):
    for text, reply in zip(TEXTS, server_replies(engine, TEXTS, **asked), strict=True):
        options = reply.options
        inputs = engine.tokenizer.encode_texts([text])

        def run(items, options=options):
            return engine.run(items, attention=options.attention, last_layer=options.last_layer_only)

        done = assemble_batches(run, inputs, options, engine.heads, lambda lengths: [np.arange(len(lengths))])
        for kind, typed in reply.typed.items():
            same(done.typed[kind][0], typed[0])
        want = reply.inputs[0]
        if done.inputs is None:  # the model's own pooling asked: the sentence embeddings alone, the batch as one
            assert options.sentences_only and want.token_embeddings is None and want.attentions is None
            continue
        got = done.inputs[0]
        assert got.tokens == want.tokens
        for name in ("token_embeddings", "attentions"):
            if getattr(want, name) is not None:
                same(getattr(got, name), getattr(want, name))
        assert got.analyses.keys() == want.analyses.keys()
        for name in ("rollout", "norms", "norms_summed"):
            if name in want.analyses:
                same(got.analyses[name], want.analyses[name])  # type: ignore[arg-type]
        for name, stat in want.analyses.get("head_stats", {}).items():  # type: ignore[union-attr]
            same(got.analyses["head_stats"][name], stat)  # type: ignore[index]


# --- the models with outputs of their own: SPLADE, ColBERT, bge-m3 -------------------------------------------------


@pytest.fixture(scope="module")
def splade_engine(tmp_path_factory) -> Engine:
    from .test_splade import export, save_splade

    base = tmp_path_factory.mktemp("one_road_splade")
    return Engine.from_directory(export(save_splade(base / "ckpt"), base / "artifacts", ["embeddings"]))


@pytest.fixture(scope="module")
def colbert_engine(tmp_path_factory) -> Engine:
    from .test_colbert import CLASSIC, export, save_colbert

    base = tmp_path_factory.mktemp("one_road_colbert")
    return Engine.from_directory(export(save_colbert(base / "ckpt", CLASSIC), base / "artifacts", ["embeddings"]))


@pytest.fixture(scope="module")
def m3_engine(tmp_path_factory) -> Engine:
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    from .test_bge_m3 import save_bge_m3

    base = tmp_path_factory.mktemp("one_road_bge_m3")
    out = base / "artifacts"
    build_artifacts(read_checkpoint(save_bge_m3(base / "ckpt")), out, log=lambda m: None, variants=["embeddings"])
    return Engine.from_directory(out)


def test_splade_sparse_weights_are_the_same_bytes_on_both_roads(splade_engine, tmp_path):
    replies = server_replies(splade_engine, TEXTS, sparse=SparseOptions())
    table = offline_table(splade_engine, TEXTS, tmp_path / "out.parquet")
    for reply, pairs in zip(replies, table.column("sparse_embedding").to_pylist(), strict=True):
        same_sparse(pairs, reply.inputs[0].sparse)


@pytest.mark.parametrize("input_type", ["query", "document"])
def test_colbert_vectors_are_the_same_bytes_on_both_roads(colbert_engine, tmp_path, input_type):
    replies = server_replies(colbert_engine, TEXTS, multi_vector=input_type)
    table = offline_table(colbert_engine, TEXTS, tmp_path / "out.parquet", input_type=input_type)
    for reply, written in zip(replies, column(table, "multi_vector", np.float32), strict=True):
        assert reply.inputs[0].multi_vector is not None
        same(written, reply.inputs[0].multi_vector)


def test_bge_m3_three_outputs_are_the_same_bytes_on_both_roads(m3_engine, tmp_path):
    replies = server_replies(m3_engine, TEXTS, sparse=SparseOptions(), multi_vector="document")
    table = offline_table(m3_engine, TEXTS, tmp_path / "out.parquet",
                          outputs=("embedding", "sparse_embedding", "multi_vector"))
    dense, vectors = column(table, "embedding", np.float32), column(table, "multi_vector", np.float32)
    for i, reply in enumerate(replies):
        assert reply.inputs[0].multi_vector is not None
        same(dense[i], reply.embeddings[0])
        same(vectors[i], reply.inputs[0].multi_vector)
        same_sparse(table.column("sparse_embedding")[i].as_py(), reply.inputs[0].sparse)
