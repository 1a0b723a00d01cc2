"""The model a request names is the model that computes, on every door and route that names one: four different
random-weight models in one real server (two embedders of the same shape, two rerankers), each reply checked by
its numbers against that model's own offline engine or sentence-transformers, never by the name it carries.

Two models of one shape matter: a route that ignored the name would still answer a well-formed reply, with the
default model's vectors (KServe's infer did, naming the model asked for).
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton

from attnserve.default_model import default_checkpoint_dir
from attnserve.engine.engine import Engine
from attnserve.v1 import encoder_pb2 as pb
from tests.checkpoints import save_cross_encoder, save_sentence_transformer, save_tiny_bert
from tests.serving import ServerProcess, serving
from tests.test_kserve import text_input

TEXTS = ["the cat sat on the mat", "where is the train", "a"]
QUERY = "what do cats do"


def _export(checkpoint, out):
    """The fp32 graphs and the maps' (the references here are fp32): the server chooses among those."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    ckpt = read_checkpoint(checkpoint)
    variants = (["scores", "scores_fused", "attention"] if ckpt.kind == "reranker"
                else ["embeddings", "embeddings_fused", "attention", "attention_last"])
    build_artifacts(ckpt, out, log=lambda m: None, variants=variants)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> artifact directory: embedders `a` (the default) and `b`, rerankers `r1` and `r2`; and the
    cross-encoders' checkpoints, for sentence-transformers' scores."""
    root = tmp_path_factory.mktemp("four_models")
    dirs, checkpoints = {}, {}
    for name, seed in (("a", 1), ("b", 2)):
        bert = save_tiny_bert(root / f"{name}_bert", vocab_size=64, seed=seed)
        st = save_sentence_transformer(bert, root / f"{name}_st", "mean", normalize=True, max_seq_length=48)
        dirs[name] = _export(st, root / name)
    for name, seed in (("r1", 0), ("r2", 1)):
        checkpoints[name] = save_cross_encoder(root / f"{name}_ckpt", default_checkpoint_dir(), seed=seed)
        dirs[name] = _export(checkpoints[name], root / name)
    return dirs, checkpoints


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    flags = [f for name, d in models[0].items() for f in ("--model", f"{name}={d}")]
    process = ServerProcess(None, *flags, env={"ATTNSERVE_THREADS": "1"},
                            log_path=tmp_path_factory.mktemp("four_models_server") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def want(models):
    """Each embedder's sentence embeddings of TEXTS, from its own engine, and its last layer's maps of TEXTS[0];
    each reranker's scores of (QUERY, text), in TEXTS order, from sentence-transformers' CrossEncoder."""
    from sentence_transformers import CrossEncoder

    dirs, checkpoints = models
    found = {name: CrossEncoder(str(ckpt), device="cpu").predict([(QUERY, t) for t in TEXTS])
             for name, ckpt in checkpoints.items()}
    for name in ("a", "b"):
        engine = Engine.from_directory(dirs[name], attention=True)
        found[name] = engine.encode(TEXTS).embeddings
        inputs = engine.tokenizer.encode_texts([TEXTS[0]], truncate=False)
        found[name, "attention"] = engine.run(inputs, attention=True).attentions[-1, 0]  # (heads, T, T)
    return found


def test_the_models_differ(want):
    # Else every check below would pass with the wrong model.
    assert want["a"].shape == want["b"].shape
    assert np.abs(want["a"] - want["b"]).max() > 0.1
    assert np.abs(want["r1"] - want["r2"]).max() > 1e-3


def post(server, path: str, body: dict) -> dict:
    return httpx.post(server.http_url + path, json=body, timeout=60).json()


def kserve_http(server, model: str, versioned: bool = False):
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
    reply = post(server, f"/v2/models/{model}{'/versions/1' if versioned else ''}/infer", body)
    embedding = next(o for o in reply["outputs"] if o["name"] == "embedding")
    return np.reshape(embedding["data"], embedding["shape"])


def tritonclient_http(server, model: str):
    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"))
    result = client.infer(model, [text_input(TEXTS)], outputs=[triton.InferRequestedOutput("embedding",
                                                                                             binary_data=True)])
    return result.as_numpy("embedding")


def kserve_grpc(server, model: str):
    """KServe v2 over gRPC, through tritonclient.grpc: a reranker's scores take the query beside the texts."""
    client = triton_grpc.InferenceServerClient(server.target)
    query = [text_input([QUERY], name="query", module=triton_grpc)] if model.startswith("r") else []
    result = client.infer(model, [*query, text_input(TEXTS, module=triton_grpc)])
    client.close()
    return result.as_numpy("score" if model.startswith("r") else "embedding")


def grpc_embed(server, model: str):
    with server.channel() as channel:
        reply = server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in TEXTS], model=model),
                                           timeout=60)
    return [np.frombuffer(e.sentence_embedding.data, "<f4") for e in reply.embeddings]


def rerank_http(server, model: str):
    reply = post(server, "/v1/rerank", {"model": model, "query": QUERY, "documents": TEXTS})
    return [r["relevance_score"] for r in sorted(reply["results"], key=lambda r: r["index"])]


def rerank_grpc(server, model: str):
    with server.channel() as channel:
        ranked = server.stub(channel).Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS, model=model), timeout=60)
    return [r.score for r in sorted(ranked.results, key=lambda r: r.index)]


def attention(server, model: str):
    item = post(server, "/v1/attention", {"inputs": TEXTS[0], "model": model})["data"][0]
    return np.reshape(item["attentions"], item["shape"])[0]  # the last layer, every head


# door: (what it answers for a model, the models it serves)
DOORS = {
    "openai /v1/embeddings": (lambda s, m: [r["embedding"] for r in post(s, "/v1/embeddings", {
        "input": TEXTS, "model": m})["data"]], "ab"),
    "openai /embeddings": (lambda s, m: [r["embedding"] for r in post(s, "/embeddings", {
        "input": TEXTS, "model": m})["data"]], "ab"),
    "kserve infer": (kserve_http, "ab"),
    "kserve versioned infer": (lambda s, m: kserve_http(s, m, versioned=True), "ab"),
    "kserve binary infer through tritonclient.http": (tritonclient_http, "ab"),
    "kserve grpc infer through tritonclient.grpc": (kserve_grpc, ["a", "b", "r1", "r2"]),
    "grpc Embed": (grpc_embed, "ab"),
    "attention": (attention, "ab"),
    "rerank over http": (rerank_http, ["r1", "r2"]),
    "rerank over grpc": (rerank_grpc, ["r1", "r2"]),
}
CASES = [(door, model) for door, (_, models) in DOORS.items() for model in models]


@pytest.mark.parametrize("door, model", CASES, ids=[f"{door}-{model}" for door, model in CASES])
def test_every_door_computes_with_the_model_named(server, want, door, model):
    expected = want[model, "attention"] if door == "attention" else want[model]
    np.testing.assert_allclose(np.asarray(DOORS[door][0](server, model), dtype=np.float32), expected, atol=1e-5,
                               rtol=0)


def test_tei_routes_name_no_model_and_compute_with_the_default(server, want):
    np.testing.assert_allclose(np.asarray(post(server, "/embed", {"inputs": TEXTS}), dtype=np.float32), want["a"],
                               atol=1e-5, rtol=0)
