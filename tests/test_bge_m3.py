"""bge-m3: dense, sparse and ColBERT outputs from one pass, against FlagEmbedding's M3Embedder on a random-weight XLM-R
with bge-m3's head files, served on /embed, /embed_sparse, /embed_multi and gRPC (all three in one request), and
written as three columns by one offline run (locally, through a server and on Ray).

FlagEmbedding 1.4.2's package __init__ imports a reranker module written for transformers 4 (gone in 5); its M3
embedder runs on 5, so flag_m3 imports that module with the packages' __init__ files left out, its code unchanged
(tests/flag_embedding.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from attnserve.config import ClientConfig, EngineConfig
from attnserve.engine.engine import Engine, embeddings_graph
from attnserve.engine.manifest import load_manifest
from attnserve.offline.encode import encode_file
from attnserve.offline.job import EncodeJob
from attnserve.offline.remote import encode_file_remote
from attnserve.v1 import encoder_pb2 as pb
from tests.checkpoints import save_sentence_transformer, save_tiny_family
from tests.flag_embedding import flag_module
from tests.offline_helpers import text_file
from tests.output_kinds import export, grpc_refusal
from tests.serving import ServerProcess, serving

TEXTS = ["The Eiffel Tower stands in Paris.", "a b a b a", "Berlin ist die Hauptstadt von Deutschland.",
         " ".join(["long"] * 80)]  # past max_seq_length (64): cut, as FlagEmbedding cuts it
MAX = 64
COLUMNS = ("embedding", "sparse_embedding", "multi_vector")


def flag_m3():
    """FlagEmbedding's M3Embedder, its packages' __init__ files left out (the module docstring says why)."""
    return flag_module("FlagEmbedding.inference.embedder.encoder_only.m3").M3Embedder


def save_bge_m3(directory: Path, seed: int = 0) -> Path:
    """A 2-layer, hidden-32 XLM-R (random weights, a real Unigram tokenizer) under Transformer -> Pooling(cls) ->
    Normalize, as bge-m3's sentence-transformers pipeline is, with bge-m3's heads beside it: colbert_linear.pt, a
    Linear(32, 32), and sparse_linear.pt, a Linear(32, 1), saved as FlagEmbedding saves them."""
    import torch

    base = save_tiny_family(directory.parent / f"{directory.name}.xlmr", "xlm-roberta", seed=seed)
    save_sentence_transformer(base, directory, pooling="cls", normalize=True, max_seq_length=MAX)
    torch.manual_seed(seed + 1)
    torch.save(torch.nn.Linear(32, 32).state_dict(), directory / "colbert_linear.pt")
    sparse = torch.nn.Linear(32, 1)
    torch.nn.init.normal_(sparse.weight, std=0.5)  # weights above 0 for about half the tokens
    torch.save(sparse.state_dict(), directory / "sparse_linear.pt")
    return directory


@pytest.fixture(scope="module")
def m3_checkpoint(tmp_path_factory):
    return save_bge_m3(tmp_path_factory.mktemp("bge_m3") / "checkpoint")


@pytest.fixture(scope="module")
def reference(m3_checkpoint):
    """FlagEmbedding's three outputs of TEXTS, in fp32 on the CPU."""
    model = flag_m3()(str(m3_checkpoint), use_fp16=False, devices="cpu", normalize_embeddings=True)
    out = model.encode(TEXTS, batch_size=4, max_length=MAX, return_dense=True, return_sparse=True,
                       return_colbert_vecs=True)
    return out["dense_vecs"], out["lexical_weights"], out["colbert_vecs"]


@pytest.fixture(scope="module")
def m3_artifacts(m3_checkpoint, tmp_path_factory) -> Path:
    return export(m3_checkpoint, tmp_path_factory.mktemp("bge_m3_artifacts") / "artifacts")


@pytest.fixture(scope="module")
def served(m3_artifacts, tmp_path_factory):
    with serving(ServerProcess(m3_artifacts, log_path=tmp_path_factory.mktemp("bge_m3") / "server.log")) as process:
        yield process


def assert_same_sparse(got, expected: dict) -> None:
    """got: (index, value) pairs as the column and /embed_sparse give them, or a dict as FlagEmbedding's."""
    got = got if isinstance(got, dict) else {str(x["index"]): x["value"] for x in got}
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(float(value), abs=2e-5), key


