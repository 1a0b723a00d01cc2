"""The self-written encoder against sentence-transformers' own all-MiniLM-L6-v2 (the minGPT-style reference test)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnserve.engine.batching import pad
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.model.pooling import pool

from .conftest import VARIED_TEXTS


@pytest.fixture(scope="session")
def sentence_transformer(checkpoint):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(checkpoint.directory), device="cpu")


@pytest.fixture(scope="session")
def tokenizer(checkpoint):
    return TextTokenizer(checkpoint.tokenizer_file, checkpoint.max_seq_length, checkpoint.config.vocab_size)


def test_tokenizer_matches_sentence_transformers(tokenizer, sentence_transformer):
    # tokenizer.json itself truncates at 128 and pads to 128; the engine must use 256 and no padding.
    theirs = sentence_transformer.tokenize(VARIED_TEXTS)
    ours = tokenizer.encode_texts(VARIED_TEXTS)
    for i, x in enumerate(ours):
        n = int(theirs["attention_mask"][i].sum())
        assert x.ids.tolist() == theirs["input_ids"][i, :n].tolist()
    assert max(len(x) for x in ours) == 256
    assert [x.truncated for x in ours] == [False] * 6 + [True, True]


def test_encoder_matches_sentence_transformers(encoder, tokenizer, sentence_transformer, checkpoint):
    reference = sentence_transformer.encode(VARIED_TEXTS, normalize_embeddings=False)  # (N, H)
    reference_tokens = sentence_transformer.encode(VARIED_TEXTS, output_value="token_embeddings")
    ids, mask = pad([x.ids for x in tokenizer.encode_texts(VARIED_TEXTS)])
    with torch.no_grad():
        hidden, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
        ours = pool(hidden, torch.from_numpy(mask), checkpoint.pooling).numpy()
    cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.99999, cosine
    for i, tokens in enumerate(reference_tokens):
        n = tokens.shape[0]
        assert np.abs(hidden[i, :n].numpy() - tokens.numpy()).max() <= 1e-4


def test_default_pipeline_normalizes(checkpoint):
    # all-MiniLM-L6-v2's modules.json ends in Normalize; the manifest records it as the default.
    assert checkpoint.pooling == "mean" and checkpoint.normalize and checkpoint.max_seq_length == 256


def test_attention_rows_sum_to_one_and_padded_keys_get_zero(encoder, tokenizer):
    ids, mask = pad([x.ids for x in tokenizer.encode_texts(["short one", "a somewhat longer sentence than that"])])
    with torch.no_grad():
        _, attentions = encoder(torch.from_numpy(ids), torch.from_numpy(mask), output_attentions=True)
    L, B, nh, T, _ = attentions.shape
    assert (L, B, nh, T) == (6, 2, 12, ids.shape[1])
    torch.testing.assert_close(attentions.sum(-1), torch.ones(L, B, nh, T), atol=1e-6, rtol=0)
    padded_keys = torch.from_numpy(mask == 0)[None, :, None, None, :].expand_as(attentions)
    assert attentions[padded_keys].numel() > 0
    assert torch.count_nonzero(attentions[padded_keys]) == 0  # exactly zero, not merely small


def test_sequence_in_padded_batch_equals_sequence_alone(encoder, tokenizer, checkpoint):
    inputs = tokenizer.encode_texts(VARIED_TEXTS)
    ids, mask = pad([x.ids for x in inputs])
    with torch.no_grad():
        batched, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
        for i, x in enumerate(inputs):
            alone, _ = encoder(torch.from_numpy(x.ids[None]), torch.ones(1, len(x), dtype=torch.int64))
            assert torch.allclose(batched[i, : len(x)], alone[0], atol=1e-5)
