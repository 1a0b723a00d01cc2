"""A batch's outputs and each input's share of them: what a session run gives (BatchOutput) and the rows the
outputs are assembled from (RowOutput, engine/outputs.py), the same rows for a server's batcher and offline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .pooling import l2_normalize


@dataclass
class BatchOutput:
    """One session run over a padded batch, rows in the order given."""

    lengths: np.ndarray  # (B,) real token counts
    last_hidden_state: np.ndarray | None  # (B, T, H), padded positions are not meaningful; None for a reranker
    sentence_embedding: np.ndarray | None  # (B, D), the pipeline before its final normalisation; None: reranker
    # (L, B, nh, T, T) when the attention graph ran; (1, B, nh, T, T), the last layer's, when the last-layer one did
    attentions: np.ndarray | None = None
    scores: np.ndarray | None = None  # (B, num_labels) a reranker's raw logits
    value_norms: np.ndarray | None = None  # (L, B, nh, T) each head's value norms (model/value_norms.py)
    rollout: np.ndarray | None = None  # (B, T, T) from the last-layer graph (attnserve/attention_analyses.py's rollout)
    map_layers: tuple[int, ...] | None = None  # the layers `attentions` holds, in order; None: every layer
    # Where run()'s time went, in seconds: building the padded tensors, and the session's run (server/statistics.py).
    feed_seconds: float = 0.0
    run_seconds: float = 0.0


@dataclass
class RowOutput:
    """One input's share of a batch: views into the batch's arrays, padding cut off."""

    sentence_embedding: np.ndarray | None  # (D,) the pipeline before its final normalisation; None: reranker
    token_embeddings: np.ndarray | None  # (T, H); None for a reranker
    attentions: np.ndarray | None  # (L, nh, T, T) when the attention graph ran; (1, nh, T, T) the last-layer one
    scores: np.ndarray | None = None  # (num_labels,) a reranker's raw logits
    value_norms: np.ndarray | None = None  # (L, nh, T) each head's value norms, with attentions (model/value_norms.py)
    rollout: np.ndarray | None = None  # (T, T) when the last-layer graph ran
    map_layers: tuple[int, ...] | None = None  # the layers `attentions` holds; None: every layer
    # (D,) sentence_embedding L2-normalised, with the rest of its batch at once (what most requests return); None
    # where the batch had no sentence embeddings.
    normalized: np.ndarray | None = None

    def layer_maps(self, layers: Sequence[int]) -> np.ndarray:
        """(len(layers), nh, T, T): these layers' maps (non-negative indices, each among those the row holds)."""
        assert self.attentions is not None
        held = self.map_layers
        return self.attentions[list(layers) if held is None else [held.index(layer) for layer in layers]]


def normalized_rows(out: BatchOutput) -> np.ndarray | None:
    """(B, D) the batch's sentence embeddings normalised at once: a reply of normalised full vectors only slices
    them. None where the batch has none (a reranker's)."""
    return None if out.sentence_embedding is None else l2_normalize(out.sentence_embedding)


def row_of(out: BatchOutput, row: int, n: int, token_states: bool, normalized: np.ndarray | None) -> RowOutput:
    """Row `row` (n real tokens) of a batch. token_states False: its sentence embeddings alone, copied, so that no
    row holds its batch's (B, T, H) array once the batch is answered (a request of many long inputs)."""
    return RowOutput(
        None if out.sentence_embedding is None else
        out.sentence_embedding[row] if token_states else out.sentence_embedding[row].copy(),
        out.last_hidden_state[row, :n] if out.last_hidden_state is not None and token_states else None,
        out.attentions[:, row, :, :n, :n] if out.attentions is not None else None,
        out.scores[row] if out.scores is not None else None,
        out.value_norms[:, row, :, :n] if out.value_norms is not None else None,
        out.rollout[row, :n, :n] if out.rollout is not None else None, out.map_layers,
        None if normalized is None else normalized[row] if token_states else normalized[row].copy())
