"""The JSON forms of a request's inputs (OpenAI's `input`, TEI's `inputs`) -> the core's list of inputs.

The body model has checked the form already (bodies.Inputs); this only tells the forms apart.
"""

from __future__ import annotations

from ..requests import Input


def inputs_of(value: str | list) -> list[Input]:
    """A text, texts, one input's token ids, several inputs' token ids, or sentence pairs (tuples)."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    return [tuple(item) if isinstance(item, tuple) else item for item in value]
