"""An attention grid drawn over a picture (client/image_overlay.py): each patch's colour on its own box."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from attnserve.client.image_overlay import overlay
from attnserve.engine.patch_attention import patch_boxes
from attnserve.errors import AttnserveError


def test_each_patch_colour_falls_on_its_box_and_the_brightest_is_the_largest_weight():
    picture = Image.new("RGB", (32, 32), (0, 0, 0))
    grid = np.zeros((4, 4))
    grid[2, 1] = 0.7  # patch 9
    grid[0, 3] = 0.1  # patch 3
    drawn = np.asarray(overlay(picture, grid, alpha=1.0))  # the colours alone
    assert drawn.shape == (32, 32, 3)
    boxes = patch_boxes(4, 8)
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


@pytest.mark.parametrize("grid, alpha, scale, problem", [
    (np.zeros((2, 3)), 0.5, "max", "must be square"),
    (np.zeros((2, 2)), 1.5, "max", "alpha must be between 0 and 1"),
    (np.zeros((2, 2)), 0.5, "log", "scale must be max or fixed"),
])
def test_bad_arguments_are_one_line_errors(grid, alpha, scale, problem):
    with pytest.raises(AttnserveError, match=problem):
        overlay(Image.new("RGB", (8, 8)), grid, alpha=alpha, scale=scale)
