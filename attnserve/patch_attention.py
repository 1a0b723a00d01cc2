"""Attention over image patches: one image's maps (the image attention graph's, export/image_tower.py) read as grids
over the image, and where each patch lies in it, for drawing the maps over the picture.

maps: (L, nh, T, T) float32, T = [the class token,] then rows x cols patches in row-major order (the patch embedding
is a Conv with stride P over the preprocessed H x W image, flattened: model/vision_transformer.py PatchEmbeddings).
A fixed-size tower's image is S x S, its grid g x g (g = S / P), inferred from T; a NaFlex tower's (SigLIP 2) has
its own rows x cols, which T alone cannot tell (12 patches are 3 x 4 or 2 x 6): the caller passes them as shape.

- patch_maps: what each layer's and head's attention says of the patches, (L, nh, rows, cols), each grid summing to
  1. With a class token (CLIP), its row: the attention the class token pays each patch (DINO's maps), renormalised
  over the patches. Without one (SigLIP, which pools with an attention head instead), the attention each patch
  receives, averaged over the patches' own rows.
- patch_rollout: rollout (attention_analyses.py, Abnar & Zuidema) read the same way, (rows, cols).
- patch_boxes: each patch's pixels in the preprocessed image, (rows * cols, 4) as top, left, bottom, right
  (exclusive), in the maps' order.
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


def grid_shape(tokens: int, class_token: bool, shape: tuple[int, int] | None = None) -> tuple[int, int]:
    """(rows, cols) of a map's patches: shape where given (checked against T), else the square g x g T implies."""
    if shape is None:
        g = patch_grid(tokens, class_token)
        return g, g
    rows, cols = shape
    patches = tokens - int(class_token)
    if rows < 1 or cols < 1 or rows * cols != patches:
        raise ValueError(f"a {rows} x {cols} grid is not the {patches} patches of {tokens} tokens"
                         f"{' (with a class token)' if class_token else ''}")
    return rows, cols


def patch_maps(maps: np.ndarray, class_token: bool, shape: tuple[int, int] | None = None) -> np.ndarray:
    """(L, nh, T, T) -> (L, nh, rows, cols) float32, each grid summing to 1; shape (rows, cols), None: square."""
    rows, cols = grid_shape(maps.shape[-1], class_token, shape)
    return _read(maps.astype(np.float64), class_token).reshape(*maps.shape[:-2], rows, cols).astype(np.float32)


def patch_rollout(maps: np.ndarray, class_token: bool, shape: tuple[int, int] | None = None) -> np.ndarray:
    """(L, nh, T, T) -> (rows, cols) float32 summing to 1: rollout's class-token row (or column means) over the
    patches; shape (rows, cols), None: square."""
    rows, cols = grid_shape(maps.shape[-1], class_token, shape)
    return _read(rollout(maps).astype(np.float64), class_token).reshape(rows, cols).astype(np.float32)


def patch_boxes(rows: int, cols: int, patch_size: int) -> np.ndarray:
    """(rows * cols, 4) int64: top, left, bottom, right of each patch in the preprocessed image, in the maps'
    order."""
    row, col = np.divmod(np.arange(rows * cols), cols)
    top, left = row * patch_size, col * patch_size
    return np.stack([top, left, top + patch_size, left + patch_size], axis=1).astype(np.int64)