def test_the_http_routes_give_flag_embeddings_three_outputs(served, reference):
    dense, lexical, colbert = reference
    answers = [httpx.post(f"{served.http_url}/{route}", json={"inputs": TEXTS}, timeout=60)
               for route in ("embed", "embed_sparse", "embed_multi")]
    assert all(answer.status_code == 200 for answer in answers), [answer.text for answer in answers]
    np.testing.assert_allclose(np.asarray(answers[0].json()), dense, atol=2e-5)
    for got, expected in zip(answers[1].json(), lexical, strict=True):
        assert_same_sparse(got, expected)
    for got, expected in zip(answers[2].json(), colbert, strict=True):
        np.testing.assert_allclose(np.asarray(got), expected, atol=2e-5)  # every token's but CLS, eos included
    info = httpx.get(f"{served.http_url}/info", timeout=10).json()
    assert info["outputs"] == ["embed", "embed_sparse", "embed_multi", "attention", "similarity", "late_chunking"]


def test_one_grpc_request_gives_all_three_from_one_pass(served, reference):
    dense, lexical, colbert = reference
    with served.channel() as channel:
        stub = served.stub(channel)
        reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in TEXTS], sparse=pb.SparseOptions(),
                                           multi_vector=pb.MultiVectorOptions()), timeout=60)
        for e, d, w, c in zip(reply.embeddings, dense, lexical, colbert, strict=True):
            np.testing.assert_allclose(np.frombuffer(e.sentence_embedding.data, "<f4"), d, atol=2e-5)
            assert_same_sparse({str(int(i)): float(v) for i, v in zip(e.sparse_embedding.indices,
                                                                      e.sparse_embedding.values, strict=True)}, w)
            vectors = np.frombuffer(e.multi_vector.data, "<f4").reshape(tuple(e.multi_vector.shape))
            np.testing.assert_allclose(vectors, c, atol=2e-5)
        assert [e.truncated for e in reply.embeddings] == [False, False, False, True]
        # top_k keeps the largest weights, as for a SPLADE model
        top = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=TEXTS[0])], sparse=pb.SparseOptions(top_k=2)),
                         timeout=60).embeddings[0].sparse_embedding
        best = sorted(lexical[0].items(), key=lambda kv: -kv[1])[:2]
        assert sorted(top.indices) == sorted(int(k) for k, _ in best)
        assert "dimensions does not apply" in grpc_refusal(stub.Embed, pb.EmbedRequest(
            inputs=[pb.Input(text="a")], multi_vector=pb.MultiVectorOptions(), dimensions=8), timeout=60)


def test_one_offline_run_writes_all_three_columns_locally_through_a_server_and_on_ray(m3_artifacts, served,
                                                                                      reference, tmp_path):
    """A model without the heads refuses --outputs: tests/test_encode.py."""
    dense, lexical, colbert = reference
    src = text_file(tmp_path / "texts.txt", TEXTS)
    local, remote = tmp_path / "local.parquet", tmp_path / "remote.parquet"
    # the graph Ray's actors run (the default one), not the one a calibration here may time faster: same bits
    graph = embeddings_graph(load_manifest(m3_artifacts), EngineConfig())[2].name
    engine = Engine.from_directory(m3_artifacts, EngineConfig(graph=graph))
    encode_file(engine, EncodeJob(src, local, progress=False, outputs=COLUMNS))
    encode_file_remote(EncodeJob(src, remote, progress=False, outputs=COLUMNS), ClientConfig(target=served.target))
    for path in (local, remote):
        table = pq.read_table(path)
        assert table.column_names == ["id", *COLUMNS, "num_tokens", "truncated"]
        np.testing.assert_allclose(np.stack(table.column("embedding").to_pylist()), dense, atol=2e-5)
        for got, expected in zip(table.column("sparse_embedding").to_pylist(), lexical, strict=True):
            assert_same_sparse(got, expected)
        for got, expected in zip(table.column("multi_vector").to_pylist(), colbert, strict=True):
            np.testing.assert_allclose(np.asarray(got), expected, atol=2e-5)
        assert table.column("truncated").to_pylist() == [False, False, False, True]
    only = tmp_path / "sparse.parquet"  # one column alone
    encode_file(engine, EncodeJob(src, only, progress=False, outputs=("sparse_embedding",)))
    assert pq.read_table(only).column_names == ["id", "sparse_embedding", "num_tokens", "truncated"]
    pytest.importorskip("ray", reason="the ray extra is not installed")  # on Ray: the local file, byte for byte
    import ray

    from attnserve.offline.ray_encode import encode_file_ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        encode_file_ray(EncodeJob(src, tmp_path / "ray.parquet", progress=False, outputs=COLUMNS), EngineConfig(),
                        m3_artifacts)
    finally:
        ray.shutdown()
    assert pq.read_table(tmp_path / "ray.parquet").equals(pq.read_table(local))
