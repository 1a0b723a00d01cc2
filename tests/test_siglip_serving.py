"""A SigLIP model served (a tiny random-weight SiglipModel exported by `attnserve export`): its text tower takes every
text padded to its 64 positions and pools the last, its image tower pools with its attention head and has no class
token, and its zero-shot scores are the sigmoid of each label's logit (cosine x scale + bias). Each is held to
transformers' SiglipModel on the same texts and images."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.serving import ServerProcess, serving
from tests.test_image_serving import IMAGES, assert_same, data_uri

TEXTS = ["a photo of the cat", "the dog", "the photo and the cat of the dog " * 12]  # the last one past 64 tokens


@pytest.fixture(scope="module")
def siglip_server(siglip_artifacts, tmp_path_factory):
    process = ServerProcess(siglip_artifacts, log_path=tmp_path_factory.mktemp("siglip_server") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def reference(siglip_artifacts):
    """transformers' SiglipModel from the checkpoint the artifacts came from, its processor's padding and pixels."""
    import torch
    import transformers

    checkpoint = json.loads((siglip_artifacts / "manifest.json").read_text())["source"]["checkpoint"]
    model = transformers.SiglipModel.from_pretrained(checkpoint, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    processor = transformers.SiglipImageProcessor.from_pretrained(checkpoint)
    ids = tokenizer(TEXTS, padding="max_length", max_length=64, truncation=True, return_tensors="pt")["input_ids"]
    pixels = processor(images=[Image.open(io.BytesIO(d)) for d in IMAGES], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=pixels)
        maps = torch.stack(model.vision_model(pixel_values=pixels, output_attentions=True).attentions)
    return {"texts": out.text_embeds.numpy(), "images": out.image_embeds.numpy(),
            "logits_per_image": out.logits_per_image.numpy(), "maps": maps.numpy()}


def test_texts_and_images_embed_as_siglip_does(siglip_server, reference):
    reply = httpx.post(f"{siglip_server.http_url}/v1/embeddings", timeout=30, json={
        "model": "", "input": [{"text": t} for t in TEXTS] + [{"image": data_uri(d)} for d in IMAGES]})
    assert reply.status_code == 200, reply.text
    vectors = [d["embedding"] for d in reply.json()["data"]]
    assert_same(vectors[:3], reference["texts"])
    assert_same(vectors[3:], reference["images"])
    assert reply.headers["X-Truncated-Inputs"] == "2"  # cut at the 64 positions SigLIP pads every text to
    tokens = httpx.post(f"{siglip_server.http_url}/embed_all", timeout=30, json={"inputs": "the dog"}).json()
    assert len(tokens[0]) == 64  # the pads are inputs the tower attends to: every text is 64 tokens


def assert_sigmoid_zero_shot(server, images: list[bytes], labels: list[str], logits_per_image: np.ndarray) -> None:
    """POST /v1/zero_shot scores each image's labels with the sigmoid of transformers' logits_per_image."""
    body = httpx.post(f"{server.http_url}/v1/zero_shot", timeout=30, json={
        "images": [base64.b64encode(d).decode() for d in images], "labels": labels}).json()
    assert body["activation"] == "sigmoid"
    want = 1 / (1 + np.exp(-logits_per_image))
    for i, result in enumerate(body["data"]):
        got = {s["label"]: s["score"] for s in result["scores"]}
        assert np.allclose([got[t] for t in labels], want[i], atol=1e-4)


def test_zero_shot_is_the_sigmoid_of_each_logit(siglip_server, reference):
    assert_sigmoid_zero_shot(siglip_server, IMAGES, TEXTS, reference["logits_per_image"])


def test_attention_over_patches_has_no_class_token_and_stretches(siglip_server, reference):
    reply = httpx.post(f"{siglip_server.http_url}/v1/attention", timeout=30, json={
        "inputs": [{"image": data_uri(IMAGES[1])}], "layers": [0, 1]})
    assert reply.status_code == 200, reply.text
    item = reply.json()["data"][0]
    assert item["tokens"][0] == "patch 0,0" and item["num_tokens"] == 16
    assert item["image"]["class_token"] is False and item["image"]["fit"] == "stretch"
    assert np.abs(np.array(item["attentions"]) - reference["maps"][:, 1]).max() < 1e-5
