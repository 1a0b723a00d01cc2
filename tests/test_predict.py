"""Classification (TEI's POST /predict, gRPC Classify, KServe's `scores`) with *ForSequenceClassification
checkpoints of several labels, against transformers' own pipeline("text-classification"): single-label (softmax)
and multi-label (sigmoid) as config.json's problem_type says, id2label's names, raw logits; TEI's client and
tritonclient read them."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import requests
from tei_client import HttpClient

from attnserve.default_model import default_checkpoint_dir
from attnserve.v1 import encoder_pb2 as pb
from tests.serving import ServerProcess, serving

LABELS = ["negative", "neutral", "positive"]
TEXTS = ["I loved this film.", "The weather is fine, I suppose.", "Terrible service and cold food.",
         "A long review that goes on about the plot and the actors " * 3]
PAIRS = [("Is it raining?", "The streets are wet."), ("Who wrote it?", "A cat sat on the mat.")]


@pytest.fixture(scope="module", params=["single_label_classification", "multi_label_classification"])
def classifier(request, tmp_path_factory):
    """(checkpoint, running server) of a 3-label classifier with this problem_type."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint
    from tests.checkpoints import save_cross_encoder

    base = tmp_path_factory.mktemp(request.param)
    ckpt = save_cross_encoder(base / "ckpt", default_checkpoint_dir(), seed=3, labels=LABELS,
                              problem_type=request.param)
    build_artifacts(read_checkpoint(ckpt, "tiny-classifier"), base / "artifacts", log=lambda m: None)
    with serving(ServerProcess(base / "artifacts", log_path=base / "server.log")) as server:
        yield ckpt, server


def reference(ckpt, inputs, raw: bool = False) -> list[list[dict]]:
    import transformers

    pipe = transformers.pipeline("text-classification", model=str(ckpt), tokenizer=str(ckpt), device="cpu",
                                 top_k=None)
    batch = [{"text": x[0], "text_pair": x[1]} if isinstance(x, tuple) else x for x in inputs]
    return pipe(batch, function_to_apply="none" if raw else None)


def check(got: list[list[dict]], want: list[list[dict]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert [s["label"] for s in g] == [s["label"] for s in w]  # the same order: best first
        np.testing.assert_allclose([s["score"] for s in g], [s["score"] for s in w], atol=1e-5)


def scores(predictions) -> list[list[dict]]:
    return [[{"label": s.label, "score": s.score} for s in p.scores] for p in predictions]


def test_predict_over_http_teis_client_and_grpc_equals_transformers_pipeline(classifier):
    ckpt, server = classifier
    url = f"{server.http_url}/predict"
    batch = requests.post(url, json={"inputs": [[t] for t in TEXTS] + [list(p) for p in PAIRS]}, timeout=60).json()
    check(batch, reference(ckpt, TEXTS + PAIRS))
    one = requests.post(url, json={"inputs": TEXTS[0]}, timeout=60).json()  # one text: one list, not a batch
    check([one], reference(ckpt, TEXTS[:1]))
    pair = requests.post(url, json={"inputs": list(PAIRS[0])}, timeout=60).json()  # two strings: one pair (TEI)
    check([pair], reference(ckpt, PAIRS[:1]))
    raw = requests.post(url, json={"inputs": TEXTS, "raw_scores": True}, timeout=60).json()
    check(raw, reference(ckpt, TEXTS, raw=True))
    check(scores(HttpClient(server.http_url, timeout=60).classify(TEXTS[:2] + [PAIRS[0]])),
          reference(ckpt, TEXTS[:2] + [PAIRS[0]]))
    with server.channel() as channel:
        stub = server.stub(channel)
        inputs = [pb.Input(text=t) for t in TEXTS] + [pb.Input(pair=pb.TextPair(a=a, b=b)) for a, b in PAIRS]
        check(scores(stub.Classify(pb.ClassifyRequest(inputs=inputs)).predictions), reference(ckpt, TEXTS + PAIRS))
        info = stub.GetModelInfo(pb.GetModelInfoRequest())
        assert list(info.labels) == LABELS and list(info.outputs) == ["predict", "attention"] and info.num_labels == 3
        with pytest.raises(grpc.RpcError) as raised:  # a 3-label classifier does not rerank
            stub.Rerank(pb.RerankRequest(query="q", texts=["a"]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_classifier_asked_for_embeddings_is_told_it_predicts_not_that_it_reranks(classifier):
    """A classifier is neither an embedder nor a reranker: every embeddings route says so and points to predict,
    which answers, where rerank (a reranker's) refuses it too."""
    server = classifier[1]
    want = ("tiny-classifier is a classifier with 3 labels and has no embeddings: it scores texts and pairs through "
            "predict (/predict, gRPC Classify)")
    for route in ("/embed", "/embed_sparse", "/embed_multi", "/embed_all"):
        reply = requests.post(f"{server.http_url}{route}", json={"inputs": "a"}, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"].endswith(want), (route, reply.text)
    rerank = requests.post(f"{server.http_url}/v1/rerank", json={"query": "q", "documents": ["a"]}, timeout=60)
    assert rerank.status_code == 400 and "3 labels" in rerank.json()["error"]["message"]
    assert requests.post(f"{server.http_url}/predict", json={"inputs": "a"}, timeout=60).status_code == 200


def test_an_embedder_asked_to_predict_says_what_it_is(server, stub):
    reply = requests.post(f"{server.http_url}/predict", json={"inputs": "a"}, timeout=60)
    assert reply.status_code in (400, 422) and "has no classifier" in reply.json()["error"]
    with pytest.raises(grpc.RpcError) as raised:
        stub.Classify(pb.ClassifyRequest(inputs=[pb.Input(text="a")]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "has no classifier" in raised.value.details()
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert list(info.outputs) == ["embed", "attention", "similarity", "late_chunking"]
    assert list(info.embedding_types) == ["float", "int8", "uint8", "binary", "ubinary"]


def test_kserve_infer_gives_a_classifiers_scores_in_label_order_to_tritonclient(classifier):
    """`text` in, `scores` [N, labels] out over HTTP and gRPC, each row in the label order of its metadata, equal to
    transformers' pipeline (probabilities, or logits with raw_scores)."""
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    from tests.test_kserve import text_input

    ckpt, server = classifier

    def by_label(predictions: list[list[dict]]) -> np.ndarray:
        return np.array([[next(s["score"] for s in p if s["label"] == label) for label in LABELS]
                         for p in predictions], dtype=np.float32)

    http = triton_http.InferenceServerClient(server.http_url.removeprefix("http://"))
    metadata = http.get_model_metadata("tiny-classifier")
    assert metadata["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, len(LABELS)]}]
    for raw in (False, True):
        got = http.infer("tiny-classifier", [text_input(TEXTS)], parameters={"raw_scores": raw})
        np.testing.assert_allclose(got.as_numpy("scores"), by_label(reference(ckpt, TEXTS, raw=raw)), atol=1e-5)
    got = triton_grpc.InferenceServerClient(server.target).infer("tiny-classifier",
                                                                [text_input(TEXTS, module=triton_grpc)])
    np.testing.assert_allclose(got.as_numpy("scores"), by_label(reference(ckpt, TEXTS)), atol=1e-5)
