"""Matryoshka `dimensions`: the one rule that every protocol and offline encoding apply.

A request (or `attnserve encode --dimensions N`) may keep the first N dimensions of the sentence embedding,
1 <= N <= the model's embedding size; the vector is cut first and normalised after, when normalisation is asked,
as sentence-transformers' truncate_dim and OpenAI's `dimensions` do.
"""

from __future__ import annotations

import numpy as np

from attnserve.errors import InvalidInputError

from .pooling import l2_normalize


def check_dimensions(dimensions: int | None, size: int) -> None:
    """None (all of them) or 1..size; otherwise an InvalidInputError about the field `dimensions`."""
    if dimensions is not None and not 1 <= dimensions <= size:
        problem = (f"dimensions {dimensions} is out of range: this model's embeddings have {size} "
                   f"(ask for 1 to {size})")
        raise InvalidInputError(problem, field="dimensions", description=problem)


def cut_and_normalize(sentences: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """(N, H) -> (N, D): the first `dimensions` (all when None), then L2-normalised if asked."""
    if dimensions is not None:
        sentences = sentences[:, :dimensions]  # (N, D): cut before normalising
    return l2_normalize(sentences) if normalize else sentences
