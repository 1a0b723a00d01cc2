"""The tiny CLIP, SigLIP and SigLIP 2 (NaFlex) served, through every door users send images to with their own clients
(openai, vLLM's messages, Cohere, Infinity, gRPC, KServe v2, /similarity, /v1/zero_shot, the maps with the client and
the CLI), each held to transformers' model on the same texts and images: in one process serving the three, through two
front-door workers (the images cross to the engine process), and offline."""

from __future__ import annotations

import base64
import io
import json

import grpc
import httpx
import numpy as np
import pytest
from PIL import Image

from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import run_cli
from tests.image_origin import image_origin
from tests.serving import ServerProcess, serving
from tests.test_images import HOSTILE


def png(seed: int, size: tuple[int, int] = (50, 40), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4}.get(mode)
    shape = (size[1], size[0], channels) if channels else (size[1], size[0])
    buffer = io.BytesIO()
    Image.fromarray((rng.random(shape) * 255).astype(np.uint8), mode).save(buffer, "PNG")
    return buffer.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


MODELS = ("clip", "siglip", "siglip2")
SERVED = {"clip": "", "siglip": "siglip", "siglip2": "siglip2"}  # CLIP is the default model: asked as ""
TEXTS = ["A Photo of the CAT", "the dog", "the photo and the cat of the dog " * 12]  # the last past every tower's
LABELS, TEMPLATE = ["cat", "dog", "photo"], "a photo of the {}"  # zero-shot's
IMAGES = [png(0), png(1, (33, 64), "RGBA"), png(2, (64, 48), "L")]
IMAGES_OF = {"clip": IMAGES, "siglip": IMAGES, "siglip2": [  # wide, tall, square, tiny (upsampled), large (the patch
    png(0, (160, 40)), png(1, (33, 64), "RGBA"), png(2, (64, 64), "L"), png(3, (5, 7)),  # budget, downsampled) and
    png(4, (300, 200)), png(5, (3000, 1))]}  # one pixel high: NaFlex's patch counts differ
# The image tower each describes: a NaFlex tower takes no one image size but up to 24 patches.
TOWERS = {"clip": (32, 8, 2, 4, 0), "siglip": (32, 8, 2, 4, 0), "siglip2": (0, 8, 2, 4, 24)}
FIT = {"clip": "crop", "siglip": "stretch", "siglip2": "patches"}


@pytest.fixture(scope="module")
def image_server(clip_artifacts, siglip_artifacts, siglip2_artifacts, tmp_path_factory):
    models = {"clip": clip_artifacts, "siglip": siglip_artifacts, "siglip2": siglip2_artifacts}
    process = ServerProcess(None, *(f"--model={name}={folder}" for name, folder in models.items()),
                            log_path=tmp_path_factory.mktemp("image_server") / "server.log")
    with serving(process):
        yield process


def tokenized(name: str, tokenizer, texts: list[str]) -> dict:
    """CLIP's texts padded to the longest with their mask; SigLIP's padded to 64 and taken without one: the pads are
    inputs the tower attends to (model/clip.py)."""
    if name == "clip":
        return dict(tokenizer(texts, padding=True, truncation=True, max_length=77, return_tensors="pt"))
    return {"input_ids": tokenizer(texts, padding="max_length", max_length=64, truncation=True,
                                   return_tensors="pt")["input_ids"]}


