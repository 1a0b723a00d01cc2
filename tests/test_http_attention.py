"""POST /v1/attention: attention weights with their word pieces over HTTP, the same as gRPC's, as nested lists or
base64, against a real `attnserve serve` process. And sentence pairs on the wire: gRPC Input.pair and HTTP [[a, b]]
items, with Embedding.pair_start / a JSON `pair_start` telling where segment b starts; the Python client's pairs and
rerank. An embedder whose graph takes no token types refuses pairs with one clear error, never encoding them as one
segment."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from attnserve.client import Client, RequestError

TEXT = "The cat sat on the mat because it was tired."
PAIR = ("What do cats eat?", "Cats eat meat.")


def attention(server, **body) -> httpx.Response:
    return httpx.post(f"{server.http_url}/v1/attention", json=body, timeout=60)


def maps(item: dict) -> np.ndarray:
    if isinstance(item["attentions"], str):
        return np.frombuffer(base64.b64decode(item["attentions"]), dtype="<f4").reshape(item["shape"])
    return np.array(item["attentions"], dtype=np.float32)


def test_every_head_of_two_layers_equals_grpc(server):
    reply = attention(server, inputs=TEXT, layers=[0, -1])
    assert reply.status_code == 200, reply.text
    [item] = reply.json()["data"]
    with Client(server.target) as client:
        expected = client.attention(TEXT, layers=[0, -1])
    assert item["tokens"] == expected.tokens and item["tokens"][:3] == ["[CLS]", "the", "cat"]
    assert (item["layers"], item["heads"], item["shape"]) == ([0, 5], list(range(12)), [2, 12, 13, 13])
    assert (item["num_tokens"], item["truncated"]) == (13, False)
    np.testing.assert_allclose(maps(item), expected.attentions, atol=1e-6)
    np.testing.assert_allclose(maps(item).sum(axis=-1), 1.0, atol=1e-5)
    assert reply.json()["usage"] == {"prompt_tokens": 13, "total_tokens": 13}


def test_chosen_heads_averaged_base64_token_ids_and_truncation(server, engine):
    full = maps(attention(server, inputs=[TEXT, "A second input."]).json()["data"][0])  # (1, 12, T, T)
    chosen = attention(server, inputs=[TEXT, "A second input."], heads=[3, -1], encoding_format="base64").json()
    first = chosen["data"][0]
    assert first["heads"] == [3, 11] and first["shape"] == [1, 2, 13, 13] and isinstance(first["attentions"], str)
    np.testing.assert_array_equal(maps(first), full[:, [3, 11]])
    assert chosen["data"][1]["tokens"] == ["[CLS]", "a", "second", "input", ".", "[SEP]"]
    averaged = attention(server, inputs=[TEXT], heads=[3, -1], average_heads=True, encoding_format="base64")
    [mean] = averaged.json()["data"]
    assert mean["shape"] == [1, 1, 13, 13]
    np.testing.assert_allclose(maps(mean), full[:, [3, 11]].mean(axis=1, keepdims=True), atol=1e-6)
    by_ids = attention(server, inputs=engine.tokenizer.encode_texts([TEXT])[0].ids.tolist()).json()["data"][0]
    np.testing.assert_array_equal(maps(by_ids), maps(attention(server, inputs=TEXT).json()["data"][0]))
    long = attention(server, inputs="word " * 300, truncate=True, average_heads=True).json()["data"][0]
    assert (long["num_tokens"], long["truncated"], long["shape"]) == (256, True, [1, 1, 256, 256])


@pytest.mark.parametrize("body, param, message", [
    (dict(inputs=TEXT, layers=[6]), "layers[0]",
     "layers[0]: layer 6 is out of range: this model has 6 layers, 0..5 or -6..-1"),
    (dict(inputs=TEXT, heads=[0, -13]), "heads[1]",
     "heads[1]: head -13 is out of range: this model has 12 heads, 0..11 or -12..-1"),
    (dict(inputs=TEXT, layers=["last"]), "layers[0]", "layers[0]: input should be a valid integer"),
    (dict(inputs=["word " * 300] * 20, truncate=True, layers=list(range(6))), None,
     "the reply would be about 1260.1 MiB"),  # 20 x 6 x 12 x 256 x 256 floats as JSON text: 3.5x gRPC's
    (dict(inputs=TEXT, model="gpt-4"), "model", "the model 'gpt-4' does not exist here"),
])
def test_bad_requests_name_the_field(server, body, param, message):
    reply = attention(server, **body)
    error = reply.json()["error"]
    assert reply.status_code == (404 if param == "model" else 400), reply.text
    assert error["param"] == param and error["message"].startswith(message), error


def test_a_pair_over_grpc_and_http(server, engine):
    # TEI's /embed reads ["a", "b"] as two texts, as TEI does; a pair is [["a", "b"]].
    two = httpx.post(f"{server.http_url}/embed", json={"inputs": list(PAIR)}, timeout=60)
    assert two.status_code == 200 and len(two.json()) == 2
    expected = engine.tokenizer.encode_pairs([PAIR])[0]
    reply = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": [list(PAIR)]}, timeout=60)
    with Client(server.target) as client:
        if not engine.takes_token_types:
            assert reply.status_code == 400 and "take no token types" in reply.json()["error"]["message"]
            with pytest.raises(RequestError) as caught:
                client.encode([PAIR, "a single text"])
            assert caught.value.error_details.code.name == "INVALID_ARGUMENT"
            assert "input 0: " in str(caught.value) and "take no token types" in str(caught.value)
            return
        pair, single = client.encode([PAIR, "a single text"], attention_layers=[-1])
    assert reply.json()["data"][0]["pair_start"] == expected.pair_start
    assert pair.pair_start == expected.pair_start and single.pair_start is None
    assert pair.tokens == engine.tokenizer.tokens(expected.ids)  # both segments' word pieces
    assert pair.attentions.shape[-1] == len(expected)
    assert np.abs(pair.sentence_embedding - engine.encode_tokenized([expected]).embeddings[0]).max() <= 1e-5


def test_client_reranks(reranker_server):
    with Client(reranker_server.target) as client:
        results = client.rerank("what do cats eat", ["stocks fell", "cats eat meat", "kittens"], top_n=2,
                                return_text=True)
        assert len(results) == 2 and results[0].score >= results[1].score
        assert all(r.text == ["stocks fell", "cats eat meat", "kittens"][r.index] for r in results)
        with pytest.raises(RequestError, match="is a reranker"):
            client.encode([PAIR])
