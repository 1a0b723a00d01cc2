"""Sentence pairs on the wire: gRPC Input.pair and HTTP [[a, b]] items, with Embedding.pair_start / a JSON
`pair_start` telling where segment b starts; the Python client's pairs and rerank. An embedder whose graph takes
no token types (helper fam adds the input to BERT-family graphs) refuses pairs with one clear error, never
encoding them as one segment."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from attnserve.client.client import Client, RequestError

PAIR = ("What do cats eat?", "Cats eat meat.")


def test_a_pair_over_grpc(server, engine):
    expected = engine.tokenizer.encode_pairs([PAIR])[0]
    with Client(server.target) as client:
        if not engine.takes_token_types:
            with pytest.raises(RequestError) as caught:
                client.encode([PAIR, "a single text"])
            assert caught.value.error_details.code.name == "INVALID_ARGUMENT"
            assert "input 0: " in str(caught.value) and "take no token types" in str(caught.value)
            return
        pair, single = client.encode([PAIR, "a single text"], attention_layers=[-1])
    assert pair.pair_start == expected.pair_start and single.pair_start is None
    assert pair.tokens == engine.tokenizer.tokens(expected.ids)  # both segments' word pieces
    assert pair.attentions.shape[-1] == len(expected)
    want = engine.encode_tokenized([expected]).embeddings[0]
    assert np.abs(pair.sentence_embedding - want).max() <= 1e-5


def test_a_pair_over_http(server, engine):
    reply = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": [list(PAIR)]}, timeout=60)
    if not engine.takes_token_types:
        assert reply.status_code == 400 and "take no token types" in reply.json()["error"]["message"]
        return
    item = reply.json()["data"][0]
    assert item["pair_start"] == engine.tokenizer.encode_pairs([PAIR])[0].pair_start


def test_two_strings_stay_two_texts_on_teis_embed(server):
    """TEI's /embed reads ["a", "b"] as two texts, as TEI does; a pair is [["a", "b"]]."""
    reply = httpx.post(f"{server.http_url}/embed", json={"inputs": list(PAIR)}, timeout=60)
    assert reply.status_code == 200 and len(reply.json()) == 2


def test_client_reranks(reranker_server):
    with Client(reranker_server.target) as client:
        results = client.rerank("what do cats eat", ["stocks fell", "cats eat meat", "kittens"], top_n=2,
                                return_text=True)
        assert len(results) == 2 and results[0].score >= results[1].score
        assert all(r.text == ["stocks fell", "cats eat meat", "kittens"][r.index] for r in results)
        with pytest.raises(RequestError, match="is a reranker"):
            client.encode([PAIR])

