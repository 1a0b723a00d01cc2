"""Request bodies on every HTTP door, against a real `attnserve serve`: one integer rule (8, not 8.0) on every
integer field of every door; an unknown field, or another door's name for one, answered with the route's fields or
its own name for it; an image sent to a route of texts told where images go. Every error is one line of JSON in its
route's family envelope (docs/http.md, Request bodies)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.doors import MODEL, check_envelope, family, message

INFER = f"/v2/models/{MODEL}/infer"


def whole(field: str, value: int) -> str:
    return f"{field}: must be an integer, written without a fraction or exponent: {value}, not {float(value)!r}"


TOKEN_IDS = "; a token id must be an integer, written without a fraction or exponent: 101, not 101.0"


def tensor(shape: list, data: list) -> dict:
    return {"name": "text", "datatype": "BYTES", "shape": shape, "data": data}


# (route, body: JSON or its raw bytes, what the error says): a float where an integer belongs, on every door.
FLOATS = [
    ("/v1/embeddings", {"input": "a", "model": "", "dimensions": 8.0}, whole("dimensions", 8)),
    ("/embeddings", {"input": "a", "model": "", "dimensions": 8.0}, whole("dimensions", 8)),
    ("/v1/embeddings", {"input": "a", "model": "", "dimensions": 8.5}, "dimensions: must be an integer, got 8.5"),
    ("/v1/embeddings", {"input": [[101.0, 102.0]], "model": ""}, TOKEN_IDS),
    ("/v1/embeddings", {"input": [101, 102.0], "model": ""}, "; a token id must be an integer, written without a "
                                                             "fraction or exponent: 102, not 102.0"),
    ("/embeddings_image", {"input": "aGVsbG8=", "model": "", "dimensions": 8.0}, whole("dimensions", 8)),
    ("/embed", {"inputs": "a", "dimensions": 8.0}, whole("dimensions", 8)),
    ("/embed", b'{"inputs": "a", "dimensions": 8e0}', whole("dimensions", 8)),  # an exponent makes a float too
    ("/", {"inputs": "a", "dimensions": 8.0}, whole("dimensions", 8)),
    ("/embed", {"inputs": [[101.0, 102.0]]}, TOKEN_IDS),
    ("/embed_all", {"inputs": [101.0, 102.0]}, TOKEN_IDS),
    ("/embed_sparse", {"inputs": "a", "top_k": 3.0}, whole("top_k", 3)),
    ("/decode", {"ids": [101.0]}, TOKEN_IDS),
    ("/v2/embed", {"model": "", "texts": ["a"], "output_dimension": 8.0}, whole("output_dimension", 8)),
    ("/v2/embed", {"model": "", "texts": ["a"], "max_tokens": 512.0}, whole("max_tokens", 512)),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 1.0}, whole("top_n", 1)),
    ("/v2/rerank", {"model": "", "query": "q", "documents": ["a"], "top_n": 1.0}, whole("top_n", 1)),
    ("/v2/rerank", {"model": "", "query": "q", "documents": ["a"], "max_tokens_per_doc": 2.0},
     whole("max_tokens_per_doc", 2)),
    ("/v1/attention", {"inputs": "a", "layers": [1.0]}, whole("layers[0]", 1)),
    ("/v1/attention", {"inputs": "a", "heads": [0, 1.0]}, whole("heads[1]", 1)),
    ("/embed_chunks", {"inputs": "a b", "spans": [[[0.0, 1]]]}, whole("spans[0][0][0]", 0)),
    ("/embed_chunks", {"inputs": "a b", "chunker": "tokens", "chunk_tokens": 2.0}, whole("chunk_tokens", 2)),
    (INFER, {"inputs": [tensor([1.0], ["a"])]}, whole("inputs[0].shape[0]", 1)),
    (INFER, {"inputs": [tensor([1], ["a"])], "parameters": {"dimensions": 8.0}}, whole("parameters.dimensions", 8)),
]
# The same requests with integers, where the server's model answers them: only the spelling was refused.
INTEGERS = [
    ("/v1/embeddings", {"input": "a", "model": "", "dimensions": 8}),
    ("/embeddings", {"input": [[101, 102]], "model": ""}),
    ("/embed", {"inputs": "a", "dimensions": 8}),
    ("/", {"inputs": [[101, 102]]}),
    ("/embed_all", {"inputs": [101, 102]}),
    ("/decode", {"ids": [101]}),
    ("/v2/embed", {"model": "", "texts": ["a"], "output_dimension": 8, "max_tokens": 512}),
    ("/embed_chunks", {"inputs": "a b", "spans": [[[0, 1]]]}),
    ("/embed_chunks", {"inputs": "a b", "chunker": "tokens", "chunk_tokens": 2}),
    (INFER, {"inputs": [tensor([1], ["a"])], "parameters": {"dimensions": 8}}),
]
TEXT_INPUTS = "(it is OpenAI's name, for /v1/embeddings): send inputs"
# (route, body, what the error says): on every route, a field it does not take. Most refuse it, listing theirs;
# TEI's and KServe's ignore it (as TEI and Triton do), and name it beside a required field that is missing; a
# field that another door names so is said as that door's, with the route's own name.
FIELDS = [
    ("/v1/embeddings", {"inputs": ["a"], "model": ""},
     "inputs: not a field of /v1/embeddings (it is TEI's name, for /embed): send input"),
    ("/embeddings", {"inputs": ["a"], "model": ""},
     "inputs: not a field of /embeddings (it is TEI's name, for /embed): send input"),
    ("/v1/embeddings", {"input": "a", "model": "", "temperature": 1},
     "temperature: not a field of /v1/embeddings; its fields: input, messages, model, encoding_format, dimensions, "
     "user, truncate, prompt_name, prompt, task, pooling"),
    ("/v1/embeddings", {"texts": ["a"], "model": ""},
     "texts: not a field of /v1/embeddings (it is Cohere's name, for /v2/embed): send input"),
    ("/v1/embeddings", {"model": "", "messages": [{"role": "user", "content": "a", "name": "x"}]},
     "messages[0].name: not a field of messages[0]; its fields: role, content"),
    ("/embeddings_image", {"inputs": ["aGVsbG8="], "model": ""},
     "inputs: not a field of /embeddings_image (it is TEI's name, for /embed): send input"),
    ("/embed", {"input": "a"}, f"input: not a field of /embed {TEXT_INPUTS}"),
    ("/", {"input": "a"}, f"input: not a field of / {TEXT_INPUTS}"),
    ("/embed_all", {"input": "a"}, f"input: not a field of /embed_all {TEXT_INPUTS}"),
    ("/embed_sparse", {"input": "a"}, f"input: not a field of /embed_sparse {TEXT_INPUTS}"),
    ("/predict", {"input": "a"}, f"input: not a field of /predict {TEXT_INPUTS}"),
    ("/tokenize", {"input": "a"}, f"input: not a field of /tokenize {TEXT_INPUTS}"),
    ("/embed", {"text": "a"}, "inputs: required (text: not a field of /embed; its fields: model, inputs, normalize, "
                              "truncate"),
    ("/similarity", {"source_sentence": "a", "sentences": ["b"]},
     "inputs: required (source_sentence, sentences: not fields of /similarity; its fields: "),
    ("/decode", {"tokens": [101]}, "ids: required (tokens: not a field of /decode; its fields: model, ids, "
                                   "skip_special_tokens)"),
    ("/rerank", {"query": "q", "documents": ["a"]},
     "documents: not a field of /rerank (it is Cohere's name, for /v1/rerank and /v2/rerank): send texts"),
    ("/v1/rerank", {"query": "q", "texts": ["a"]},
     "texts: not a field of /v1/rerank (it is TEI's name, for /rerank): send documents"),
    ("/v1/rerank", {"query": "q", "documents": [{"text": "a", "title": "t"}]},
     "documents[0].title: not a field of documents[0]; its fields: text"),
    ("/v2/rerank", {"model": "", "query": "q", "texts": ["a"]},
     "texts: not a field of /v2/rerank (it is TEI's name, for /rerank): send documents"),
    ("/v2/embed", {"model": "", "input": ["a"]},
     "input: not a field of /v2/embed (it is OpenAI's name, for /v1/embeddings): send texts"),
    ("/v2/embed", {"model": "", "texts": ["a"], "dimensions": 8},
     "dimensions: not a field of /v2/embed (it is OpenAI's and TEI's name): send output_dimension"),
    ("/v1/attention", {"input": "a"}, f"input: not a field of /v1/attention {TEXT_INPUTS}"),
    ("/v1/attention", {"inputs": "a", "layer": 1}, "layer: not a field of /v1/attention; its fields: inputs, model, "
                                                   "layers, heads"),
    ("/embed_chunks", {"input": "a", "chunker": "sentences"}, f"input: not a field of /embed_chunks {TEXT_INPUTS}"),
    ("/embed_multi", {"input": "a"}, f"input: not a field of /embed_multi {TEXT_INPUTS}"),
    ("/v1/zero_shot", {"images": ["aGVsbG8="], "labels": ["a"], "temperature": 1},
     "temperature: not a field of /v1/zero_shot; its fields: model, images, labels, template"),
    (INFER, {"input": [tensor([1], ["a"])]},
     f"inputs: required (input: not a field of {INFER}; its fields: id, parameters, inputs, outputs)"),
]
# Unknown fields TEI's and KServe's routes ignore, as TEI and Triton do (tei-client sends normalize to /embed_all).
IGNORED = [
    ("/embed", {"inputs": "a", "normalise": True}),
    ("/embed_all", {"inputs": "a", "normalize": True}),
    ("/tokenize", {"inputs": "a", "options": {}}),
    (INFER, {"inputs": [tensor([1], ["a"])], "model_name": MODEL}),
    ("/v2/repository/index", {"repository_name": "", "unknown": 1}),
]


def post(server, route: str, body: dict | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.http_url + route, content=content, headers={"Content-Type": "application/json"},
                      timeout=60)


def refused(reply: httpx.Response, route: str) -> str:
    """The message of a 400, checked to be one line of JSON in the envelope of the route's family."""
    assert "\n" not in reply.text.strip() and "Traceback" not in reply.text, reply.text
    body = check_envelope(family(route), reply, 400)
    if family(route) == "openai":  # param names the field the message does
        assert body["error"]["code"] == "invalid_input" and message(body).startswith(f"{body['error']['param']}: ")
    return message(body)


