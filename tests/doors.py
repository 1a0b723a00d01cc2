"""What the tests of the serving doors share: the default model's name, texts within its max_seq_length, a text past
it, and each HTTP API family's error envelope (docs/http.md)."""

from __future__ import annotations

from tests.conftest import VARIED_TEXTS

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = [t for t in VARIED_TEXTS if len(t) < 200]
LONG = "The beginning of a long text. " + "filler words " * 150 + "and its very different ending!"
# Cohere's routes answer in OpenAI's envelope.
OPENAI_ROUTES = ("/v1/", "/embeddings", "/v2/embed", "/v2/rerank")


def family(route: str) -> str:
    """The family whose envelope a served route answers its errors in."""
    if route.startswith(("/v2/models", "/v2/repository")):
        return "kserve"
    return "openai" if route.startswith(OPENAI_ROUTES) else "tei"


def check_envelope(family: str, reply, status: int) -> dict:
    """Asserts an httpx reply's status and `family`'s envelope; returns the body."""
    assert reply.status_code == status, reply.text
    body = reply.json()
    if family.startswith("openai"):
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    elif family == "kserve":
        assert set(body) == {"error"} and isinstance(body["error"], str), body
    else:
        assert set(body) == {"error", "error_type"}, body
    return body


def message(body: dict) -> str:
    return body["error"]["message"] if isinstance(body["error"], dict) else body["error"]
