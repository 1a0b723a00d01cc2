"""Images in: how a request names one (server/image_inputs.py: data URIs and base64 under a byte limit, URLs fetched
only from the hosts the operator allows, from a real HTTP server on loopback), decoding under limits
(attnserve/images.py), and the pixels of CLIP's, SigLIP's and SigLIP 2's preprocessing (engine/image_processor.py)
equal to transformers' own image processors (their Pillow backend) on real files of every mode; the hostile ones and
what it cannot reproduce refused in one line each."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import zlib
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from PIL import Image

from attnserve.engine.image_processor import read_image_processor
from attnserve.errors import CheckpointError
from attnserve.images import ImageError, decode_image
from attnserve.server.image_inputs import UrlPolicy, fetch_image, image_from_string
from tests.image_origin import image_origin


def _gradient(width: int, height: int) -> np.ndarray:
    """(H, W, 3) uint8 with detail at every scale: resizing and cropping errors show."""
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(width * 1000 + height)
    return np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)),
                     rng.integers(0, 256, (height, width))], axis=-1).astype(np.uint8)


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def _exif_rotated_jpeg() -> bytes:
    """A 160 x 90 JPEG whose EXIF says "rotate 90 clockwise to view" (orientation 6), as phones save them."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return _encoded(Image.fromarray(_gradient(160, 90)), "JPEG", exif=exif.tobytes(), quality=95)


def real_images() -> dict[str, bytes]:
    rgb = Image.fromarray(_gradient(300, 200))
    rgba = Image.fromarray(np.dstack([_gradient(123, 457), np.linspace(0, 255, 123 * 457).reshape(457, 123)
                                      .astype(np.uint8)]), "RGBA")
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    palette.info["transparency"] = 3
    sixteen = Image.fromarray(np.arange(64 * 48, dtype=np.uint16).reshape(48, 64) * 20)  # mode I;16
    return {
        "RGB png": _encoded(rgb, "PNG"),
        "RGB jpeg": _encoded(rgb, "JPEG", quality=90),
        "RGBA png": _encoded(rgba, "PNG"),
        "L png": _encoded(rgb.convert("L"), "PNG"),
        "P png with transparency": _encoded(palette, "PNG"),
        "CMYK jpeg": _encoded(rgb.convert("CMYK"), "JPEG", quality=90),
        "I;16 png": _encoded(sixteen, "PNG"),
        "EXIF-rotated jpeg": _exif_rotated_jpeg(),
        "tiny webp": _encoded(Image.fromarray(_gradient(10, 7)), "WEBP", lossless=True),
        "wide bmp": _encoded(Image.fromarray(_gradient(640, 64)), "BMP"),
    }


REAL = real_images()


@pytest.fixture(scope="module")
def processors(tmp_path_factory) -> dict[str, Path]:
    """preprocessor_config.json as transformers saves each: a variant with an old file's int sizes and a crop larger
    than the resize (the padded crop), and SigLIP 2's NaFlex one with small patches, a low patch budget and another
    resample filter."""
    import transformers

    root = tmp_path_factory.mktemp("processors")
    for name, processor in {"clip": transformers.CLIPImageProcessor(),
                            "siglip": transformers.SiglipImageProcessor(),
                            "clip-odd": transformers.CLIPImageProcessor(size=200, crop_size=230, resample=2),
                            "siglip2": transformers.Siglip2ImageProcessor(),
                            "siglip2-small": transformers.Siglip2ImageProcessor(patch_size=8, max_num_patches=64,
                                                                                resample=3)}.items():
        processor.save_pretrained(str(root / name))
    config = json.loads((root / "clip-odd" / "preprocessor_config.json").read_text())
    config.update(size=200, crop_size=230)  # an old CLIPFeatureExtractor file's ints
    (root / "clip-odd" / "preprocessor_config.json").write_text(json.dumps(config))
    return {name: root / name for name in ("clip", "siglip", "clip-odd", "siglip2", "siglip2-small")}