def transformers_reference(name: str, artifacts) -> dict:
    """transformers' model from the checkpoint the artifacts came from, its tokenizer right-padded (SigLIP 2's class
    pads on the left by default; big_vision trained it right-padded) and its image processor's pixels (SigLIP 2's
    patches, masks and spatial shapes): the embeddings, logits, zero-shot scores and the maps (L, I, nh, T, T)."""
    import torch
    import transformers

    checkpoint = json.loads((artifacts / "manifest.json").read_text())["source"]["checkpoint"]
    model_class = {"clip": "CLIPModel", "siglip": "SiglipModel", "siglip2": "Siglip2Model"}[name]
    model = getattr(transformers, model_class).from_pretrained(checkpoint, attn_implementation="eager").eval()
    if name == "siglip2":  # Siglip2Tokenizer, which lowercases, and pads on the left unless told
        default = transformers.AutoTokenizer.from_pretrained(checkpoint)
        assert (type(default).__name__, default.padding_side) == ("Siglip2Tokenizer", "left")
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, padding_side="right")
    processor = transformers.AutoImageProcessor.from_pretrained(checkpoint, backend="pil")
    pixels = dict(processor(images=[Image.open(io.BytesIO(d)) for d in IMAGES_OF[name]], return_tensors="pt",
                            do_convert_rgb=True))
    with torch.no_grad():
        out = model(**tokenized(name, tokenizer, TEXTS), **pixels)
        labelled = model(**tokenized(name, tokenizer, [TEMPLATE.format(x) for x in LABELS]), **pixels)
        maps = torch.stack(model.vision_model(**pixels, output_attentions=True).attentions)
    activation = labelled.logits_per_image.softmax(-1) if name == "clip" else labelled.logits_per_image.sigmoid()
    return {"texts": out.text_embeds.numpy(), "images": out.image_embeds.numpy(), "maps": maps.numpy(),
            "logits_per_image": out.logits_per_image.numpy(), "zero_shot": activation.numpy(),
            "scale": float(model.logit_scale.detach().exp()),
            "bias": float(getattr(model, "logit_bias", torch.zeros(1)).detach()),
            "shapes": pixels["spatial_shapes"].tolist() if "spatial_shapes" in pixels else [[4, 4]] * len(IMAGES),
            "dog_tokens": tokenized(name, tokenizer, ["the dog"])["input_ids"].shape[1]}


@pytest.fixture(scope="module")
def reference(clip_artifacts, siglip_artifacts, siglip2_artifacts) -> dict[str, dict]:
    artifacts = {"clip": clip_artifacts, "siglip": siglip_artifacts, "siglip2": siglip2_artifacts}
    return {name: transformers_reference(name, artifacts[name]) for name in MODELS}


