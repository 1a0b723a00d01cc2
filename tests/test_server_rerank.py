"""Scores on real servers: reranking by gRPC Rerank, TEI's /rerank (through TEI's own client), the Cohere-style
/v1/rerank and Cohere's SDK on /v2/rerank, against sentence-transformers' CrossEncoder over the same checkpoint,
hostile requests one clear error each; an embedder asked to rerank, or a reranker to embed, told what it is; and
TEI's /similarity and gRPC Similarity, the cosines of the served embeddings."""

from __future__ import annotations

import cohere
import grpc
import httpx
import numpy as np
import pytest
import torch
from sentence_transformers import CrossEncoder
from tei_client import HttpClient
from tokenizers import Tokenizer

from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import RERANKER_MAX_INPUTS as MAX_INPUTS
from tests.conftest import VARIED_TEXTS
from tests.output_kinds import grpc_refusal
from tests.serving import ServerProcess, serving

QUERY = "what do cats eat"
TEXTS = ["Cats are obligate carnivores and eat meat.", "The stock market fell on Monday.", "Kittens drink milk.",
         "Paris is the capital of France.", "a", "Ünïcödé naïve café 東京は日本の首都です。"]
HUGE_QUERY = "cats " * 10_000  # past the tiny reranker's max_seq_length 64 in any pair
ASKED_NOT_TO = ("the pair is longer than max_seq_length 64 tokens, and the request asked not to truncate; to cut it "
                "to max_seq_length instead, set ")
# Raw logits reach about 6 here, where float32 rounding of a differently batched run reaches 1e-5 (2e-6 relative);
# the 1e-5 is for the scores users get, after the sigmoid.
LOGIT_TOLERANCE = 2e-5


@pytest.fixture(scope="module", params=["one process", "two workers"])
def rerank_server(request, tmp_path_factory):
    """Every rerank door in one process (the shared reranker, conftest.py), and through two front-door workers
    (serve --workers) with the same limit on inputs."""
    if request.param == "one process":
        yield request.getfixturevalue("reranker_server")
        return
    process = ServerProcess(request.getfixturevalue("reranker_artifacts"), "--workers", "2",
                            env={"ATTNSERVE_MAX_INPUTS_PER_REQUEST": str(MAX_INPUTS)},
                            log_path=tmp_path_factory.mktemp("reranker_workers") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def rerank_stub(rerank_server):
    with rerank_server.channel() as channel:
        yield rerank_server.stub(channel)


@pytest.fixture(scope="module")
def expected(cross_encoder_dir):
    """CrossEncoder's scores (its sigmoid) and raw logits for (QUERY, text), in TEXTS order."""
    model = CrossEncoder(str(cross_encoder_dir), device="cpu")
    pairs = [(QUERY, text) for text in TEXTS]
    return model.predict(pairs), model.predict(pairs, activation_fn=torch.nn.Identity())


def _check_ranking(results, want, tolerance=1e-5, score="score"):
    """results (objects or dicts, best first) hold each text's index and score: the order and the scores of want."""
    def field(result, name):
        return result[name] if isinstance(result, dict) else getattr(result, name)

    indices, scores = [field(r, "index") for r in results], [field(r, score) for r in results]
    assert len(set(indices)) == len(indices)
    assert list(scores) == sorted(scores, reverse=True)
    assert np.abs(np.asarray(scores) - want[list(indices)]).max() <= tolerance
    assert list(indices) == list(np.argsort(-want, kind="stable"))[: len(indices)]


def test_grpc_rerank_matches_cross_encoder(rerank_stub, expected):
    scores, logits = expected
    assert scores.max() - scores.min() > 0.1  # a real order to get right
    reply = rerank_stub.Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS))
    _check_ranking(reply.results, scores)
    assert len(reply.results) == len(TEXTS) and reply.model == "tiny-reranker"
    assert not any(r.HasField("text") for r in reply.results)
    raw = rerank_stub.Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS, raw_scores=True, return_text=True, top_n=2))
    _check_ranking(raw.results, logits, LOGIT_TOLERANCE)
    assert len(raw.results) == 2 and [r.text for r in raw.results] == [TEXTS[r.index] for r in raw.results]