@pytest.mark.parametrize("kind", ["clip", "siglip", "clip-odd", "siglip2", "siglip2-small"])
@pytest.mark.parametrize("name", list(REAL))
def test_pixels_equal_transformers_image_processor(processors, kind, name):
    """The file opened and turned upright as transformers' load_image does, then given to the processor as it is
    (load_image's convert("RGB") would drop an alpha channel the processor composites over white; SigLIP 2's class
    converts only when asked). NaFlex: each image at its own aspect ratio in whole patches, as many as fit the
    budget: the size (spatial_shapes), the patch count and every flattened patch equal to Siglip2ImageProcessor's."""
    import transformers
    from PIL import ImageOps

    from attnserve.engine.image_encoder import flat_patches

    processor = read_image_processor(processors[kind] / "preprocessor_config.json")
    ours = processor.pixels(decode_image(REAL[name]))  # (C, H, W)
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(REAL[name])))
    theirs = transformers.AutoImageProcessor.from_pretrained(str(processors[kind]), backend="pil")(
        images=image, return_tensors="np", **({"do_convert_rgb": True} if processor.patches else {}))
    assert ours.dtype == np.float32 and (processor.patches is not None) == kind.startswith("siglip2")
    if processor.patches is None:
        assert ours.shape == theirs["pixel_values"][0].shape
        assert np.abs(ours - theirs["pixel_values"][0]).max() <= 1e-6
        return
    patch = processor.patches[0]
    rows, cols = (int(x) for x in theirs["spatial_shapes"][0])
    assert ours.shape == (3, rows * patch, cols * patch) and rows * cols <= processor.patches[1]
    count = int(theirs["pixel_attention_mask"][0].sum())
    assert count == rows * cols
    assert np.abs(flat_patches(ours, patch) - theirs["pixel_values"][0][:count]).max() <= 1e-6


def test_an_exif_rotated_jpeg_is_seen_upright():
    assert decode_image(_exif_rotated_jpeg()).size == (90, 160)  # stored 160 x 90, viewed rotated


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height and whose data is a few bytes: a decompression bomb's shape."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) \
        + chunk(b"IEND", b"")


def animated_gif() -> bytes:
    frames = [Image.fromarray(np.roll(_gradient(20, 20), shift, axis=1)).convert("P") for shift in (0, 5, 10)]
    return _encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