def unit(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def assert_same(got, want, floor: float = 0.99999) -> None:
    cosines = (unit(got) * unit(want)).sum(-1)
    assert cosines.min() >= floor, cosines


def post(server, route: str, body: dict, status: int = 200) -> dict | list:
    reply = httpx.post(f"{server.http_url}{route}", timeout=30, json=body)
    assert reply.status_code == status, reply.text
    return reply.json()


def expected_image(name: str, reference: dict, i: int) -> dict:
    """Where image i's positions lie: a class token's whole square (CLIP), then its patches of 8 px, row-major: a
    4 x 4 square (CLIP's centre crop, SigLIP's stretched picture), or SigLIP 2's own rows x cols (a square's side
    and grid only where they are one)."""
    rows, cols = reference[name]["shapes"][i]
    boxes = [[r * 8, c * 8, r * 8 + 8, c * 8 + 8] for r in range(rows) for c in range(cols)]
    return {"size": rows * 8 if rows == cols else None, "patch_size": 8, "grid": rows if rows == cols else None,
            "height": rows * 8, "width": cols * 8, "rows": rows, "cols": cols, "class_token": name == "clip",
            "fit": FIT[name], "boxes": ([[0, 0, 32, 32]] if name == "clip" else []) + boxes}


def assert_patch_attention(item: dict, name: str, reference: dict, i: int, layers: list[int]) -> None:
    image = expected_image(name, reference, i)
    rows, cols, first = image["rows"], image["cols"], int(image["class_token"])
    n = rows * cols + first
    assert item["image"] == image
    assert item["num_tokens"] == n and item["tokens"][first] == "patch 0,0"
    assert item["tokens"][-1] == f"patch {rows - 1},{cols - 1}" and item["tokens"][:first] == ["<class>"] * first
    want = reference[name]["maps"][layers, i, :, :n, :n]
    assert np.abs(np.array(item["attentions"]) - want).max() < 1e-5


# --- the doors -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_openai_client_embeds_texts_and_images_in_one_space(image_server, reference, name):
    """One space: an image's cosine with a text, times the model's scale (plus SigLIP's bias), is transformers'
    logits_per_image."""
    import openai

    want = reference[name]
    client = openai.OpenAI(base_url=f"{image_server.http_url}/v1", api_key="unused")
    items = [{"text": t} for t in TEXTS] + [{"image": data_uri(d)} for d in IMAGES_OF[name]]
    raw = client.embeddings.with_raw_response.create(model=SERVED[name], input=items)  # type: ignore[arg-type]
    reply = raw.parse()
    vectors = np.array([d.embedding for d in reply.data])
    assert_same(vectors[:3], want["texts"])
    assert_same(vectors[3:], want["images"])
    logits = unit(vectors[3:]) @ unit(vectors[:3]).T * want["scale"] + want["bias"]
    assert np.allclose(logits, want["logits_per_image"], atol=1e-4 * want["scale"])
    assert raw.headers["X-Truncated-Inputs"] == "2"  # cut at the text tower's positions (77, or SigLIP's 64)
    # Each image counts its own patches (the batcher's tokens), SigLIP's texts their 64 positions each.
    if name == "siglip2":
        assert reply.usage.prompt_tokens == 3 * 64 + sum(rows * cols for rows, cols in want["shapes"])
    tokens = post(image_server, "/embed_all", {"model": SERVED[name], "inputs": "the dog"})
    assert len(tokens[0]) == want["dog_tokens"]  # SigLIP's pads are inputs the tower attends to: 64


@pytest.mark.parametrize("name", MODELS)
def test_each_image_embeds_alike_alone_in_vllm_messages_and_batched_in_infinitys_route(image_server, reference,
                                                                                       name):
    """An image's embedding does not depend on the images padded into its batch (SigLIP 2's are of other sizes)."""
    images = IMAGES_OF[name]
    for i, image in enumerate(images):
        part = {"type": "image_url", "image_url": {"url": data_uri(image)}}
        reply = post(image_server, "/v1/embeddings", {"model": SERVED[name], "messages": [
            {"role": "user", "content": [part]}]})
        assert_same([reply["data"][0]["embedding"]], reference[name]["images"][i:i + 1])
    reply = post(image_server, "/embeddings_image", {"model": SERVED[name], "input": [  # bare base64, data URIs
        base64.b64encode(images[0]).decode(), *(data_uri(d) for d in images[1:])]})
    assert_same([d["embedding"] for d in reply["data"]], reference[name]["images"])


def test_cohere_sdk_embeds_images_and_inputs(image_server, reference):
    import cohere

    client = cohere.ClientV2(base_url=image_server.http_url, api_key="unused")
    reply = client.embed(model="", input_type="image", images=[data_uri(data) for data in IMAGES],
                         embedding_types=["float"])
    assert_same(reply.embeddings.float_, reference["clip"]["images"])
    reply = client.embed(model="", input_type="search_document", embedding_types=["float"], inputs=[
        {"content": [{"type": "text", "text": TEXTS[0]}]},
        {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}}]}])
    assert_same(reply.embeddings.float_, [reference["clip"]["texts"][0], reference["clip"]["images"][1]])


@pytest.mark.parametrize("name", MODELS)
def test_grpc_embeds_image_bytes_and_refuses_bytes_of_another_type_than_declared(image_server, reference, name):
    with image_server.channel() as channel:
        reply = image_server.stub(channel).Embed(pb.EmbedRequest(model=SERVED[name], inputs=[
            *(pb.Input(image=pb.Image(data=data)) for data in IMAGES_OF[name]), pb.Input(text=TEXTS[0])]))
        with pytest.raises(grpc.RpcError) as refused:
            image_server.stub(channel).Embed(pb.EmbedRequest(model=SERVED[name], inputs=[
                pb.Input(image=pb.Image(data=IMAGES[0], mime_type="image/jpeg"))]))
    vectors = [np.frombuffer(e.sentence_embedding.data, dtype=np.float32) for e in reply.embeddings]
    assert_same(vectors[:-1], reference[name]["images"])
    assert_same(vectors[-1:], reference[name]["texts"][:1])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "declared image/jpeg but its bytes are PNG" in refused.value.details()


