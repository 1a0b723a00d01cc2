"""Helpers the family tests (test_qwen3, test_gemma3, test_eurobert, test_nomic_bert, test_gte, test_jina_v3,
test_modernbert) share: padded random batches, transformers' model of a checkpoint folder, our encoder loaded
from it, its export, the error between the two on real positions, cosines, and a config's refusal."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.errors import CheckpointError
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import load_encoder, read_checkpoint

from .checkpoints import edit_json

# Padded batches from 1 token to past a max_seq_length of 40; each row's length is its own.
LENGTHS = [(1,), (5, 3), (16, 9, 1), (40, 17, 33), (100, 64, 7, 100)]


def padded_batch(lengths: tuple[int, ...], vocab_size: int, pad_id: int, seed: int, side: str = "right",
                 first_id: int = 4) -> tuple[torch.Tensor, ...]:
    """(B, T) ids in [first_id, vocab_size) and mask, padded on `side` with the padding id, as a tokenizer pads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(first_id, vocab_size, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    if side == "left":
        mask = mask.flip(1)
    return ids * mask + pad_id * (1 - mask), mask


def padded_batch_with_types(lengths: tuple[int, ...], vocab_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(B, T) ids, mask and token types (a second segment in each row's second half); padding is id 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(max(lengths))[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids * mask, mask, types


def transformers_model(model_dir: Path, implementation: str):
    import transformers

    return transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation=implementation).eval()


def max_error(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> float:
    return float((got - want).abs()[mask.bool()].max())  # real positions only


def max_error_on_real_positions(encoder, model_dir: Path, implementation: str, lengths_list=LENGTHS,
                                first_id: int = 4) -> float:
    """Our encoder's last hidden states against transformers', right-padded batches of lengths_list."""
    reference = transformers_model(model_dir, implementation)
    errors = []
    for seed, lengths in enumerate(lengths_list):
        ids, mask = padded_batch(lengths, encoder.config.vocab_size, encoder.config.pad_token_id, seed,
                                 first_id=first_id)
        with torch.no_grad():
            got, _ = encoder(ids, mask)
            want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        errors.append(max_error(got, want, mask))
    return max(errors)


def load_ours(model_dir: Path, encoder_class: type) -> torch.nn.Module:
    """Our encoder of the checkpoint, checked to be the family's class."""
    encoder = load_encoder(read_checkpoint(model_dir))
    assert isinstance(encoder, encoder_class)
    return encoder


def export(st_dir: Path, out: Path) -> tuple[Path, list[str]]:
    """The artifacts of the sentence-transformers folder, and the export's log lines. Every family's attention graph
    gives each head's value norms, verified against the PyTorch encoder (model/value_norms.py)."""
    lines: list[str] = []
    manifest = build_artifacts(read_checkpoint(st_dir), out, log=lines.append)
    attention = manifest.variants["attention"]
    assert "value_norms" in attention.outputs and attention.parity["max_rel_value_norms"] <= 1e-4, attention.parity
    return out, lines


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def refusal_before_weights_load(model_dir: Path, checkpoint: Path, change: dict) -> str:
    """The CheckpointError message of reading model_dir's config and tokenizer with `change` made to the config,
    beside weights that are not weights (reading them would fail differently)."""
    checkpoint.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(model_dir / name, checkpoint / name)
    (checkpoint / "model.safetensors").write_bytes(b"not weights: reading them would fail differently")
    edit_json(checkpoint / "config.json", **change)
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(checkpoint)
    return str(refused.value)
