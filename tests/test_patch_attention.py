"""Attention over image patches (attnserve/patch_attention.py) from transformers' own vision towers' maps: the class
token's row for CLIP, the received attention for SigLIP, rollout, and where each patch lies in the image; a NaFlex
image's rows x cols grid, read row-major. Then the grid drawn over a picture (client/image_overlay.py): each patch's
colour on its own box; what the client draws it over (client/image_attention.py) and writes."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from attnserve.attention_analyses import rollout
from attnserve.client.client import PatchPositions, to_patches
from attnserve.client.image_attention import ImageAttention, write_image
from attnserve.client.image_overlay import overlay
from attnserve.errors import AttnserveError
from attnserve.patch_attention import patch_boxes, patch_grid, patch_maps, patch_rollout
from attnserve.v1 import encoder_pb2 as pb

SIDE, PATCH = 32, 8  # a 4 x 4 grid


def towers(kind: str):
    import transformers

    torch.manual_seed(0)
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
              "image_size": SIDE, "patch_size": PATCH}
    if kind == "clip":
        return transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**vision)).eval()
    return transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision)).eval()


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_patch_maps_and_rollout_read_the_towers_maps(kind):
    """transformers' own maps of one image (eager attention gives them)."""
    model = towers(kind)
    model.set_attn_implementation("eager")
    pixels = torch.from_numpy(np.random.default_rng(0).normal(size=(1, 3, SIDE, SIDE)).astype(np.float32))
    with torch.no_grad():
        maps = torch.stack(model(pixel_values=pixels, output_attentions=True).attentions)[:, 0].numpy()
    class_token = kind == "clip"
    g = SIDE // PATCH
    assert maps.shape[-1] == g * g + int(class_token) and patch_grid(maps.shape[-1], class_token) == g
    grids = patch_maps(maps, class_token)
    assert grids.shape == (3, 4, g, g)
    np.testing.assert_allclose(grids.sum(axis=(-2, -1)), 1.0, atol=1e-5)
    if class_token:  # layer 1, head 2: the class token's row over the 16 patches, renormalised
        row = maps[1, 2, 0, 1:]
        np.testing.assert_allclose(grids[1, 2].ravel(), row / row.sum(), atol=1e-6)
    else:  # what patch 5 receives, averaged over every patch's row
        np.testing.assert_allclose(grids[1, 2].ravel()[5], maps[1, 2, :, 5].mean() / maps[1, 2].mean(0).sum(),
                                   atol=1e-6)
    flow = rollout(maps)
    expected = flow[0, 1:] / flow[0, 1:].sum() if class_token else flow.mean(0) / flow.mean(0).sum()
    np.testing.assert_allclose(patch_rollout(maps, class_token).ravel(), expected, atol=1e-6)


def test_each_patch_box_is_where_its_token_looks():
    """Pixels only inside patch k's box change only token k's patch embedding: the boxes are the maps' order."""
    conv = towers("clip").get_input_embeddings()  # the patch embedding: a Conv of stride PATCH
    g = SIDE // PATCH
    boxes = patch_boxes(g, g, PATCH)
    assert boxes.shape == (g * g, 4) and boxes[-1].tolist() == [SIDE - PATCH, SIDE - PATCH, SIDE, SIDE]
    for k in (0, 3, 6, 13):
        top, left, bottom, right = boxes[k]
        pixels = torch.zeros(1, 3, SIDE, SIDE)
        pixels[..., top:bottom, left:right] = 1.0
        with torch.no_grad():
            tokens = conv(pixels).flatten(2).transpose(1, 2)[0]  # (N, H), as the tower flattens them
        assert torch.nonzero(tokens.abs().sum(-1) > 1e-6).ravel().tolist() == [k]


@pytest.mark.parametrize("class_token", [False, True])
def test_a_rows_by_cols_grid_is_read_row_major(class_token):
    """A NaFlex image's 3 x 5 patches: the reads of patch_maps and rollout, reshaped by hand to 3 rows of 5."""
    rows, cols = 3, 5
    T = rows * cols + int(class_token)
    weights = np.random.default_rng(1).random((2, 3, T, T))
    maps = weights / weights.sum(-1, keepdims=True)  # (L, nh, T, T), rows summing to 1 as softmax's
    grids = patch_maps(maps, class_token, (rows, cols))
    assert grids.shape == (2, 3, rows, cols)
    read = maps[1, 2, 0, 1:] if class_token else maps[1, 2].mean(0)  # (15,): patch k is row k // 5, column k % 5
    np.testing.assert_allclose(grids[1, 2], (read / read.sum()).reshape(rows, cols), atol=1e-6)
    assert grids[1, 2, 2, 0] == pytest.approx(read[10] / read.sum(), abs=1e-6)  # row 2, column 0: patch 10
    flow = rollout(maps)
    flow_read = flow[0, 1:] if class_token else flow.mean(0)
    np.testing.assert_allclose(patch_rollout(maps, class_token, (rows, cols)),
                               (flow_read / flow_read.sum()).reshape(rows, cols), atol=1e-6)


MAPS = np.full((1, 1, 16, 16), 1 / 16)  # a class token and 15 patches, or 16 patches


