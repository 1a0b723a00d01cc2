"""POST /v1/attention: attention weights with their word pieces over HTTP, the same as gRPC's, as nested lists or
base64, against a real `attnserve serve` process."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from attnserve.client import Client

TEXT = "The cat sat on the mat because it was tired."


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
    got = maps(item)
    np.testing.assert_allclose(got, expected.attentions, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, atol=1e-5)
    assert reply.json()["usage"] == {"prompt_tokens": 13, "total_tokens": 13}


def test_chosen_heads_averaged_and_base64(server):
    full = maps(attention(server, inputs=[TEXT, "A second input."]).json()["data"][0])  # (1, 12, T, T)
    chosen = attention(server, inputs=[TEXT, "A second input."], heads=[3, -1], encoding_format="base64")
    averaged = attention(server, inputs=[TEXT], heads=[3, -1], average_heads=True, encoding_format="base64")
    first = chosen.json()["data"][0]
    assert first["heads"] == [3, 11] and first["shape"] == [1, 2, 13, 13] and isinstance(first["attentions"], str)
    np.testing.assert_array_equal(maps(first), full[:, [3, 11]])
    assert chosen.json()["data"][1]["tokens"] == ["[CLS]", "a", "second", "input", ".", "[SEP]"]
    [mean] = averaged.json()["data"]
    assert mean["shape"] == [1, 1, 13, 13]
    np.testing.assert_allclose(maps(mean), full[:, [3, 11]].mean(axis=1, keepdims=True), atol=1e-6)


def test_token_ids_and_truncation(server, engine):
    ids = engine.tokenizer.encode_texts([TEXT])[0].ids.tolist()
    by_ids = attention(server, inputs=ids).json()["data"][0]
    by_text = attention(server, inputs=TEXT).json()["data"][0]
    np.testing.assert_array_equal(maps(by_ids), maps(by_text))
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
