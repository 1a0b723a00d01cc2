"""Tiny static-embedding folders, saved by the libraries themselves: model2vec's StaticModel.save_pretrained (plain,
and vocabulary-quantized: a token mapping and per-token weights) and sentence-transformers' own save of a
StaticEmbedding (and a Normalize), over BERT's WordPiece tokenizer of tests/checkpoints.py (its [UNK] is what
model2vec drops)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .checkpoints import save_wordpiece_tokenizer

VOCAB, DIM = 200, 16


def _tokenizer(directory: Path):
    from tokenizers import Tokenizer

    save_wordpiece_tokenizer(directory / "tokenizer", VOCAB)
    return Tokenizer.from_file(str(directory / "tokenizer" / "tokenizer.json"))


def save_model2vec(directory: Path, seed: int = 0, normalize: bool = True, max_length: int | None = 24,
                   quantized: bool = False) -> Path:
    """A StaticModel with random vectors; quantized: 40 rows shared through a token mapping, each id weighted."""
    from model2vec import StaticModel

    rng = np.random.default_rng(seed)
    rows = 40 if quantized else VOCAB
    model = StaticModel(rng.standard_normal((rows, DIM)).astype(np.float32), _tokenizer(directory),
                        normalize=normalize, max_length=max_length,
                        token_mapping=rng.integers(0, rows, VOCAB) if quantized else None,
                        weights=rng.uniform(0.2, 2.0, VOCAB).astype(np.float32) if quantized else None)
    model.save_pretrained(directory / "model")
    return directory / "model"


def save_static_embedding(directory: Path, seed: int = 0, normalize: bool = True) -> Path:
    """sentence-transformers' SentenceTransformer([StaticEmbedding, Normalize]) with random weights, saved by it."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding

    torch.manual_seed(seed)
    modules = [StaticEmbedding(_tokenizer(directory), embedding_weights=torch.randn(VOCAB, DIM))]
    SentenceTransformer(modules=modules + ([Normalize()] if normalize else []), device="cpu").save(
        str(directory / "model"))
    return directory / "model"
