"""/openapi.json: a valid OpenAPI 3.1 description of exactly the routes served, whose schemas the real replies
and errors satisfy."""

from __future__ import annotations

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from tests.doors import MODEL

SERVED = {("post", "/v1/embeddings"), ("post", "/embeddings"), ("get", "/v1/models"), ("get", "/v1/models/{id}"),
          ("post", "/embed"), ("post", "/"), ("post", "/embed_all"), ("post", "/tokenize"), ("post", "/decode"),
          ("get", "/info"), ("get", "/health"), ("post", "/v1/attention"), ("get", "/openapi.json"),
          ("post", "/rerank"), ("post", "/v1/rerank"), ("post", "/v2/rerank"), ("get", "/v2"),
          ("get", "/v2/health/live"),
          ("get", "/v2/health/ready"), ("post", "/v2/models/{name}/infer"),
          ("post", "/v2/models/{name}/versions/{version}/infer"), ("get", "/v2/models/{name}/ready"),
          ("get", "/v2/models/{name}/versions/{version}/ready"), ("get", "/v2/models/{name}"),
          ("get", "/v2/models/{name}/versions/{version}"), ("get", "/"), ("post", "/v2/embed"),
          ("post", "/similarity"), ("post", "/predict"), ("post", "/embed_sparse"), ("post", "/embed_multi"),
          ("get", "/explorer"), ("get", "/v2/models/{name}/config"),
          ("get", "/v2/models/{name}/versions/{version}/config"), ("post", "/v2/repository/index"),
          ("get", "/v2/models/stats"), ("get", "/v2/models/{name}/stats"),
          ("get", "/v2/models/{name}/versions/{version}/stats"), ("post", "/embed_chunks")}
# What no embedding model answers: a server of one leaves them out of its description (they answer 400).
NOT_AN_EMBEDDERS = {("post", "/rerank"), ("post", "/v1/rerank"), ("post", "/v2/rerank"), ("post", "/predict"),
                    ("post", "/embed_sparse"), ("post", "/embed_multi")}
