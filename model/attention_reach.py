"""Which keys each layer's queries may attend to, as a model declares it: the structure of its attention masks
(causal, sliding or local windows), written into the manifest so that a client draws a masked cell as masked rather
than as a weight that happens to be 0 (the attention explorer, attnserve/explorer_static/mapview.js).

A layer's reach is (behind, ahead): query i may attend to key j when i - j <= behind and j - i <= ahead, None being
no bound. Every key: (None, None); causal: (None, 0); Mistral's sliding window w: (w - 1, 0); ModernBERT's local
layers: (w // 2, w // 2). Padding is not part of it: a padded key gets 0 from every query whatever the layer.

An encoder declares its layers' reach with attention_reach(); one that does not attends to every key in every layer.
tests/test_family_conformance.py checks each family's declaration against the zeros of its own attention maps.
"""

from __future__ import annotations

from typing import Any

import torch

Reach = tuple[int | None, int | None]  # (behind, ahead): how far before and after a query its keys may lie
EVERY_KEY: Reach = (None, None)
CAUSAL: Reach = (None, 0)


def causal_within(window: int | None) -> Reach:
    """A causal layer whose queries see the keys fewer than `window` positions behind them, themselves included
    (None: every earlier key)."""
    return (None if window is None else window - 1, 0)


def reach_of(encoder: Any) -> tuple[Reach, ...]:
    """Every layer's reach, first to last: the encoder's declaration, else every key everywhere."""
    num_layers = int(encoder.config.num_layers)
    declare = getattr(encoder, "attention_reach", None)
    reach = tuple(declare()) if declare is not None else (EVERY_KEY,) * num_layers
    if len(reach) != num_layers:
        raise ValueError(f"{type(encoder).__name__} declares the reach of {len(reach)} layers, not {num_layers}")
    return reach


def beyond(reach: Reach, T: int) -> torch.Tensor:
    """(T, T) bool: True where key j (column) lies beyond query i's (row's) reach."""
    behind, ahead = reach
    offset = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # key - query
    out = torch.zeros(T, T, dtype=torch.bool)
    if behind is not None:
        out |= offset < -behind
    if ahead is not None:
        out |= offset > ahead
    return out

