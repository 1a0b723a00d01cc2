"""CLIP as sentence-transformers saves it (model/clip.py image_text_checkpoint): its Transformer module at the
root (5.4 and later, the preprocessing in processor_config.json) and the legacy CLIPModel module in its own folder,
with and without Normalize, read to the same towers. Each image's embedding equals sentence-transformers' own
encode of it; a pipeline that cannot be reproduced is refused in one line."""

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
from attnserve.model.clip import image_text_checkpoint, load_image_text_model


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    """A small CLIPModel as transformers saves it, with its image processor (32 px)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": 32, "patch_size": 8}, projection_dim=32)
    directory = tmp_path_factory.mktemp("clip") / "model"
    transformers.CLIPModel(config).eval().save_pretrained(str(directory), safe_serialization=True)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        str(directory))
    return directory


def images() -> list[bytes]:
    """PNGs of several sizes and modes (RGB, RGBA, L), random pixels."""
    rng = np.random.default_rng(0)
    out = []
    for (height, width), mode in (((40, 56), "RGB"), ((33, 32), "RGBA"), ((64, 48), "L")):
        channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
        array = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(array.squeeze(-1) if channels == 1 else array, mode).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def ours_of(directory) -> np.ndarray:
    model = load_image_text_model(directory)
    processor = image_processor_in(image_text_checkpoint(directory).directory)
    pixels = np.stack([processor.pixels(decode_image(data)) for data in images()])
    with torch.no_grad():
        features = model.image_features(torch.from_numpy(pixels))
    return (F.normalize(features, dim=-1) if model.normalize else features).numpy()


def theirs_of(directory) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(directory), device="cpu")
    return model.encode([Image.open(io.BytesIO(data)) for data in images()], convert_to_numpy=True)


def check_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    cosines = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
    assert cosines.min() >= 0.99999, cosines
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalized"])
def test_a_sentence_transformers_save_embeds_images_as_it_does(clip_dir, tmp_path, normalize):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Transformer

    saved = tmp_path / "st"
    SentenceTransformer(modules=[Transformer(str(clip_dir)), *([Normalize()] if normalize else [])],
                        device="cpu").save(str(saved))
    assert image_text_checkpoint(saved).normalize is normalize
    assert not (saved / "preprocessor_config.json").exists()  # its preprocessing is in processor_config.json
    ours = ours_of(saved)
    check_equal(ours, theirs_of(saved))
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-6)


def test_the_legacy_clip_module_in_its_own_folder(clip_dir, tmp_path):
    saved = tmp_path / "legacy"
    shutil.copytree(clip_dir, saved / "0_CLIPModel")
    (saved / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"}]))
    assert image_text_checkpoint(saved).directory == saved / "0_CLIPModel"
    check_equal(ours_of(saved), theirs_of(saved))


@pytest.mark.parametrize("modules, problem", [
    ([{"path": "", "type": "sentence_transformers.models.Transformer"},
      {"path": "1_Dense", "type": "sentence_transformers.models.Dense"}], "Transformer, Dense"),
    ([{"path": "../elsewhere", "type": "sentence_transformers.models.CLIPModel"}], "not a folder inside"),
    ([], "expected a list of module objects"),
])
def test_a_pipeline_it_cannot_reproduce_is_refused(tmp_path, modules, problem):
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match=problem):
        image_text_checkpoint(tmp_path)


def test_other_methods_for_a_modality_are_refused(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}]))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"modality_config": {
        "text": {"method": "get_text_features", "method_output_name": "pooler_output"},
        "image": {"method": "forward", "method_output_name": "image_embeds"}}}))
    with pytest.raises(CheckpointError, match="cannot reproduce modality_config"):
        image_text_checkpoint(tmp_path)


def test_the_preprocessing_is_read_where_transformers_reads_it(clip_dir, tmp_path):
    import transformers

    processor = json.loads((clip_dir / "preprocessor_config.json").read_text())
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": processor,
                                                                "processor_class": "CLIPProcessor"}))
    assert image_processor_in(tmp_path) == image_processor_in(clip_dir)
    # both files, each its own crop: transformers 5 reads processor_config.json's, and so do we
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**processor, "crop_size": {"height": 16,
                                                                                           "width": 16}}))
    theirs = transformers.AutoImageProcessor.from_pretrained(str(tmp_path), backend="pil").crop_size
    assert image_processor_in(tmp_path).crop == (theirs["height"], theirs["width"]) == (32, 32)
    # a processor file without image_processor (an older one): preprocessor_config.json's
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "CLIPProcessor"}))
    theirs = transformers.AutoImageProcessor.from_pretrained(str(tmp_path), backend="pil").crop_size
    assert image_processor_in(tmp_path).crop == (theirs["height"], theirs["width"]) == (16, 16)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": [1, 2]}))
    with pytest.raises(CheckpointError, match="image_processor must be an object"):
        image_processor_in(tmp_path)
    (tmp_path / "processor_config.json").unlink()
    (tmp_path / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match="checkpoint file missing: .*preprocessor_config.json"):
        image_processor_in(tmp_path)


def test_a_legacy_save_exports_and_serves_as_sentence_transformers_encodes(tmp_path):
    """sentence-transformers' own legacy CLIP save (a CLIPModel module in 0_CLIPModel, then Normalize): `attnserve
    export` of its root, then the engine's image and text embeddings against its encode()."""
    from sentence_transformers import SentenceTransformer

    from attnserve.engine.engine import Engine
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint
    from tests.checkpoints import save_tiny_clip

    checkpoint = save_tiny_clip(tmp_path / "clip")
    saved = tmp_path / "legacy"
    shutil.copytree(checkpoint, saved / "0_CLIPModel")
    (saved / "1_Normalize").mkdir()
    (saved / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"},
        {"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    manifest = build_artifacts(read_checkpoint(saved), tmp_path / "artifacts", log=lambda m: None,
                               variants=["embeddings"])
    assert manifest.model == "legacy" and manifest.normalize and manifest.images is not None
    engine = Engine.from_directory(tmp_path / "artifacts")
    texts = ["a photo of the cat", "the dog"]
    theirs = SentenceTransformer(str(saved), device="cpu")
    check_equal(engine.encode(texts).embeddings, theirs.encode(texts, convert_to_numpy=True))
    assert engine.images is not None
    rows = engine.run([engine.images.prepare(data) for data in images()]).sentence_embedding
    ours = rows / np.linalg.norm(rows, axis=-1, keepdims=True)
    check_equal(ours, theirs.encode([Image.open(io.BytesIO(data)) for data in images()], convert_to_numpy=True))
