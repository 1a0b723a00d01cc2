"""Sentence pooling and L2 normalisation in numpy, for the paths that choose pooling at request time.

Each mode is defined once here and once in torch for the exported graph (model/pooling.py); a test checks
that the two agree. Inputs are right-padded, as the engine always pads.
"""

from __future__ import annotations

import numpy as np

from attnserve.pooling_modes import POOLING_MODES


def pool(last_hidden_state: np.ndarray, lengths: np.ndarray, mode: str) -> np.ndarray:
    """(B, T, H) with right padding, (B,) real lengths (>= 1) -> (B, H); mode one of POOLING_MODES."""
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling mode {mode!r}")
    T = last_hidden_state.shape[1]
    real = np.arange(T)[None, :] < lengths[:, None]  # (B, T)
    if mode == "cls":
        return last_hidden_state[:, 0].copy()
    if mode == "lasttoken":
        return last_hidden_state[np.arange(len(lengths)), lengths - 1].copy()
    if mode == "max":
        return np.where(real[:, :, None], last_hidden_state, -np.inf).max(axis=1).astype(last_hidden_state.dtype)
    if mode == "weightedmean":
        weights = real * np.arange(1, T + 1, dtype=last_hidden_state.dtype)[None, :]  # (B, T): position + 1
        return np.einsum("bth,bt->bh", last_hidden_state, weights) / weights.sum(axis=1, keepdims=True)
    summed = np.einsum("bth,bt->bh", last_hidden_state, real.astype(last_hidden_state.dtype))  # (B, H)
    counts = lengths.astype(last_hidden_state.dtype)[:, None]  # (B, 1)
    return summed / (counts if mode == "mean" else np.sqrt(counts))


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows to unit length; matches sentence-transformers' Normalize (eps 1e-12)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
