"""Attention over image patches (attnserve/patch_attention.py) from transformers' own vision towers' maps: the class
token's row for CLIP, the received attention for SigLIP, rollout, and where each patch lies in the image; a NaFlex
image's rows x cols grid, read row-major."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnserve.attention_analyses import rollout
from attnserve.patch_attention import patch_boxes, patch_grid, patch_maps, patch_rollout

SIDE, PATCH = 32, 8  # a 4 x 4 grid


def towers(kind: str):
    import transformers

    torch.manual_seed(0)
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
              "image_size": SIDE, "patch_size": PATCH}
    if kind == "clip":
        return transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**vision)).eval()
    return transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision)).eval()


def their_maps(model, pixels: torch.Tensor) -> np.ndarray:
    """(L, nh, T, T): transformers' own maps of one image (eager attention gives them)."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(pixel_values=pixels, output_attentions=True).attentions
    return torch.stack(attentions)[:, 0].numpy()


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_patch_maps_and_rollout_read_the_towers_maps(kind):
    model = towers(kind)
    pixels = torch.from_numpy(np.random.default_rng(0).normal(size=(1, 3, SIDE, SIDE)).astype(np.float32))
    maps = their_maps(model, pixels)
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
    model = towers("clip")
    conv = model.get_input_embeddings()  # the patch embedding: a Conv of stride PATCH
    g = SIDE // PATCH
    boxes = patch_boxes(g, g, PATCH)
    assert boxes.shape == (g * g, 4) and boxes[-1].tolist() == [SIDE - PATCH, SIDE - PATCH, SIDE, SIDE]
    for k in (0, 3, 6, 13):
        top, left, bottom, right = boxes[k]
        pixels = torch.zeros(1, 3, SIDE, SIDE)
        pixels[..., top:bottom, left:right] = 1.0
        with torch.no_grad():
            tokens = conv(pixels).flatten(2).transpose(1, 2)[0]  # (N, H), as the tower flattens them
        changed = torch.nonzero(tokens.abs().sum(-1) > 1e-6).ravel().tolist()
        assert changed == [k]


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
    expected = (read / read.sum()).reshape(rows, cols)
    np.testing.assert_allclose(grids[1, 2], expected, atol=1e-6)
    assert grids[1, 2, 2, 0] == pytest.approx(read[10] / read.sum(), abs=1e-6)  # row 2, column 0: patch 10
    flow = rollout(maps)
    flow_read = flow[0, 1:] if class_token else flow.mean(0)
    np.testing.assert_allclose(patch_rollout(maps, class_token, (rows, cols)),
                               (flow_read / flow_read.sum()).reshape(rows, cols), atol=1e-6)


def test_a_shape_or_map_that_is_not_the_maps_patches_is_refused():
    maps = np.full((1, 1, 16, 16), 1 / 16)  # a class token and 15 patches
    with pytest.raises(ValueError, match=r"a 4 x 4 grid is not the 15 patches of 16 tokens \(with a class token\)"):
        patch_maps(maps, True, (4, 4))
    with pytest.raises(ValueError, match="a 3 x 5 grid is not the 16 patches of 16 tokens$"):
        patch_rollout(maps, False, (3, 5))
    with pytest.raises(ValueError, match="a -3 x -5 grid"):  # 15 patches, but no grid has -3 rows
        patch_maps(maps[..., 1:, 1:], False, (-3, -5))
    with pytest.raises(ValueError, match="not a class token and a square grid"):
        patch_grid(16, class_token=True)
    with pytest.raises(ValueError, match="not a square grid"):
        patch_grid(15, class_token=False)


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
