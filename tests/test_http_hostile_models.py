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
import tritonclient.http as triton

from attnserve.default_model import default_checkpoint_dir
from attnserve.engine.engine import Engine
from attnserve.v1 import encoder_pb2 as pb
from tests.checkpoints import save_cross_encoder, save_sentence_transformer, save_tiny_bert
from tests.serving import ServerProcess, serving

TEXTS = ["the cat sat on the mat", "where is the train", "a"]
QUERY = "what do cats do"
TOLERANCE = 1e-5


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
    dirs, _ = models
    flags = [f for name, d in dirs.items() for f in ("--model", f"{name}={d}")]
    process = ServerProcess(None, *flags, env={"ATTNSERVE_THREADS": "1"},
                            log_path=tmp_path_factory.mktemp("four_models_server") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def offline(models):
    """Each embedder's sentence embeddings of TEXTS, from its own engine."""
    dirs, _ = models
    return {name: Engine.from_directory(dirs[name]).encode(TEXTS).embeddings for name in ("a", "b")}


@pytest.fixture(scope="module")
def cross_scores(models):
    """Each reranker's scores of (QUERY, text), in TEXTS order, from sentence-transformers' CrossEncoder."""
    from sentence_transformers import CrossEncoder

    _, checkpoints = models
    return {name: CrossEncoder(str(ckpt), device="cpu").predict([(QUERY, t) for t in TEXTS])
            for name, ckpt in checkpoints.items()}


def test_the_models_differ(offline, cross_scores):
    # Else every check below would pass with the wrong model.
    assert offline["a"].shape == offline["b"].shape
    assert np.abs(offline["a"] - offline["b"]).max() > 0.1
    assert np.abs(cross_scores["r1"] - cross_scores["r2"]).max() > 1e-3


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings"])
@pytest.mark.parametrize("model", ["a", "b"])
def test_openai_computes_with_the_model_of_the_body(server, offline, path, model):
    reply = httpx.post(server.http_url + path, json={"input": TEXTS, "model": model}, timeout=60).json()
    _close([row["embedding"] for row in reply["data"]], offline[model])


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("model", ["a", "b"])
def test_kserve_infer_computes_with_the_model_of_the_path(server, offline, model, versioned):
    path = f"/v2/models/{model}{'/versions/1' if versioned else ''}/infer"
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
    reply = httpx.post(server.http_url + path, json=body, timeout=60).json()
    embedding = next(o for o in reply["outputs"] if o["name"] == "embedding")
    _close(np.reshape(embedding["data"], embedding["shape"]), offline[model])


@pytest.mark.parametrize("model", ["a", "b"])
def test_kserve_binary_infer_through_tritonclient_computes_with_the_model_named(server, offline, model):
    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"))
    tensor = triton.InferInput("text", [len(TEXTS)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_), binary_data=True)
    result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("embedding", binary_data=True)])
    _close(result.as_numpy("embedding"), offline[model])


@pytest.mark.parametrize("model", ["a", "b", "r1", "r2"])
def test_kserve_grpc_infer_computes_with_the_model_named(server, offline, cross_scores, model):
    """KServe v2 over gRPC, through tritonclient.grpc: an embedder's embeddings, a reranker's scores (query and
    text in, score out), each from the model named."""
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(server.target)
    names = ("query", "text") if model.startswith("r") else ("text",)
    tensors = []
    for name in names:
        values = [QUERY] if name == "query" else TEXTS
        tensor = triton_grpc.InferInput(name, [len(values)], "BYTES")
        tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=np.object_))
        tensors.append(tensor)
    result = client.infer(model, tensors)
    if model.startswith("r"):
        _close(result.as_numpy("score"), cross_scores[model])
    else:
        _close(result.as_numpy("embedding"), offline[model])
    client.close()


@pytest.mark.parametrize("model", ["a", "b"])
def test_attention_computes_with_the_model_of_the_body(server, models, model):
    dirs, _ = models
    engine = Engine.from_directory(dirs[model], attention=True)
    inputs = engine.tokenizer.encode_texts([TEXTS[0]], truncate=False)
    want = engine.run(inputs, attention=True).attentions[-1, 0]  # (heads, T, T): the last layer, every head
    reply = httpx.post(server.http_url + "/v1/attention", json={"inputs": TEXTS[0], "model": model},
                       timeout=60).json()
    _close(np.reshape(reply["data"][0]["attentions"], reply["data"][0]["shape"])[0], want)


@pytest.mark.parametrize("model", ["a", "b"])
def test_grpc_embed_computes_with_the_model_of_the_message(server, offline, model):
    with server.channel() as channel:
        reply = server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in TEXTS], model=model),
                                           timeout=60)
    got = [np.frombuffer(e.sentence_embedding.data, "<f4") for e in reply.embeddings]
    _close(got, offline[model])


def test_tei_routes_name_no_model_and_compute_with_the_default(server, offline):
    _close(httpx.post(server.http_url + "/embed", json={"inputs": TEXTS}, timeout=60).json(), offline["a"])


@pytest.mark.parametrize("model", ["r1", "r2"])
def test_reranking_computes_with_the_model_named_on_both_doors(server, cross_scores, model):
    want = cross_scores[model]
    reply = httpx.post(server.http_url + "/v1/rerank", json={"model": model, "query": QUERY, "documents": TEXTS},
                       timeout=60).json()
    _close([r["relevance_score"] for r in sorted(reply["results"], key=lambda r: r["index"])], want)
    with server.channel() as channel:
        ranked = server.stub(channel).Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS, model=model), timeout=60)
    _close([r.score for r in sorted(ranked.results, key=lambda r: r.index)], want)

