"""Helpers the family tests (test_family_conformance.py, test_fused_attention.py) share: padded random batches,
transformers' model of a checkpoint folder, the error between two models' hidden states on real positions, cosines,
and a config's refusal."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import edit_json


def padded_batch(lengths: tuple[int, ...], vocab_size: int, pad_id: int, seed: int, side: str = "right",
                 first_id: int = 4) -> tuple[torch.Tensor, ...]:
    """(B, T) ids in [first_id, vocab_size) and mask, padded on `side` with the padding id, as a tokenizer pads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(first_id, vocab_size, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    if side == "left":
        mask = mask.flip(1)
    return ids * mask + pad_id * (1 - mask), mask


def transformers_model(model_dir: Path, implementation: str):
    import transformers

    return transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation=implementation).eval()


def max_error(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> float:
    return float((got - want).abs()[mask.bool()].max())  # real positions only


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def refusal_before_weights_load(model_dir: Path, checkpoint: Path, change: dict) -> str:
    """The CheckpointError message of reading model_dir's config, tokenizer (and adapters) with `change` made to the
    config (a key naming a file, "adapters/x/adapter_config.json": its changes made to that file), beside weights
    that are not weights (reading them would fail differently)."""
    checkpoint.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(model_dir / name, checkpoint / name)
    if (model_dir / "adapters").is_dir():
        shutil.copytree(model_dir / "adapters", checkpoint / "adapters")
    (checkpoint / "model.safetensors").write_bytes(b"not weights: reading them would fail differently")
    edit_json(checkpoint / "config.json", **{k: v for k, v in change.items() if "/" not in k})
    for file, changes in ((k, v) for k, v in change.items() if "/" in k):
        edit_json(checkpoint / file, **changes)
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(checkpoint)
    return str(refused.value)
