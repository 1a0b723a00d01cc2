"""What a request with images may ask, and its images decoded: an image-text model's image tower
(engine/image_encoder.py) embeds them, in the space it shares with its texts."""

from __future__ import annotations

from attnserve.engine.image_encoder import ImageEncoder, ImageInput
from attnserve.engine.manifest import Manifest
from attnserve.engine.output_options import OutputOptions
from attnserve.images import ImageError

from .image_inputs import ImageBytes, ImageUrl
from .requests import EncodeRequest, RequestLimits, invalid


def image_rows(request: EncodeRequest) -> list[int]:
    """The rows of the request's inputs that are images (their bytes, or URLs the core fetches first)."""
    return [row for row, item in enumerate(request.inputs) if isinstance(item, ImageBytes | ImageUrl)]


def check_images(request: EncodeRequest, options: OutputOptions, manifest: Manifest, images: ImageEncoder | None,
                 row: int) -> None:
    """What a request with images may ask: an image's embedding (in the model's shared space with its texts), cut
    to `dimensions`, normalised or not, as float or binary, and the image tower's maps over its patches (with
    attention; choose_attention holds them to the tower's layers and heads). Its patches' states are not served."""
    if images is None:
        raise invalid(f"inputs[{row}]", f"{manifest.model} is a text model: it embeds no images", f"input {row}")
    refused = [name for name, asked in (
        ("token_embeddings", options.token_embeddings),
        ("pooling", options.pooling is not None), ("late_chunking", request.late_chunking is not None),
        ("sparse", request.sparse is not None), ("multi_vector", request.multi_vector is not None)) if asked]
    if refused:
        raise invalid(refused[0], f"{refused[0]} is not served for images (input {row} is one): an image's "
                                  "embedding is its tower's pooled output in the space it shares with texts")
    calibrated = [t for t in options.embedding_types if t in ("int8", "uint8")]
    if calibrated and request.ranges is None:
        raise invalid("embedding_types", f"{calibrated[0]} embeddings of images need the request's own ranges: "
                                         "the model's are calibrated on texts (binary and float need none)")


def image_input(images: ImageEncoder, item: object, row: int, limits: RequestLimits) -> ImageInput:
    """A request's image -> its ImageInput (decoded, preprocessed), or a 4xx naming the input."""
    if not isinstance(item, ImageBytes):  # the core fetches URLs before it prepares (Core._fetch_images)
        raise invalid(f"inputs[{row}]", "this image URL was not fetched", f"input {row}")
    try:
        return images.prepare(item.data, item.declared, limits.max_image_pixels)
    except ImageError as error:
        raise invalid(f"inputs[{row}]", str(error), f"input {row}") from None
