"""An image-text model's image tower at serving time (CLIP, SigLIP: the manifest's `images`, export/image_tower.py):
an image's bytes -> an ImageInput the batcher queues like a tokenized text -> a batch run on the tower's graph.

An ImageInput counts as many tokens as the tower's sequence has positions (its patches, and the class token), so
images share the batcher's budget and admission with texts: a ViT-B/16 image at 224 px is 197 tokens, a batch of
max_batch_tokens 16,384 holds 83 of them. Every image of a fixed-size tower is the same size (the processor's
crop), so a batch of its images has no padding. SigLIP 2's NaFlex tower takes each image at its own aspect ratio,
as many patches as it needs up to the processor's max_num_patches: its ImageInput counts its own patches, the
batcher takes images of near counts together (as it takes texts of near lengths), and a batch is padded to its
longest with masked patches.

The graph is the one of the text graph's precision: fp32, int8, fp16, bf16 (OpenVINO's, where export could verify
it; fp32 otherwise); an attention request runs the attention graph (fp32), with the maps over the patches.
Shapes: B batch, C channels, S side, T positions (patches and the class token), H hidden, D the shared space,
L layers, nh heads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnserve.images import DEFAULT_MAX_PIXELS, decode_image
from attnserve.patch_attention import patch_boxes

from .image_processor import ImageProcessor, read_image_processor
from .manifest import Manifest
from .session import Session, open_graph

# The text graph's precision -> the image graph run beside it.
IMAGE_GRAPHS = {"fp32": "image_embeds", "bf16": "image_embeds_bf16", "int8": "image_embeds_int8",
                "fp16": "image_embeds_fp16"}
IMAGE_ATTENTION = "image_attention"


@dataclass(frozen=True)
class PatchLayout:
    """Where an image tower's positions lie in the height x width image it takes (S x S for a fixed-size tower):
    the class token first where there is one (CLIP; SigLIP has none), then rows x cols patches of P px in row-major
    order (attnserve/patch_attention.py)."""

    height: int  # px: S, or a NaFlex image's rows x P
    width: int
    patch_size: int  # P
    class_token: bool
    # How a picture became that image: "crop" (its shortest edge resized to S, then the center S x S: CLIP's
    # processor), "stretch" (resized to S x S: SigLIP's) or "patches" (resized to whole patches, its aspect ratio
    # kept as near as they allow: SigLIP 2's NaFlex); where to draw the maps over the original picture.
    fit: str = "crop"

    @property
    def rows(self) -> int:
        return self.height // self.patch_size

    @property
    def cols(self) -> int:
        return self.width // self.patch_size

    @property
    def side(self) -> int | None:
        """A square image's side in px; None where it is not square (the wire's size, 0 on gRPC)."""
        return self.height if self.height == self.width else None

    @property
    def grid(self) -> int | None:
        """A square image's patches along a side; None where it is not square (the wire's grid)."""
        return self.rows if self.side is not None else None

    @property
    def positions(self) -> int:
        return self.rows * self.cols + int(self.class_token)

    def labels(self) -> list[str]:
        """Each position's name, as a text's word pieces label its maps: "<class>", then "patch ROW,COL"."""
        cols = self.cols
        return ["<class>"] * int(self.class_token) + [f"patch {i // cols},{i % cols}"
                                                      for i in range(self.rows * cols)]

    def boxes(self) -> np.ndarray:
        """(T, 4) int64: each position's top, left, bottom, right in the image; the class token's is the whole
        image."""
        patches = patch_boxes(self.rows, self.cols, self.patch_size)  # (rows * cols, 4)
        if not self.class_token:
            return patches
        whole = np.array([[0, 0, self.height, self.width]], dtype=np.int64)
        return np.concatenate([whole, patches])


@dataclass(frozen=True)
class ImageInput:
    """One image, preprocessed: what the batcher queues (its len() is the tower's positions, as a text's tokens)."""

    pixels: np.ndarray  # (C, S, S) float32, as the checkpoint's image processor gives them (NaFlex: (C, H, W))
    positions: int  # T
    truncated: bool = False  # an image is never cut; as TokenizedInput's, for the reply's counts
    layout: PatchLayout | None = None  # where its positions lie; None where only the pixels travel (workers' wire)
    # What a TokenizedInput has and an image has none of, read where texts and images are checked and counted alike.
    type_ids: ClassVar[None] = None
    pair_start: ClassVar[None] = None
    attended: ClassVar[None] = None

    def __len__(self) -> int:
        return self.positions


def flat_patches(pixels: np.ndarray, patch: int) -> np.ndarray:
    """(C, H, W) -> (rows * cols, P * P * C): the patches in row-major order, each flattened by its rows, columns
    and then channels (transformers' convert_image_to_patches, which NaFlex towers take)."""
    C, H, W = pixels.shape
    return pixels.reshape(C, H // patch, patch, W // patch, patch).transpose(1, 3, 2, 4, 0).reshape(
        (H // patch) * (W // patch), patch * patch * C)


class ImageEncoder:
    """The image tower's sessions and preprocessing for one served model."""

    def __init__(self, manifest: Manifest, precision: str, provider: str, threads: int = 0, spin: str = "on",
                 sessions: bool = True):
        """sessions False: preprocessing only, no graph opened (a front-door worker's, server/workers/front.py:
        the engine process runs the batches)."""
        images = manifest.images
        assert images is not None, "ImageEncoder is for a manifest with images"
        self.manifest, self.provider, self.threads, self.spin = manifest, provider, threads, spin
        self.settings = images
        self.processor: ImageProcessor = read_image_processor(manifest.path(images["processor"]["file"]))
        self.max_patches = int(images.get("max_patches", 0))  # NaFlex: each image's own size; 0: one size
        side = images["image_size"]
        self.layout = PatchLayout(side, side, images["patch_size"], images["class_token"],
                                  "crop" if self.processor.crop is not None else "stretch")
        self.graph = IMAGE_GRAPHS.get(precision, "image_embeds")
        if self.graph not in images["graphs"]:
            self.graph = "image_embeds"
        self.precision = images["graphs"][self.graph]["precision"]
        self._session = self._open(self.graph) if sessions else None
        self._attention: Session | None = None
        self._lock = threading.Lock()

    @property
    def positions(self) -> int:
        """T: the patches, and the class token where there is one (NaFlex: the most an image has)."""
        return self.max_patches or self.layout.positions

    @property
    def num_layers(self) -> int:
        return int(self.settings["num_layers"])

    @property
    def num_heads(self) -> int:
        return int(self.settings["num_heads"])

    @property
    def embedding_size(self) -> int:
        return int(self.settings["embedding_size"])

    def _open(self, name: str, arena: bool = True) -> Session:
        graph = self.settings["graphs"][name]
        return open_graph(self.manifest.path(graph["file"]), graph.get("backend", "onnxruntime"), graph["precision"],
                          self.provider, self.threads, arena, spin=self.spin)

    def prepare(self, data: bytes, declared: str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInput:
        """An image's bytes -> its ImageInput, or ImageError (attnserve/images.py) in one line."""
        image = decode_image(data, max_pixels, declared)
        try:
            pixels = self.processor.pixels(image)
        finally:
            image.close()
        if not self.max_patches:
            return ImageInput(pixels, self.positions, layout=self.layout)
        layout = PatchLayout(pixels.shape[1], pixels.shape[2], self.layout.patch_size, self.layout.class_token,
                             "patches")
        return ImageInput(pixels, layout.positions, layout=layout)

    def run(self, inputs: list[ImageInput], attention: bool = False) -> dict[str, np.ndarray]:
        """A batch of images -> {"image_embeds" (B, D), "last_hidden_state" (B, T, H), and with attention
        "attentions" (L, B, nh, T, T) and "value_norms" (L, B, nh, T)}; NaFlex: T the batch's most patches, each
        image's own the first of them."""
        session = self._attention_session() if attention else self._session
        assert session is not None, "an ImageEncoder without sessions prepares images only"
        names = self.settings["graphs"][IMAGE_ATTENTION if attention else self.graph]["outputs"]
        feed = self._naflex_feed(inputs) if self.max_patches else {"pixel_values": np.stack([x.pixels for x in inputs])}
        return dict(zip(names, session.run(names, feed), strict=True))

    def _naflex_feed(self, inputs: list[ImageInput]) -> dict[str, np.ndarray]:
        """NaFlex images -> pixel_values (B, N, P * P * C), padded with zeros to the batch's most patches N,
        pixel_attention_mask (B, N) 1 for an image's own, spatial_shapes (B, 2) its rows and cols."""
        P = self.layout.patch_size
        flat = [flat_patches(x.pixels, P) for x in inputs]
        n = max(len(f) for f in flat)
        pixels = np.zeros((len(flat), n, flat[0].shape[1]), dtype=np.float32)
        mask = np.zeros((len(flat), n), dtype=np.int64)
        for i, f in enumerate(flat):
            pixels[i, :len(f)], mask[i, :len(f)] = f, 1
        shapes = np.array([[x.pixels.shape[1] // P, x.pixels.shape[2] // P] for x in inputs], dtype=np.int64)
        return {"pixel_values": pixels, "pixel_attention_mask": mask, "spatial_shapes": shapes}

    def _attention_session(self) -> Session:
        with self._lock:
            if self._attention is None:  # its intermediates grow with the batch: no arena keeps a burst's peak
                self._attention = self._open(IMAGE_ATTENTION, arena=False)
        return self._attention
