"""Sentence pooling and L2 normalisation in numpy, for the paths that choose pooling at request time."""

from __future__ import annotations

import numpy as np


def pool(last_hidden_state: np.ndarray, lengths: np.ndarray, mode: str) -> np.ndarray:
    """(B, T, H) with right padding, (B,) real lengths -> (B, H)."""
    if mode == "cls":
        return last_hidden_state[:, 0].copy()
    if mode != "mean":
        raise ValueError(f"unknown pooling mode {mode!r}")
    T = last_hidden_state.shape[1]
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(last_hidden_state.dtype)  # (B, T)
    return np.einsum("bth,bt->bh", last_hidden_state, mask) / np.maximum(lengths, 1)[:, None]


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows to unit length; matches sentence-transformers' Normalize (eps 1e-12)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
