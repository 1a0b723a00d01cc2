"""CLIP, SigLIP and SigLIP 2 (model/clip.py, model/vision_transformer.py) against transformers' models at real
configurations (ViT-B/16 with CLIP's text tower, SigLIP base-patch16-224, SigLIP 2's NaFlex base-patch16) with 2 of
their 12 layers (every layer runs the same code), random weights: features, logits, the maps over the patches. Then
CLIP as sentence-transformers saves it (model/clip.py image_text_checkpoint), at the root and in the legacy folder,
against its own encode. What cannot be reproduced is refused in one line."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from attnserve.engine.image_processor import image_processor_in
from attnserve.errors import CheckpointError
from attnserve.images import decode_image
from attnserve.model.attention_reach import CAUSAL, EVERY_KEY, beyond, reach_of
from attnserve.model.clip import TextEncoder, image_text_checkpoint, load_image_text_model, read_config
from tests.checkpoints import TINY_TOWER
from tests.test_image_serving import IMAGES  # PNGs of several sizes and modes (RGB, RGBA, L)

LAYERS = {"num_hidden_layers": 2}  # a tower's layers (the module docstring)
CONFIGS = {  # the model class, and its config's real sizes at LAYERS
    "clip": ("CLIP", {"text_config": LAYERS, "vision_config": {"patch_size": 16, **LAYERS}, "projection_dim": 512}),
    "siglip": ("Siglip", {"text_config": LAYERS, "vision_config": LAYERS}),
    "siglip2": ("Siglip2", {"text_config": LAYERS, "vision_config": LAYERS}),  # 256 position embeddings, 16 px
}


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    """By name: transformers' model (eager attention, which gives the maps), ours over the same checkpoint, and its
    folder; SigLIP's scale and bias random, not the init's 0 and 0, so that they are checked too."""
    import transformers

    made = {}

    def get(name: str):
        if name not in made:
            kind, config = CONFIGS[name]
            torch.manual_seed(0)
            model = getattr(transformers, f"{kind}Model")(getattr(transformers, f"{kind}Config")(**config)).eval()
            if name != "clip":
                with torch.no_grad():
                    model.logit_scale.fill_(2.3)
                    model.logit_bias.fill_(-10.0)
            directory = tmp_path_factory.mktemp(name) / "model"
            model.save_pretrained(str(directory), safe_serialization=True)
            reference = getattr(transformers, f"{kind}Model").from_pretrained(str(directory),
                                                                             attn_implementation="eager").eval()
            made[name] = reference, load_image_text_model(directory), directory
        return made[name]

    return get


def _cosine(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy()


def _pixels(n: int, side: int = 224) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(1).normal(size=(n, 3, side, side)).astype(np.float32))


def _texts(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP's: three texts as its tokenizer gives them, <|startoftext|> ... <|endoftext|>, padded with <|endoftext|>
    (its pad token), one as long as the model's 77 positions. SigLIP's: padded to 64 tokens and run without a mask
    (the pooled output is the last position's)."""
    rng = np.random.default_rng(2)
    if name != "clip":
        ids = torch.from_numpy(np.random.default_rng(3).integers(2, 32000, size=(3, 64)))
        return ids, torch.ones_like(ids)
    ids = np.full((3, 77), 49407, dtype=np.int64)
    mask = np.zeros((3, 77), dtype=np.int64)
    for row, n in enumerate([5, 77, 12]):
        ids[row, 0], ids[row, 1:n - 1], ids[row, n - 1] = 49406, rng.integers(300, 49000, n - 2), 49407
        mask[row, :n] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_image_and_text_features_logits_and_zero_shot_equal_transformers(towers, name):
    reference, ours, _ = towers(name)
    assert (ours.config.vision.attention_pooling, ours.config.text.causal) == (name != "clip", name == "clip")
    pixels, (ids, mask) = _pixels(2), _texts(name)
    with torch.no_grad():
        want = reference(input_ids=ids, pixel_values=pixels, **({"attention_mask": mask} if name == "clip" else {}))
        images, texts = ours.image_features(pixels), ours.text_features(ids, mask)
        logits = ours.logits_per_image(images, texts)
        features = reference.get_image_features(pixel_values=pixels).pooler_output
    assert _cosine(images, want.image_embeds).min() >= 0.99999
    assert _cosine(texts, want.text_embeds).min() >= 0.99999
    assert torch.allclose(images, features, atol=1e-4)
    assert torch.allclose(logits, want.logits_per_image, atol=1e-3)
    # The cosine of an image and a text is the logit, less SigLIP's bias, over exp(logit_scale).
    cosine = torch.nn.functional.normalize(images, dim=-1) @ torch.nn.functional.normalize(texts, dim=-1).T
    bias = reference.logit_bias if name != "clip" else 0.0
    assert torch.allclose(cosine, (want.logits_per_image - bias) / reference.logit_scale.exp(), atol=1e-5)
    scores = want.logits_per_image.softmax(-1) if name == "clip" else want.logits_per_image.sigmoid()
    assert torch.allclose(ours.zero_shot(logits), scores, atol=1e-5)  # a softmax over the texts, or each's sigmoid


