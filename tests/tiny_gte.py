"""A tiny random-weight GTE v1.5 saved by transformers itself (GteModel), with a lowercasing WordPiece tokenizer
as gte-base-en-v1.5's (checkpoints.save_tiny_bert's)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .checkpoints import save_tiny_bert

VOCAB_SIZE = 200


def save_tiny_gte(directory: Path, model_class: str = "GteModel", seed: int = 0, **config) -> Path:
    """A 3-layer, hidden-64, 4-head GTE with 128 positions, no token types (as gte-base-en-v1.5) and plain rotary
    positions (transformers cannot load the NTK-scaled ones: test_family_conformance.py scales a copy), with random
    weights larger than transformers' initialisation (whose attention would be nearly uniform).
    config: GteConfig settings over these."""
    import transformers

    save_tiny_bert(directory, vocab_size=VOCAB_SIZE, seed=seed)  # its tokenizer; the BERT weights are replaced
    settings = dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                    intermediate_size=96, max_position_embeddings=128, type_vocab_size=0, pad_token_id=0,
                    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(transformers.GteConfig(**{**settings, **config}))
    with torch.no_grad():
        for name, param in model.named_parameters():
            # LayerNorm weights around 1, everything else a wide spread: every part of the model shows.
            param.copy_(1 + 0.3 * torch.randn_like(param) if ("LayerNorm" in name or "layernorm" in name)
                        and name.endswith("weight") else 0.2 * torch.randn_like(param))
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer["model_max_length"] = settings["max_position_embeddings"]
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return directory


def alibaba_ntk_inv_freq(head_size: int, base: float, factor: float) -> torch.Tensor:
    """The reference frequencies, written out as Alibaba's NTKScalingRotaryEmbedding (and vLLM's) computes them
    (mixed_b None): the base times the factor, then every frequency divided by factor ** (2 / dim)."""
    scaled_base = base * factor
    inv_freq = 1.0 / (scaled_base ** (torch.arange(0, head_size, 2).float() / head_size))
    return inv_freq / factor ** (2 / head_size)
