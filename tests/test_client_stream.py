"""Client.embed_stream, the client's method for the EmbedStream RPC, against a real server over loopback."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from attnserve.client import Client, RequestError
from tests.conftest import VARIED_TEXTS

BATCHES = [VARIED_TEXTS[:2], ["one more"], VARIED_TEXTS[2:6], [[101, 7592, 102]]]  # texts, and token ids


def test_embed_stream_answers_each_batch_in_order_as_embed_does(server):
    with Client(server.target) as client:
        streamed = list(client.embed_stream(iter(BATCHES), truncate=True))
        alone = [client.embed(batch, truncate=True) for batch in BATCHES]
        unnormalised = next(client.embed_stream([BATCHES[0]], normalize=False, truncate=True))
    assert [a.shape for a in streamed] == [(len(batch), 384) for batch in BATCHES]
    for got, expected in zip(streamed, alone, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.all(np.abs(np.linalg.norm(unnormalised, axis=1) - 1) > 1e-3)  # the options reach every request


def test_embed_stream_raises_request_error_naming_the_request_after_the_replies_before_it(server):
    with Client(server.target) as client:
        stream = client.embed_stream([["fine"], ["", "x"], ["never answered"]])
        assert next(stream).shape == (1, 384)
        with pytest.raises(RequestError) as caught:
            next(stream)
    details = caught.value.error_details
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT and details.request_index == 1
    assert details.field == "inputs[0].text" and "request 1: input 0: empty text" in details.message
