"""bge-m3's sparse and ColBERT outputs from the encoder's last hidden state, as FlagEmbedding's BGEM3FlagModel
computes them (its M3 model's _sparse_embedding and _colbert_embedding), with the heads' weights the export stored
(model/bge_m3.py). The dense embedding is the graph's own (CLS, normalised), from the same pass.

- sparse: each token's weight relu(w . h + b); a token id's weight is the most of its tokens' above 0; the
  tokenizer's cls, eos, pad and unk ids are left out;
- ColBERT: W h + b for every token but the first (CLS), each L2-normalised: (T - 1, d).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnserve.errors import ArtifactError

from .manifest import sha256_of


class BgeM3Heads:
    def __init__(self, directory: Path, settings: dict):
        path = directory / str(settings["file"])
        if path.is_file() and settings.get("sha256") and sha256_of(path) != settings["sha256"]:
            raise ArtifactError(f"bge-m3's heads changed since export (sha256 differs): {path}; export again")
        try:
            with np.load(path, allow_pickle=False) as arrays:
                self._colbert_weight = arrays["colbert_weight"].T.copy()  # (H, d)
                self._colbert_bias = arrays["colbert_bias"]  # (d,)
                self._sparse_weight = arrays["sparse_weight"][0]  # (H,)
                self._sparse_bias = float(arrays["sparse_bias"][0])
        except (OSError, KeyError, ValueError) as e:
            raise ArtifactError(f"bge-m3's heads unreadable: {path}: {e}") from None
        self.colbert_dim = int(self._colbert_bias.shape[0])
        self._unused = np.asarray(settings.get("unused_ids", ()), dtype=np.int64)

    def sparse(self, ids: np.ndarray, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T,) ids, (T, H) last hidden state -> (indices, values): the token ids with a weight above 0, ascending,
        int32, and each one's most weight, float32."""
        weights = np.maximum(hidden.astype(np.float32) @ self._sparse_weight + self._sparse_bias, 0.0)  # (T,)
        kept = (weights > 0) & ~np.isin(ids, self._unused)
        indices, where = np.unique(ids[kept], return_inverse=True)  # ascending ids, each token's index into them
        values = np.zeros(len(indices), dtype=np.float32)
        np.maximum.at(values, where, weights[kept])
        return indices.astype(np.int32), values

    def colbert(self, hidden: np.ndarray) -> np.ndarray:
        """(T, H) last hidden state -> (T - 1, d) float32, every token's but the first, each of unit length."""
        vectors = hidden[1:].astype(np.float32) @ self._colbert_weight + self._colbert_bias  # (T - 1, d)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
