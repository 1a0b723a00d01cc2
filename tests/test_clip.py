"""CLIP and SigLIP (model/clip.py, model/vision_transformer.py) against transformers' CLIPModel and SiglipModel at
real configurations (ViT-B/16 with CLIP's text tower, SigLIP base-patch16-224), random weights saved as
transformers saves them: image and text features, the logits, and the attention maps over the patches. Each tower
keeps its real widths, heads, vocabulary, positions and patches, with 2 of its 12 layers: every layer runs the same
code, and 12 took a 571 MB checkpoint a model to save and load."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attnserve.errors import CheckpointError
from attnserve.model.clip import load_image_text_model, read_config

LAYERS = {"num_hidden_layers": 2}  # a tower's layers (the module docstring)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy()


def _save(model, directory):
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    config = transformers.CLIPConfig(text_config=LAYERS, vision_config={"patch_size": 16, **LAYERS},
                                     projection_dim=512)  # ViT-B/16
    return _save(transformers.CLIPModel(config).eval(), tmp_path_factory.mktemp("clip") / "model")


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    model = transformers.SiglipModel(transformers.SiglipConfig(text_config=LAYERS, vision_config=LAYERS)
                                     ).eval()  # base-patch16-224
    with torch.no_grad():  # random, not the init's 0 and 0: the scale and bias are checked too
        model.logit_scale.fill_(2.3)
        model.logit_bias.fill_(-10.0)
    return _save(model, tmp_path_factory.mktemp("siglip") / "model")


@pytest.fixture(scope="module")
def clip_models(clip_dir):
    """transformers' CLIPModel (eager attention, which gives the maps) and ours, over the same checkpoint."""
    import transformers

    reference = transformers.CLIPModel.from_pretrained(str(clip_dir), attn_implementation="eager").eval()
    return reference, load_image_text_model(clip_dir)


@pytest.fixture(scope="module")
def siglip_models(siglip_dir):
    import transformers

    reference = transformers.SiglipModel.from_pretrained(str(siglip_dir), attn_implementation="eager").eval()
    return reference, load_image_text_model(siglip_dir)


def _pixels(n: int, side: int = 224) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(1).normal(size=(n, 3, side, side)).astype(np.float32))


def _clip_texts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three texts as CLIP's tokenizer gives them: <|startoftext|> ... <|endoftext|>, padded with
    <|endoftext|> (its pad token), one of them as long as the model's 77 positions."""
    rng = np.random.default_rng(2)
    lengths = [5, 77, 12]
    ids = np.full((3, 77), 49407, dtype=np.int64)
    mask = np.zeros((3, 77), dtype=np.int64)
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, 1:n - 1], ids[row, n - 1] = 49406, rng.integers(300, 49000, n - 2), 49407
        mask[row, :n] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def test_clip_image_and_text_features_and_logits_equal_transformers(clip_models):
    reference, ours = clip_models
    pixels, (ids, mask) = _pixels(2), _clip_texts()
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask, pixel_values=pixels)
        images, texts = ours.image_features(pixels), ours.text_features(ids, mask)
        logits = ours.logits_per_image(images, texts)
    assert _cosine(images, want.image_embeds).min() >= 0.99999
    assert _cosine(texts, want.text_embeds).min() >= 0.99999
    assert torch.allclose(images, reference.get_image_features(pixel_values=pixels).pooler_output, atol=1e-4)
    assert torch.allclose(logits, want.logits_per_image, atol=1e-3)
    # The cosine of an image and a text is the logit over exp(logit_scale), as the check reads it.
    cosine = torch.nn.functional.normalize(images, dim=-1) @ torch.nn.functional.normalize(texts, dim=-1).T
    assert torch.allclose(cosine, want.logits_per_image / reference.logit_scale.exp(), atol=1e-5)
    assert torch.allclose(ours.zero_shot(logits), want.logits_per_image.softmax(dim=-1), atol=1e-5)