@pytest.mark.parametrize("route, body, message", FLOATS, ids=[f"{r}-{i}" for i, (r, *_) in enumerate(FLOATS)])
def test_a_float_where_an_integer_belongs_is_refused_on_every_door(server, route, body, message):
    assert message in refused(post(server, route, body), route)


@pytest.mark.parametrize("route, body", INTEGERS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(INTEGERS)])
def test_the_same_fields_as_integers_are_answered(server, route, body):
    reply = post(server, route, body)
    assert reply.status_code == 200, (route, reply.text)


@pytest.mark.parametrize("route, body, message", FIELDS, ids=[f"{r}-{i}" for i, (r, *_) in enumerate(FIELDS)])
def test_a_field_the_route_does_not_take_is_named_with_the_routes_own(server, route, body, message):
    assert refused(post(server, route, body), route).startswith(message)


@pytest.mark.parametrize("route, body", IGNORED, ids=[r for r, _ in IGNORED])
def test_teis_and_kserves_routes_ignore_unknown_fields_beside_their_own(server, route, body):
    assert post(server, route, body).status_code == 200


def test_openapi_json_types_integers_and_says_how_they_are_written(server):
    spec = httpx.get(f"{server.http_url}/openapi.json", timeout=30).json()
    assert "8, not 8.0" in spec["info"]["description"]
    dimensions = spec["components"]["schemas"]["OpenAIEmbeddingsBody"]["properties"]["dimensions"]
    assert {"type": "integer"} in dimensions["anyOf"], dimensions
    assert (dimensions["minimum"], dimensions["maximum"]) == (1, 384), dimensions


# --- an image-text model: an image sent to a route of texts ----------------------------------------------------

@pytest.mark.parametrize("route, inputs, where", [
    ("/embed_all", "list", "inputs[1]"), ("/embed_all", "object", "inputs"), ("/embed", "list", "inputs[1]"),
    ("/tokenize", "list", "inputs[1]")])
def test_an_image_sent_to_a_route_of_texts_is_told_where_images_go(clip_server, route, inputs, where):
    from tests.test_image_serving import data_uri, png

    image = {"image": data_uri(png(0))}
    message = refused(post(clip_server, route, {"inputs": ["a cat", image] if inputs == "list" else image}), route)
    assert message.startswith(f"{where}: an image, which {route} does not take: its inputs are a string"), message
    assert "an image-text model's images go to /v1/embeddings (input: [{\"image\": ...}])" in message, message
    if route == "/embed_all":
        assert "(token embeddings are served for texts only)" in message
    # where the message sends it, the same image is embedded, beside the text
    reply = post(clip_server, "/v1/embeddings", {"model": "", "input": [{"text": "a cat"}, image]})
    assert reply.status_code == 200 and len(reply.json()["data"]) == 2, reply.text
    assert "Traceback" not in clip_server.log_tail()
