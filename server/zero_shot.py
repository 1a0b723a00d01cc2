"""Zero-shot image classification by an image-text model (CLIP, SigLIP), door-neutral: each image's score for each
candidate label, as the model was trained to give it.

The labels (each put into the template, CLIP's "a photo of a {}.") and the images are encoded as one request through
the batcher; then, as transformers' CLIPModel and SiglipModel forward: logits = cosine x exp(logit_scale)
(+ logit_bias for SigLIP), and CLIP's scores are the softmax over the labels, SigLIP's the sigmoid of each logit
(its labels are not exclusive). The scale and bias are the checkpoint's, kept by the export (manifest images).
Shapes: I images, L labels, D the shared space.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnserve.engine.outputs import EncodeReply
from attnserve.errors import InvalidInputError

from .image_inputs import ImageBytes, ImageUrl
from .requests import EncodeRequest, Input


def _invalid(field: str, description: str) -> InvalidInputError:
    return InvalidInputError(f"{field}: {description}", field=field, description=description)


@dataclass(frozen=True)
class ZeroShotRequest:
    images: Sequence[Input]  # ImageBytes, or ImageUrl the core fetches
    labels: Sequence[str]
    template: str = "{}"  # each label's text: the template with {} replaced by the label
    model: str | None = None

    def to_encode(self) -> EncodeRequest:
        """The labels' texts first, then the images: one encode request, normalised (cosines follow)."""
        if not self.labels:
            raise _invalid("labels", "no labels: send 1 or more candidate labels")
        if not self.images:
            raise _invalid("images", "no images: send 1 or more")
        if self.template.count("{}") != 1:
            raise _invalid("template", f"must hold {{}} once, where each label goes; got {self.template!r}")
        for i, image in enumerate(self.images):
            if not isinstance(image, ImageBytes | ImageUrl):
                raise _invalid(f"images[{i}]", "must be an image")
        texts = [self.template.replace("{}", label) for label in self.labels]
        return EncodeRequest(inputs=[*texts, *self.images], normalize=True, model=self.model)


@dataclass
class ZeroShotReply:
    scores: np.ndarray  # (I, L) float32: softmax over the labels (CLIP) or the sigmoid of each (SigLIP)
    logits: np.ndarray  # (I, L) float32: cosine x scale (+ bias)
    labels: list[str]
    activation: str  # "softmax" or "sigmoid"
    tokens: int
    model: str


def build_zero_shot_reply(reply: EncodeReply, labels: Sequence[str], images: dict) -> ZeroShotReply:
    """The encode reply of [label texts..., images...] (normalised) -> each image's scores, as the model's forward."""
    embeddings = reply.embeddings.astype(np.float64)  # (L + I, D), unit length
    texts, pictures = embeddings[:len(labels)], embeddings[len(labels):]  # (L, D), (I, D)
    logits = pictures @ texts.T * images["logit_scale"] + (images["logit_bias"] or 0.0)  # (I, L)
    if images["zero_shot"] == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        scores = shifted / shifted.sum(axis=1, keepdims=True)
    return ZeroShotReply(scores.astype(np.float32), logits.astype(np.float32), list(labels), images["zero_shot"],
                         reply.tokens, reply.model)


def zero_shot_error(error: InvalidInputError, labels: int) -> InvalidInputError:
    """An error about the encode request, named as the zero-shot request names its inputs: input i < labels is
    labels[i], the others images[i - labels]."""
    field, message = error.field or "", str(error)
    match = re.match(r"inputs\[(\d+)\](.*)", field)
    if match:
        row = int(match.group(1))
        name, label = (f"labels[{row}]", f"label {row}") if row < labels else (
            f"images[{row - labels}]", f"image {row - labels}")
        field = name + match.group(2)
        message = re.sub(rf"^input {row}(?=:)", label, message)
    return InvalidInputError(message, field=field, description=error.description)
