"""Rotary position embeddings (RoPE), shared by every family whose positions are rotary.

Queries and keys are rotated by an angle per position and frequency, so that their dot product depends only
on the distance between the two positions. The cos and sin tables are computed once here, in fp32 and up to
the model's positions, exactly as transformers computes them, and sliced to T in the graph: a table also keeps
the angles exact in the fp16 graph, where position * frequency would lose whole radians.

Shapes: B batch, nh heads, T sequence, P the model's positions, d the rotated size (the head size, or a part).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn as nn


class RotaryPositions:
    """Base of a config whose positions are rotary: they start at 0, so an input may fill all of them."""

    max_position_embeddings: int

    @property
    def usable_positions(self) -> int:
        """Positions an input may fill: rotary positions start at 0, so all of them."""
        return self.max_position_embeddings


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    """(d/2,) fp32: the frequencies theta^(-2i/d) of transformers' "default" rope type."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(dim: int, theta: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_positions: int) -> torch.Tensor:
    """(d/2,) fp32: transformers' "llama3" rope type (Llama 3.1 and later): the frequencies whose wavelength is
    longer than the pretraining context over low_freq_factor are divided by factor, those shorter than it over
    high_freq_factor are kept, and those between are interpolated smoothly."""
    inv_freq = default_inv_freq(dim, theta)
    wavelength = 2 * math.pi / inv_freq
    low_wavelength, high_wavelength = original_positions / low_freq_factor, original_positions / high_freq_factor
    scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
    smooth = (original_positions / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos and sin of every position's angles, (P, d), for one set of frequencies."""

    cos: torch.Tensor  # (P, d)
    sin: torch.Tensor  # (P, d)

    def __init__(self, inv_freq: torch.Tensor, positions: int, scale: float = 1.0):
        """inv_freq: (d/2,) fp32; scale multiplies cos and sin (transformers' attention_scaling, 1 for most)."""
        super().__init__()
        angles = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # (P, d/2)
        angles = torch.cat((angles, angles), dim=-1)  # (P, d): each frequency drives two halves
        # Not in the state dict: derived from the config, as transformers' inv_freq buffer is.
        self.register_buffer("cos", angles.cos() * scale, persistent=False)
        self.register_buffer("sin", angles.sin() * scale, persistent=False)

    def forward(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:T], self.sin[:T]  # (T, d) each


class GlobalLocalBases(Protocol):
    """A config with one rope base for the layers that see every key and another for the windowed ones."""

    @property
    def head_size(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...
    @property
    def global_rope_theta(self) -> float: ...
    @property
    def local_rope_theta(self) -> float: ...


def global_and_local(cfg: GlobalLocalBases) -> tuple[RotaryEmbedding, RotaryEmbedding]:
    """The rotary tables of the global (full) layers and of the local (sliding) ones: Gemma 3's and ModernBERT's."""
    return (RotaryEmbedding(default_inv_freq(cfg.head_size, cfg.global_rope_theta), cfg.max_position_embeddings),
            RotaryEmbedding(default_inv_freq(cfg.head_size, cfg.local_rope_theta), cfg.max_position_embeddings))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, nh, T, d); cos, sin: (T, d). Rotates each pair (x[i], x[i + d/2]) by its position's angle
    (transformers' rotate_half layout, which every family here uses)."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (B, nh, T, d)
    return x * cos + rotated_half * sin
