"""An image-text model served (a tiny random-weight CLIP exported by `attnserve export`), through every door users send
images to, with their own clients: openai (Jina's form), vLLM's `messages`, Cohere's SDK (images and inputs),
Infinity's /embeddings_image, gRPC's Input.image, KServe v2 through tritonclient; /similarity and /v1/zero_shot.

Each embedding is held to transformers' CLIPModel on the same image and text (cosine >= 0.99999), and an image's
cosine with a caption, times the model's scale, to transformers' logits_per_image. Served in one process, and
through two front-door workers (the images cross to the engine process)."""

from __future__ import annotations

import base64
import io

import grpc
import httpx
import numpy as np
import pytest
from PIL import Image

from attnserve.v1 import encoder_pb2 as pb
from tests.test_images import animated_gif, png_header_only

CAPTIONS = ["a photo of the cat", "the dog", "and of the photo"]
LABELS, TEMPLATE = ["cat", "dog", "photo"], "a photo of the {}"  # zero-shot's


def png(seed: int, size: tuple[int, int] = (50, 40), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4}.get(mode)
    shape = (size[1], size[0], channels) if channels else (size[1], size[0])
    buffer = io.BytesIO()
    Image.fromarray((rng.random(shape) * 255).astype(np.uint8), mode).save(buffer, "PNG")
    return buffer.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


IMAGES = [png(0), png(1, (33, 64), "RGBA"), png(2, (64, 48), "L")]


@pytest.fixture(scope="module")
def reference(clip_dir):
    """transformers' own: each image's and caption's embedding (unit length), logits_per_image, the softmax over
    LABELS in TEMPLATE of each image (zero-shot's scores), and the image tower's eager attention over each image's
    patches (maps: (L, I, nh, T, T))."""
    import torch
    import transformers

    model = transformers.CLIPModel.from_pretrained(str(clip_dir), attn_implementation="eager").eval()
    processor = transformers.CLIPProcessor.from_pretrained(str(clip_dir))
    pictures = [Image.open(io.BytesIO(data)) for data in IMAGES]
    inputs = processor(text=CAPTIONS, images=pictures, return_tensors="pt", padding=True)
    labelled = processor(text=[TEMPLATE.format(label) for label in LABELS], images=pictures, return_tensors="pt",
                         padding=True)
    with torch.no_grad():
        out = model(**inputs)
        zero_shot = model(**labelled).logits_per_image.softmax(dim=-1).numpy()  # (I, L)
        maps = torch.stack(model.vision_model(pixel_values=inputs["pixel_values"], output_attentions=True).attentions)
    return {"images": out.image_embeds.numpy(), "texts": out.text_embeds.numpy(), "zero_shot": zero_shot,
            "maps": maps.numpy(),
            "logits_per_image": out.logits_per_image.numpy(), "scale": float(model.logit_scale.detach().exp())}


def unit(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def assert_same(got, want, floor: float = 0.99999) -> None:
    cosines = (unit(got) * unit(want)).sum(-1)
    assert cosines.min() >= floor, cosines


def test_openai_client_embeds_images_and_captions_in_one_space(clip_server, reference):
    import openai

    client = openai.OpenAI(base_url=f"{clip_server.http_url}/v1", api_key="unused")
    items = [{"image": data_uri(data)} for data in IMAGES] + [{"text": caption} for caption in CAPTIONS]
    reply = client.embeddings.create(model="", input=items)  # type: ignore[arg-type]  # Jina's form
    vectors = np.array([d.embedding for d in reply.data])
    assert_same(vectors[:3], reference["images"])
    assert_same(vectors[3:], reference["texts"])
    # One space: an image's cosine with a caption, times the model's scale, is transformers' logits_per_image.
    logits = unit(vectors[:3]) @ unit(vectors[3:]).T * reference["scale"]
    assert np.allclose(logits, reference["logits_per_image"], atol=1e-4 * reference["scale"])


def test_vllm_messages_and_infinity_embeddings_image(clip_server, reference):
    image_part = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}
    reply = httpx.post(f"{clip_server.http_url}/v1/embeddings", timeout=30, json={
        "model": "", "messages": [{"role": "user", "content": [image_part]}]})
    assert reply.status_code == 200, reply.text
    assert_same([reply.json()["data"][0]["embedding"]], reference["images"][:1])
    # Infinity's route: bare base64 and data URIs alike
    reply = httpx.post(f"{clip_server.http_url}/embeddings_image", timeout=30, json={
        "model": "", "input": [base64.b64encode(IMAGES[0]).decode(), data_uri(IMAGES[1]), data_uri(IMAGES[2])]})
    assert reply.status_code == 200, reply.text
    assert_same([d["embedding"] for d in reply.json()["data"]], reference["images"])
    both = httpx.post(f"{clip_server.http_url}/v1/embeddings", timeout=30, json={
        "model": "", "messages": [{"role": "user", "content": [image_part, {"type": "text", "text": "x"}]}]})
    assert both.status_code == 400 and "one text or one image" in both.json()["error"]["message"]