def test_kserve_v2_image_bytes_tensor_through_tritonclient(image_server, reference):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(image_server.http_url.removeprefix("http://"))
    assert {m["name"] for m in client.get_model_repository_index()} == set(MODELS)
    assert {spec["name"] for spec in client.get_model_metadata("clip")["inputs"]} == {"text", "image"}
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([TEXTS[0]], dtype=object))
    image = triton.InferInput("image", [3], "BYTES")
    image.set_data_from_numpy(np.array(IMAGES, dtype=object))
    vectors = client.infer("clip", [text, image]).as_numpy("embedding")  # the texts, then the images
    assert_same(vectors[1:], reference["clip"]["images"])
    assert_same(vectors[:1], reference["clip"]["texts"][:1])


@pytest.mark.parametrize("name", MODELS)
def test_similarity_is_the_models_logits_and_zero_shot_their_softmax_or_sigmoid(image_server, reference, name):
    """CLIP's zero-shot scores are a softmax over the labels, SigLIP's the sigmoid of each (cosine x scale + bias)."""
    want = reference[name]
    similarity = post(image_server, "/similarity", {"model": SERVED[name], "inputs": {
        "source_sentence": {"image": data_uri(IMAGES_OF[name][0])}, "sentences": TEXTS}})
    assert np.allclose(np.array(similarity) * want["scale"] + want["bias"], want["logits_per_image"][0], atol=1e-3)
    body = post(image_server, "/v1/zero_shot", {"model": SERVED[name], "labels": LABELS, "template": TEMPLATE,
                                                "images": [base64.b64encode(d).decode() for d in IMAGES_OF[name]]})
    assert body["activation"] == ("softmax" if name == "clip" else "sigmoid")
    assert len(body["data"]) == len(IMAGES_OF[name])
    for result, scores in zip(body["data"], want["zero_shot"], strict=True):
        ranked = [s["score"] for s in result["scores"]]
        assert ranked == sorted(ranked, reverse=True)
        assert name != "clip" or abs(sum(ranked) - 1) < 1e-5
        got = {s["label"]: s["score"] for s in result["scores"]}
        assert np.allclose([got[label] for label in LABELS], scores, atol=1e-4), (got, scores)


# --- what is refused -----------------------------------------------------------------------------------------------

def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_images_get_a_clear_4xx_and_the_server_lives(image_server, name):
    """tests/test_images.py's hostile images, each sent three times."""
    data, fragment = HOSTILE[name]
    before = _rss_kb(image_server.process.pid)
    for _ in range(3):
        body = post(image_server, "/v1/embeddings", {"model": "", "input": [
            {"text": "fine"}, {"image": base64.b64encode(data).decode()}]}, status=400)
        message = body["error"]["message"]
        assert message.startswith("input 1: ") and fragment in message and "Traceback" not in message, message
    assert _rss_kb(image_server.process.pid) - before < 100 * 1024  # memory bounded by limits, not by the input
    post(image_server, "/embeddings_image", {"model": "", "input": data_uri(IMAGES[0])})


IMAGE_PART = {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}}


@pytest.mark.parametrize("body, fragment", [
    ({"input": [{"image": data_uri(IMAGES[0], "image/svg+xml")}]}, "image/svg+xml"),
    ({"input": [{"image": "http://169.254.169.254/latest/meta-data"}]}, "fetches no image URLs"),
    ({"input": [{"image": "file:///etc/passwd"}]}, "http(s) only"),
    ({"input": [{"image": "data:image/png,notbase64"}]}, "must be base64"),
    ({"input": [{"image": "!!!"}]}, "not base64"),
    ({"input": [{"image": data_uri(IMAGES[0])}], "encoding_format": "float", "pooling": "mean"}, "pooling"),
    ({"messages": [{"role": "user", "content": [IMAGE_PART, {"type": "text", "text": "x"}]}]},
     "one text or one image"),
])
def test_image_requests_that_cannot_be_served_are_refused_naming_why(image_server, body, fragment):
    assert fragment in post(image_server, "/v1/embeddings", {"model": "", **body}, status=400)["error"]["message"]


