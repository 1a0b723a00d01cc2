"""An attention grid drawn over a picture (client/image_overlay.py): each patch's colour on its own box, for square
grids and a NaFlex image's rows x cols; what the client draws it over (client/image_attention.py) and writes."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from attnserve.client.client import PatchPositions, to_patches
from attnserve.client.image_attention import ImageAttention, write_image
from attnserve.client.image_overlay import overlay
from attnserve.errors import AttnserveError
from attnserve.patch_attention import patch_boxes
from attnserve.v1 import encoder_pb2 as pb


def test_each_patch_colour_falls_on_its_box_and_the_brightest_is_the_largest_weight():
    picture = Image.new("RGB", (32, 32), (0, 0, 0))
    grid = np.zeros((4, 4))
    grid[2, 1] = 0.7  # patch 9
    grid[0, 3] = 0.1  # patch 3
    drawn = np.asarray(overlay(picture, grid, alpha=1.0))  # the colours alone
    assert drawn.shape == (32, 32, 3)
    boxes = patch_boxes(4, 4, 8)
    brightness = [drawn[top:bottom, left:right].astype(int).sum(-1) for top, left, bottom, right in boxes]
    for block in brightness:  # one flat colour per patch
        assert block.min() == block.max()
    means = np.array([block[0, 0] for block in brightness])
    assert int(means.argmax()) == 9 and means[3] > means[0]
    faint = np.asarray(overlay(picture, grid, alpha=1.0, scale="fixed")).astype(int).sum(-1)
    assert faint.max() < drawn.astype(int).sum(-1).max()  # 0.7 is not the brightest on the fixed 0..1 scale


def test_the_picture_shows_through_and_the_result_writes_as_png():
    picture = Image.new("L", (40, 40), 200)  # any mode: drawn in RGB
    drawn = overlay(picture, np.full((5, 5), 0.04), alpha=0.25)
    assert drawn.mode == "RGB" and drawn.size == (40, 40)
    assert np.asarray(drawn).min() > 100  # three quarters of the light grey picture
    buffer = io.BytesIO()
    drawn.save(buffer, format="PNG")
    assert Image.open(io.BytesIO(buffer.getvalue())).size == (40, 40)


def test_a_rows_by_cols_grid_colours_each_patch_box_of_a_wide_picture():
    """A NaFlex image's 3 x 5 patches over a 40 x 24 picture (the model's image at 8 px a patch)."""
    picture = Image.new("RGB", (40, 24), (0, 0, 0))
    grid = np.zeros((3, 5))
    grid[1, 4] = 0.9  # patch 9: row 1's last
    grid[2, 0] = 0.3  # patch 10: row 2's first
    drawn = np.asarray(overlay(picture, grid, alpha=1.0))
    assert drawn.shape == (24, 40, 3)
    blocks = [drawn[top:bottom, left:right].astype(int).sum(-1) for top, left, bottom, right in patch_boxes(3, 5, 8)]
    for block in blocks:  # one flat colour per patch
        assert block.min() == block.max()
    means = np.array([block[0, 0] for block in blocks])
    assert int(means.argmax()) == 9 and means[10] > means[0] and means[0] == means[14]


def naflex_attention(picture: Image.Image, rows: int, cols: int, patch: int = 8) -> ImageAttention:
    """An ImageAttention as a NaFlex tower's reply makes it: rows x cols patches, no class token, fit patches;
    uniform maps but patch 0 draws every row's attention."""
    T = rows * cols
    maps = np.full((2, 2, T, T), 0.5 / (T - 1), dtype=np.float32)
    maps[..., 0] = 0.5
    layout = PatchPositions(0, patch, 0, False, patch_boxes(rows, cols, patch), "patches", rows * patch,
                            cols * patch, rows, cols)
    return ImageAttention(picture, maps, maps[-1, 0], [f"patch {k // cols},{k % cols}" for k in range(T)], layout)


def test_a_naflex_map_is_drawn_over_the_whole_picture_at_the_grids_aspect_ratio(tmp_path):
    data = naflex_attention(Image.new("RGB", (100, 50), (255, 255, 255)), 3, 5)  # 2:1, the grid 5:3
    seen = data.seen()
    assert seen.size == (100, 60)  # the whole picture, its width kept, stretched to 5:3
    grid, what = data.grid("heatmap", 1, None)
    assert grid.shape == (3, 5) and grid.sum() == pytest.approx(1.0) and "attention each patch receives" in what
    assert grid[0, 0] > grid[1, 3] and np.allclose(grid.ravel()[1:], grid[0, 1])
    assert data.grid("rollout", 0, None)[0].shape == (3, 5)
    write_image(data, "heatmap", tmp_path / "map.png", 1, None)
    drawn = np.asarray(Image.open(tmp_path / "map.png")).astype(int).sum(-1)
    assert drawn.shape == (60, 100)
    top_left, next_one = drawn[:20, :20], drawn[:20, 20:40]  # patch 0,0 and 0,1: 20 x 20 px each
    assert top_left.min() == top_left.max() and next_one.min() == next_one.max() and top_left[0, 0] != next_one[0, 0]
    tall = naflex_attention(Image.new("RGB", (30, 90)), 5, 2)
    assert tall.seen().size == (36, 90)  # taller than the grid's 2:5: its height kept


def test_a_naflex_maps_arrays_carry_its_rows_and_cols(tmp_path):
    data = naflex_attention(Image.new("RGB", (100, 50)), 3, 5)
    write_image(data, "heatmap", tmp_path / "maps.npz", 1, None)
    with np.load(tmp_path / "maps.npz") as arrays:
        assert (int(arrays["rows"]), int(arrays["cols"]), int(arrays["height"]), int(arrays["width"])) == (3, 5, 24, 40)
        assert int(arrays["image_size"]) == 0 and arrays["boxes"].shape == (15, 4)
    write_image(data, "heatmap", tmp_path / "maps.json", 1, None)
    written = json.loads((tmp_path / "maps.json").read_text())
    assert [written[k] for k in ("rows", "cols", "height", "width", "fit")] == [3, 5, 24, 40, "patches"]


def test_an_older_servers_square_patch_positions_imply_rows_and_cols():
    """A reply without height, width, rows, cols (fields 7-10): a square image, its grid and size stand for them."""
    old = to_patches(pb.PatchPositions(image_size=32, patch_size=8, grid=4, class_token=True, fit="crop",
                                       boxes=[0] * 17 * 4))
    assert (old.rows, old.cols, old.height, old.width, old.shape) == (4, 4, 32, 32, (4, 4))
    new = to_patches(pb.PatchPositions(patch_size=8, fit="patches", boxes=[0] * 15 * 4, height=24, width=40, rows=3,
                                       cols=5))
    assert (new.image_size, new.grid, new.shape, new.height, new.width) == (0, 0, (3, 5), 24, 40)


@pytest.mark.parametrize("grid, alpha, scale, problem", [
    (np.zeros((2, 3, 1)), 0.5, "max", "must be rows x cols"),
    (np.zeros((0, 3)), 0.5, "max", "must be rows x cols"),
    (np.zeros((2, 2)), 1.5, "max", "alpha must be between 0 and 1"),
    (np.zeros((2, 2)), 0.5, "log", "scale must be max or fixed"),
])
def test_bad_arguments_are_one_line_errors(grid, alpha, scale, problem):
    with pytest.raises(AttnserveError, match=problem):
        overlay(Image.new("RGB", (8, 8)), grid, alpha=alpha, scale=scale)