def test_cohere_sdk_embeds_images_and_inputs(clip_server, reference):
    import cohere

    client = cohere.ClientV2(base_url=clip_server.http_url, api_key="unused")
    reply = client.embed(model="", input_type="image", images=[data_uri(data) for data in IMAGES],
                         embedding_types=["float"])
    assert_same(reply.embeddings.float_, reference["images"])
    reply = client.embed(model="", input_type="search_document", embedding_types=["float"], inputs=[
        {"content": [{"type": "text", "text": CAPTIONS[0]}]},
        {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}}]}])
    assert_same(reply.embeddings.float_, [reference["texts"][0], reference["images"][1]])


def test_grpc_embeds_image_bytes(clip_server, reference):
    with clip_server.channel() as channel:
        reply = clip_server.stub(channel).Embed(pb.EmbedRequest(inputs=[
            *(pb.Input(image=pb.Image(data=data)) for data in IMAGES), pb.Input(text=CAPTIONS[0])]))
    vectors = [np.frombuffer(e.sentence_embedding.data, dtype=np.float32) for e in reply.embeddings]
    assert_same(vectors[:3], reference["images"])
    assert_same(vectors[3:], reference["texts"][:1])
    with clip_server.channel() as channel, pytest.raises(grpc.RpcError) as refused:
        clip_server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(image=pb.Image(data=IMAGES[0],
                                                                                        mime_type="image/jpeg"))]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "declared image/jpeg but its bytes are PNG" in refused.value.details()


def test_kserve_v2_image_bytes_tensor_through_tritonclient(clip_server, reference):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(clip_server.http_url.removeprefix("http://"))
    model = client.get_model_repository_index()[0]["name"]
    inputs = {spec["name"] for spec in client.get_model_metadata(model)["inputs"]}
    assert inputs == {"text", "image"}
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([CAPTIONS[0]], dtype=object))
    image = triton.InferInput("image", [3], "BYTES")
    image.set_data_from_numpy(np.array(IMAGES, dtype=object))
    result = client.infer(model, [text, image])
    vectors = result.as_numpy("embedding")  # the texts, then the images
    assert_same(vectors[1:], reference["images"])
    assert_same(vectors[:1], reference["texts"][:1])


def test_similarity_is_the_models_logits_and_zero_shot_its_softmax(clip_server, reference):
    reply = httpx.post(f"{clip_server.http_url}/similarity", timeout=30, json={
        "inputs": {"source_sentence": {"image": data_uri(IMAGES[0])}, "sentences": CAPTIONS}})
    assert reply.status_code == 200, reply.text
    assert np.allclose(np.array(reply.json()) * reference["scale"], reference["logits_per_image"][0], atol=1e-3)
    reply = httpx.post(f"{clip_server.http_url}/v1/zero_shot", timeout=30, json={
        "model": "", "images": [data_uri(data) for data in IMAGES], "labels": LABELS, "template": TEMPLATE})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["activation"] == "softmax" and len(body["data"]) == 3
    for result, want in zip(body["data"], reference["zero_shot"], strict=True):
        scores = [s["score"] for s in result["scores"]]
        assert scores == sorted(scores, reverse=True) and abs(sum(scores) - 1) < 1e-5
        got = {s["label"]: s["score"] for s in result["scores"]}
        assert np.allclose([got[label] for label in LABELS], want, atol=1e-4), (got, want)