@pytest.mark.parametrize("call, problem", [
    (lambda: patch_maps(MAPS, True, (4, 4)), r"a 4 x 4 grid is not the 15 patches of 16 tokens \(with a class token\)"),
    (lambda: patch_rollout(MAPS, False, (3, 5)), "a 3 x 5 grid is not the 16 patches of 16 tokens$"),
    (lambda: patch_maps(MAPS[..., 1:, 1:], False, (-3, -5)), "a -3 x -5 grid"),  # 15 patches, no grid of -3 rows
    (lambda: patch_grid(16, class_token=True), "not a class token and a square grid"),
    (lambda: patch_grid(15, class_token=False), "not a square grid"),
])
def test_a_shape_or_map_that_is_not_the_maps_patches_is_refused(call, problem):
    with pytest.raises(ValueError, match=problem):
        call()


def test_the_boxes_of_a_rows_by_cols_grid_tile_its_image():
    """3 x 5 patches of 8 px: a 24 x 40 image, row-major, every pixel in exactly one box."""
    boxes = patch_boxes(3, 5, PATCH)
    assert boxes.shape == (15, 4)
    assert boxes[4].tolist() == [0, 32, 8, 40] and boxes[5].tolist() == [8, 0, 16, 8]  # row 0's last, row 1's first
    assert boxes[-1].tolist() == [16, 32, 24, 40]
    covered = np.zeros((3 * PATCH, 5 * PATCH), dtype=int)
    for top, left, bottom, right in boxes:
        covered[top:bottom, left:right] += 1
    assert (covered == 1).all()


# --- drawn over the picture --------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, cols, bright, faint", [(4, 4, 9, 3), (3, 5, 9, 10)])
def test_each_patch_colour_falls_on_its_box_and_the_brightest_is_the_largest_weight(rows, cols, bright, faint):
    """Square grids and a NaFlex image's 3 x 5 patches over a 40 x 24 picture (the model's image at 8 px a patch)."""
    picture = Image.new("RGB", (cols * 8, rows * 8), (0, 0, 0))
    grid = np.zeros((rows, cols))
    grid.ravel()[bright] = 0.7
    grid.ravel()[faint] = 0.1
    drawn = np.asarray(overlay(picture, grid, alpha=1.0))  # the colours alone
    assert drawn.shape == (rows * 8, cols * 8, 3)
    blocks = [drawn[top:bottom, left:right].astype(int).sum(-1) for top, left, bottom, right in
              patch_boxes(rows, cols, 8)]
    assert all(block.min() == block.max() for block in blocks)  # one flat colour per patch
    means = np.array([block[0, 0] for block in blocks])
    assert int(means.argmax()) == bright and means[faint] > means[0] and means[0] == means[-1]
    faded = np.asarray(overlay(picture, grid, alpha=1.0, scale="fixed")).astype(int).sum(-1)
    assert faded.max() < drawn.astype(int).sum(-1).max()  # 0.7 is not the brightest on the fixed 0..1 scale


def test_the_picture_shows_through_and_the_result_writes_as_png():
    drawn = overlay(Image.new("L", (40, 40), 200), np.full((5, 5), 0.04), alpha=0.25)  # any mode: drawn in RGB
    assert drawn.mode == "RGB" and drawn.size == (40, 40)
    assert np.asarray(drawn).min() > 100  # three quarters of the light grey picture
    buffer = io.BytesIO()
    drawn.save(buffer, format="PNG")
    assert Image.open(io.BytesIO(buffer.getvalue())).size == (40, 40)


def naflex_attention(picture: Image.Image, rows: int, cols: int, patch: int = 8) -> ImageAttention:
    """An ImageAttention as a NaFlex tower's reply makes it: rows x cols patches, no class token, fit patches;
    uniform maps but patch 0 draws every row's attention."""
    T = rows * cols
    maps = np.full((2, 2, T, T), 0.5 / (T - 1), dtype=np.float32)
    maps[..., 0] = 0.5
    layout = PatchPositions(0, patch, 0, False, patch_boxes(rows, cols, patch), "patches", rows * patch,
                            cols * patch, rows, cols)
    return ImageAttention(picture, maps, maps[-1, 0], [f"patch {k // cols},{k % cols}" for k in range(T)], layout)


def test_a_naflex_map_is_drawn_over_the_whole_picture_at_the_grids_aspect_ratio_and_its_arrays_carry_it(tmp_path):
    data = naflex_attention(Image.new("RGB", (100, 50), (255, 255, 255)), 3, 5)  # 2:1, the grid 5:3
    assert data.seen().size == (100, 60)  # the whole picture, its width kept, stretched to 5:3
    grid, what = data.grid("heatmap", 1, None)
    assert grid.shape == (3, 5) and grid.sum() == pytest.approx(1.0) and "attention each patch receives" in what
    assert grid[0, 0] > grid[1, 3] and np.allclose(grid.ravel()[1:], grid[0, 1])
    assert data.grid("rollout", 0, None)[0].shape == (3, 5)
    write_image(data, "heatmap", tmp_path / "map.png", 1, None)
    drawn = np.asarray(Image.open(tmp_path / "map.png")).astype(int).sum(-1)
    assert drawn.shape == (60, 100)
    top_left, next_one = drawn[:20, :20], drawn[:20, 20:40]  # patch 0,0 and 0,1: 20 x 20 px each
    assert top_left.min() == top_left.max() and next_one.min() == next_one.max() and top_left[0, 0] != next_one[0, 0]
    assert naflex_attention(Image.new("RGB", (30, 90)), 5, 2).seen().size == (36, 90)  # taller: its height kept
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
