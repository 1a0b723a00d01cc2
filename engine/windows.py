"""A text as windows the model takes: what chunked embeddings (--long-inputs chunk) and late chunking encode.

The text is tokenized whole, without special tokens. Its tokens are cut into consecutive windows of as many as fit
beside the prompt's tokens and the model's special tokens, and each window is the model's prefix, the prompt, its
own tokens and the model's suffix ("[CLS] prompt window [SEP]" for BERT, "window <|endoftext|>" for Qwen3), as
the tokenizer's post-processor frames any text. Without a prompt the windows are exactly the tokenizers library's
overflowing windows of the text (stride 0). A text that fits is one window.

The prompt is tokenized apart from the text, so that every window starts with it (an instruction model's windows
all read as queries, or all as documents); a text that fits, encoded the usual way, has its prompt tokenized with
it, which may join the two at their border differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from attnserve.errors import InvalidInputError

from .tokenized import TokenizedInput


@dataclass(frozen=True)
class Windows:
    """One text's windows, and where its own tokens are in them."""

    inputs: list[TokenizedInput]  # each at most max_length tokens, special tokens included
    text_tokens: list[int]  # per window: how many of the text's tokens it holds (its weight when pooled)
    text_start: int  # the index, in every window, of its first text token (after the prefix and the prompt)
    offsets: np.ndarray  # (n, 2) int64: the character span [start, stop) of each of the text's n tokens, in order


@dataclass(frozen=True)
class Frame:
    """The special tokens the model's post-processor puts around a single text."""

    prefix: list[int]
    suffix: list[int]

    @classmethod
    def of(cls, whole: Tokenizer) -> Frame:
        # A one-token text framed by the post-processor: what comes before and after its sequence-0 tokens.
        probe = whole.post_process(whole.encode("a", add_special_tokens=False))
        sequence = probe.sequence_ids
        own = [i for i, s in enumerate(sequence) if s == 0]
        if not own:
            return cls(list(probe.ids), [])
        return cls(list(probe.ids[: own[0]]), list(probe.ids[own[-1] + 1:]))


def windows_of(whole: Tokenizer, frame: Frame, text: str, prompt: str, max_length: int, label: str,
               dropped: np.ndarray | None = None) -> Windows:
    """text cut into windows of at most max_length tokens (frame and prompt included), in order.

    whole: the tokenizer without truncation. Its cost grows with the text (bounded by a request's size). dropped:
    ids left out of the text's tokens before it is cut (a model2vec model's unknown token)."""
    encoding = whole.encode(text, add_special_tokens=False)
    prompt_ids = whole.encode(prompt, add_special_tokens=False).ids if prompt else []
    room = max_length - len(frame.prefix) - len(frame.suffix) - len(prompt_ids)
    if room < 1:
        raise InvalidInputError(f"{label}: the prompt takes {len(prompt_ids)} of the {max_length} tokens a window "
                                "holds, leaving none for the text")
    ids = encoding.ids
    offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)  # (n, 2)
    if dropped is not None and dropped.size:
        kept = ~np.isin(np.asarray(ids, dtype=np.int64), dropped)
        ids, offsets = [i for i, keep in zip(ids, kept, strict=True) if keep], offsets[kept]
    head = [*frame.prefix, *prompt_ids]
    # A text whose characters all tokenize to nothing (a normaliser drops them) is one window with weight 1.
    starts = range(0, len(ids), room) if ids else range(1)
    inputs = [TokenizedInput(np.asarray([*head, *ids[s:s + room], *frame.suffix], dtype=np.int64), False)
              for s in starts]
    weights = [len(ids[s:s + room]) for s in starts] if ids else [1]
    return Windows(inputs, weights, len(head), offsets)
