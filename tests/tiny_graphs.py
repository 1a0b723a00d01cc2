"""Tiny random-weight models' graphs with fused attention, exported once per test session for the int8 tests that
read them (each writes its own graphs beside, never into, them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attnserve.export.optimize import fuse_attention, quiet
from attnserve.export.torch_to_onnx import export_graph
from attnserve.model.checkpoint import Checkpoint, load_encoder, read_checkpoint
from attnserve.model.encoder import SentenceEncoder
from attnserve.model.sentence_head import load_head

from .checkpoints import save_sentence_transformer, save_tiny_family
from .tiny_qwen3 import save_qwen3_embedding, save_tiny_qwen3

# Kept for the session: a test module that names the fixture has a definition of its own, which would export again.
_MADE: dict[str, tuple[Checkpoint, Path]] = {}


@pytest.fixture(scope="session")
def fused_graph(tmp_path_factory) -> Callable[[str], tuple[Checkpoint, Path]]:
    """family -> (its checkpoint, its fused graph): bert or mpnet (tests/checkpoints.py's tiny models as
    sentence-transformers pipelines, mean-pooled) or qwen3 (tests/tiny_qwen3.py's, as Qwen3-Embedding)."""
    made = _MADE

    def of(family: str) -> tuple[Checkpoint, Path]:
        if family not in made:
            root = tmp_path_factory.mktemp(f"fused-{family}")
            if family == "qwen3":
                folder = save_qwen3_embedding(save_tiny_qwen3(root / "model"), root / "st")
            else:
                folder = save_sentence_transformer(save_tiny_family(root / "model", family), root / "st", "mean")
            ckpt = read_checkpoint(folder)
            export_graph(SentenceEncoder(load_encoder(ckpt), load_head(ckpt.directory, ckpt.pipeline)),
                         root / "plain.onnx")
            with quiet():
                fuse_attention(root / "plain.onnx", root / "fused.onnx", ckpt.config)
            made[family] = ckpt, root / "fused.onnx"
        return made[family]

    return of