# Routes that answer an HTML page, not JSON: the attention explorer (tests/test_explorer.py drives it in a browser).
PAGES = {("get", "/explorer")}
# Answered by a reranker (an embedder refuses them, as ERRORS checks): test_rerank_routes_answer_as_described.
RERANK_CALLS = [
    ("post", "/rerank", {"query": "q", "texts": ["a", "b c"], "return_text": True}),
    ("post", "/v1/rerank", {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": True}),
    ("post", "/v2/rerank", {"model": "", "query": "q", "documents": ["a", "b c"], "top_n": 1,
                            "max_tokens_per_doc": 2}),
    ("post", "/predict", {"inputs": [["a"], ["q", "b"]], "raw_scores": True}),
]
# A request per route, and what it answers.
CALLS = [
    ("post", "/v1/embeddings", {"input": ["a", "b"], "model": MODEL}),
    ("post", "/v1/embeddings", {"input": "a", "model": MODEL, "encoding_format": "base64", "dimensions": 8}),
    ("post", "/embeddings", {"input": [[101, 102]], "model": MODEL}),
    ("get", "/v1/models", None),
    ("get", "/", None),
    ("get", f"/v1/models/{MODEL}", None),
    ("post", "/embed", {"inputs": "a"}),
    ("post", "/", {"inputs": ["a", "b"]}),
    ("post", "/embed_all", {"inputs": "a b"}),
    ("post", "/tokenize", {"inputs": ["a b", "c"]}),
    ("post", "/decode", {"ids": [[101, 102], [7592]]}),
    ("get", "/info", None),
    ("get", "/health", None),
    ("post", "/v1/attention", {"inputs": "a b", "heads": [1]}),
    ("post", "/v1/attention", {"inputs": ["a b"], "average_heads": True, "encoding_format": "base64"}),
    ("get", "/openapi.json", None),
    ("get", "/v2", None),
    ("get", "/v2/health/live", None),
    ("get", "/v2/health/ready", None),
    ("post", f"/v2/models/{MODEL}/infer", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                                       "data": ["a", "b"]}]}),
    ("post", f"/v2/models/{MODEL}/versions/1/infer", {"inputs": [{"name": "text", "datatype": "BYTES",
                                                                  "shape": [1, 1], "data": [["a"]]}],
                                                      "outputs": [{"name": "num_tokens"}], "id": "7"}),
    ("get", f"/v2/models/{MODEL}/ready", None),
    ("get", f"/v2/models/{MODEL}/versions/1/ready", None),
    ("get", f"/v2/models/{MODEL}", None),
    ("get", f"/v2/models/{MODEL}/versions/1", None),
    ("get", f"/v2/models/{MODEL}/config", None),
    ("get", f"/v2/models/{MODEL}/versions/1/config", None),
    ("post", "/v2/repository/index", {"ready": True}),
    ("get", "/v2/models/stats", None),
    ("get", f"/v2/models/{MODEL}/stats", None),
    ("get", f"/v2/models/{MODEL}/versions/1/stats", None),
    ("post", "/v2/embed", {"model": MODEL, "texts": ["a", "b c"], "embedding_types": ["float", "int8", "ubinary",
                                                                                     "base64"]}),
    ("post", "/embed", {"inputs": ["a"], "embedding_type": "binary"}),
    ("post", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b", "a c"]}}),
    # an option at the top level beside a null `parameters`: one place, not two (schemathesis found the schema
    # said otherwise, since properties and required hold of a null)
    ("post", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "prompt": "q: ",
                             "truncate": True, "parameters": None}),
    ("post", "/embed_chunks", {"inputs": ["One. Two!", "x y z"], "chunker": "sentences"}),
    ("post", "/embed_chunks", {"inputs": "One. Two!", "spans": [[[0, 4], [5, 9]]], "encoding_format": "base64"}),
    ("post", "/embed_chunks", {"inputs": "a b c", "chunker": "tokens", "chunk_tokens": 2, "dimensions": 8}),
]
ERRORS = [
    ("post", "/v1/embeddings", {"input": "", "model": MODEL}, 400),
    ("post", "/v1/embeddings", {"input": "a", "model": "nope"}, 404),
    ("get", "/v1/models/nope", None, 404),
    ("post", "/embed", b"not json", 400),
    ("post", "/tokenize", {"inputs": 5}, 400),
    ("post", "/v1/attention", {"inputs": "a", "layers": [9]}, 400),
    ("get", "/nowhere", None, 404),
    ("get", "/v1/nowhere", None, 404),
    ("delete", "/embed", None, 405),
    ("post", "/rerank", {"query": "q", "texts": ["a"]}, 400),  # an embedder does not rerank
    ("post", "/v1/rerank", {"query": "q", "documents": ["a"]}, 400),
    ("post", "/v2/rerank", {"model": MODEL, "query": "q", "documents": ["a"]}, 400),
    ("post", f"/v2/models/{MODEL}/infer", {"inputs": []}, 400),
    ("get", "/v2/models/nope", None, 404),
    ("get", "/v2/nowhere", None, 404),
    ("post", "/v2/embed", {"model": MODEL, "texts": ["a"], "embedding_types": ["int4"]}, 400),
    ("post", "/predict", {"inputs": "a"}, 400),  # an embedder has no classifier
    ("post", "/embed_sparse", {"inputs": "a"}, 400),  # a dense model has no sparse embeddings
    ("post", "/embed_multi", {"inputs": "a"}, 400),  # nor multi-vector ones
    ("post", "/embed_chunks", {"inputs": "a b", "spans": [[[0, 9]]]}, 400),  # past the text's end
]
# Answered by a SPLADE model: tests/test_splade.py checks its reply against this description.
SPARSE_CALLS = [("post", "/embed_sparse", {"inputs": ["a b", "c"], "top_k": 3, "return_tokens": True})]
# Answered by a ColBERT model: tests/test_colbert.py.
MULTI_VECTOR_CALLS = [("post", "/embed_multi", {"inputs": ["a b", "c"], "input_type": "query"}),
                      ("post", "/embed_multi", {"inputs": "a b", "encoding_format": "base64"})]