HOSTILE = {
    "empty": (b"", "empty"),
    "text": (b"hello, this is not an image at all", "cannot be read as PNG"),
    "svg": (b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', "SVG"),
    "svg without a prolog": (b' <svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>', "SVG"),
    "eps (Ghostscript)": (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "cannot be read as PNG"),
    "20,000 x 20,000 png": (png_header_only(20_000, 20_000), "over the limit of"),
    "zero-width png": (png_header_only(0, 10), "cannot be read as PNG"),
    "truncated png": (REAL["RGB png"][:400], "truncated"),
    "corrupt png": (REAL["RGB png"][:60] + bytes(200) + REAL["RGB png"][260:], "corrupt"),
    "animated gif": (animated_gif(), "3 frames"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_images_are_refused_in_one_line(name):
    data, fragment = HOSTILE[name]
    with pytest.raises(ImageError, match=fragment) as refused:
        decode_image(data)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300


def test_a_declared_type_must_agree_with_the_bytes_and_the_pixel_limit_is_the_servers():
    png = REAL["RGB png"]  # 300 x 200 = 60,000 pixels
    assert decode_image(png, declared="image/png").size == (300, 200)
    assert decode_image(png, max_pixels=60_000).size == (300, 200)
    for options, refusal in (({"declared": "image/jpeg"}, "declared image/jpeg but its bytes are PNG"),
                             ({"declared": "image/svg+xml"}, "image/svg\\+xml' is not accepted"),
                             ({"max_pixels": 59_999}, "60,000 pixels, over the limit of 59,999")):
        with pytest.raises(ImageError, match=refusal):
            decode_image(png, **options)


@pytest.mark.parametrize(("change", "fragment"), [
    ({"do_pad": True}, "do_pad"),
    ({"image_processor_type": "ViTImageProcessor"}, "ViTImageProcessor"),
    ({"size": {"longest_edge": 224}}, "only shortest_edge"),
    ({"image_std": [0.5, 0.0, 0.5]}, "must be above 0"),
    ({"do_reduce_labels": True}, "do_reduce_labels"),
    ({"resample": 99}, "invalid image processor setting"),
    ({"max_num_patches": 64}, "setting 'max_num_patches'"),  # SigLIP 2's NaFlex setting, in a CLIP file
    ({"image_processor_type": "Siglip2ImageProcessor", "do_resize": False}, "do_resize false"),
])
def test_preprocessing_it_cannot_reproduce_is_refused_in_one_line(processors, tmp_path, change, fragment):
    config = json.loads((processors["clip"] / "preprocessor_config.json").read_text())
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=fragment):
        read_image_processor(path)


# --- how a request names an image --------------------------------------------------------------------------------

PIXEL = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
                         "AAAABJRU5ErkJggg==")  # a one-pixel PNG
ENCODED = base64.b64encode(PIXEL).decode()


@pytest.mark.parametrize("value, declared", [
    (f"data:image/png;base64,{ENCODED}", "image/png"),
    (ENCODED, None),
    (ENCODED.rstrip("="), None),  # unpadded
    (base64.urlsafe_b64encode(PIXEL).decode(), None),
    ("\n".join(ENCODED[i:i + 20] for i in range(0, len(ENCODED), 20)), None),  # MIME's line breaks
])
def test_data_uris_and_base64_forms(value, declared):
    image = image_from_string(value, 1000)
    assert (image.data, image.declared) == (PIXEL, declared)


@pytest.mark.parametrize(("value", "fragment"), [
    ("data:image/png,rawbytes", "must be base64"),
    ("data:;;;", "malformed"),
    ("file:///etc/passwd", "http\\(s\\) only, not 'file'"),
    ("not base64 at all!", "is not base64"),
    ("QUJD" * 1000, "over this server's limit of 1,000 bytes"),
])
def test_malformed_forms_are_refused_in_one_line(value, fragment):
    with pytest.raises(ImageError, match=fragment):
        image_from_string(value, 1000)


@pytest.fixture(scope="module")
def origin():
    with image_origin(PIXEL) as url:
        yield url


def fetch(url: str, policy: UrlPolicy):
    async def fetched():
        async with aiohttp.ClientSession() as session:
            return await fetch_image(url, policy, session)
    return asyncio.run(fetched())


ALLOWED = UrlPolicy(allowed_hosts=("127.0.0.1",), max_bytes=1_000_000, timeout_s=1.0, max_redirects=3)


@pytest.mark.parametrize("path", ["/ok.png", "/to-ok"])
def test_an_allowed_host_is_fetched_and_redirects_within_it_followed(origin, path):
    fetched = fetch(origin + path, ALLOWED)
    assert fetched.data == PIXEL and fetched.declared == "image/png"


@pytest.mark.parametrize(("path", "policy", "fragment"), [
    ("/ok.png", UrlPolicy(), "fetches no image URLs"),
    ("/ok.png", UrlPolicy(allowed_hosts=("example.com",)), "does not fetch images from '127.0.0.1'"),
    ("/to-elsewhere", ALLOWED, "does not fetch images from 'localhost'"),
    ("/loop", ALLOWED, "redirected more than 3 times"),
    ("/big", ALLOWED, "over this server's limit of 1,000,000 bytes"),
    ("/big.png", ALLOWED, "over this server's limit of 1,000,000 bytes"),
    ("/slow", ALLOWED, "took over 1 s"),
    ("/missing", ALLOWED, "answered HTTP 404"),
])
def test_urls_off_the_policy_are_refused(origin, path, policy, fragment):
    with pytest.raises(ImageError, match=fragment):
        fetch(origin + path, policy)
