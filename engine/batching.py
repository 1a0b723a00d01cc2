"""Batch planning: group inputs of similar length under a padded-token budget."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# What one more session run costs, counted in padded token cells, on the CPU: a
# fixed per-run overhead plus less efficient small matmuls. It is the price a
# split must beat in saved padding (EngineConfig.batch_cost_on: a GPU's is more).
BATCH_OVERHEAD_CELLS = 64


def plan_batches(lengths: Sequence[int] | np.ndarray, max_batch_tokens: int, max_batch_size: int,
                 run_cells: int = BATCH_OVERHEAD_CELLS) -> list[np.ndarray]:
    """Indices of each batch, longest inputs first.

    Inputs are sorted by length, then cut into contiguous runs that minimise
    padded cells + run_cells per batch, subject to the budget
    (longest x count <= max_batch_tokens) and the batch-size cap. Greedy
    filling would let a batch of short texts span, say, 6 to 28 tokens when
    inputs are few; the optimal cut splits such a batch where padding costs
    more than another run. An input longer than the budget gets a batch alone.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]  # (N,) descending: a batch's first input sets its padded length
    n = len(order)
    if n == 0:
        return []
    # Inputs so alike in length that no split saves a run's overhead in padding, and that fit one batch, are one
    # batch: any plan of k >= 2 batches costs at least min x N + 2 runs, one batch max x N + 1 run. (A server under
    # a load of similar texts plans every batch from such a queue: the loop below costs ~10 us a start considered.)
    longest, shortest = int(sorted_lengths[0]), int(sorted_lengths[-1])
    if (longest - shortest) * n <= run_cells and n <= max_batch_size and \
            n <= max(1, max_batch_tokens // max(longest, 1)):
        return [order]
    # Most inputs a batch starting at i may take: (N,)
    room = np.minimum(max_batch_size, np.maximum(1, max_batch_tokens // np.maximum(sorted_lengths, 1)))
    window = int(room.max())
    # The plan's batches start only where _boundaries says one may: the cheapest plan over those is the cheapest.
    ends = _boundaries(sorted_lengths, room)  # (P,) ascending, 0 and n included
    P = len(ends)
    cost = np.full(P, np.inf)  # cost[q]: best plan for the first ends[q] inputs
    cost[0] = 0.0
    cut = np.zeros(P, dtype=np.int64)  # cut[q]: the index in ends where the last batch of that plan starts
    # Per boundary, read once rather than gathered again for every q: (P,) each (the last, at N, never starts one).
    start_length = sorted_lengths[np.minimum(ends, n - 1)].astype(np.float64)
    start_room = room[np.minimum(ends, n - 1)]
    firsts = np.searchsorted(ends, ends - window)  # (P,) the first boundary within a window of q's
    for q in range(1, P):
        j, first = int(ends[q]), int(firsts[q])
        size = j - ends[first:q]  # (q - first,) each candidate last batch's inputs
        total = cost[first:q] + start_length[first:q] * size + run_cells
        total[size > start_room[first:q]] = np.inf
        best = int(total.argmin())
        cost[q], cut[q] = total[best], first + best
    batches, q = [], len(ends) - 1
    while q > 0:
        batches.append(order[ends[cut[q]]: ends[q]])
        q = int(cut[q])
    return batches[::-1]


def _boundaries(sorted_lengths: np.ndarray, room: np.ndarray) -> np.ndarray:
    """(P,) ascending: where a batch of the cheapest plan may start, 0 and N (the end) included; a fraction of the N
    inputs where lengths repeat, as a long queue's do, so that planning 20,000 texts costs ms, not a loop over each.

    Why no other start is needed: where a batch starts inside a run of equal lengths and is not full, moving its
    first boundary one input back costs the batch before at least that length and this one exactly it, so is never
    dearer. Some cheapest plan therefore starts each batch at the start of a run, or fills it: it starts at s with
    s + room[s] another start (or N). Found from the last run back, a run's room being one number.
    """
    n = len(sorted_lengths)
    start = np.zeros(n + 1, dtype=bool)
    start[n] = True
    runs = np.flatnonzero(np.diff(sorted_lengths)) + 1  # (R - 1,) where each run but the first starts
    bounds = np.concatenate([[0], runs, [n]])
    for a, b in zip(bounds[-2::-1], bounds[:0:-1], strict=True):  # runs [a, b), last first
        a, b, r = int(a), int(b), int(room[a])
        start[a] = True
        seeds = np.flatnonzero(start[b:b + r]) + b  # full batches ending at these start inside the run
        if seeds.size and b - a > 1:
            steps = np.arange(1, (b - a - 1) // r + 2)
            inside = (seeds[:, None] - r * steps[None, :]).ravel()
            start[inside[inside > a]] = True
    return np.flatnonzero(start)


def pad(sequences: Sequence[np.ndarray], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad to the longest: input_ids and attention_mask, both (B, T) int64."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    T = int(lengths.max())
    real = np.arange(T) < lengths[:, None]  # (B, T)
    ids = np.full((len(sequences), T), pad_id, dtype=np.int64)
    ids[real] = np.concatenate(sequences)  # row by row, as the mask's True cells run
    return ids, real.astype(np.int64)


def pad_types(type_ids: Sequence[np.ndarray | None], width: int) -> np.ndarray:
    """Right-pad token types to (B, width) int64; None (a single text) and padding are type 0."""
    types = np.zeros((len(type_ids), width), dtype=np.int64)
    for row, seq in enumerate(type_ids):
        if seq is not None:
            types[row, : len(seq)] = seq
    return types