@pytest.fixture(scope="module")
def spec(server) -> dict:
    reply = httpx.get(f"{server.http_url}/openapi.json", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    return reply.json()


def schema_of(spec: dict, method: str, route: str, status: str) -> dict | None:
    content = spec["paths"][route][method]["responses"][status].get("content")
    if content is None:
        return None
    schema = content["application/json" if "application/json" in content else next(iter(content))]["schema"]
    return {**schema, "components": spec["components"]}


def request_schema_of(spec: dict, method: str, route: str) -> dict | None:
    body = spec["paths"][route][method].get("requestBody")
    return {**body["content"]["application/json"]["schema"], "components": spec["components"]} if body else None


def route_of(spec: dict, path: str) -> str:
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    if path.startswith(f"/v2/models/{MODEL}"):
        rest = path.removeprefix(f"/v2/models/{MODEL}").replace("/versions/1", "/versions/{version}")
        return "/v2/models/{name}" + rest
    return path


def call(server, method: str, path: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.request(method, f"{server.http_url}{path}", content=body, timeout=60)
    return httpx.request(method, f"{server.http_url}{path}", json=body, timeout=60)


def listed(spec: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, methods in spec["paths"].items() for method in methods}


def test_a_valid_openapi_31_description_of_exactly_the_routes_served_which_answer_as_described(server, spec):
    validate(spec)
    assert spec["openapi"] == "3.1.0"
    assert listed(spec) == SERVED - NOT_AN_EMBEDDERS
    assert "security" not in spec  # this server takes no API key
    answered = set()
    for method, path, body in CALLS:
        reply = call(server, method, path, body)
        assert reply.status_code == 200, (path, reply.text)
        route = route_of(spec, path)
        answered.add((method, route))
        if body is not None:  # what the server took, the description takes too
            Draft202012Validator(request_schema_of(spec, method, route)).validate(body)
        schema = schema_of(spec, method, route, "200")
        if schema is None:
            assert reply.content == b""
        else:
            Draft202012Validator(schema).validate(reply.json())
    for method, path in PAGES:
        reply = call(server, method, path, None)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html"), path
        Draft202012Validator(schema_of(spec, method, path, "200")).validate(reply.text)
        answered.add((method, path))
    assert answered == SERVED - NOT_AN_EMBEDDERS
    for method, path, body, status in ERRORS:
        reply = call(server, method, path, body)
        assert reply.status_code == status, (path, reply.text)
        route = route_of(spec, path)
        if (method, route) not in listed(spec):  # no such route, or none this model answers: its family's envelope
            route, method = (("/v1/embeddings", "post") if path.startswith("/v1/") or path == "/v2/rerank" else
                             ("/v2/models/{name}/infer", "post") if path.startswith("/v2") else ("/embed", "post"))
        Draft202012Validator(schema_of(spec, method, route, "default")).validate(reply.json())


def test_rerank_routes_answer_as_described(reranker_server):
    spec = httpx.get(f"{reranker_server.http_url}/openapi.json", timeout=30).json()  # the reranker's own
    validate(spec)
    assert {("post", "/rerank"), ("post", "/v1/rerank"), ("post", "/v2/rerank"), ("post", "/predict"),
            ("post", "/")} <= listed(spec)
    assert not {("post", "/embed"), ("post", "/v1/embeddings"), ("post", "/embed_sparse")} & listed(spec)
    for method, path, body in [*RERANK_CALLS, ("post", "/", {"inputs": "a"})]:  # TEI's / predicts for it
        reply = call(reranker_server, method, path, body)
        assert reply.status_code == 200, (path, reply.text)
        Draft202012Validator(schema_of(spec, method, path, "200")).validate(reply.json())
