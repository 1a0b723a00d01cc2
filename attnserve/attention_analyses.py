"""Analyses of one input's attention maps, computed where the maps are (the server), so that a client need not
fetch layers x heads x T x T floats to get them.

maps: (L, nh, T, T) float32, every layer's every head, each row summing to 1 over the keys the query may attend to
(a padded, causal or out-of-window key has weight 0).

- rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"): per layer the heads' mean A, then
  0.5 A + 0.5 I with its rows re-normalised, multiplied from the first layer to the last: R = Â_L ... Â_2 Â_1, a
  (T, T) matrix whose rows sum to 1 (a product of row-stochastic matrices).
- head_stats: a (L, nh) grid per statistic, each the mean over the input's query rows i of
    entropy              -sum_j a_ij ln a_ij (nats; 0 ln 0 = 0)
    normalized_entropy   that divided by ln(the keys row i attends to: weight above 0), 0 where there is one key,
                         so that lengths, causal rows and local windows compare
    first_special        a_i,f: f the input's first special token ([CLS], <s>; Qwen3's closing <|endoftext|>)
    separators           sum of a_ij over the special tokens after it ([SEP], </s>)
    self                 a_ii
    previous, next       a_i,i-1 and a_i,i+1, over the rows that have such a token
    distance             sum_j a_ij |i - j|, in tokens
  and for a sentence pair (pair_start s: segment a is [0, s), b is [s, T)):
    a_to_b               sum over j in b of a_ij, over the rows i in a
    b_to_a               sum over j in a of a_ij, over the rows i in b
  A statistic over no row or no token (no special token at all, a one-token input's previous) is 0.
- norms (Kobayashi et al., EMNLP 2020, "Attention is not only a weight"): ||a_ij f_h(x_j)|| = a_ij ||f_h(x_j)||,
  f_h(x_j) token j's value vector through head h's slice of W_O, whose norms the attention graph gives
  (model/value_norms.py): (layers, heads, T, T) for the layers and heads asked, and norms_summed, (layers, T, T),
  the sum over every head of a layer.
"""

from __future__ import annotations

import numpy as np

ANALYSES = ("rollout", "head_stats", "norms")
HEAD_STATS = ("entropy", "normalized_entropy", "first_special", "separators", "self", "previous", "next",
              "distance")
PAIR_STATS = ("a_to_b", "b_to_a")


def rollout(maps: np.ndarray) -> np.ndarray:
    """(L, nh, T, T) -> (T, T) float32, rows summing to 1."""
    # The heads' mean accumulated in float64 without a float64 copy of the maps (a 256-token row's are 38 MB so).
    return rollout_of_means(maps.mean(axis=1, dtype=np.float64))  # (L, T, T)


def rollout_of_means(means: np.ndarray) -> np.ndarray:
    """(L, T, T) each layer's mean over heads -> (T, T) float32: rollout from there (export/verify.py checks the
    last-layer graph's rollout with it, from PyTorch's maps read a layer at a time)."""
    T = means.shape[-1]
    result = np.eye(T)
    for mean in means:
        a = 0.5 * mean + 0.5 * np.eye(T)  # (T, T)
        a /= a.sum(axis=1, keepdims=True)
        result = a @ result  # this layer's flow on top of the layers below it
    return result.astype(np.float32)


def head_stats(maps: np.ndarray, special: np.ndarray, pair_start: int | None = None) -> dict[str, np.ndarray]:
    """(L, nh, T, T) maps, (T,) bool special tokens -> {statistic: (L, nh) float32}, HEAD_STATS then, for a pair,
    PAIR_STATS."""
    a = maps.astype(np.float64)  # (L, nh, T, T)
    L, nh, T, _ = a.shape
    logs = np.log(a, where=a > 0, out=np.zeros_like(a))
    entropy = -(a * logs).sum(axis=-1)  # (L, nh, T) per row
    keys = (a > 0).sum(axis=-1)  # (L, nh, T): the keys each row attends to
    log_keys = np.log(np.maximum(keys, 1))
    normalized = np.divide(entropy, log_keys, where=log_keys > 0, out=np.zeros_like(entropy))
    positions = np.arange(T)
    distance = (a * np.abs(positions[:, None] - positions[None, :])).sum(axis=-1)  # (L, nh, T)
    specials = np.flatnonzero(special)
    first = a[..., specials[0]] if len(specials) else np.zeros((L, nh, T))  # (L, nh, T)
    separators = a[..., specials[1:]].sum(axis=-1)  # (L, nh, T): 0 where there are none
    diagonal = a[..., positions, positions]  # (L, nh, T)
    stats = {"entropy": entropy.mean(axis=-1), "normalized_entropy": normalized.mean(axis=-1),
             "first_special": first.mean(axis=-1), "separators": separators.mean(axis=-1),
             "self": diagonal.mean(axis=-1),
             "previous": _mean_rows(a[..., positions[1:], positions[1:] - 1]),
             "next": _mean_rows(a[..., positions[:-1], positions[:-1] + 1]),
             "distance": distance.mean(axis=-1)}
    if pair_start is not None:
        s = pair_start
        stats["a_to_b"] = _mean_rows(a[..., :s, s:].sum(axis=-1))
        stats["b_to_a"] = _mean_rows(a[..., s:, :s].sum(axis=-1))
    return {name: value.astype(np.float32) for name, value in stats.items()}


def _mean_rows(per_row: np.ndarray) -> np.ndarray:
    """(L, nh, R) -> (L, nh): the mean over R rows, 0 where there are none."""
    return per_row.mean(axis=-1) if per_row.shape[-1] else np.zeros(per_row.shape[:-1])


def norm_weighted(maps: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """(..., nh, T, T) weights, (..., nh, T) value norms -> (..., nh, T, T) float32: a_ij ||f_h(x_j)||."""
    return (maps * norms[..., None, :]).astype(np.float32)