def test_tei_rerank_through_teis_client(rerank_server, expected):
    scores, logits = expected
    client = HttpClient(rerank_server.http_url)
    ranks = client.rerank(QUERY, TEXTS, return_text=True).ranks
    _check_ranking(ranks, scores)
    assert [r.text for r in ranks] == [TEXTS[r.index] for r in ranks]
    _check_ranking(client.rerank(QUERY, TEXTS, raw_scores=True).ranks, logits, LOGIT_TOLERANCE)


def test_v1_rerank_cohere_style(rerank_server, expected):
    body = {"model": "tiny-reranker", "query": QUERY, "documents": [TEXTS[0], {"text": TEXTS[1]}, *TEXTS[2:]],
            "top_n": 3, "return_documents": True}
    reply = httpx.post(f"{rerank_server.http_url}/v1/rerank", json=body, timeout=60).json()
    results = reply["results"]
    _check_ranking(results, expected[0], score="relevance_score")
    assert len(results) == 3 and reply["model"] == "tiny-reranker" and reply["usage"]["total_tokens"] > 0
    assert [r["document"]["text"] for r in results] == [TEXTS[r["index"]] for r in results]
    everything = httpx.post(f"{rerank_server.http_url}/v1/rerank", timeout=60,
                            json={"query": QUERY, "documents": TEXTS, "top_n": 100}).json()["results"]
    assert len(everything) == len(TEXTS) and "document" not in everything[0]  # top_n over the count: all, as Cohere