def test_clip_attention_over_patches_equals_transformers_eager(clip_models):
    reference, ours = clip_models
    pixels = _pixels(2)
    with torch.no_grad():
        want = reference.vision_model(pixel_values=pixels, output_attentions=True)
        hidden, pooled, maps = ours.vision(pixels, output_attentions=True)
    assert maps is not None and maps.shape == (2, 2, 12, 197, 197)  # L, B, nh, class token + 14 x 14 patches
    assert (maps - torch.stack(want.attentions)).abs().max() <= 1e-5
    assert torch.allclose(maps.sum(-1), torch.ones(()), atol=1e-5)
    assert (hidden - want.last_hidden_state).abs().max() <= 1e-4
    assert ours.vision.value_norms().shape == (2, 2, 12, 197)


def test_clip_text_tower_is_causal_and_pools_the_end_of_text(clip_models):
    reference, ours = clip_models
    ids, mask = _clip_texts()
    with torch.no_grad():
        want = reference.text_model(input_ids=ids, attention_mask=mask, output_attentions=True)
        hidden, pooled, maps = ours.text(ids, mask, output_attentions=True)
    real = mask.bool()
    assert (hidden - want.last_hidden_state)[real].abs().max() <= 1e-4
    assert (pooled - want.pooler_output).abs().max() <= 1e-4
    assert maps is not None and torch.all(maps[..., 0, 1:] == 0)  # the first token sees only itself


def test_clip_config_with_the_legacy_end_of_text_id_pools_the_highest_id(tmp_path):
    import transformers

    torch.manual_seed(0)
    small = transformers.CLIPConfig(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "eos_token_id": 2},
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": 32, "patch_size": 8}, projection_dim=32)
    directory = _save(transformers.CLIPModel(small).eval(), tmp_path / "model")
    reference = transformers.CLIPModel.from_pretrained(str(directory)).eval()
    ours = load_image_text_model(directory)
    assert ours.config.text.eos_token_id == 2
    ids, mask = _clip_texts()
    with torch.no_grad():
        want = reference.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
        assert torch.allclose(ours.text_features(ids, mask), want, atol=1e-5)


def test_siglip_features_logits_and_zero_shot_equal_transformers(siglip_models):
    reference, ours = siglip_models
    assert ours.config.vision.attention_pooling and not ours.config.text.causal
    pixels = _pixels(2)
    # SigLIP's tokenizer pads every text to 64 tokens, and the model is run without a mask: the pooled output is
    # the last position's.
    ids = torch.from_numpy(np.random.default_rng(3).integers(2, 32000, size=(3, 64)))
    ones = torch.ones_like(ids)
    with torch.no_grad():
        want = reference(input_ids=ids, pixel_values=pixels)
        images, texts = ours.image_features(pixels), ours.text_features(ids, ones)
        logits = ours.logits_per_image(images, texts)
    assert _cosine(images, want.image_embeds).min() >= 0.99999
    assert _cosine(texts, want.text_embeds).min() >= 0.99999
    assert torch.allclose(logits, want.logits_per_image, atol=1e-3)
    assert torch.allclose(ours.zero_shot(logits), torch.sigmoid(want.logits_per_image), atol=1e-5)


def test_siglip_attention_over_patches_equals_transformers_eager(siglip_models):
    reference, ours = siglip_models
    pixels = _pixels(1)
    with torch.no_grad():
        want = reference.vision_model(pixel_values=pixels, output_attentions=True)
        hidden, pooled, maps = ours.vision(pixels, output_attentions=True)
    assert maps is not None and maps.shape == (2, 1, 12, 196, 196)  # no class token: the 14 x 14 patches
    assert (maps - torch.stack(want.attentions)).abs().max() <= 1e-5
    assert (pooled - want.pooler_output).abs().max() <= 1e-4


