"""An attention grid over a picture: the patch grid (attnserve/patch_attention.py) stretched over the image and
coloured, blended with it, for `attnserve attention` on images and the explorer's still pictures.

The grid, rows x cols patches (square but for SigLIP 2's NaFlex towers), covers the image the model saw: the
preprocessed H x W image. Drawn over the part of the picture that became it (the image the caller passes: CLIP's
crop, or the whole picture), each patch's colour falls on its own box (patch_boxes), stretched as the picture was.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from attnserve.errors import AttnserveError

COLORMAP = "inferno"  # dark to bright: attention read as light


def overlay(image: Image.Image, grid: np.ndarray, alpha: float = 0.6, scale: str = "max") -> Image.Image:
    """(rows, cols) non-negative weights over `image` -> an RGB image of its size: the weights coloured (each
    patch a block of one colour), blended with the picture at `alpha`. scale "max": the largest weight is the
    brightest; "fixed": 0..1 as given, so that grids compare."""
    if grid.ndim != 2 or grid.size == 0:
        raise AttnserveError(f"an attention grid must be rows x cols, got shape {grid.shape}")
    if not 0.0 <= alpha <= 1.0:
        raise AttnserveError(f"alpha must be between 0 and 1, got {alpha}")
    if scale not in ("max", "fixed"):
        raise AttnserveError(f"scale must be max or fixed, got {scale!r}")
    from matplotlib import colormaps

    values = np.nan_to_num(grid.astype(np.float64), nan=0.0).clip(min=0.0)
    if scale == "max" and values.max() > 0:
        values = values / values.max()
    colours = (colormaps[COLORMAP](values.clip(0.0, 1.0))[..., :3] * 255).astype(np.uint8)  # (rows, cols, 3)
    # NEAREST: each patch one flat block, its edges on the patches' edges when the image is the model's crop.
    heat = Image.fromarray(colours, "RGB").resize(image.size, resample=Image.Resampling.NEAREST)
    return Image.blend(image.convert("RGB"), heat, alpha)