def test_a_text_model_refuses_images_naming_why(server):
    body = post(server, "/v1/embeddings", {"model": "", "input": [{"image": data_uri(IMAGES[0])}]}, status=400)
    assert "is a text model" in body["error"]["message"]
    reply = httpx.post(f"{server.http_url}/v1/zero_shot", timeout=30, json={
        "images": [data_uri(IMAGES[0])], "labels": ["x"]})
    assert reply.status_code in (400, 404), reply.text


# --- attention over the patches ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_attention_over_patches_equals_transformers_and_says_where_each_patch_lies(image_server, reference, name):
    reply = post(image_server, "/v1/attention", {"model": SERVED[name], "layers": [0, 1], "analyses": ["rollout"],
                                                 "inputs": [{"image": data_uri(d)} for d in IMAGES_OF[name]]})
    for i, item in enumerate(reply["data"]):
        assert_patch_attention(item, name, reference, i, [0, 1])
    assert name != "siglip2" or reference[name]["shapes"][0][1] > reference[name]["shapes"][0][0]  # wide is wide


@pytest.mark.parametrize("name", MODELS)
def test_the_python_client_gets_the_maps_and_where_each_patch_lies(image_server, reference, name):
    from attnserve.client import Client
    from attnserve.client.client import ImageInput

    with Client(image_server.target, model=SERVED[name] or None) as client:
        result = client.attention(ImageInput(IMAGES_OF[name][1]), [0, 1], analyses=["rollout", "norms"])
        tower = client.model_info().image_tower
    keys = ("image_size", "patch_size", "num_layers", "num_heads", "max_patches")
    assert tuple(getattr(tower, key) for key in keys) == TOWERS[name]
    models = {m["id"]: m for m in httpx.get(f"{image_server.http_url}/v1/models", timeout=30).json()["data"]}
    assert models[name]["image_tower"] == dict(zip(keys, TOWERS[name], strict=True))
    image, patches = expected_image(name, reference, 1), result.patches
    n = image["rows"] * image["cols"] + int(image["class_token"])
    assert patches is not None and patches.boxes.shape == (n, 4)
    assert (patches.rows, patches.cols, patches.height, patches.width, patches.fit) == tuple(
        image[k] for k in ("rows", "cols", "height", "width", "fit"))
    assert (patches.grid, patches.image_size) == (image["grid"] or 0, image["size"] or 0)  # NaFlex's: not square
    assert np.abs(result.attentions - reference[name]["maps"][:, 1, :, :n, :n]).max() < 1e-5
    assert result.rollout.shape == (n, n) and result.norms.shape == (2, 4, n, n)


CLI_PICTURES = {  # a picture, the size its maps are drawn at, the views drawn
    "clip": (png(3, (90, 60)), (60, 60), ("heatmap", "rollout", "model")),  # over the centre square CLIP saw
    "siglip2": (IMAGES_OF["siglip2"][0], (160, 40), ("heatmap",)),  # the whole wide picture, at its aspect ratio
}


@pytest.mark.parametrize("name", list(CLI_PICTURES))
def test_the_cli_draws_an_images_attention_over_it(image_server, reference, tmp_path, name):
    picture, size, views = CLI_PICTURES[name]
    path = tmp_path / "picture.png"
    path.write_bytes(picture)
    served = ["--target", image_server.target, *(["--model", name] if SERVED[name] else [])]
    for view in views:
        out = tmp_path / f"{view}.png"
        done = run_cli("attention", path, "-o", out, "--view", view, *served)
        assert done.returncode == 0, done.stderr
        assert out.is_file() and f"wrote {out}" in done.stdout
        if view != "model":
            assert Image.open(out).size == size
    arrays = tmp_path / "maps.npz"
    assert run_cli("attention", path, "-o", arrays, *served).returncode == 0
    with np.load(arrays) as saved:
        rows, cols = reference[name]["shapes"][0]  # CLIP's 4 x 4 for any picture; SigLIP 2's wide one's own
        assert (int(saved["rows"]), int(saved["cols"])) == (rows, cols)
        n = rows * cols + (name == "clip")
        assert saved["attentions"].shape == (2, 4, n, n) and saved["boxes"].shape == (n, 4)
    refused = run_cli("attention", path, "-o", tmp_path / "x.png", "--layer", "7", *served)
    assert refused.returncode != 0 and "--layer 7 is out of range" in refused.stderr


