"""Quantized embeddings: float, int8, uint8, binary and ubinary, as sentence-transformers' quantize_embeddings gives.

Vector databases store int8 or binary codes to cut memory 4 to 32 times (Cohere's `embedding_types`, Voyage's
`output_dtype`). The rule is sentence-transformers' (util/quantization.py, 6.2), byte for byte given the same
ranges:

  int8 / uint8   per dimension, q = clip(floor((x - min) / step), 0, 255) with step = (max - min) / 255 (1 where
                 max == min); uint8 is q, int8 is q - 128. The ranges are a (2, D) array: minima, then maxima.
  binary/ubinary each dimension's sign bit (x > 0), packed 8 dimensions a byte, the first dimension in the high bit
                 (numpy's packbits): ubinary is the bytes, binary the bytes - 128 as int8. D/8 bytes, rounded up.

Matryoshka `dimensions` come first, then quantization, as sentence-transformers orders them (truncate_dim, then
precision): the ranges are those of the cut (and normalised) vectors.

int8 and uint8 need ranges that do not depend on the request, or the same text would get other codes in another
batch. Export keeps the sentence embeddings of its 512 verification texts (PyTorch's, as the pipeline gives them)
beside the graphs (CALIBRATION_FILE, hashed in the manifest); the ranges of a request are those texts' embeddings
cut and normalised as the request's are, so every replica quantizes the same way. A request may pass its own.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from attnserve.errors import InvalidInputError

from .dimensions import cut_and_normalize

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
RANGED = ("int8", "uint8")  # the types that need per-dimension ranges
# The calibration embeddings export writes beside the graphs: (texts, D) float32.
CALIBRATION_FILE = "quantization_calibration.npy"


def quantize(embeddings: np.ndarray, embedding_type: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """(N, D) float32 -> (N, D) float32, int8 or uint8, or (N, ceil(D / 8)) int8 or uint8 for the binary types.

    ranges: (2, D) minima and maxima, for int8 and uint8."""
    if embedding_type == "float":
        return embeddings.astype(np.float32, copy=False)
    if embedding_type in RANGED:
        assert ranges is not None, "int8 and uint8 need ranges (check_ranges / calibration_ranges)"
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]  # (D,)
        steps = (ranges[1, :] - starts) / 255  # (D,)
        steps = np.where(steps == 0, 1, steps)
        codes = np.clip(np.floor((embeddings - starts) / steps), 0, 255)  # (N, D)
        return codes.astype(np.uint8) if embedding_type == "uint8" else (codes - 128).astype(np.int8)
    if embedding_type == "ubinary":
        return np.packbits(embeddings > 0, axis=-1)  # (N, ceil(D / 8)) uint8
    if embedding_type == "binary":
        return (np.packbits(embeddings > 0, axis=-1) - 128).astype(np.int8)
    raise ValueError(f"unknown embedding type {embedding_type!r}")


def quantized_size(embedding_type: str, dimensions: int) -> int:
    """Bytes (or floats, for float) one vector takes: D, or ceil(D / 8) for the binary types."""
    return (dimensions + 7) // 8 if embedding_type.endswith("binary") else dimensions


def check_embedding_types(types: list[str] | tuple[str, ...], field: str = "embedding_types") -> tuple[str, ...]:
    """The types asked, in order, once each; an InvalidInputError naming the allowed ones for anything else."""
    if not types:
        raise _invalid(field, f"no embedding types: ask for one or more of {', '.join(EMBEDDING_TYPES)}")
    for i, kind in enumerate(types):
        if kind not in EMBEDDING_TYPES:
            raise _invalid(field if len(types) == 1 else f"{field}[{i}]",
                           f"embedding type {kind!r} is not one of {', '.join(EMBEDDING_TYPES)}")
    return tuple(dict.fromkeys(types))


def check_ranges(ranges, dimensions: int, field: str = "ranges") -> np.ndarray:
    """A request's own ranges -> (2, D) float32: [minima, maxima], finite, each minimum at most its maximum."""
    try:
        array = np.asarray(ranges, dtype=np.float64)
    except (TypeError, ValueError):
        raise _invalid(field, f"ranges must be two lists of {dimensions} numbers (minima, then maxima)") from None
    if array.shape != (2, dimensions):
        raise _invalid(field, f"ranges must be two lists of {dimensions} numbers (minima, then maxima), one per "
                              f"dimension of the embeddings returned; got shape {list(array.shape)}")
    with np.errstate(over="ignore"):  # a float64 past float32's range becomes inf here, and is refused
        as_float32 = array.astype(np.float32)  # the codes are computed in float32
    if not np.isfinite(as_float32).all():
        raise _invalid(field, "ranges must be finite float32 numbers (at most 3.4e38 in magnitude)")
    if (array[0] > array[1]).any():
        first = int(np.argmax(array[0] > array[1]))
        raise _invalid(field, f"ranges: dimension {first}'s minimum {array[0, first]:g} is above its maximum "
                              f"{array[1, first]:g}")
    return as_float32


def calibration_ranges(path: Path, sha256: str, dimensions: int | None, normalize: bool) -> np.ndarray:
    """(2, D): the per-dimension minima and maxima of export's calibration embeddings, cut to `dimensions` and
    normalised as a request's embeddings are. sha256 keys the cache: a re-export is read afresh."""
    return _calibration_ranges(str(path), sha256, dimensions, normalize).copy()


@functools.lru_cache(maxsize=64)
def _calibration_ranges(path: str, sha256: str, dimensions: int | None, normalize: bool) -> np.ndarray:
    embeddings = np.load(path).astype(np.float32, copy=False)  # (texts, D)
    cut = cut_and_normalize(embeddings, dimensions, normalize)  # (texts, dimensions)
    return np.vstack((cut.min(axis=0), cut.max(axis=0)))  # (2, dimensions)


def _invalid(field: str, description: str) -> InvalidInputError:
    return InvalidInputError(description, field=field, description=description)
