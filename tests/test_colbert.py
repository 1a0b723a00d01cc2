"""ColBERT (model/colbert.py, engine/multi_vector.py): sentence-transformers' MultiVectorEncoder pipelines on
random-weight BERTs, exported and served, against its encode_query / encode_document (within 1e-4) on every door:
/embed_multi, gRPC's multi_vector, KServe v2 through tritonclient, MaxSim reranking, and `encode`'s column."""

from __future__ import annotations

import base64
import json
import shutil
import string
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import requests
import tritonclient.http as triton

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import read_checkpoint
from attnserve.v1 import encoder_pb2 as pb
from tests import output_kinds
from tests.conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from tests.offline_helpers import encoded, text_file
from tests.output_kinds import export, grpc_refusal
from tests.serving import ServerProcess, serving
from tests.test_http_openapi import MULTI_VECTOR_CALLS
from tests.test_kserve import text_input

QUERIES = ["What is the capital of France?", "a", "Which encoders score each token of a query on its own? " * 3,
           "¿Dónde está la biblioteca?"]
DOCUMENTS = ["Paris is the capital of France.", "Hello, world!", "!!! ... ???", "a",
             *[t for t in VARIED_TEXTS if len(t) < 400][:4], "Encoders " * 200]
# The classic ColBERT settings: fixed query expansion with [MASK], not attended; punctuation skipped in documents.
CLASSIC = {"query_length": 16, "document_length": 64, "expansion": {"strategy": "fixed", "length": 16},
           "skiplist": list(string.punctuation), "skiplist_tasks": None, "dense": [(8, False, "Identity")],
           "normalize": True, "similarity": None}
# The other branches: "min" expansion with its own token, attended; the skip-list on both sides; two Dense layers
# (with a bias and Tanh); no Normalize; MeanMaxSim; documents at max_seq_length.
VARIANT = {"query_length": 24, "document_length": None,
           "expansion": {"strategy": "min", "length": 12, "attend": True, "token": "[unused1]"},
           "skiplist": [".", ",", "?", "!", "not-a-token"], "skiplist_tasks": ["query", "document"],
           "dense": [(16, True, "Tanh"), (6, False, "Identity")], "normalize": False, "similarity": "meanmaxsim"}


def save_colbert(directory: Path, settings: dict, seed: int = 0) -> Path:
    """tiny_bert_config's BERT under MultiVectorEncoder's Transformer -> Dense* -> MultiVectorMask -> Normalize?,
    saved by sentence-transformers with "[Q] " and "[D] " prompts."""
    import torch
    import transformers
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    tokenizer, config = output_kinds.tiny_bert_config()
    torch.manual_seed(seed)
    staging = directory.parent / f"{directory.name}.bert"
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    modules = [Transformer(str(staging), max_seq_length=128, query_length=settings["query_length"],
                           document_length=settings["document_length"], query_expansion=settings["expansion"])]
    size = 32
    for out, bias, activation in settings["dense"]:
        modules.append(Dense(size, out, bias=bias, activation_function=getattr(torch.nn, activation)(),
                             module_input_name="token_embeddings", module_output_name="token_embeddings"))
        size = out
    modules.append(MultiVectorMask(skiplist_words=settings["skiplist"], skiplist_tasks=settings["skiplist_tasks"]))
    if settings["normalize"]:
        modules.append(Normalize(module_input_name="token_embeddings"))
    MultiVectorEncoder(modules=modules, prompts={"query": "[Q] ", "document": "[D] "}, device="cpu",
                       similarity_fn_name=settings["similarity"]).save(str(directory))
    return directory


def reference(checkpoint: Path, texts: list[str], input_type: str) -> list[np.ndarray]:
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(checkpoint), device="cpu")
    encode = model.encode_query if input_type == "query" else model.encode_document
    return encode(texts, convert_to_numpy=True)


def check_vectors(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4)