def test_cohere_client_v2_reranks_with_its_own_sdk(rerank_server, expected, cross_encoder_dir):
    """cohere.ClientV2.rerank posts /v2/rerank: its results best first, as CrossEncoder scores them; top_n; and
    max_tokens_per_doc cuts each document to its first N tokens, as CrossEncoder scores the cut text."""
    client = cohere.ClientV2(api_key="unused", base_url=rerank_server.http_url)
    reply = client.rerank(model="tiny-reranker", query=QUERY, documents=TEXTS, top_n=3)
    _check_ranking(reply.results, expected[0], score="relevance_score")
    assert len(reply.results) == 3 and reply.id and reply.meta.billed_units.search_units == 1
    assert len(client.rerank(model="", query=QUERY, documents=TEXTS).results) == len(TEXTS)
    # The first 4 tokens of each document, as the checkpoint's tokenizer cuts them at a token's end.
    tokenizer = Tokenizer.from_file(str(cross_encoder_dir / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads every text to a length of its own
    tokenizer.no_truncation()
    offsets = [tokenizer.encode(text, add_special_tokens=False).offsets for text in TEXTS]
    cut = [text if len(ends) <= 4 else text[:ends[3][1]] for text, ends in zip(TEXTS, offsets, strict=True)]
    assert cut != TEXTS
    want = CrossEncoder(str(cross_encoder_dir), device="cpu").predict([(QUERY, text) for text in cut])
    short = client.rerank(model="tiny-reranker", query=QUERY, documents=TEXTS, max_tokens_per_doc=4).results
    _check_ranking(short, want, score="relevance_score")
    with pytest.raises(cohere.errors.BadRequestError, match="max_tokens_per_doc 0 is not a positive integer"):
        client.rerank(model="tiny-reranker", query=QUERY, documents=TEXTS, max_tokens_per_doc=0)
    with pytest.raises(cohere.errors.NotFoundError, match="'nope'"):
        client.rerank(model="nope", query=QUERY, documents=TEXTS)


def test_pairs_batch_with_each_other(rerank_stub, expected):
    """Many concurrent requests' pairs go through the one batcher and come back to their own callers."""
    scores, _ = expected
    futures = [rerank_stub.Rerank.future(pb.RerankRequest(query=QUERY, texts=TEXTS[i:] + TEXTS[:i]))
               for i in range(len(TEXTS))]
    for i, future in enumerate(futures):
        _check_ranking(future.result(timeout=60).results, np.concatenate([scores[i:], scores[:i]]))


HOSTILE_HTTP = [
    ("/rerank", {"query": QUERY, "texts": []}, "no texts: send 1 to 8 texts"),
    ("/rerank", {"query": QUERY, "texts": ["x"] * (MAX_INPUTS + 1)}, "too many texts: 9"),
    ("/rerank", {"query": QUERY, "texts": ["fine", 5]}, "texts[1]: input should be a valid string"),
    ("/rerank", {"query": QUERY, "texts": ["fine", " "]}, "text 1: empty text"),
    ("/rerank", {"query": "", "texts": ["x"]}, "query: the query must be a non-empty string"),
    ("/rerank", {"query": HUGE_QUERY, "texts": ["x"], "truncate": False},
     "text 0: " + ASKED_NOT_TO + '"truncate": true in the body'),
    ("/rerank", {"texts": ["x"]}, "query: required"),
    ("/v1/rerank", {"query": QUERY, "documents": ["x"], "top_n": 0}, "top_n 0 is not a positive integer"),
    ("/v1/rerank", {"query": QUERY, "documents": ["x"], "top_n": -3}, "top_n -3 is not a positive integer"),
    ("/v1/rerank", {"query": QUERY, "documents": ["x"], "top_n": "2"}, "top_n: input should be a valid integer"),
    ("/v1/rerank", {"query": QUERY, "documents": []}, "no texts"),
    ("/v1/rerank", {"query": QUERY, "documents": ["x"], "model": "other"}, "the model 'other' does not exist"),
]


@pytest.mark.parametrize("route,body,message", HOSTILE_HTTP, ids=[f"{r} {m[:30]}" for r, _, m in HOSTILE_HTTP])
def test_hostile_http_requests_get_one_clear_error(rerank_server, route, body, message):
    reply = httpx.post(f"{rerank_server.http_url}{route}", json=body, timeout=60)
    assert reply.status_code == (404 if "does not exist" in message else 400), reply.text
    error = reply.json()["error"]
    text = error if isinstance(error, str) else error["message"]
    assert message in text, text


@pytest.mark.parametrize("request_,message", [
    (pb.RerankRequest(query=QUERY), "no texts"),
    (pb.RerankRequest(query=QUERY, texts=["x"] * (MAX_INPUTS + 1)), "too many texts"),
    (pb.RerankRequest(query=QUERY, texts=["x"], top_n=0), "top_n 0 is not a positive integer"),
    (pb.RerankRequest(query=QUERY, texts=["x"], top_n=-1), "top_n -1 is not a positive integer"),
    (pb.RerankRequest(query="", texts=["x"]), "query: the query must be a non-empty string"),
    (pb.RerankRequest(query=HUGE_QUERY, texts=["x"], truncate=False),
     ASKED_NOT_TO + "truncate: true (field `truncate` of RerankRequest)"),
    (pb.RerankRequest(query=QUERY, texts=["x"], truncation_direction=7), "truncation_direction 7 is not one of"),
    (pb.RerankRequest(query=QUERY, texts=["x"], model="other"), "the model 'other' does not exist"),
])
def test_hostile_grpc_requests_get_one_clear_error(rerank_stub, request_, message):
    code = grpc.StatusCode.NOT_FOUND if "does not exist" in message else grpc.StatusCode.INVALID_ARGUMENT
    details = grpc_refusal(rerank_stub.Rerank, request_, code)
    assert message in details, details


def test_an_unset_truncate_cuts_a_huge_query_and_false_refuses_it(rerank_server, rerank_stub):
    """--auto-truncate, on by default: a pair over max_seq_length is cut when the request does not say."""
    body = {"query": HUGE_QUERY, "documents": ["x", "cats"]}
    reply = httpx.post(f"{rerank_server.http_url}/v1/rerank", json=body, timeout=60)
    assert reply.status_code == 200 and len(reply.json()["results"]) == 2
    assert reply.json()["usage"]["total_tokens"] == 2 * 64
    refused = httpx.post(f"{rerank_server.http_url}/v1/rerank", json={**body, "truncate": False}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["message"].endswith(
        'the request asked not to truncate; to cut it to max_seq_length instead, set "truncate": true in the body')
    reply = httpx.post(f"{rerank_server.http_url}/rerank", json={"query": HUGE_QUERY, "texts": ["x", "cats"]},
                       timeout=60)
    assert reply.status_code == 200 and sorted(r["index"] for r in reply.json()) == [0, 1]
    assert len(rerank_stub.Rerank(pb.RerankRequest(query=HUGE_QUERY, texts=["x"]), timeout=60).results) == 1


def test_each_model_says_what_it_is_when_asked_what_it_cannot_do(rerank_stub, rerank_server, stub, server):
    info = rerank_stub.GetModelInfo(pb.GetModelInfoRequest())
    assert (info.model, info.kind, info.num_labels) == ("tiny-reranker", "reranker", 1)
    assert stub.GetModelInfo(pb.GetModelInfoRequest()).kind == "embedder"
    assert grpc_refusal(rerank_stub.Embed, pb.EmbedRequest(inputs=[pb.Input(text="hello")])).endswith(
        "tiny-reranker is a reranker (a cross-encoder of one label) and has no embeddings: it scores (query, document) "
        "pairs through rerank (/rerank, /v1/rerank, /v2/rerank, gRPC Rerank)")
    reply = httpx.post(f"{rerank_server.http_url}/embed", json={"inputs": "hello"}, timeout=60)
    assert reply.status_code == 400 and "is a reranker" in reply.json()["error"]
    details = grpc_refusal(stub.Rerank, pb.RerankRequest(query=QUERY, texts=["x"]))
    assert "is an embedding model, not a reranker" in details
    for route, body in (("/rerank", {"query": QUERY, "texts": ["x"]}),
                        ("/v1/rerank", {"query": QUERY, "documents": ["x"]})):
        reply = httpx.post(f"{server.http_url}{route}", json=body, timeout=60)
        assert reply.status_code == 400 and "not a reranker" in reply.text, reply.text


SOURCE = "A man is eating food."
SENTENCES = ["A man is eating a piece of bread.", "The girl is carrying a baby.", "A man is riding a horse.",
             *[t for t in VARIED_TEXTS if len(t) < 300][:5]]


def cosines(embeddings: np.ndarray) -> np.ndarray:
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    return unit[1:] @ unit[0]


def test_similarity_is_the_cosine_of_the_served_embeddings_over_http_and_grpc(server, stub, engine):
    scores = httpx.post(f"{server.http_url}/similarity",
                        json={"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES}}, timeout=60).json()
    embeddings = np.array(httpx.post(f"{server.http_url}/embed", json={"inputs": [SOURCE, *SENTENCES]},
                                     timeout=60).json(), dtype=np.float32)
    np.testing.assert_allclose(scores, cosines(embeddings), atol=1e-5)
    assert scores[0] > scores[1] and scores[0] > 0.5  # eating food: bread beats a baby
    reply = stub.Similarity(pb.SimilarityRequest(source_sentence=SOURCE, sentences=SENTENCES))
    np.testing.assert_allclose(reply.scores, cosines(engine.encode([SOURCE, *SENTENCES]).embeddings), atol=1e-5)
    assert reply.model == "sentence-transformers/all-MiniLM-L6-v2"


def test_bad_similarity_requests_name_their_field(server, stub):
    def post(sentences, source=SOURCE, **body):
        return httpx.post(f"{server.http_url}/similarity", timeout=60,
                          json={"inputs": {"source_sentence": source, "sentences": sentences}, **body})

    empty = post(["ok", ""])
    assert empty.status_code in (400, 422) and empty.json()["error"].startswith("sentence 1: empty text"), empty.text
    assert post(["a"], source="").json()["error"].startswith("inputs.source_sentence: empty text")  # as TEI names it
    long = post(["word " * 400], truncate=False)
    assert long.status_code in (400, 413, 422) and "sentence 0" in long.json()["error"]
    assert post([]).status_code in (400, 422)
    details = grpc_refusal(stub.Similarity, pb.SimilarityRequest(source_sentence=SOURCE, sentences=["ok", " "]))
    assert details.startswith("sentence 1:"), details


def test_tei_parameters_carry_truncate_direction_and_prompt_name_as_teis_similarity_takes_them(server):
    """TEI's SimilarityRequest puts its options under `parameters`: each is honoured there, the same as at the top
    level (attnserve's older place), and given both ways is refused."""
    inputs = {"source_sentence": SOURCE, "sentences": [" ".join(f"word{i}" for i in range(400)), "a short one"]}

    def post(body):
        return httpx.post(f"{server.http_url}/similarity", json={"inputs": inputs, **body}, timeout=60)

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
    for top, here in ((True, False), (True, True)):  # once, as /openapi.json says
        twice = post({"truncate": top, "parameters": {"truncate": here}})
        assert twice.status_code == 400 and twice.json()["error"] == (
            f"parameters.truncate: {str(here).lower()} here and true at the top level: give it once (TEI's place is "
            "parameters)")
