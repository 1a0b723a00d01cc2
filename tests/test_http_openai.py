"""The OpenAI embeddings API, called by the clients users have: the official `openai` SDK and LangChain's
OpenAIEmbeddings, against a real `attnserve serve` process; vectors checked against the offline engine."""

from __future__ import annotations

import threading

import numpy as np
import openai
import pytest

from attnserve.engine.pooling import l2_normalize
from tests.conftest import GUARD_KEY, GUARDED_ALIASES, GUARDED_QUEUE_TOKENS
from tests.doors import MODEL, TEXTS
from tests.test_server_load import mixed_texts

LONG = "word " * 300


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def vectors(reply) -> np.ndarray:
    assert [d.index for d in reply.data] == list(range(len(reply.data)))
    return np.array([d.embedding for d in reply.data], dtype=np.float32)


def token_ids(engine, texts):
    return [x.ids.tolist() for x in engine.tokenizer.encode_texts(texts)]


# case: (create's arguments, the offline engine's vectors, the prompt tokens) for the SDK's replies.
ANSWERS = {
    "texts": (lambda e: dict(input=TEXTS), lambda e: e.encode(TEXTS, normalize=True).embeddings,
              lambda e: int(e.encode(TEXTS).num_tokens.sum())),
    "a single string": (lambda e: dict(input=TEXTS[0]), lambda e: e.encode(TEXTS[:1]).embeddings, lambda e: 12),
    "dimensions keep the first n, then normalise": (
        lambda e: dict(input=TEXTS[:3], dimensions=64),
        lambda e: l2_normalize(e.encode(TEXTS[:3], normalize=False).embeddings[:, :64]), None),
    "token ids": (lambda e: dict(input=token_ids(e, TEXTS[:2])), lambda e: e.encode(TEXTS[:2]).embeddings,
                  lambda e: sum(map(len, token_ids(e, TEXTS[:2])))),
    "one input of token ids": (lambda e: dict(input=token_ids(e, TEXTS[1:2])[0]),
                               lambda e: e.encode(TEXTS[1:2]).embeddings, lambda e: len(token_ids(e, TEXTS[1:2])[0])),
    "truncate, attnserve's extension": (lambda e: dict(input=LONG, extra_body={"truncate": True}),
                                        lambda e: e.encode([LONG]).embeddings, lambda e: 256),
}


@pytest.mark.parametrize("encoding_format", [openai.NOT_GIVEN, "float"])  # the SDK asks for base64 by default
@pytest.mark.parametrize("case", list(ANSWERS))
def test_the_sdks_replies_equal_the_offline_engine(client, engine, case, encoding_format):
    arguments, offline, tokens = ANSWERS[case]
    reply = client.embeddings.create(model=MODEL, encoding_format=encoding_format, **arguments(engine))
    got = vectors(reply)
    np.testing.assert_allclose(got, offline(engine), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert reply.model == MODEL and reply.object == "list"
    if tokens is not None:
        assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens(engine)


def test_served_model_aliases_and_the_models_list(guarded_server):
    with openai.OpenAI(base_url=f"{guarded_server.http_url}/v1", api_key=GUARD_KEY, max_retries=0) as c:
        assert [m.id for m in c.models.list()] == [MODEL, *GUARDED_ALIASES]
        assert c.models.retrieve(MODEL).id == MODEL and c.models.retrieve("minilm").owned_by == "attnserve"
        a = c.embeddings.create(input="aliases name one model", model="text-embedding-3-small")
        b = c.embeddings.create(input="aliases name one model", model=MODEL)
        assert a.model == "text-embedding-3-small"
        np.testing.assert_array_equal(vectors(a), vectors(b))
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("gpt-4")


# case: (what is sent, param, the message); unknown fields and floats for integers: tests/test_http_bodies.py.
ERRORS = {
    "empty text": (dict(input=["fine", "  "]), "input[1]", "input 1: empty text"),
    "no inputs": (dict(input=[]), "input", "no inputs: send 1 to 2048 inputs"),
    "too many inputs": (dict(input=["x"] * 2049), "input",
                        "too many inputs: 2049; this server takes at most 2048 per request"),
    "token id out of range": (dict(input=[[101, 30522, 102]]), "input[0]",
                              "input 0: token id 30522 is out of range [0, 30522)"),
    "over-long with truncate false": (dict(input=[LONG], extra_body={"truncate": False}), "input[0]",
                                      "input 0: longer than max_seq_length 256 tokens, and the request asked not to "
                                      "truncate; to cut it to max_seq_length instead, set \"truncate\": true in the "
                                      "body (the openai SDK: extra_body={\"truncate\": True})"),
    "dimensions above the hidden size": (dict(input="x", dimensions=385), "dimensions",
                                         "dimensions 385 is out of range: this model's embeddings have 384 (ask for 1 "
                                         "to 384)"),
    "dimensions 0": (dict(input="x", dimensions=0), "dimensions", "dimensions 0 is out of range"),
    "a bad encoding_format": (dict(input="x", encoding_format="int8"), "encoding_format",
                              "encoding_format: input should be 'float' or 'base64'"),
    "a mixed input": (dict(input=["x", 5]), "input", "input: must be a string, a list of strings, a list of token ids, "
                                                     "a list of lists of token ids or (an image-text model's, as "
                                                     "Jina's API) a list of"),
}


def test_errors_arrive_as_the_sdks_typed_exceptions(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.embeddings.create(input="x", model="text-embedding-3-small")
    assert error.value.code == "model_not_found" and error.value.param == "model"
    for case, (kwargs, param, message) in ERRORS.items():
        with pytest.raises(openai.BadRequestError) as error:
            client.embeddings.create(model=MODEL, **kwargs)
        assert error.value.param == param and error.value.code == "invalid_input", case
        assert error.value.body["message"].startswith(message), (case, error.value.body)


def test_langchains_1000_texts_over_the_queues_budget_are_admitted_in_parts(guarded_server, engine):
    """LangChain's default batch, 1,000 texts a request, holding several times what the queue holds
    (--max-queue-tokens 1024): admitted in parts, answered whole and in order (it was a 413), while a query sent
    meanwhile is answered too."""
    from langchain_openai import OpenAIEmbeddings

    texts = [" ".join(t.split()[:12]) for t in mixed_texts(1000, seed=3)]
    tokens = sum(len(ids) for ids in engine.tokenizer.encode_texts(texts))
    assert tokens > 3 * GUARDED_QUEUE_TOKENS, tokens
    # check_embedding_ctx_length=False: else LangChain sends tiktoken ids, which a BERT vocabulary cannot read.
    embeddings = OpenAIEmbeddings(model=MODEL, base_url=f"{guarded_server.http_url}/v1", api_key=GUARD_KEY,
                                  check_embedding_ctx_length=False, max_retries=0, request_timeout=600)
    query: list[np.ndarray] = []
    meanwhile = threading.Timer(
        0.5, lambda: query.append(np.array(embeddings.embed_query("what does the fox jump over?"), dtype=np.float32)))
    meanwhile.start()
    documents = np.array(embeddings.embed_documents(texts), dtype=np.float32)
    meanwhile.join()
    assert documents.shape == (1000, 384)
    np.testing.assert_allclose(documents, engine.encode(texts).embeddings, atol=1e-5)
    np.testing.assert_allclose(query[0], engine.encode(["what does the fox jump over?"]).embeddings[0], atol=1e-5)