@pytest.fixture(scope="module")
def siglip2_models(tmp_path_factory):
    """SigLIP 2's NaFlex base-patch16 (Siglip2Config's defaults: 256 position embeddings, patches of 16 px), random
    weights: transformers' Siglip2Model and ours."""
    import transformers

    torch.manual_seed(0)
    model = transformers.Siglip2Model(transformers.Siglip2Config(text_config=LAYERS, vision_config=LAYERS)).eval()
    with torch.no_grad():
        model.logit_scale.fill_(2.3)
        model.logit_bias.fill_(-10.0)
    directory = _save(model, tmp_path_factory.mktemp("siglip2") / "model")
    reference = transformers.Siglip2Model.from_pretrained(str(directory), attn_implementation="eager").eval()
    return reference, load_image_text_model(directory)


def test_siglip2_naflex_images_of_every_shape_equal_transformers(siglip2_models):
    """Images of their own rows x cols in one padded batch (wide, tall, one patch, the full 256 and more: the 16 x 16
    position grid resized down and up along each axis), with their maps, and texts."""
    reference, ours = siglip2_models
    assert ours.config.family == "siglip2" and ours.config.vision.variable_resolution
    shapes = torch.tensor([[8, 32], [25, 10], [1, 1], [16, 16], [12, 21]])  # rows, cols: at most 256 patches
    n = int(shapes.prod(-1).max())
    rng = np.random.default_rng(4)
    pixels = torch.from_numpy(rng.normal(size=(len(shapes), n, 3 * 16 * 16)).astype(np.float32))
    mask = (torch.arange(n)[None] < shapes.prod(-1)[:, None]).long()  # (B, N): each image's own patches
    ids = torch.from_numpy(rng.integers(2, 32000, size=(2, 64)))
    with torch.no_grad():
        want = reference(input_ids=ids, pixel_values=pixels, pixel_attention_mask=mask, spatial_shapes=shapes)
        want_maps = torch.stack(reference.vision_model(pixel_values=pixels, pixel_attention_mask=mask,
                                                       spatial_shapes=shapes, output_attentions=True).attentions)
        images = ours.image_features(pixels, mask, shapes)
        texts = ours.text_features(ids, torch.ones_like(ids))
        _, _, maps = ours.vision(pixels, output_attentions=True, patch_mask=mask, spatial_shapes=shapes)
    assert _cosine(images, want.image_embeds).min() >= 0.99999
    assert _cosine(texts, want.text_embeds).min() >= 0.99999
    assert torch.allclose(ours.logits_per_image(images, texts), want.logits_per_image, atol=1e-3)
    assert maps is not None
    for i, count in enumerate(shapes.prod(-1).tolist()):  # each image's maps over its own patches
        assert (maps[:, i, :, :count, :count] - want_maps[:, i, :, :count, :count]).abs().max() <= 1e-5


@pytest.mark.parametrize(("change", "fragment"), [
    ({"architectures": ["CLIPForImageClassification"]}, "CLIPForImageClassification"),
    ({"vision_config": {"hidden_act": "prelu"}}, "vision_config.hidden_act 'prelu' is not supported"),
    ({"vision_config": {"image_size": 225}}, "must be a multiple of patch_size"),
    ({"text_config": {"num_attention_heads": 7}}, "a multiple of num_attention_heads"),
    ({"text_config": "nope"}, "text_config must be an object"),
    ({"model_type": "siglip2", "architectures": ["Siglip2Model"], "vision_config": {"num_patches": 250}},
     "vision_config.num_patches 250 must be a square"),
    ({"model_type": "siglip3"}, "model_type 'siglip3' is not an image-text model \\(only clip, siglip, siglip2\\)"),
])
def test_configs_the_towers_cannot_reproduce_are_refused_in_one_line(clip_dir, change, fragment):
    import json

    raw = json.loads((clip_dir / "config.json").read_text())
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    with pytest.raises(CheckpointError, match=fragment):
        read_config(raw, clip_dir / "config.json")


def test_a_checkpoint_with_a_missing_tower_weight_is_refused_naming_it(clip_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_bytes((clip_dir / "config.json").read_bytes())
    tensors = load_file(str(clip_dir / "model.safetensors"))
    del tensors["visual_projection.weight"]
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match="visual_projection.weight"):
        load_image_text_model(directory)