HOSTILE = {
    "corrupt": (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "cannot be read"),
    "truncated": (IMAGES[0][:len(IMAGES[0]) // 2], "corrupt or truncated"),
    "20000 x 20000": (png_header_only(20000, 20000), "over the limit of 25,000,000"),
    "zero width": (png_header_only(0, 10), "image"),
    "three frames": (animated_gif(), "3 frames"),
    "svg": (b'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>', "SVG"),
    "empty": (b"", "empty"),
}


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_images_get_a_clear_4xx_and_the_server_lives(clip_server, name):
    data, fragment = HOSTILE[name]
    before = _rss_kb(clip_server.process.pid)
    for _ in range(3):
        reply = httpx.post(f"{clip_server.http_url}/v1/embeddings", timeout=30, json={
            "model": "", "input": [{"text": "fine"}, {"image": base64.b64encode(data).decode()}]})
        assert reply.status_code == 400, reply.text
        message = reply.json()["error"]["message"]
        assert message.startswith("input 1: ") and fragment in message and "Traceback" not in message, message
    assert _rss_kb(clip_server.process.pid) - before < 100 * 1024  # memory bounded by limits, not by the input
    ok = httpx.post(f"{clip_server.http_url}/embeddings_image", timeout=30, json={"model": "", "input": data_uri(
        IMAGES[0])})
    assert ok.status_code == 200


@pytest.mark.parametrize("body, fragment", [
    ({"input": [{"image": data_uri(IMAGES[0], "image/svg+xml")}]}, "image/svg+xml"),
    ({"input": [{"image": "http://169.254.169.254/latest/meta-data"}]}, "fetches no image URLs"),
    ({"input": [{"image": "file:///etc/passwd"}]}, "http(s) only"),
    ({"input": [{"image": "data:image/png,notbase64"}]}, "must be base64"),
    ({"input": [{"image": "!!!"}]}, "not base64"),
    ({"input": [{"image": data_uri(IMAGES[0])}], "encoding_format": "float", "pooling": "mean"}, "pooling"),
])
def test_image_requests_that_cannot_be_served_are_refused_naming_why(clip_server, body, fragment):
    reply = httpx.post(f"{clip_server.http_url}/v1/embeddings", timeout=30, json={"model": "", **body})
    assert reply.status_code == 400, reply.text
    assert fragment in reply.json()["error"]["message"]


def test_a_text_model_refuses_images_naming_why(server):
    reply = httpx.post(f"{server.http_url}/v1/embeddings", timeout=30, json={
        "model": "", "input": [{"image": data_uri(IMAGES[0])}]})
    assert reply.status_code == 400 and "is a text model" in reply.json()["error"]["message"], reply.text
    reply = httpx.post(f"{server.http_url}/v1/zero_shot", timeout=30, json={
        "images": [data_uri(IMAGES[0])], "labels": ["x"]})
    assert reply.status_code in (400, 404), reply.text


def test_attention_over_patches_equals_transformers_on_every_door(clip_server, reference):
    from attnserve.client import Client
    from attnserve.client.client import ImageInput

    reply = httpx.post(f"{clip_server.http_url}/v1/attention", timeout=30, json={
        "inputs": [{"image": data_uri(d)} for d in IMAGES], "layers": [0, 1], "analyses": ["rollout"]})
    assert reply.status_code == 200, reply.text
    for i, item in enumerate(reply.json()["data"]):
        assert np.abs(np.array(item["attentions"]) - reference["maps"][:, i]).max() < 1e-5
        assert item["tokens"][:2] == ["<class>", "patch 0,0"] and item["num_tokens"] == 17
        assert item["image"] == {"size": 32, "patch_size": 8, "grid": 4, "height": 32, "width": 32, "rows": 4,
                                 "cols": 4, "class_token": True, "fit": "crop",
                                 "boxes": [[0, 0, 32, 32]] + [[r * 8, c * 8, r * 8 + 8, c * 8 + 8]
                                                              for r in range(4) for c in range(4)]}
    with Client(clip_server.target) as client:
        result = client.attention(ImageInput(IMAGES[1]), [0, 1], analyses=["rollout", "norms"])
        assert client.model_info().image_tower.num_layers == 2
    assert np.abs(result.attentions - reference["maps"][:, 1]).max() < 1e-5
    assert result.patches is not None and result.patches.grid == 4 and result.patches.boxes.shape == (17, 4)
    assert (result.patches.rows, result.patches.cols, result.patches.height, result.patches.width) == (4, 4, 32, 32)
    assert result.rollout.shape == (17, 17) and result.norms.shape == (2, 4, 17, 17)


def test_the_cli_draws_an_images_attention_over_it(clip_server, tmp_path):
    from tests.conftest import run_cli

    picture = tmp_path / "wide.png"
    picture.write_bytes(png(3, (90, 60)))
    for view in ("heatmap", "rollout", "model"):
        out = tmp_path / f"{view}.png"
        done = run_cli("attention", picture, "-o", out, "--view", view, "--target", clip_server.target)
        assert done.returncode == 0, done.stderr
        assert out.is_file() and f"wrote {out}" in done.stdout
        if view != "model":  # drawn over the centre square the model saw, at the picture's resolution
            assert Image.open(out).size == (60, 60)
    arrays = tmp_path / "maps.npz"
    assert run_cli("attention", picture, "-o", arrays, "--target", clip_server.target).returncode == 0
    with np.load(arrays) as saved:
        assert saved["attentions"].shape == (2, 4, 17, 17) and saved["boxes"].shape == (17, 4)
    refused = run_cli("attention", picture, "-o", tmp_path / "x.png", "--layer", "7", "--target", clip_server.target)
    assert refused.returncode != 0 and "--layer 7 is out of range" in refused.stderr


@pytest.fixture(scope="module")
def image_host():
    """A web server on loopback (a thread of its own) with an image, a redirect off the allowed host, one too
    large and one too slow."""
    import asyncio
    import threading

    from aiohttp import web

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=IMAGES[0], content_type="image/png")

    def redirect(to: str):
        async def handler(request):
            raise web.HTTPFound(to)
        return handler

    def serve(body: bytes):
        async def handler(request):
            return web.Response(body=body, content_type="image/png")
        return handler

    app = web.Application()
    app.router.add_get("/cat.png", serve(IMAGES[0]))
    app.router.add_get("/away", redirect("http://localhost:1/cat.png"))
    app.router.add_get("/here", redirect("/cat.png"))
    app.router.add_get("/big.png", serve(png(9, (400, 400))))
    app.router.add_get("/slow.png", slow)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.mark.parametrize("path, status, fragment", [
    ("/cat.png", 200, None), ("/here", 200, None),
    ("/away", 400, "does not fetch images from 'localhost'"),
    ("/big.png", 400, "over this server's limit of 100,000 bytes"),
    ("/slow.png", 400, "took over 1 s"),
])
def test_image_urls_are_fetched_only_from_allowed_hosts_within_limits(image_workers, image_host, reference, path,
                                                                     status, fragment):
    reply = httpx.post(f"{image_workers.http_url}/embeddings_image", timeout=30, json={
        "model": "", "input": [image_host + path]})
    assert reply.status_code == status, reply.text
    if status == 200:
        assert_same([reply.json()["data"][0]["embedding"]], reference["images"][:1])
    else:
        assert fragment in reply.json()["error"]["message"]
    other = httpx.post(f"{image_workers.http_url}/embeddings_image", timeout=30, json={
        "model": "", "input": ["http://10.0.0.1/cat.png"]})  # a host off the list: never contacted
    assert other.status_code == 400 and "does not fetch images from '10.0.0.1'" in other.json()["error"]["message"]


def test_images_through_two_front_door_workers(image_workers, reference):
    """HTTP, gRPC and the maps, through `serve --workers 2`: each worker decodes, the engine process runs."""
    reply = httpx.post(f"{image_workers.http_url}/v1/embeddings", timeout=30, json={
        "model": "", "input": [{"image": data_uri(d)} for d in IMAGES] + [{"text": c} for c in CAPTIONS]})
    assert reply.status_code == 200, reply.text
    vectors = [d["embedding"] for d in reply.json()["data"]]
    assert_same(vectors[:3], reference["images"])
    assert_same(vectors[3:], reference["texts"])
    with image_workers.channel() as channel:
        request = pb.EmbedRequest(inputs=[pb.Input(image=pb.Image(data=IMAGES[2]))])
        embedded = image_workers.stub(channel).Embed(request)
    assert_same([np.frombuffer(embedded.embeddings[0].sentence_embedding.data, np.float32)], reference["images"][2:])
    maps = httpx.post(f"{image_workers.http_url}/v1/attention", timeout=30, json={
        "inputs": [{"image": data_uri(IMAGES[0])}], "layers": [0, 1]}).json()["data"][0]
    assert np.abs(np.array(maps["attentions"]) - reference["maps"][:, 0]).max() < 1e-5 and maps["image"]["grid"] == 4
    refused = httpx.post(f"{image_workers.http_url}/embeddings_image", timeout=30, json={
        "model": "", "input": base64.b64encode(HOSTILE["20000 x 20000"][0]).decode()})
    assert refused.status_code == 400 and "over the limit of" in refused.json()["error"]["message"]
