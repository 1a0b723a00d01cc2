"""`attnserve attention IMAGE`: an image's attention over its patches, fetched from a server that serves an image-text
model (CLIP, SigLIP), drawn over the picture (.png, .jpg), or its arrays (.npz, .json).

Views: heatmap (a layer's map over the patches, the mean of its heads or one --head: CLIP's class token -> patch
row, SigLIP's attention each patch receives; attnserve/patch_attention.py), rollout (Abnar & Zuidema's, read the same
way), model (every layer x head, each a small picture). Each map is the tower's rows x cols patch grid (square but
for SigLIP 2's NaFlex towers). The maps are drawn over the part of the picture the model saw: its center square for
CLIP's processor ("crop"), all of it for SigLIP's ("stretch") and NaFlex's ("patches": all of it, stretched to the
grid's aspect ratio, which is the picture's as near as whole patches allow), at the picture's own resolution, the
picture upright as the server decoded it (EXIF orientation applied).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from attnserve.errors import AttnserveError
from attnserve.images import DEFAULT_MAX_PIXELS, decode_image
from attnserve.patch_attention import patch_maps, patch_rollout

from .client import Client, ImageInput, PatchPositions
from .image_overlay import overlay

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")
VIEWS = ("heatmap", "rollout", "model")
PICTURES = (".png", ".jpg", ".jpeg")
DATA = (".npz", ".json")


def is_image_file(argument: str) -> bool:
    """Whether `attnserve attention`'s argument names an image file (then it is read as one, not as a text)."""
    path = Path(argument)
    return path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()


@dataclass
class ImageAttention:
    """One image's attention, every layer's, as a server returned it."""

    picture: Image.Image  # upright, as decoded
    maps: np.ndarray  # (L, nh, T, T)
    rollout: np.ndarray  # (T, T)
    tokens: list[str]  # "<class>", "patch ROW,COL", ...
    patches: PatchPositions

    def seen(self) -> Image.Image:
        """The part of the picture the model saw: the center square (crop), all of it (stretch), or all of it at the
        grid's aspect ratio (patches: the model saw it resized to rows x cols whole patches)."""
        if self.patches.fit == "stretch":
            return self.picture
        if self.patches.fit == "patches":
            return self._at_grid_ratio()
        width, height = self.picture.size
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return self.picture.crop((left, top, left + side, top + side))

    def _at_grid_ratio(self) -> Image.Image:
        """The whole picture stretched to the patch grid's aspect ratio (cols : rows), its larger side kept, so
        that each patch's colour falls on the part of the picture that patch saw."""
        width, height = self.picture.size
        rows, cols = self.patches.shape
        if width * rows >= height * cols:  # wider than the grid: keep the width
            size = (width, max(1, round(width * rows / cols)))
        else:
            size = (max(1, round(height * cols / rows)), height)
        return self.picture if size == self.picture.size else self.picture.resize(size, Image.Resampling.BICUBIC)

    def grid(self, view: str, layer: int, head: int | None) -> tuple[np.ndarray, str]:
        """(rows, cols) weights summing to 1, and what they are."""
        shape = self.patches.shape
        if view == "rollout":
            return (patch_rollout(self.maps, self.patches.class_token, shape),
                    "attention rollout (Abnar & Zuidema, 2020)")
        grids = patch_maps(self.maps, self.patches.class_token, shape)[layer]  # (nh, rows, cols)
        what = "class token -> patches" if self.patches.class_token else "attention each patch receives"
        if head is None:
            return grids.mean(axis=0), f"layer {layer}, mean of {len(grids)} heads: {what}"
        return grids[head], f"layer {layer}, head {head}: {what}"


def check_image_request(view: str, path: Path) -> None:
    """What cannot be written for an image, in one line, before the server is asked."""
    suffix = path.suffix.lower()
    if suffix not in (*PICTURES, *DATA):
        raise AttnserveError(f"-o {path}: an image's attention is written as {', '.join((*PICTURES, *DATA))}")
    if view not in VIEWS:
        raise AttnserveError(f"--view {view} does not apply to an image: one of {', '.join(VIEWS)}")
    if not path.parent.is_dir():
        raise AttnserveError(f"cannot write {path}: no such directory {path.parent}")


def fetch_image(client: Client, source: Path, num_layers: int) -> ImageAttention:
    """Every layer's maps and rollout of the image in `source`."""
    data = ImageInput.read(source).data
    picture = decode_image(data, DEFAULT_MAX_PIXELS)  # upright, as the server reads it
    result = client.attention(ImageInput(data), range(num_layers), analyses=["rollout"])
    if result.patches is None or result.attentions is None or result.rollout is None:
        raise AttnserveError("the server's reply carries no patch positions: is it serving an image-text model?")
    return ImageAttention(picture.convert("RGB"), result.attentions, result.rollout, list(result.tokens),
                          result.patches)


def write_image(data: ImageAttention, view: str, path: Path, layer: int, head: int | None) -> str:
    """Write the file; returns what was written, for the command's one line."""
    suffix = path.suffix.lower()
    patches = data.patches
    # image_size: a square image's side (0 otherwise), as before; height, width, rows, cols: any image's.
    arrays = {"attentions": data.maps, "rollout": data.rollout, "boxes": patches.boxes,
              "tokens": np.array(data.tokens), "image_size": np.array(patches.image_size),
              "height": np.array(patches.height), "width": np.array(patches.width), "rows": np.array(patches.rows),
              "cols": np.array(patches.cols), "class_token": np.array(patches.class_token)}
    try:
        if suffix == ".npz":
            np.savez_compressed(path, **arrays)  # type: ignore[arg-type]
            return "every layer's weights over the patches, rollout and each position's box"
        if suffix == ".json":
            path.write_text(json.dumps({name: value.tolist() for name, value in arrays.items()} | {
                "fit": data.patches.fit}), encoding="utf-8")
            return "every layer's weights over the patches, rollout and each position's box"
        if view == "model":
            return _model_view(data, path)
        grid, what = data.grid(view, layer, head)
        overlay(data.seen(), grid).save(path)
        return what
    except OSError as e:
        raise AttnserveError(f"cannot write {path}: {e.strerror}") from None


def _model_view(data: ImageAttention, path: Path) -> str:
    """Every layer x head, each its map over the picture, in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grids = patch_maps(data.maps, data.patches.class_token, data.patches.shape)  # (L, nh, rows, cols)
    layers, heads = grids.shape[:2]
    seen = data.seen()
    seen.thumbnail((160, 160))
    figure, axes = plt.subplots(layers, heads, figsize=(1.4 * heads, 1.4 * layers), squeeze=False)
    for i in range(layers):
        for j in range(heads):
            axes[i][j].imshow(overlay(seen, grids[i, j]))
            axes[i][j].set_axis_off()
            if i == 0:
                axes[i][j].set_title(f"head {j}", fontsize=7)
        axes[i][0].text(-0.1, 0.5, f"layer {i}", transform=axes[i][0].transAxes, rotation=90, va="center",
                        ha="right", fontsize=7)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return f"model view, {layers} layers x {heads} heads"