def maxsim_here(query: np.ndarray, documents: list[np.ndarray], mean: bool = False) -> np.ndarray:
    """MaxSim written out: for each query vector its best dot product with the document's vectors, summed."""
    scores = np.array([np.einsum("qd,td->qt", query, doc).max(axis=1).sum() for doc in documents])
    return scores / len(query) if mean else scores


@pytest.fixture(scope="module")
def colbert(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("colbert")
    checkpoint = save_colbert(base / "ckpt", CLASSIC)
    return checkpoint, export(checkpoint, base / "artifacts")


@pytest.fixture(scope="module")
def other_settings(tmp_path_factory) -> tuple[Path, Path]:
    """A model of VARIANT's settings, its fp32 graph alone: the classic model's export builds them all."""
    base = tmp_path_factory.mktemp("colbert_variant")
    checkpoint = save_colbert(base / "ckpt", VARIANT, seed=1)
    return checkpoint, export(checkpoint, base / "artifacts", ["embeddings"])


@pytest.fixture(scope="module")
def colbert_server(colbert, other_settings, tmp_path_factory):
    """The classic model (the default) and the other settings' ("variant") in one server."""
    process = ServerProcess(None, "--model", f"classic={colbert[1]}", "--model", f"variant={other_settings[1]}",
                            log_path=tmp_path_factory.mktemp("colbert") / "server.log")
    with serving(process):
        yield process


def engine_vectors(engine: Engine, texts: list[str], input_type: str) -> list[np.ndarray]:
    assert engine.multi_vector is not None
    return list(engine.encode_multi_vector(engine.multi_vector.encode(texts, input_type), input_type).embeddings)


@pytest.mark.parametrize("model", ["colbert", "other_settings"])
def test_engine_equals_multi_vector_encoder(request, model):
    checkpoint, artifacts = request.getfixturevalue(model)
    engine = Engine.from_directory(artifacts, EngineConfig())
    queries = QUERIES if model == "colbert" else [*QUERIES, "word " * 40]  # past the floor, and past query_length
    got = {kind: engine_vectors(engine, texts, kind) for kind, texts in (("query", queries), ("document", DOCUMENTS))}
    check_vectors(got["query"], reference(checkpoint, queries, "query"))
    check_vectors(got["document"], reference(checkpoint, DOCUMENTS, "document"))
    if model == "colbert":  # every query is exactly the expansion's 16 tokens: [MASK]s fill the short ones
        assert {len(v) for v in got["query"]} == {16}
        assert len(got["document"][2]) == 3  # "!!! ... ???": [CLS], "[", "d", "]" and [SEP] less the punctuation
    else:
        manifest = engine.manifest.multi_vector
        assert manifest is not None and manifest["similarity"] == "meanmaxsim" and manifest["document_length"] == 128


@pytest.mark.parametrize("folder, key, value, words", [
    ("2_MultiVectorMask", "keep_only_token_ids", [5], "keep_only_token_ids"),
    ("2_MultiVectorMask", "skiplist_tasks", ["image"], "skiplist_tasks"),
    ("1_Dense", "module_input_name", "sentence_embedding", "only token_embeddings"),
])
def test_pipelines_the_export_cannot_reproduce_are_refused_in_one_line(colbert, tmp_path, folder, key, value, words):
    copy = shutil.copytree(colbert[0], tmp_path / "copy")
    config = json.loads((copy / folder / "config.json").read_text())
    (copy / folder / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(CheckpointError, match=words):
        read_checkpoint(copy)


def test_embed_multi_float_and_base64(colbert, colbert_server):
    url = f"{colbert_server.http_url}/embed_multi"
    for input_type, texts in (("query", QUERIES), ("document", DOCUMENTS)):
        want = reference(colbert[0], texts, input_type)
        reply = requests.post(url, json={"inputs": texts, "input_type": input_type}, timeout=60)
        assert reply.status_code == 200, reply.text
        check_vectors([np.array(v, np.float32).reshape(-1, 8) for v in reply.json()], want)
        reply = requests.post(url, json={"inputs": texts, "input_type": input_type, "encoding_format": "base64"},
                              timeout=60)
        assert reply.status_code == 200, reply.text
        check_vectors([np.frombuffer(base64.b64decode(v), "<f4").reshape(-1, 8) for v in reply.json()], want)
    one = requests.post(url, json={"inputs": "a"}, timeout=60)
    check_vectors([np.array(one.json()[0], np.float32)], reference(colbert[0], ["a"], "document"))
    output_kinds.assert_answers_as_openapi_says(colbert_server, MULTI_VECTOR_CALLS)


def test_grpc_multi_vector_tensors_and_model_info(colbert, colbert_server):
    with colbert_server.channel() as channel:
        stub = colbert_server.stub(channel)
        for input_type, texts in ((pb.INPUT_TYPE_QUERY, QUERIES), (pb.INPUT_TYPE_DOCUMENT, DOCUMENTS)):
            reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts],
                                               multi_vector=pb.MultiVectorOptions(input_type=input_type)), timeout=60)
            got = []
            for e in reply.embeddings:
                assert not e.HasField("sentence_embedding") and e.multi_vector.dtype == pb.FLOAT32
                got.append(np.frombuffer(e.multi_vector.data, "<f4").reshape(tuple(e.multi_vector.shape)))
            check_vectors(got, reference(colbert[0], texts, "query" if input_type == pb.INPUT_TYPE_QUERY else
                                         "document"))
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60)
        assert list(info.outputs) == ["embed_multi", "rerank"] and info.embedding_size == 8
        assert info.pooling == "multi_vector"
        assert "multi-vector (ColBERT) model" in grpc_refusal(stub.Embed, pb.EmbedRequest(inputs=[pb.Input(text="x")]),
                                                              timeout=60)


