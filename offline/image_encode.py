"""A chunk of images through an image-text model's image tower (engine/image_encoder.py), as rows.encode_inputs runs
a chunk of texts: batched, normalised as a text's embedding is, with the images it refuses left out and said why.

Each image is decoded as its batch comes up, not as its chunk is read: the chunk holds its files' bytes, and pixels
((C, S, S) float32, 600 KB an image at 224 px) are held for two batches at a time, the one the engine runs and the
next, which a thread decodes meanwhile (Pillow's decoders release the GIL, as onnxruntime does). A bad image
(attnserve/images.py: corrupt, truncated, SVG, several frames, over the pixel limit) is refused with its one-line
ImageError, the same words the server answers; the rest of its batch runs.

Every image of a model has the same length (the tower's positions: its patches, and the class token), so the batch
plan (engine/batching.py, texts' too) cuts the chunk into runs in input order, of the budget's size. Same images in,
same batches, same bits out: local and Ray runs both come through here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from attnserve.engine.batch_outputs import assemble_batch, in_order
from attnserve.engine.batching import plan_batches
from attnserve.engine.engine import Encoded, EncodeStats, Engine
from attnserve.engine.image_encoder import ImageEncoder, ImageInput
from attnserve.engine.output_options import OutputOptions
from attnserve.errors import ConfigError
from attnserve.images import ImageError


def image_tower(engine: Engine) -> ImageEncoder:
    """The engine's image tower, or the one line that refuses images to a text model."""
    if engine.images is None:
        raise ConfigError(f"{engine.manifest.model} is a text model: it embeds no images")
    return engine.images


def _prepared(tower: ImageEncoder, images: Sequence[bytes], batch: np.ndarray, max_pixels: int
              ) -> tuple[list[int], list[ImageInput], dict[int, str]]:
    """One batch decoded: (the positions kept, their ImageInputs, {position refused: reason})."""
    kept, inputs, refused = [], [], {}
    for i in batch.tolist():
        try:
            inputs.append(tower.prepare(images[i], max_pixels=max_pixels))
            kept.append(i)
        except ImageError as e:
            refused[i] = str(e)
    return kept, inputs, refused


def encode_images(engine: Engine, images: Sequence[bytes], options: OutputOptions, on_batch: Callable[[int], None],
                  max_pixels: int) -> tuple[Encoded, dict[int, str]]:
    """Image files' bytes -> (their encoded rows, {position: reason} of those refused, left out of the rows).

    options: the embeddings' dimensions, normalisation and type, assembled as a server's are (engine/outputs.py);
    the driver settles them as for texts.
    num_tokens: the tower's positions; truncated: never (an image is resized, not cut)."""
    tower = image_tower(engine)
    start = time.perf_counter()
    positions = tower.positions  # T (NaFlex: the most an image may have)
    batches = plan_batches(np.full(len(images), positions, dtype=np.int64), engine.batch_tokens,
                           engine.config.max_batch_size)
    parts: list[tuple[Sequence[int], np.ndarray]] = []  # each batch's kept positions and (b, D) embeddings
    lengths = np.zeros(len(images), dtype=np.int32)  # each image's own positions
    cells = 0  # positions computed: each batch's longest x its images
    refused: dict[int, str] = {}
    with ThreadPoolExecutor(1, thread_name_prefix="attnserve-decode") as pool:
        def decoding(k: int) -> Future | None:
            return pool.submit(_prepared, tower, images, batches[k], max_pixels) if k < len(batches) else None

        upcoming = decoding(0)
        for k in range(len(batches)):
            assert upcoming is not None
            kept, inputs, bad = upcoming.result()
            upcoming = decoding(k + 1)  # beside this batch's run
            refused.update(bad)
            if inputs:
                # the tower's projected output, typed as asked: (b, D), or (b, ceil(D / 8)) binary
                parts.append((kept, assemble_batch(engine.run(inputs), inputs, options, engine.heads).typed[
                    options.embedding_types[0]]))
                lengths[kept] = [len(x) for x in inputs]
                cells += max(len(x) for x in inputs) * len(inputs)
                on_batch(len(inputs))
    keep = np.ones(len(images), dtype=bool)
    keep[list(refused)] = False
    embeddings, lengths = in_order(parts, len(images))[keep], lengths[keep]  # (n, D), (n,), in input order
    n = len(embeddings)
    stats = EncodeStats(n, int(lengths.sum()), cells, time.perf_counter() - start)
    return Encoded(embeddings, lengths, np.zeros(n, dtype=bool), stats), refused

