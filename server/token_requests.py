"""TEI's /tokenize and /decode, as neutral requests: a text's every token, and the text of token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnserve.engine.manifest import Manifest
from attnserve.engine.prompts import apply_prompt
from attnserve.engine.tokenizer import TextTokenizer, Token
from attnserve.errors import InvalidInputError

from .requests import RequestLimits, check_count, located


@dataclass(frozen=True)
class TokenizeRequest:
    texts: Sequence[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None
    prompt: str | None = None
    model: str | None = None  # None: the server's default model


@dataclass(frozen=True)
class DecodeRequest:
    ids: Sequence[Sequence[int]]
    skip_special_tokens: bool = True
    model: str | None = None  # None: the server's default model


def prepare_tokenize(request: TokenizeRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits
                     ) -> list[list[Token]]:
    """Every token of each text (its prompt before it), whole; the texts are checked as any text input is."""
    check_count(len(request.texts), limits.max_inputs)
    texts = apply_prompt(manifest, request.texts, request.prompt_name, request.prompt)
    return _labelled(lambda labels: tokenizer.token_spans(texts, request.add_special_tokens, labels), len(texts))


def prepare_decode(request: DecodeRequest, tokenizer: TextTokenizer, limits: RequestLimits) -> list[str]:
    """The text of each id list; the ids are checked as token-id inputs are."""
    check_count(len(request.ids), limits.max_inputs)
    return _labelled(lambda labels: tokenizer.decode(request.ids, request.skip_special_tokens, labels),
                     len(request.ids))


def _labelled(call, n: int):
    """Run a tokenizer call that names the inputs "input i" in its errors, adding the input's field to an error."""
    labels = [f"input {i}" for i in range(n)]
    try:
        return call(labels)
    except InvalidInputError as error:
        raise located(error, labels, [f"inputs[{i}]" for i in range(n)]) from None