def test_kserve_v2_token_embeddings_through_tritonclient(colbert, colbert_server):
    name = requests.get(f"{colbert_server.http_url}/info", timeout=60).json()["model_id"]
    client = triton.InferenceServerClient(colbert_server.http_url.removeprefix("http://"), network_timeout=60)
    try:
        assert [o["name"] for o in client.get_model_metadata(name)["outputs"]] == ["token_embeddings", "num_vectors"]
        for input_type, texts, binary in (("query", QUERIES, True), ("document", DOCUMENTS, False)):
            reply = client.infer(name, [text_input(texts, binary)], parameters={"input_type": input_type}, outputs=[
                triton.InferRequestedOutput(o, binary_data=binary) for o in ("token_embeddings", "num_vectors")])
            padded, counts = reply.as_numpy("token_embeddings"), reply.as_numpy("num_vectors")
            assert padded.shape == (len(texts), counts.max(), 8)
            assert not padded[np.arange(padded.shape[1])[None, :] >= counts[:, None]].any()  # zeros past each count
            check_vectors([row[:n] for row, n in zip(padded, counts, strict=True)],
                          reference(colbert[0], texts, input_type))
    finally:
        client.close()


def test_rerank_ranks_by_maxsim_on_every_door(colbert, colbert_server):
    query, documents = QUERIES[0], DOCUMENTS
    want = maxsim_here(reference(colbert[0], [query], "query")[0], reference(colbert[0], documents, "document"))
    order = np.argsort(-want, kind="stable")
    cohere = requests.post(f"{colbert_server.http_url}/v1/rerank",
                           json={"model": "", "query": query, "documents": documents}, timeout=60).json()
    tei = requests.post(f"{colbert_server.http_url}/rerank", json={"query": query, "texts": documents,
                                                                    "return_text": True}, timeout=60).json()
    with colbert_server.channel() as channel:
        grpc_reply = colbert_server.stub(channel).Rerank(pb.RerankRequest(query=query, texts=documents, top_n=3),
                                                         timeout=60)
    for results, score_key in ((cohere["results"], "relevance_score"), (tei, "score")):
        assert [r["index"] for r in results] == order.tolist()
        np.testing.assert_allclose([r[score_key] for r in results], want[order], rtol=1e-5, atol=1e-4)
    assert [r["text"] for r in tei] == [documents[i] for i in order]
    assert [r.index for r in grpc_reply.results] == order[:3].tolist()
    np.testing.assert_allclose([r.score for r in grpc_reply.results], want[order[:3]], rtol=1e-5, atol=1e-4)


