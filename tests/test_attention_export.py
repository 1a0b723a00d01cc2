"""`attnserve attention`'s exports (client/attention_export.py): every view as PNG and SVG, the data as .npz and
.json, against the server's own reply; bad combinations in one line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import assert_one_line_error, run_cli

TEXT = "The cat sat on the mat because it was tired."
PAIR = "It slept all afternoon."
VIEWS = ("heatmap", "heads", "model", "rollout", "norms", "stats")


@pytest.mark.parametrize("view", VIEWS)
def test_every_view_writes_a_png_and_an_svg(server, tmp_path, view):
    for extension in ("png", "svg"):
        out = tmp_path / f"{view}.{extension}"
        flags = ["--pair", PAIR] if view in ("stats", "heads") else []
        result = run_cli("attention", TEXT, *flags, "--view", view, "--scale", "log" if view == "norms" else "fixed",
                         "-o", out, "--target", server.target)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"wrote {out}: ") and result.stderr == ""
        if extension == "png":
            from matplotlib.image import imread

            image = imread(out)  # parses: a real PNG
            assert image.ndim == 3 and min(image.shape[:2]) > 200 and image.std() > 0.01  # not one flat colour
        else:
            root = ET.parse(out).getroot()  # parses: a real SVG
            assert root.tag.endswith("svg") and len(list(root.iter())) > 50


def test_npz_and_json_hold_the_servers_arrays(server, stub, tmp_path):
    npz, data = tmp_path / "a.npz", tmp_path / "a.json"
    for out, view in ((npz, "heatmap"), (data, "stats")):  # the data formats hold everything, whatever the view
        result = run_cli("attention", TEXT, "--pair", PAIR, "--view", view, "-o", out, "--target", server.target)
        assert result.returncode == 0, result.stderr
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(pair=pb.TextPair(a=TEXT, b=PAIR))], truncate=True,
                                       attention=pb.AttentionOptions(layers=list(range(6)), analyses=[
                                           "rollout", "head_stats", "norms"])), timeout=60).embeddings[0]

    def array(t: pb.Tensor) -> np.ndarray:
        return np.frombuffer(t.data, "<f4").reshape(tuple(t.shape))

    arrays = np.load(npz)
    as_json = json.loads(data.read_text())
    for got in (arrays, {k: np.array(v) for k, v in as_json.items() if k not in ("model", "text", "pair")}):
        assert list(got["tokens"]) == list(reply.tokens) and int(got["pair_start"]) == reply.pair_start
        assert got["layers"].tolist() == list(range(6))
        np.testing.assert_allclose(got["attentions"], array(reply.attentions), atol=1e-6)
        np.testing.assert_allclose(got["rollout"], array(reply.analyses.rollout), atol=1e-6)
        np.testing.assert_allclose(got["norms"], array(reply.analyses.norms), atol=1e-5)
        np.testing.assert_allclose(got["norms_summed"], array(reply.analyses.norms_summed), atol=1e-5)
        for name, grid in reply.analyses.head_stats.items():
            np.testing.assert_allclose(got[f"head_stats_{name}"], array(grid), atol=1e-6)
    assert as_json["text"] == TEXT and as_json["pair"] == PAIR


def test_html_is_a_standalone_explorer_with_the_data_in_it(server, tmp_path):
    """tests/test_explorer.py opens such a page in Chromium from file://; here: the file and what it carries."""
    import re

    out = tmp_path / "cat.html"
    result = run_cli("attention", TEXT, "--view", "rollout", "-o", out, "--target", server.target)
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") or page.lower().startswith("<!doctype html>")
    data = json.loads(re.search(r"window\.ATTNSERVE_DATA = (\{.*?\});</script>", page, re.S).group(1))
    item = data["data"][0]
    assert item["tokens"][:3] == ["[CLS]", "the", "cat"] and item["layers"] == list(range(6))
    assert item["shape"] == [6, 12, len(item["tokens"]), len(item["tokens"])]
    assert {"rollout", "norms", "norms_summed", "head_stats"} <= set(item)
    # Nothing is fetched from the network: no script, style sheet or image from elsewhere (the SVG namespace is a name)
    assert not re.search(r"""(src|href)=["']?https?://""", page) and "@import" not in page


def test_bad_combinations_are_one_line(server, tmp_path):
    def attention(*args):
        return run_cli("attention", "x", *args, "--target", server.target)

    assert_one_line_error(attention("-o", tmp_path / "m.bmp"), "the file type follows the extension, one of .png")
    assert_one_line_error(attention("--view", "model", "--head", "2", "-o", tmp_path / "m.png"),
                          "--head does not apply to --view model")
    assert_one_line_error(attention("--view", "rollout", "--layer", "9", "-o", tmp_path / "m.png"),
                          "--layer 9 is out of range: this model has 6 layers")
    assert_one_line_error(attention("--view", "flow", "-o", tmp_path / "m.png"),
                          "--view flow is not one of heatmap, heads, model, rollout, norms, stats")
    assert_one_line_error(attention("--scale", "sqrt", "-o", tmp_path / "m.png"), "--scale sqrt is not one of")
    assert_one_line_error(attention("-o", tmp_path / "missing" / "m.npz"), "cannot write")
