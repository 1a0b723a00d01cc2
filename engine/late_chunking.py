"""Late chunking (Günther et al., 2024, arXiv:2409.04701): the encoder reads a whole document once, then the token
embeddings of each chunk's span are mean-pooled, so that every chunk's embedding carries the document's context.

A chunk is a span [start, stop) of the document's characters (Unicode code points, as Python and JSON index a
string). Its tokens are the document's tokens that start inside it (tokenizers' character offsets); a document
longer than the model's length is read in windows (engine/windows.py) whose token embeddings are put end to end.
The spans come with the request, or from a built-in chunker over the tokens: "sentences" (a sentence ends at . ! ?
or their full-width forms followed by white space, or at a line break) or "tokens" (every chunk_tokens tokens).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from attnserve.config import DEFAULT_CHUNK_TOKENS as DEFAULT_CHUNK_TOKENS
from attnserve.config import LATE_CHUNKERS
from attnserve.errors import InvalidInputError

# The chunkers, and the "tokens" chunker's chunk when unset (DEFAULT_CHUNK_TOKENS): declared with encode's settings
# (attnserve/config.py), whose --late-chunking and --chunk-tokens name them.
CHUNKERS = LATE_CHUNKERS
# Why a chunker's text is refused: it makes no chunk of a text the tokenizer keeps nothing of (an empty list of
# chunks would lose an offline run's row unsaid).
NO_TOKEN_TO_CHUNK = "no token to chunk: the tokenizer keeps nothing of the text"
# Where a sentence ends: after its closing punctuation (and any closing quotes or brackets) and the white space that
# follows, or after a line break.
_SENTENCE_END = re.compile(r"[.!?\u2026\u3002\uff01\uff1f][\"'\u2019\u201d)\]]*\s+|\n+")


def chunker_spans(text: str, offsets: np.ndarray, chunker: str, chunk_tokens: int | None) -> list[tuple[int, int]]:
    """The spans a built-in chunker cuts text into, from its tokens' (n, 2) character offsets: each holds at least
    one token, runs from its first token's start to its last token's stop, and the spans follow one another."""
    starts = offsets[:, 0]
    if chunker == "tokens":
        assert chunk_tokens is not None and chunk_tokens >= 1, "checked when the request was prepared"
        groups = [(i, min(i + chunk_tokens, len(offsets))) for i in range(0, len(offsets), chunk_tokens)]
    else:
        ends = [m.end() for m in _SENTENCE_END.finditer(text)]  # the character each next sentence starts at
        cuts = np.searchsorted(starts, ends, side="left")  # (k,) the first token of each next sentence
        bounds = sorted({0, *(int(c) for c in cuts), len(offsets)})
        groups = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return [(int(offsets[a, 0]), int(offsets[b - 1, 1])) for a, b in groups]


def check_spans(spans: Sequence, text: str, label: str, field: str) -> list[tuple[int, int]]:
    """A request's spans of one text: pairs of integers 0 <= start < stop <= len(text)."""
    if isinstance(spans, str) or not isinstance(spans, Sequence) or not spans:
        raise _invalid(field, f"{label}: give the text's chunks as a non-empty list of [start, stop] character spans")
    out = []
    for k, span in enumerate(spans):
        if (isinstance(span, str) or not isinstance(span, Sequence) or len(span) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)):
            raise _invalid(f"{field}[{k}]", f"{label}: chunk {k} is not a [start, stop] pair of integers")
        start, stop = span
        if not 0 <= start < stop <= len(text):
            raise _invalid(f"{field}[{k}]", f"{label}: chunk {k} [{start}, {stop}) is not a span of the text's "
                                            f"{len(text)} characters (0 <= start < stop <= {len(text)})")
        out.append((start, stop))
    return out


def token_ranges(spans: Sequence[tuple[int, int]], offsets: np.ndarray, label: str, field: str
                 ) -> list[tuple[int, int]]:
    """Each span's tokens, as a range [a, b) of the text's tokens: those that start inside it. A span no token
    starts in (white space alone, or inside one token) is refused: it has no embedding to give."""
    starts = offsets[:, 0]  # ascending: tokens follow the text
    out = []
    for k, (start, stop) in enumerate(spans):
        a, b = (int(i) for i in np.searchsorted(starts, [start, stop], side="left"))
        if b <= a:
            raise _invalid(f"{field}[{k}]", f"{label}: no token starts in chunk {k} [{start}, {stop}): a chunk needs "
                                            "one or more of the text's tokens")
        out.append((a, b))
    return out


# A text's late chunks: their character spans [start, stop), and their tokens' ranges [a, b) in the text's tokens.
TextChunks = tuple[list[tuple[int, int]], list[tuple[int, int]]]


class ChunkMeans:
    """A text's chunks' mean token embeddings, summed window by window as the windows run: what is held is the
    chunks' sums, never the text's token embeddings. Each window's share comes from a running sum over its
    tokens, so that overlapping chunks cost no more than their count."""

    def __init__(self, ranges: Sequence[tuple[int, int]], hidden_size: int):
        self._ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)  # (k, 2) token ranges [a, b)
        self._sums = np.zeros((len(self._ranges), hidden_size), dtype=np.float64)  # (k, H)

    def add(self, tokens: np.ndarray, first: int) -> None:
        """(m, H) the embeddings of the text's tokens first .. first + m - 1 (one window's)."""
        running = np.zeros((len(tokens) + 1, tokens.shape[1]), dtype=np.float64)  # (m + 1, H)
        np.cumsum(tokens, axis=0, dtype=np.float64, out=running[1:])
        low = np.clip(self._ranges[:, 0] - first, 0, len(tokens))  # (k,) each chunk's share of this window
        high = np.clip(self._ranges[:, 1] - first, 0, len(tokens))
        self._sums += running[high] - running[low]

    def means(self) -> np.ndarray:
        """(k, H) float32."""
        counts = (self._ranges[:, 1] - self._ranges[:, 0]).astype(np.float64)  # (k,) >= 1 (token_ranges)
        return (self._sums / counts[:, None]).astype(np.float32)


def _invalid(field: str, message: str) -> InvalidInputError:
    return InvalidInputError(message, field=field, description=message.split(": ", 1)[-1])