def test_meanmaxsim_reranking_equals_sentence_transformers_similarity(other_settings, colbert_server):
    from sentence_transformers import MultiVectorEncoder

    checkpoint, _ = other_settings
    results = requests.post(f"{colbert_server.http_url}/v1/rerank", json={
        "model": "variant", "query": QUERIES[2], "documents": DOCUMENTS}, timeout=60).json()["results"]
    model = MultiVectorEncoder(str(checkpoint), device="cpu")
    want = model.similarity(model.encode_query([QUERIES[2]]), model.encode_document(DOCUMENTS))[0].numpy()
    here = maxsim_here(reference(checkpoint, [QUERIES[2]], "query")[0], reference(checkpoint, DOCUMENTS, "document"),
                       mean=True)
    np.testing.assert_allclose(want, here, rtol=1e-5, atol=1e-5)
    got = np.zeros(len(DOCUMENTS))
    got[[r["index"] for r in results]] = [r["relevance_score"] for r in results]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_requests_a_colbert_model_cannot_answer_are_refused_in_words(colbert_server, server):
    url = colbert_server.http_url
    embed = requests.post(f"{url}/embed", json={"inputs": "x"}, timeout=60)
    assert embed.status_code == 400 and "/embed_multi" in embed.json()["error"]
    for body, field in (({"inputs": "x", "input_type": "passage"}, "input_type"), ({"inputs": ["x", ""]}, "input 1"),
                        ({"inputs": []}, "no inputs")):
        reply = requests.post(f"{url}/embed_multi", json=body, timeout=60)
        assert reply.status_code == 400 and field in reply.json()["error"], reply.text
    dense = requests.post(f"{server.http_url}/embed_multi", json={"inputs": "x"}, timeout=60)
    assert dense.status_code == 400 and "not a multi-vector (ColBERT) model" in dense.json()["error"]
    info = requests.get(f"{url}/info", timeout=60).json()
    assert info["outputs"] == ["embed_multi", "rerank"] and info["embedding_types"] == ["float"]


def read_vectors(path: Path) -> list[np.ndarray]:
    return [np.array(row, np.float32).reshape(-1, 8) for row in pq.read_table(path).column("multi_vector").to_pylist()]


def test_offline_multi_vector_column_round_trips_and_resumes_locally_and_through_a_server(colbert, colbert_server,
                                                                                          tmp_path):
    """An input type for a dense model: tests/test_encode.py."""
    checkpoint, artifacts = colbert
    texts, source = [*DOCUMENTS, *QUERIES], tmp_path / "in.txt"
    out = output_kinds.stopped_then_resumed(source, texts, "--artifacts", artifacts)
    table = pq.read_table(out)
    assert str(table.schema.field("multi_vector").type) == "list<element: fixed_size_list<element: float>[8]>"
    check_vectors(read_vectors(out), reference(checkpoint, texts, "document"))
    encoded(source, tmp_path / "queries.parquet", "--artifacts", artifacts, "--input-type", "query")
    check_vectors(read_vectors(tmp_path / "queries.parquet"), reference(checkpoint, texts, "query"))
    assert_one_line_error(run_cli("encode", source, "-o", tmp_path / "x.parquet", "--artifacts", artifacts,
                                  "--precision-out", "int8"), "--precision-out does not apply")
    encoded(text_file(tmp_path / "q.txt", QUERIES), tmp_path / "served.parquet", "--server", colbert_server.target,
            "--input-type", "query")
    check_vectors(read_vectors(tmp_path / "served.parquet"), reference(checkpoint, QUERIES, "query"))
