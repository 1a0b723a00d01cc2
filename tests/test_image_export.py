"""The image tower's graphs (export/image_tower.py) for CLIP ViT-B/32's, SigLIP's and SigLIP 2's shapes, random
weights: each verified against PyTorch at export, then run here on batch sizes the export never saw; a graph off its
bar, and a NaFlex processor of other patches than its tower's, refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnserve.engine.session import CPU, open_session
from attnserve.errors import ExportVerificationError
from attnserve.export.image_tower import (
    BARS,
    GRAPHS,
    SHARED,
    ImageTower,
    export_image_tower,
    graph_names,
    image_artifacts,
    naflex_feed,
    verify_image_graph,
)
from attnserve.model.clip import load_image_text_model


@pytest.fixture(scope="module", params=["clip", "siglip", "siglip2"])
def exported(request, tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp(request.param)
    # openai/clip-vit-base-patch32's and siglip-base-patch16-224's widths, patches and heads, at 2 layers: the same
    # graph code as at 12 (tests/test_clip.py checks the towers at their full depth against transformers).
    depth = {"vision_config": {"num_hidden_layers": 2}, "text_config": {"num_hidden_layers": 1}}
    if request.param == "clip":
        reference = transformers.CLIPModel(transformers.CLIPConfig(projection_dim=512, **depth))
    elif request.param == "siglip2":  # NaFlex base-patch16: 256 position embeddings, images of any shape
        reference = transformers.Siglip2Model(transformers.Siglip2Config(**depth))
    else:
        reference = transformers.SiglipModel(transformers.SiglipConfig(**depth))
    reference.eval().save_pretrained(str(root / "model"))
    model = load_image_text_model(root / "model")
    # NaFlex: checked up to 64 patches an image (the graph is the same at any count; tests/test_clip.py runs 256)
    parities = export_image_tower(model, root / "graphs", max_patches=64 if request.param == "siglip2" else 0)
    return model, root / "graphs", parities


def test_every_graph_is_written_and_holds_its_bar(exported):
    _, graphs, parities = exported
    assert set(parities) == set(graph_names())  # bf16 where OpenVINO runs it natively here
    for name, precision in GRAPHS.items():
        if name not in parities:
            continue
        assert (graphs / f"{SHARED.get(name, (name,))[0]}.onnx").is_file()
        assert parities[name]["min_cosine_image_embeds"] >= BARS[precision].min_cosine, (name, parities[name])
        assert parities[name]["images_checked"] == 8
    assert parities["image_embeds"]["max_abs_last_hidden_state"] <= 1e-4
    assert parities["image_attention"]["max_abs_attentions"] <= 1e-5


def unseen_feed(model, batch: int) -> dict[str, np.ndarray]:
    """A batch of `batch` images the checks never ran: a NaFlex tower's of rows x cols patches of their own."""
    cfg = model.config.vision
    rng = np.random.default_rng(batch)
    if not cfg.variable_resolution:
        return {"pixel_values": rng.normal(size=(batch, 3, cfg.image_size, cfg.image_size)).astype(np.float32)}
    shapes = [(int(r), int(rng.integers(1, cfg.num_patches // r + 1))) for r in rng.integers(1, 17, size=batch)]
    return naflex_feed(shapes, 3 * cfg.patch_size ** 2, rng)


@pytest.mark.parametrize("batch", [3, 7])
def test_graphs_run_at_unseen_batch_sizes_as_pytorch_and_one_off_its_bar_is_refused(exported, batch):
    model, graphs, _ = exported
    feed = unseen_feed(model, batch)
    with torch.no_grad():
        embeds, hidden, maps, norms = ImageTower(model, True)(**{k: torch.from_numpy(v) for k, v in feed.items()})
    session = open_session(graphs / "image_attention.onnx", CPU)
    got_embeds, got_hidden, got_maps, got_norms = session.run(None, feed)
    assert np.abs(got_embeds - embeds.numpy()).max() <= 1e-4
    counts = feed["pixel_attention_mask"].sum(1) if "pixel_attention_mask" in feed else [maps.shape[-1]] * batch
    for i, n in enumerate(counts):  # each image's own positions (a NaFlex batch's padding is no image's)
        assert np.abs(got_maps[:, i, :, :n, :n] - maps.numpy()[:, i, :, :n, :n]).max() <= 1e-5
        assert np.allclose(got_maps[:, i, :, :n, :n].sum(-1), 1, atol=1e-5)
        assert np.abs(got_norms[:, i, :, :n] - norms.numpy()[:, i, :, :n]).max() <= \
            1e-3 * max(1.0, float(norms.abs().max()))
    assert got_maps.shape[1] == batch
    wrong = [(-embeds.numpy(), hidden.numpy(), maps.numpy(), norms.numpy())]  # the opposite direction
    with pytest.raises(ExportVerificationError, match="image_embeds.onnx \\(fp32\\) fails parity with PyTorch"):
        verify_image_graph(graphs / "image_embeds.onnx", "fp32", [feed], wrong)


def test_a_naflex_processor_of_other_patches_than_the_towers_is_refused_before_any_graph_is_traced(tmp_path):
    import transformers

    from attnserve.errors import CheckpointError
    from tests.checkpoints import save_tiny_siglip2

    checkpoint = save_tiny_siglip2(tmp_path / "model")
    transformers.Siglip2ImageProcessor(patch_size=16, max_num_patches=24).save_pretrained(str(checkpoint))
    with pytest.raises(CheckpointError, match="takes images in patches of 8 px, and its image processor gives "
                                              "patches of 16 px"):
        image_artifacts(checkpoint, tmp_path / "work", log=lambda m: None)
