"""Batch planning: group inputs of similar length under a padded-token budget."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def plan_batches(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int) -> list[np.ndarray]:
    """Indices of each batch, longest inputs first.

    Sorting by length keeps padding small; each batch is cut where its padded
    size (its first, longest length x its count) would pass the budget. An
    input longer than the budget still gets a batch of its own.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = int(lengths[order[start]])
        n = max(1, min(max_batch_size, max_batch_tokens // max(longest, 1)))
        batches.append(order[start : start + n])
        start += n
    return batches


def pad(sequences: Sequence[np.ndarray], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad to the longest: input_ids and attention_mask, both (B, T) int64."""
    T = max(len(s) for s in sequences)
    ids = np.full((len(sequences), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), T), dtype=np.int64)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask
