"""Attention over image patches: one image's maps (the image attention graph's, export/image_tower.py) read as grids
over the image, and where each patch lies in it, for drawing the maps over the picture.

maps: (L, nh, T, T) float32, T = [the class token,] then g x g patches in row-major order (the patch embedding is a
Conv with stride P over the preprocessed S x S image, flattened: model/vision_transformer.py PatchEmbeddings).

- patch_maps: what each layer's and head's attention says of the patches, (L, nh, g, g), each grid summing to 1.
  With a class token (CLIP), its row: the attention the class token pays each patch (DINO's maps), renormalised
  over the patches. Without one (SigLIP, which pools with an attention head instead), the attention each patch
  receives, averaged over the patches' own rows.
- patch_rollout: rollout (attention_analyses.py, Abnar & Zuidema) read the same way, (g, g).
- patch_boxes: each patch's pixels in the preprocessed image, (g * g, 4) as top, left, bottom, right (exclusive),
  in the maps' order.
"""

from __future__ import annotations

import math

import numpy as np

from .attention_analyses import rollout


def patch_grid(tokens: int, class_token: bool) -> int:
    """g, the side of the patch grid, from a map's T; ValueError where T is not a square (plus the class token)."""
    patches = tokens - int(class_token)
    side = math.isqrt(max(patches, 0))
    if patches < 1 or side * side != patches:
        raise ValueError(f"{tokens} tokens are not {'a class token and ' if class_token else ''}a square grid of "
                         "patches")
    return side


def _read(rows: np.ndarray, class_token: bool) -> np.ndarray:
    """(..., T, T) -> (..., N): the class token's row over the patches, or each patch's mean received attention."""
    if class_token:
        over = rows[..., 0, 1:]  # (..., N)
    else:
        over = rows.mean(axis=-2)  # (..., N): column means, every row a patch's
    return over / over.sum(axis=-1, keepdims=True)


def patch_maps(maps: np.ndarray, class_token: bool) -> np.ndarray:
    """(L, nh, T, T) -> (L, nh, g, g) float32, each grid summing to 1."""
    g = patch_grid(maps.shape[-1], class_token)
    return _read(maps.astype(np.float64), class_token).reshape(*maps.shape[:-2], g, g).astype(np.float32)


def patch_rollout(maps: np.ndarray, class_token: bool) -> np.ndarray:
    """(L, nh, T, T) -> (g, g) float32 summing to 1: rollout's class-token row (or column means) over the patches."""
    g = patch_grid(maps.shape[-1], class_token)
    return _read(rollout(maps).astype(np.float64), class_token).reshape(g, g).astype(np.float32)


def patch_boxes(grid: int, patch_size: int) -> np.ndarray:
    """(g * g, 4) int64: top, left, bottom, right of each patch in the preprocessed image, in the maps' order."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    top, left = rows * patch_size, cols * patch_size
    return np.stack([top, left, top + patch_size, left + patch_size], axis=1).astype(np.int64)
