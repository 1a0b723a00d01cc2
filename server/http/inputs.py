"""The JSON forms of a request's inputs (OpenAI's `input`, TEI's `inputs`, images in the forms Jina, vLLM, Cohere and
Infinity take) -> the core's list of inputs.

The body model has checked the form already (bodies.py); this only tells the forms apart, and reads each image's
string (server/image_inputs.py: a data URI or base64 decoded here, a URL left for the core to fetch).
"""

from __future__ import annotations

from collections.abc import Sequence

from attnserve.errors import InvalidInputError

from ..image_inputs import image_of
from ..requests import Input
from .bodies import ContentImage, ContentText, JinaImage, JinaText
from .openai_bodies import ChatMessage


def inputs_of(value: str | list) -> list[Input]:
    """A text, texts, one input's token ids, several inputs' token ids, sentence pairs (tuples), or Jina's texts
    and images ({"text": ...}, {"image": ...})."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    if value and isinstance(value[0], JinaText | JinaImage):
        return [item.text if isinstance(item, JinaText) else image_of(item.image, f"input[{i}].image", i)
                for i, item in enumerate(value)]
    return [tuple(item) if isinstance(item, tuple) else item for item in value]


def message_input(messages: Sequence[ChatMessage]) -> Input:
    """vLLM's `messages` -> the one input they are: a text, or one image (an image-text model embeds either, not
    both at once)."""
    parts: list[tuple[str, ContentText | ContentImage | str]] = []
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            parts.append((f"messages[{i}].content", message.content))
        else:
            parts.extend((f"messages[{i}].content[{j}]", part) for j, part in enumerate(message.content))
    if len(parts) != 1:
        raise InvalidInputError(f"messages: {len(parts)} content parts: an image-text model embeds one text or "
                                "one image a request in this form (send several as `input`)", field="messages",
                                description=f"{len(parts)} content parts, not one")
    field, part = parts[0]
    if isinstance(part, str):
        return part
    if isinstance(part, ContentText):
        return part.text
    return image_of(part.image_url.url, f"{field}.image_url.url")
