"""A SigLIP 2 NaFlex model served (a tiny random-weight Siglip2Model exported by `attnserve export`): each image at its
own aspect ratio in whole patches, as many as its processor's max_num_patches allows, batched with images of near
patch counts and padded with masked patches; its position embeddings resized to each image's grid. Its texts are
lowercased as transformers' Siglip2Tokenizer lowercases them, padded to the 64 positions and pooled at the last.
Each is held to transformers' Siglip2Model and Siglip2ImageProcessor on the same texts and images."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.serving import ServerProcess, serving
from tests.test_image_serving import assert_same, data_uri, png
from tests.test_siglip_serving import assert_sigmoid_zero_shot

TEXTS = ["A Photo of the CAT", "the dog", "the photo and the cat of the dog " * 12]  # the last past 64 tokens
# Wide, tall, square, tiny (upsampled), large (the patch budget, downsampled) and one pixel high: patch counts differ.
IMAGES = [png(0, (160, 40)), png(1, (33, 64), "RGBA"), png(2, (64, 64), "L"), png(3, (5, 7)), png(4, (300, 200)),
          png(5, (3000, 1))]


@pytest.fixture(scope="module")
def siglip2_server(siglip2_artifacts, tmp_path_factory):
    process = ServerProcess(siglip2_artifacts, log_path=tmp_path_factory.mktemp("siglip2_server") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def reference(siglip2_artifacts):
    """transformers' Siglip2Model from the checkpoint the artifacts came from: its tokenizer (Siglip2Tokenizer, which
    lowercases) padding to 64, and its image processor's patches, masks and spatial shapes."""
    import torch
    import transformers

    checkpoint = json.loads((siglip2_artifacts / "manifest.json").read_text())["source"]["checkpoint"]
    model = transformers.Siglip2Model.from_pretrained(checkpoint, attn_implementation="eager").eval()
    # Right-padded, as SigLIP 2 was trained (big_vision); Siglip2Tokenizer's class pads on the left by default
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, padding_side="right")
    processor = transformers.AutoImageProcessor.from_pretrained(checkpoint, backend="pil")
    ids = tokenizer(TEXTS, padding="max_length", max_length=64, truncation=True, return_tensors="pt")["input_ids"]
    images = processor(images=[Image.open(io.BytesIO(d)) for d in IMAGES], return_tensors="pt", do_convert_rgb=True)
    with torch.no_grad():
        # input_ids alone: the pads are inputs the tower attends to, as SigLIP's texts are taken (model/clip.py)
        out = model(input_ids=ids, **images)
        maps = torch.stack(model.vision_model(**images, output_attentions=True).attentions)  # (L, B, nh, N, N)
    return {"texts": out.text_embeds.numpy(), "images": out.image_embeds.numpy(), "type": type(tokenizer).__name__,
            "class_padding_side": transformers.AutoTokenizer.from_pretrained(checkpoint).padding_side,
            "logits_per_image": out.logits_per_image.numpy(), "maps": maps.numpy(),
            "shapes": images["spatial_shapes"].numpy().tolist()}


def test_texts_and_images_of_every_shape_embed_as_siglip2_does(siglip2_server, reference):
    assert reference["type"] == "Siglip2Tokenizer" and reference["class_padding_side"] == "left"
    reply = httpx.post(f"{siglip2_server.http_url}/v1/embeddings", timeout=30, json={
        "model": "", "input": [{"text": t} for t in TEXTS] + [{"image": data_uri(d)} for d in IMAGES]})
    assert reply.status_code == 200, reply.text
    vectors = [d["embedding"] for d in reply.json()["data"]]
    assert_same(vectors[:3], reference["texts"])
    assert_same(vectors[3:], reference["images"])
    # Each image counts its own patches (the batcher's tokens), the texts their 64 positions each.
    patches = sum(rows * cols for rows, cols in reference["shapes"])
    assert reply.json()["usage"]["prompt_tokens"] == 3 * 64 + patches


def test_images_alone_and_batched_with_others_embed_alike(siglip2_server, reference):
    """An image's embedding does not depend on the images padded into its batch."""
    for i, image in enumerate(IMAGES):
        reply = httpx.post(f"{siglip2_server.http_url}/v1/embeddings", timeout=30,
                           json={"model": "", "input": [{"image": data_uri(image)}]})
        assert reply.status_code == 200, reply.text
        assert_same([reply.json()["data"][0]["embedding"]], reference["images"][i:i + 1])


def test_zero_shot_is_the_sigmoid_of_each_logit(siglip2_server, reference):
    assert_sigmoid_zero_shot(siglip2_server, IMAGES, TEXTS, reference["logits_per_image"])


