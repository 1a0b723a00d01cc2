"""text-embeddings-inference's routes, called by a TEI client as it is (tei-client's HttpClient), against a real
`attnserve serve` process; vectors and tokens checked against the offline engine."""

from __future__ import annotations

import numpy as np
import pytest
from tei_client import HttpClient
from tei_client.models import TruncationDirection

from attnserve.engine.pooling import l2_normalize
from tests.conftest import VARIED_TEXTS

TEXTS = [t for t in VARIED_TEXTS if len(t) < 200]
LONG = "The beginning of a long text. " + "filler words " * 150 + "and its very different ending!"


@pytest.fixture(scope="module")
def tei(server):
    return HttpClient(server.http_url, timeout=60)


def test_info_says_an_embedding_model(tei):
    info = tei.info()
    assert (info.server_model_id, info.server_model_type.value, info.server_model_metadata.pooling) == (
        "sentence-transformers/all-MiniLM-L6-v2", "embedding", "mean")
    assert info.server_model_dtype == "float32" and info.max_input_length == 256
    assert info.max_client_batch_size == 2048 and info.max_batch_tokens == 2048
    assert tei.health()


def test_info_gives_every_field_of_teis_info_with_its_type(server):
    """TEI's Info schema: integers where it says integer (max_concurrent_requests, tokenization_workers), and the
    served_model_name TEI's --served-model-name sets."""
    import httpx

    info = httpx.get(f"{server.http_url}/info", timeout=30).json()
    assert info["served_model_name"] == info["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert isinstance(info["max_concurrent_requests"], int) and info["max_concurrent_requests"] >= 1
    assert isinstance(info["tokenization_workers"], int) and info["tokenization_workers"] >= 1
    for name in ("max_input_length", "max_batch_tokens", "max_client_batch_size"):
        assert isinstance(info[name], int) and info[name] >= 1, name


def test_embed_equals_the_offline_engine(tei, engine):
    got = np.array(tei.embed(TEXTS), dtype=np.float32)
    np.testing.assert_allclose(got, engine.encode(TEXTS, normalize=True).embeddings, atol=1e-5)
    raw = np.array(tei.embed(TEXTS[:2], normalize=False), dtype=np.float32)
    np.testing.assert_allclose(raw, engine.encode(TEXTS[:2], normalize=False).embeddings, atol=1e-5)


def test_embed_truncates_from_either_end(tei, engine):
    # Over-long with truncate false: refused, naming the fix (this client hands the error body back as it is).
    assert tei.embed([LONG], truncate=False) == {
        "error": "input 0: longer than max_seq_length 256 tokens, and the request asked not to truncate; to cut it "
                 'to max_seq_length instead, set "truncate": true in the body', "error_type": "Validation"}
    right = np.array(tei.embed([LONG], truncate=True), dtype=np.float32)[0]
    left = np.array(tei.embed([LONG], truncate=True, truncation_direction=TruncationDirection.Left),
                    dtype=np.float32)[0]
    [kept_left] = engine.tokenizer.encode_texts([LONG], direction="left")
    assert kept_left.truncated and len(kept_left) == 256
    assert engine.tokenizer.tokens(kept_left.ids)[-3:] == ["ending", "!", "[SEP]"]
    np.testing.assert_allclose(right, engine.encode([LONG]).embeddings[0], atol=1e-5)
    np.testing.assert_allclose(left, engine.encode_tokenized([kept_left]).embeddings[0], atol=1e-5)
    assert float(right @ left) < 0.99  # the two ends are different texts


def test_embed_all_gives_the_token_embeddings(tei, engine):
    got = tei.embed_all(TEXTS[:3])
    inputs = engine.tokenizer.encode_texts(TEXTS[:3])
    for tokens, x in zip(got, inputs, strict=True):
        out = engine.run([x])
        np.testing.assert_allclose(np.array(tokens, dtype=np.float32), out.last_hidden_state[0], atol=1e-4)


def test_tokenize_and_decode(tei, engine):
    text = "Héllo,  wörld! Tokenizers split words."
    [result] = tei.tokenize(text)
    assert result.get_ids() == engine.tokenizer.encode_texts([text])[0].ids.tolist()
    first, word = result.tokens[0], result.tokens[1]
    assert (first.text, first.special, first.start) == ("[CLS]", True, None)
    assert (word.text, word.special, word.start, word.stop) == ("Héllo", False, 0, 5)
    assert text[result.tokens[3].start:result.tokens[3].stop] == result.tokens[3].text == "wörld"
    [plain] = tei.tokenize(text, add_special_tokens=False)
    assert plain.get_ids() == result.get_ids()[1:-1]
    assert tei.decode(result.get_ids()) == ["hello, world! tokenizers split words."]
    assert tei.decode([result.get_ids()[:3], [101, 102]], skip_special_tokens=False) == ["[CLS] hello,", "[CLS] [SEP]"]


def test_dimensions_on_embed(server, engine):
    import httpx

    reply = httpx.post(f"{server.http_url}/embed", json={"inputs": TEXTS[:2], "dimensions": 32}, timeout=60)
    assert reply.status_code == 200, reply.text
    raw = engine.encode(TEXTS[:2], normalize=False).embeddings
    np.testing.assert_allclose(np.array(reply.json(), dtype=np.float32), l2_normalize(raw[:, :32]), atol=1e-5)


def test_errors_in_teis_shape(server):
    import httpx

    cases = {
        "/embed": ({"inputs": ["fine", ""]}, 400, "input 1: empty text", "Validation"),
        "/embed_all": ({"inputs": [[101, 99999, 102]]}, 400, "input 0: token id 99999 is out of range", "Validation"),
        "/tokenize": ({"inputs": "x", "prompt_name": "query"}, 400, "prompt_name 'query' does not exist", "Validation"),
        "/decode": ({"ids": "nope"}, 400, "ids: must be a list of token ids or a list of lists", "Validation"),
    }
    for route, (body, status, message, kind) in cases.items():
        reply = httpx.post(f"{server.http_url}{route}", json=body, timeout=60)
        assert reply.status_code == status, (route, reply.text)
        assert reply.json()["error"].startswith(message) and reply.json()["error_type"] == kind, (route, reply.json())


def test_pooling_per_request_on_the_http_routes_equals_grpcs(server, stub):
    """`pooling` on /embed and /v1/embeddings, as gRPC's EmbedRequest.pooling: CLS pooling of the same model gives
    gRPC's vectors (it was ignored on /embed, refused on /v1/embeddings); an unknown pooling is refused, naming it."""
    import httpx

    from attnserve.v1 import encoder_pb2 as pb

    texts = TEXTS[:4]
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts], pooling=pb.CLS, normalize=True))
    want = np.stack([np.frombuffer(e.sentence_embedding.data, "<f4") for e in reply.embeddings])
    tei = np.array(httpx.post(f"{server.http_url}/embed", json={"inputs": texts, "pooling": "cls"},
                              timeout=60).json(), dtype=np.float32)
    openai = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": texts, "model": "", "pooling": "cls"},
                        timeout=60).json()
    np.testing.assert_allclose(tei, want, atol=1e-5)
    np.testing.assert_allclose(np.array([d["embedding"] for d in openai["data"]], dtype=np.float32), want, atol=1e-5)
    mean = np.array(httpx.post(f"{server.http_url}/embed", json={"inputs": texts}, timeout=60).json())
    assert np.abs(mean - tei).max() > 1e-2  # the model's own (mean) pooling is another
    refused = httpx.post(f"{server.http_url}/embed", json={"inputs": texts, "pooling": "max"}, timeout=60)
    assert refused.status_code in (400, 422) and "pooling" in refused.json()["error"]