# --- front-door workers, image URLs, offline ----------------------------------------------------------------------

@pytest.mark.parametrize("name, layers", [("clip", [0, 1]), ("siglip2", [1])])
def test_images_through_two_front_door_workers(image_workers, reference, name, layers):
    """HTTP, gRPC and the maps, through `serve --workers 2`: each worker decodes, only the pixels (C, H, W) cross to
    the engine process, each image's shape with them."""
    model, images = "" if name == "clip" else name, IMAGES_OF[name]
    reply = post(image_workers, "/v1/embeddings", {"model": model, "input": [
        {"image": data_uri(d)} for d in images] + [{"text": t} for t in TEXTS]})
    vectors = [d["embedding"] for d in reply["data"]]
    assert_same(vectors[:len(images)], reference[name]["images"])
    assert_same(vectors[len(images):], reference[name]["texts"])
    with image_workers.channel() as channel:
        embedded = image_workers.stub(channel).Embed(pb.EmbedRequest(model=model, inputs=[
            pb.Input(image=pb.Image(data=images[2]))]))
    vector = np.frombuffer(embedded.embeddings[0].sentence_embedding.data, np.float32)
    assert_same([vector], reference[name]["images"][2:3])
    maps = post(image_workers, "/v1/attention", {"model": model, "inputs": [{"image": data_uri(images[0])}],
                                                 "layers": layers})
    assert_patch_attention(maps["data"][0], name, reference, 0, layers)
    refused = post(image_workers, "/embeddings_image", {"model": model, "input": base64.b64encode(
        HOSTILE["20,000 x 20,000 png"][0]).decode()}, status=400)
    assert "over the limit of 25,000,000" in refused["error"]["message"]  # the server's default


@pytest.fixture(scope="module")
def image_host():
    with image_origin(IMAGES[0]) as url:
        yield url


@pytest.mark.parametrize("path, status, fragment", [
    ("/ok.png", 200, None), ("/to-ok", 200, None),
    ("/to-elsewhere", 400, "does not fetch images from 'localhost'"),
    ("/big.png", 400, "over this server's limit of 100,000 bytes"),
    ("/slow", 400, "took over 1 s"),
])
def test_image_urls_are_fetched_only_from_allowed_hosts_within_limits(image_workers, image_host, reference, path,
                                                                     status, fragment):
    body = post(image_workers, "/embeddings_image", {"model": "", "input": [image_host + path]}, status=status)
    if status == 200:
        assert_same([body["data"][0]["embedding"]], reference["clip"]["images"][:1])
    else:
        assert fragment in body["error"]["message"]
    other = post(image_workers, "/embeddings_image", {"model": "", "input": ["http://10.0.0.1/cat.png"]}, status=400)
    assert "does not fetch images from '10.0.0.1'" in other["error"]["message"]  # a host off the list: not contacted


def test_a_folder_encoded_offline_gives_each_image_its_own_patches(siglip2_artifacts, reference, tmp_path):
    """`attnserve encode` of a folder of SigLIP 2's images of every shape: transformers' embeddings, each row's
    num_tokens its own patch count, the padding of its batches counted."""
    import pyarrow.parquet as pq

    from attnserve.offline.encode import read_embeddings

    folder = tmp_path / "images"
    folder.mkdir()
    for i, data in enumerate(IMAGES_OF["siglip2"]):
        (folder / f"{i}.png").write_bytes(data)
    out = tmp_path / "out.parquet"
    result = run_cli("encode", folder, "-o", out, "--artifacts", siglip2_artifacts, "--no-progress")
    assert result.returncode == 0, result.stderr
    patches = [rows * cols for rows, cols in reference["siglip2"]["shapes"]]
    assert pq.read_table(out).column("num_tokens").to_pylist() == patches
    assert f"encoded {len(patches)} images, {sum(patches)} tokens" in result.stdout
    assert_same(read_embeddings(out), reference["siglip2"]["images"])
