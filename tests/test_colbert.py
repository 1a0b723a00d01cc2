"""ColBERT (model/colbert.py, engine/multi_vector.py): sentence-transformers' MultiVectorEncoder pipelines exported and
served, against MultiVectorEncoder.encode_query / encode_document over the same folder (within 1e-4), on random-weight
BERTs saved by sentence-transformers itself: POST /embed_multi, gRPC's multi_vector, KServe v2's token_embeddings
through tritonclient, MaxSim reranking on every rerank door (against MaxSim computed here), and `attnserve encode`'s
multi_vector column."""

from __future__ import annotations

import base64
import string
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
    """A 2-layer, hidden-32 BERT (MiniLM's tokenizer) under MultiVectorEncoder's Transformer -> Dense* ->
    MultiVectorMask -> Normalize?, saved by sentence-transformers with "[Q] " and "[D] " prompts."""
    import torch
    import transformers
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_checkpoint_dir()))
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                                     initializer_range=0.2)
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


def export(checkpoint: Path, out: Path, variants: list[str] | None = None) -> Path:
    """Every variant (None), as `attnserve export --all`, or those named."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    build_artifacts(read_checkpoint(checkpoint), out, log=lambda m: None, variants=variants)
    return out


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
def colbert_server(colbert, tmp_path_factory):
    with serving(ServerProcess(colbert[1], log_path=tmp_path_factory.mktemp("colbert") / "server.log")) as server:
        yield server


def engine_vectors(engine: Engine, texts: list[str], input_type: str) -> list[np.ndarray]:
    assert engine.multi_vector is not None
    return list(engine.encode_multi_vector(engine.multi_vector.encode(texts, input_type), input_type).embeddings)


@pytest.mark.parametrize("input_type", ["query", "document"])
def test_engine_equals_multi_vector_encoder(colbert, input_type):
    checkpoint, artifacts = colbert
    engine = Engine.from_directory(artifacts, EngineConfig())
    texts = QUERIES if input_type == "query" else DOCUMENTS
    got = engine_vectors(engine, texts, input_type)
    check_vectors(got, reference(checkpoint, texts, input_type))
    if input_type == "query":  # every query is exactly the expansion's 16 tokens: [MASK]s fill the short ones
        assert {len(v) for v in got} == {16}
    else:  # "!!! ... ???": [CLS], "[", "d", "]" and [SEP] less the skipped punctuation
        assert len(got[2]) == 3


@pytest.fixture(scope="module")
def other_settings(tmp_path_factory) -> tuple[Path, Path]:
    """A model of the other settings (VARIANT: meanmaxsim among them), its fp32 graph alone: the module's export of
    the classic settings builds them all."""
    base = tmp_path_factory.mktemp("colbert_variant")
    checkpoint = save_colbert(base / "ckpt", VARIANT, seed=1)
    return checkpoint, export(checkpoint, base / "artifacts", ["embeddings"])


def test_the_other_settings_equal_multi_vector_encoder(other_settings):
    checkpoint, artifacts = other_settings
    engine = Engine.from_directory(artifacts, EngineConfig())
    manifest = engine.manifest.multi_vector
    assert manifest is not None and manifest["similarity"] == "meanmaxsim" and manifest["document_length"] == 128
    queries = [*QUERIES, "word " * 40]  # longer than the floor, and longer than query_length
    for input_type, texts in (("query", queries), ("document", DOCUMENTS)):
        check_vectors(engine_vectors(engine, texts, input_type), reference(checkpoint, texts, input_type))


def test_pipelines_the_export_cannot_reproduce_are_refused_in_one_line(colbert, tmp_path):
    import json
    import shutil

    from attnserve.errors import CheckpointError
    from attnserve.model.checkpoint import read_checkpoint

    checkpoint, _ = colbert
    for folder, key, value, words in (("2_MultiVectorMask", "keep_only_token_ids", [5], "keep_only_token_ids"),
                                      ("2_MultiVectorMask", "skiplist_tasks", ["image"], "skiplist_tasks"),
                                      ("1_Dense", "module_input_name", "sentence_embedding", "only token_embeddings")):
        copy = tmp_path / f"{folder}-{key}"
        shutil.copytree(checkpoint, copy)
        config = json.loads((copy / folder / "config.json").read_text())
        (copy / folder / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(CheckpointError, match=words):
            read_checkpoint(copy)


def test_embed_multi_float_and_base64(colbert, colbert_server):
    checkpoint, _ = colbert
    for input_type, texts in (("query", QUERIES), ("document", DOCUMENTS)):
        want = reference(checkpoint, texts, input_type)
        reply = requests.post(f"{colbert_server.http_url}/embed_multi",
                              json={"inputs": texts, "input_type": input_type}, timeout=60)
        assert reply.status_code == 200, reply.text
        check_vectors([np.array(v, np.float32).reshape(-1, 8) for v in reply.json()], want)
        reply = requests.post(f"{colbert_server.http_url}/embed_multi",
                              json={"inputs": texts, "input_type": input_type, "encoding_format": "base64"}, timeout=60)
        assert reply.status_code == 200, reply.text
        check_vectors([np.frombuffer(base64.b64decode(v), "<f4").reshape(-1, 8) for v in reply.json()], want)
    one = requests.post(f"{colbert_server.http_url}/embed_multi", json={"inputs": "a"}, timeout=60)
    check_vectors([np.array(one.json()[0], np.float32)], reference(checkpoint, ["a"], "document"))


def test_embed_multi_answers_as_its_openapi_description_says(colbert_server):
    from jsonschema import Draft202012Validator

    from tests.test_http_openapi import MULTI_VECTOR_CALLS, call, schema_of

    spec = requests.get(f"{colbert_server.http_url}/openapi.json", timeout=60).json()
    for method, path, body in MULTI_VECTOR_CALLS:
        reply = call(colbert_server, method, path, body)
        assert reply.status_code == 200, reply.text
        Draft202012Validator(schema_of(spec, method, path, "200")).validate(reply.json())


def test_grpc_multi_vector_tensors_and_model_info(colbert, colbert_server):
    checkpoint, _ = colbert
    with colbert_server.channel() as channel:
        stub = colbert_server.stub(channel)
        for input_type, texts in ((pb.INPUT_TYPE_QUERY, QUERIES), (pb.INPUT_TYPE_DOCUMENT, DOCUMENTS)):
            reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts],
                                               multi_vector=pb.MultiVectorOptions(input_type=input_type)), timeout=60)
            got = []
            for e in reply.embeddings:
                assert not e.HasField("sentence_embedding") and e.multi_vector.dtype == pb.FLOAT32
                got.append(np.frombuffer(e.multi_vector.data, "<f4").reshape(tuple(e.multi_vector.shape)))
            check_vectors(got, reference(checkpoint, texts, "query" if input_type == pb.INPUT_TYPE_QUERY else
                                         "document"))
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60)
        assert list(info.outputs) == ["embed_multi", "rerank"] and info.embedding_size == 8
        assert info.pooling == "multi_vector"
        with pytest.raises(grpc.RpcError) as refused:
            stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text="x")]), timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "multi-vector (ColBERT) model" in refused.value.details()


def test_kserve_v2_token_embeddings_through_tritonclient(colbert, colbert_server):
    import tritonclient.http as triton

    checkpoint, _ = colbert
    name = colbert_server_model(colbert_server)
    client = triton.InferenceServerClient(colbert_server.http_url.removeprefix("http://"), network_timeout=60)
    try:
        metadata = client.get_model_metadata(name)
        assert [o["name"] for o in metadata["outputs"]] == ["token_embeddings", "num_vectors"]
        for input_type, texts, binary in (("query", QUERIES, True), ("document", DOCUMENTS, False)):
            tensor = triton.InferInput("text", [len(texts)], "BYTES")
            tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=binary)
            reply = client.infer(name, [tensor], parameters={"input_type": input_type}, outputs=[
                triton.InferRequestedOutput(o, binary_data=binary) for o in ("token_embeddings", "num_vectors")])
            padded, counts = reply.as_numpy("token_embeddings"), reply.as_numpy("num_vectors")
            assert padded.shape == (len(texts), counts.max(), 8)
            assert not padded[np.arange(padded.shape[1])[None, :] >= counts[:, None]].any()  # zeros past each count
            check_vectors([row[:n] for row, n in zip(padded, counts, strict=True)],
                          reference(checkpoint, texts, input_type))
    finally:
        client.close()


def colbert_server_model(server) -> str:
    return requests.get(f"{server.http_url}/info", timeout=60).json()["model_id"]


def test_rerank_ranks_by_maxsim_on_every_door(colbert, colbert_server):
    checkpoint, _ = colbert
    query, documents = QUERIES[0], DOCUMENTS
    want = maxsim_here(reference(checkpoint, [query], "query")[0], reference(checkpoint, documents, "document"))
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


def test_meanmaxsim_reranking_equals_sentence_transformers_similarity(other_settings, tmp_path):
    from sentence_transformers import MultiVectorEncoder

    checkpoint, artifacts = other_settings
    with serving(ServerProcess(artifacts, log_path=tmp_path / "server.log")) as s:
        results = requests.post(f"{s.http_url}/v1/rerank", json={"model": "", "query": QUERIES[2],
                                                                  "documents": DOCUMENTS}, timeout=60).json()["results"]
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


def test_offline_multi_vector_column_round_trips_and_resumes(colbert, tmp_path):
    checkpoint, artifacts = colbert
    texts = [*DOCUMENTS, *QUERIES]
    source = tmp_path / "in.txt"
    broken = list(texts)
    broken[6] = "   "  # line 7: stops the run after two chunks of 3 rows
    source.write_text("\n".join(broken) + "\n", encoding="utf-8")
    out, clean = tmp_path / "out.parquet", tmp_path / "clean.parquet"
    args = ("--artifacts", str(artifacts), "--no-progress", "--chunk-rows", "3")
    stopped = run_cli("encode", str(source), "-o", str(out), *args)
    assert stopped.returncode != 0 and "line 7: empty text" in stopped.stderr
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    resumed = run_cli("encode", str(source), "-o", str(out), *args)
    assert resumed.returncode == 0 and "(resumed after 6 rows)" in resumed.stdout, resumed.stderr
    assert run_cli("encode", str(source), "-o", str(clean), *args).returncode == 0
    assert out.read_bytes() == clean.read_bytes()
    table = pq.read_table(out)
    assert str(table.schema.field("multi_vector").type) == "list<element: fixed_size_list<element: float>[8]>"
    check_vectors(read_vectors(out), reference(checkpoint, texts, "document"))
    queries = tmp_path / "queries.parquet"
    assert run_cli("encode", str(source), "-o", str(queries), *args, "--input-type", "query").returncode == 0
    check_vectors(read_vectors(queries), reference(checkpoint, texts, "query"))
    refused = run_cli("encode", str(source), "-o", str(tmp_path / "x.parquet"), *args, "--precision-out", "int8")
    assert refused.returncode != 0 and "--precision-out does not apply" in refused.stderr


def test_offline_through_a_server_writes_the_same_vectors(colbert, colbert_server, tmp_path):
    checkpoint, _ = colbert
    source = tmp_path / "in.txt"
    source.write_text("\n".join(QUERIES) + "\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    done = run_cli("encode", str(source), "-o", str(out), "--server", colbert_server.target, "--no-progress",
                   "--input-type", "query")
    assert done.returncode == 0, done.stderr
    check_vectors(read_vectors(out), reference(checkpoint, QUERIES, "query"))


def test_a_dense_model_refuses_an_input_type(artifacts, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("x\n", encoding="utf-8")
    refused = run_cli("encode", str(source), "-o", str(tmp_path / "o.parquet"), "--artifacts", str(artifacts),
                      "--input-type", "query", "--no-progress")
    assert refused.returncode != 0 and "applies to multi-vector (ColBERT) models only" in refused.stderr
