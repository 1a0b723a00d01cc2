"""TEI's POST /similarity and gRPC Similarity against a real server: each score is the cosine of the served
embeddings, and a bad sentence is named as the similarity request names it."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import requests

from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import VARIED_TEXTS

SOURCE = "A man is eating food."
SENTENCES = ["A man is eating a piece of bread.", "The girl is carrying a baby.", "A man is riding a horse.",
             *[t for t in VARIED_TEXTS if len(t) < 300][:5]]


def cosines(embeddings: np.ndarray) -> np.ndarray:
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    return unit[1:] @ unit[0]


def test_tei_similarity_is_the_cosine_of_the_served_embeddings(server):
    scores = requests.post(f"{server.http_url}/similarity",
                           json={"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES}}, timeout=60).json()
    embeddings = np.array(requests.post(f"{server.http_url}/embed", json={"inputs": [SOURCE, *SENTENCES]},
                                        timeout=60).json(), dtype=np.float32)
    np.testing.assert_allclose(scores, cosines(embeddings), atol=1e-5)
    assert scores[0] > scores[1] and scores[0] > 0.5  # eating food: bread beats a baby


def test_grpc_similarity_equals_tei(server, stub, engine):
    reply = stub.Similarity(pb.SimilarityRequest(source_sentence=SOURCE, sentences=SENTENCES))
    want = cosines(engine.encode([SOURCE, *SENTENCES]).embeddings)
    np.testing.assert_allclose(reply.scores, want, atol=1e-5)
    assert reply.model == "sentence-transformers/all-MiniLM-L6-v2"


def test_bad_similarity_requests_name_their_field(server, stub):
    url = f"{server.http_url}/similarity"
    empty = requests.post(url, json={"inputs": {"source_sentence": SOURCE, "sentences": ["ok", ""]}}, timeout=60)
    assert empty.status_code in (400, 422)
    assert empty.json()["error"].startswith("sentence 1: empty text"), empty.json()
    none = requests.post(url, json={"inputs": {"source_sentence": "", "sentences": ["a"]}}, timeout=60)
    assert none.json()["error"].startswith("inputs.source_sentence: empty text")  # as TEI names the field
    long = requests.post(url, json={"inputs": {"source_sentence": SOURCE, "sentences": ["word " * 400]},
                                    "truncate": False}, timeout=60)
    assert long.status_code in (400, 413, 422) and "sentence 0" in long.json()["error"]
    assert requests.post(url, json={"inputs": {"source_sentence": SOURCE, "sentences": []}},
                         timeout=60).status_code in (400, 422)
    with pytest.raises(grpc.RpcError) as raised:
        stub.Similarity(pb.SimilarityRequest(source_sentence=SOURCE, sentences=["ok", " "]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("sentence 1:"), raised.value.details()


def test_tei_parameters_carry_truncate_direction_and_prompt_name_as_teis_similarity_takes_them(server):
    """TEI's SimilarityRequest puts its options under `parameters`: each is honoured there, the same as at the top
    level (attnserve's older place), and given both ways is refused."""
    url = f"{server.http_url}/similarity"
    inputs = {"source_sentence": SOURCE, "sentences": [" ".join(f"word{i}" for i in range(400)), "a short one"]}
    post = lambda body: requests.post(url, json={"inputs": inputs, **body}, timeout=60)  # noqa: E731
    for body in ({"parameters": {"truncate": False}}, {"truncate": False}):
        refused = post(body)
        assert refused.status_code == 400 and "sentence 0" in refused.json()["error"], (body, refused.text)
    cut = post({"parameters": {"truncate": True}})
    assert cut.status_code == 200 and len(cut.json()) == 2
    left = post({"parameters": {"truncate": True, "truncation_direction": "Left"}}).json()
    assert left == post({"truncate": True, "truncation_direction": "left"}).json()
    assert abs(left[0] - cut.json()[0]) > 1e-4 and left[1] == pytest.approx(cut.json()[1], abs=1e-6)
    unknown = post({"parameters": {"prompt_name": "nope"}})  # was answered 200, the prompt ignored
    assert unknown.status_code == 400 and "nope" in unknown.json()["error"], unknown.text
    both = post({"truncate": True, "parameters": {"truncate": False}})
    assert both.status_code == 400 and both.json()["error"] == (
        "parameters.truncate: false here and true at the top level: give it once (TEI's place is parameters)")
    twice = post({"truncate": True, "parameters": {"truncate": True}})  # once, as /openapi.json says
    assert twice.status_code == 400 and twice.json()["error"] == (
        "parameters.truncate: true here and true at the top level: give it once (TEI's place is parameters)")