@pytest.mark.parametrize("name, tokens", [("clip", 197), ("siglip", 196)])  # CLIP's class token + 14 x 14 patches
def test_attention_over_patches_equals_transformers_eager(towers, name, tokens):
    reference, ours, _ = towers(name)
    pixels = _pixels(2)
    with torch.no_grad():
        want = reference.vision_model(pixel_values=pixels, output_attentions=True)
        hidden, pooled, maps = ours.vision(pixels, output_attentions=True)
    assert maps is not None and maps.shape == (2, 2, 12, tokens, tokens)  # L, B, nh, T, T
    assert (maps - torch.stack(want.attentions)).abs().max() <= 1e-5
    assert torch.allclose(maps.sum(-1), torch.ones(()), atol=1e-5)
    assert (hidden - want.last_hidden_state).abs().max() <= 1e-4
    assert (pooled - want.pooler_output).abs().max() <= 1e-4
    assert ours.vision.value_norms().shape == (2, 2, 12, tokens)


def test_clip_text_tower_is_causal_and_pools_the_end_of_text(towers):
    reference, ours, _ = towers("clip")
    ids, mask = _texts("clip")
    with torch.no_grad():
        want = reference.text_model(input_ids=ids, attention_mask=mask, output_attentions=True)
        hidden, pooled, maps = ours.text(ids, mask, output_attentions=True)
    assert (hidden - want.last_hidden_state)[mask.bool()].abs().max() <= 1e-4
    assert (pooled - want.pooler_output).abs().max() <= 1e-4
    assert maps is not None and torch.all(maps[..., 0, 1:] == 0)  # the first token sees only itself
    # The reach TextEncoder declares (the manifest's, drawn as masked by clients) is exactly where the 77-token
    # text's maps are 0, in every layer; SigLIP's text tower declares every key.
    reach = reach_of(TextEncoder(ours.config))
    assert reach == (CAUSAL,) * len(reach) and reach_of(TextEncoder(towers("siglip")[1].config))[0] == EVERY_KEY
    for layer, layer_reach in enumerate(reach):
        closed = beyond(layer_reach, 77)
        assert torch.count_nonzero(maps[layer, 1][:, closed]) == 0 and bool((maps[layer, 1][:, ~closed] > 0).all())


def test_clip_config_with_the_legacy_end_of_text_id_pools_the_highest_id(tmp_path):
    import transformers

    torch.manual_seed(0)
    small = transformers.CLIPConfig(text_config={**TINY_TOWER, "eos_token_id": 2}, projection_dim=32,
                                    vision_config={**TINY_TOWER, "image_size": 32, "patch_size": 8})
    transformers.CLIPModel(small).eval().save_pretrained(str(tmp_path), safe_serialization=True)
    reference = transformers.CLIPModel.from_pretrained(str(tmp_path)).eval()
    ours = load_image_text_model(tmp_path)
    assert ours.config.text.eos_token_id == 2
    ids, mask = _texts("clip")
    with torch.no_grad():
        want = reference.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
        assert torch.allclose(ours.text_features(ids, mask), want, atol=1e-5)


def test_siglip2_naflex_images_of_every_shape_equal_transformers(towers):
    """Images of their own rows x cols in one padded batch (wide, tall, one patch, the full 256 and more: the 16 x 16
    position grid resized down and up along each axis), with their maps, and texts."""
    reference, ours, _ = towers("siglip2")
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
def test_configs_the_towers_cannot_reproduce_are_refused_in_one_line(towers, change, fragment):
    directory = towers("clip")[2]
    raw = json.loads((directory / "config.json").read_text())
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    with pytest.raises(CheckpointError, match=fragment):
        read_config(raw, directory / "config.json")


