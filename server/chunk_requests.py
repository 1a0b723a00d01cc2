"""Requests of texts in windows: late chunking (engine/late_chunking.py: each text read whole, its chunks'
token embeddings mean-pooled) and --long-inputs chunk (a text longer than max_seq_length embedded in windows)."""

from __future__ import annotations

from collections.abc import Sequence

from attnserve.engine.late_chunking import (
    CHUNKERS,
    DEFAULT_CHUNK_TOKENS,
    NO_TOKEN_TO_CHUNK,
    TextChunks,
    check_spans,
    chunker_spans,
    token_ranges,
)
from attnserve.engine.manifest import Manifest
from attnserve.engine.windows import Windows

from .requests import EncodeRequest, invalid


def windowing(request: EncodeRequest, manifest: Manifest, rule: str, image_rows: Sequence[int]) -> str | None:
    """Windows where the sentence embedding is all that is asked (tokenize()'s `windowed`): every text, read whole,
    for late chunking ("all"), or chunked for a long text ("long": --long-inputs chunk); None: none."""
    if request.late_chunking is not None:
        return "all"
    if (rule == "chunk" and _sentence_embeddings_only(request) and not image_rows
            and not manifest.pad_to_length):  # a fixed-length model's texts are cut (SigLIP's)
        return "long"
    return None


def _sentence_embeddings_only(request: EncodeRequest) -> bool:
    """Whether the request asks for its inputs' sentence embeddings alone: what chunked embedding gives."""
    return not request.token_embeddings and request.attention is None and request.sparse is None and \
        request.multi_vector is None


def check_late_chunking(request: EncodeRequest, manifest: Manifest) -> None:
    """Late chunking mean-pools token embeddings into each chunk's: a dense model whose embedding is a pooling of
    them, texts, and nothing asked that the chunks would not have."""
    late = request.late_chunking
    assert late is not None
    if not manifest.late_chunkable:
        raise invalid("late_chunking", f"late chunking mean-pools token embeddings, and {manifest.model}'s "
                                       f"embedding is not a pooling of them (its pipeline is "
                                       f"{' -> '.join(manifest.modules)})")
    for field, asked in (("pooling", request.pooling != "default"), ("token_embeddings", request.token_embeddings),
                         ("attention", request.attention is not None), ("sparse", request.sparse is not None),
                         ("embedding_types", tuple(request.embedding_types) != ("float",)),
                         ("truncate", request.truncate is not None),
                         ("truncation_direction", request.truncation_direction != "right")):
        if asked:
            raise invalid(field, f"{field} does not apply to late chunking: each text is read whole (in windows "
                                 "where it is longer than max_seq_length) and its chunks mean-pooled")
    if (late.spans is None) == (late.chunker is None):
        raise invalid("late_chunking", "late chunking takes the chunks' spans or a chunker "
                                       f"({', '.join(CHUNKERS)}), one of them")
    if late.chunker is not None and late.chunker not in CHUNKERS:
        raise invalid("late_chunking.chunker", f"chunker {late.chunker!r} is not one of {', '.join(CHUNKERS)}")
    size = late.chunk_tokens
    if size is not None and (late.chunker != "tokens" or isinstance(size, bool) or not isinstance(size, int)
                             or size < 1):
        raise invalid("late_chunking.chunk_tokens", f"chunk_tokens {size!r} is not a positive integer"
                      if late.chunker == "tokens" else "chunk_tokens goes with the tokens chunker")
    if late.spans is not None and (isinstance(late.spans, str) or not isinstance(late.spans, Sequence)
                                   or len(late.spans) != len(request.inputs)):
        raise invalid("late_chunking.spans", f"give one list of spans per input ({len(request.inputs)})")


def late_chunks(request: EncodeRequest, windows: list[Windows | None]) -> list[TextChunks]:
    """Each text's chunks: their character spans (given, or the chunker's) and their tokens' ranges."""
    late = request.late_chunking
    assert late is not None
    out = []
    for row, (text, w) in enumerate(zip(request.inputs, windows, strict=True)):
        assert isinstance(text, str) and w is not None, "late chunking tokenized every input as a text"
        label, field = f"input {row}", f"late_chunking.spans[{row}]"
        if late.spans is not None:
            spans = check_spans(late.spans[row], text, label, field)
        else:
            spans = chunker_spans(text, w.offsets, late.chunker or "sentences", late.chunk_tokens or
                                  DEFAULT_CHUNK_TOKENS)
            if not spans:  # refused, not answered with no chunk: an offline run's row would vanish unsaid
                raise invalid(f"inputs[{row}].text", NO_TOKEN_TO_CHUNK, label)
        out.append((spans, token_ranges(spans, w.offsets, label, field)))
    return out