def test_attention_over_a_wide_image_has_its_own_grid(siglip2_server, reference):
    reply = httpx.post(f"{siglip2_server.http_url}/v1/attention", timeout=30, json={
        "inputs": [{"image": data_uri(IMAGES[0])}, {"image": data_uri(IMAGES[3])}], "layers": [0, 1]})
    assert reply.status_code == 200, reply.text
    for k, i in enumerate((0, 3)):
        item = reply.json()["data"][k]
        rows, cols = reference["shapes"][i]
        n = rows * cols
        image = item["image"]
        assert (image["rows"], image["cols"], image["fit"], image["class_token"]) == (rows, cols, "patches", False)
        assert (image["height"], image["width"]) == (rows * 8, cols * 8)
        assert item["num_tokens"] == n and item["tokens"][-1] == f"patch {rows - 1},{cols - 1}"
        assert len(image["boxes"]) == n and image["boxes"][-1] == [(rows - 1) * 8, (cols - 1) * 8, rows * 8, cols * 8]
        assert np.abs(np.array(item["attentions"]) - reference["maps"][:, i, :, :n, :n]).max() < 1e-5
    assert reference["shapes"][0][1] > reference["shapes"][0][0]  # the wide image is wide in patches too


def test_a_folder_encoded_offline_gives_each_image_its_own_patches(siglip2_artifacts, reference, tmp_path):
    """`attnserve encode` of a folder of images of every shape: transformers' embeddings, each row's num_tokens
    its own patch count, the padding of its batches counted."""
    import pyarrow.parquet as pq

    from attnserve.offline.encode import read_embeddings
    from tests.conftest import run_cli

    folder = tmp_path / "images"
    folder.mkdir()
    for i, data in enumerate(IMAGES):
        (folder / f"{i}.png").write_bytes(data)
    out = tmp_path / "out.parquet"
    result = run_cli("encode", folder, "-o", out, "--artifacts", siglip2_artifacts, "--no-progress")
    assert result.returncode == 0, result.stderr
    patches = [rows * cols for rows, cols in reference["shapes"]]
    assert pq.read_table(out).column("num_tokens").to_pylist() == patches
    assert f"encoded {len(IMAGES)} images, {sum(patches)} tokens" in result.stdout
    assert_same(read_embeddings(out), reference["images"])


def test_a_processor_of_other_patches_than_the_towers_is_refused_at_export(tmp_path):
    """A NaFlex tower cut into patches its processor does not make: one line, before any graph is traced."""
    import transformers

    from attnserve.errors import CheckpointError
    from attnserve.export.image_tower import image_artifacts
    from tests.checkpoints import save_tiny_siglip2

    checkpoint = save_tiny_siglip2(tmp_path / "model")
    transformers.Siglip2ImageProcessor(patch_size=16, max_num_patches=24).save_pretrained(str(checkpoint))
    with pytest.raises(CheckpointError, match="takes images in patches of 8 px, and its image processor gives "
                                              "patches of 16 px"):
        image_artifacts(checkpoint, tmp_path / "work", log=lambda m: None)


def test_the_grpc_client_and_the_cli_take_a_wide_images_grid(siglip2_server, reference, tmp_path):
    """The Python client over gRPC: the maps over the image's own rows x cols, and `attnserve attention IMAGE`
    drawing them over the picture at its aspect ratio."""
    from attnserve.client import Client
    from attnserve.client.client import ImageInput
    from tests.conftest import run_cli

    rows, cols = reference["shapes"][0]
    with Client(siglip2_server.target) as client:
        result = client.attention(ImageInput(IMAGES[0]), [0, 1], analyses=["rollout"])
        tower = client.model_info().image_tower
    assert (tower.image_size, tower.patch_size, tower.max_patches) == (0, 8, 24)  # no one size: up to 24 patches
    models = httpx.get(f"{siglip2_server.http_url}/v1/models", timeout=30).json()["data"]
    assert models[0]["image_tower"] == {"image_size": 0, "patch_size": 8, "num_layers": 2, "num_heads": 4,
                                        "max_patches": 24}
    patches = result.patches
    assert patches is not None and (patches.rows, patches.cols, patches.fit) == (rows, cols, "patches")
    assert patches.grid == 0 and patches.image_size == 0  # not square
    assert np.abs(result.attentions - reference["maps"][:, 0, :, :rows * cols, :rows * cols]).max() < 1e-5
    image = tmp_path / "wide.png"
    image.write_bytes(IMAGES[0])
    out = tmp_path / "map.png"
    drawn = run_cli("attention", image, "-o", out, "--target", siglip2_server.target)
    assert drawn.returncode == 0, drawn.stderr
    with Image.open(out) as picture:
        assert picture.width > 2 * picture.height  # the 160 x 40 picture, drawn over as wide as it is


def test_through_front_door_workers_images_of_every_shape_embed_alike(image_workers, reference):
    """Decoded in a front-door worker, only the pixels (C, H, W) cross to the engine: each image's shape with them."""
    reply = httpx.post(f"{image_workers.http_url}/v1/embeddings", timeout=30, json={
        "model": "siglip2", "input": [{"image": data_uri(d)} for d in IMAGES]})
    assert reply.status_code == 200, reply.text
    assert_same([d["embedding"] for d in reply.json()["data"]], reference["images"])
    maps = httpx.post(f"{image_workers.http_url}/v1/attention", timeout=30, json={
        "model": "siglip2", "inputs": [{"image": data_uri(IMAGES[0])}], "layers": [1]}).json()["data"][0]
    assert (maps["image"]["rows"], maps["image"]["cols"]) == tuple(reference["shapes"][0])