def test_a_checkpoint_with_a_missing_tower_weight_is_refused_naming_it(towers, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = towers("clip")[2]
    (tmp_path / "config.json").write_bytes((directory / "config.json").read_bytes())
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors["visual_projection.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="visual_projection.weight"):
        load_image_text_model(tmp_path)


# --- as sentence-transformers saves it (the tiny CLIP of tests/checkpoints.py, 32 px) ----------------------------

def check_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    cosines = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
    assert cosines.min() >= 0.99999, cosines
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def check_images_as_sentence_transformers_encodes(directory) -> np.ndarray:
    """Our towers and preprocessing over a sentence-transformers folder against its own encode; ours."""
    from sentence_transformers import SentenceTransformer

    model = load_image_text_model(directory)
    processor = image_processor_in(image_text_checkpoint(directory).directory)
    pixels = np.stack([processor.pixels(decode_image(data)) for data in IMAGES])
    with torch.no_grad():
        features = model.image_features(torch.from_numpy(pixels))
    ours = (F.normalize(features, dim=-1) if model.normalize else features).numpy()
    theirs = SentenceTransformer(str(directory), device="cpu")
    check_equal(ours, theirs.encode([Image.open(io.BytesIO(data)) for data in IMAGES], convert_to_numpy=True))
    return ours


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalized"])
def test_a_sentence_transformers_save_embeds_images_as_it_does(clip_dir, tmp_path, normalize):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Transformer

    saved = tmp_path / "st"
    SentenceTransformer(modules=[Transformer(str(clip_dir)), *([Normalize()] if normalize else [])],
                        device="cpu").save(str(saved))
    assert image_text_checkpoint(saved).normalize is normalize
    assert not (saved / "preprocessor_config.json").exists()  # its preprocessing is in processor_config.json
    ours = check_images_as_sentence_transformers_encodes(saved)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-6)


def legacy_save(clip_dir, saved, *modules: str):
    """sentence-transformers' legacy CLIP save: a CLIPModel module in 0_CLIPModel, then `modules` (Normalize)."""
    shutil.copytree(clip_dir, saved / "0_CLIPModel")
    entries = [{"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"}]
    for i, module in enumerate(modules, start=1):
        (saved / f"{i}_{module}").mkdir()
        entries.append({"idx": i, "name": str(i), "path": f"{i}_{module}",
                        "type": f"sentence_transformers.models.{module}"})
    (saved / "modules.json").write_text(json.dumps(entries))
    return saved


def test_the_legacy_clip_module_in_its_own_folder(clip_dir, tmp_path):
    saved = legacy_save(clip_dir, tmp_path / "legacy")
    assert image_text_checkpoint(saved).directory == saved / "0_CLIPModel"
    check_images_as_sentence_transformers_encodes(saved)


def test_a_legacy_save_exports_and_serves_as_sentence_transformers_encodes(clip_dir, tmp_path):
    """`attnserve export` of a legacy save's root (with Normalize), then the engine's image and text embeddings
    against its encode()."""
    from sentence_transformers import SentenceTransformer

    from attnserve.engine.engine import Engine
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    saved = legacy_save(clip_dir, tmp_path / "legacy", "Normalize")
    manifest = build_artifacts(read_checkpoint(saved), tmp_path / "artifacts", log=lambda m: None,
                               variants=["embeddings"])
    assert manifest.model == "legacy" and manifest.normalize and manifest.images is not None
    engine = Engine.from_directory(tmp_path / "artifacts")
    texts = ["a photo of the cat", "the dog"]
    theirs = SentenceTransformer(str(saved), device="cpu")
    check_equal(engine.encode(texts).embeddings, theirs.encode(texts, convert_to_numpy=True))
    assert engine.images is not None
    rows = engine.run([engine.images.prepare(data) for data in IMAGES]).sentence_embedding
    ours = rows / np.linalg.norm(rows, axis=-1, keepdims=True)
    check_equal(ours, theirs.encode([Image.open(io.BytesIO(data)) for data in IMAGES], convert_to_numpy=True))


@pytest.mark.parametrize("modules, settings, problem", [
    ([{"path": "", "type": "sentence_transformers.models.Transformer"},
      {"path": "1_Dense", "type": "sentence_transformers.models.Dense"}], None, "Transformer, Dense"),
    ([{"path": "../elsewhere", "type": "sentence_transformers.models.CLIPModel"}], None, "not a folder inside"),
    ([], None, "expected a list of module objects"),
    ([{"path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}], {"modality_config": {
        "text": {"method": "get_text_features", "method_output_name": "pooler_output"},
        "image": {"method": "forward", "method_output_name": "image_embeds"}}}, "cannot reproduce modality_config"),
])
def test_a_pipeline_it_cannot_reproduce_is_refused(tmp_path, modules, settings, problem):
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if settings:  # other methods for a modality
        (tmp_path / "sentence_bert_config.json").write_text(json.dumps(settings))
    with pytest.raises(CheckpointError, match=problem):
        image_text_checkpoint(tmp_path)


def test_the_preprocessing_is_read_where_transformers_reads_it(clip_dir, tmp_path):
    import transformers

    def crops() -> tuple[tuple[int, int], tuple[int, int]]:
        theirs = transformers.AutoImageProcessor.from_pretrained(str(tmp_path), backend="pil").crop_size
        return image_processor_in(tmp_path).crop, (theirs["height"], theirs["width"])

    processor = json.loads((clip_dir / "processor_config.json").read_text())["image_processor"]
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "preprocessor_config.json").write_text(json.dumps(processor))
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": processor,
                                                                "processor_class": "CLIPProcessor"}))
    assert image_processor_in(tmp_path) == image_processor_in(tmp_path / "flat")
    # both files, each its own crop: transformers 5 reads processor_config.json's, and so do we
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**processor, "crop_size": {"height": 16,
                                                                                           "width": 16}}))
    assert crops() == ((32, 32), (32, 32))
    # a processor file without image_processor (an older one): preprocessor_config.json's
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "CLIPProcessor"}))
    assert crops() == ((16, 16), (16, 16))
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": [1, 2]}))
    with pytest.raises(CheckpointError, match="image_processor must be an object"):
        image_processor_in(tmp_path)
    (tmp_path / "processor_config.json").unlink()
    (tmp_path / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match="checkpoint file missing: .*preprocessor_config.json"):
        image_processor_in(tmp_path)
