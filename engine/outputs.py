"""Rows -> every output a run gives, assembled in one place for a server's replies and offline encoding alike:
pooling at request time, `dimensions`, normalisation, the quantized types, a long text's windows and late chunks;
each input's other outputs (token embeddings, attention, sparse, multi-vector) by engine/encoded_inputs.py.

A server builds its reply off the event loop, in the same thread-pool job as the door's serialization of it;
offline encoding builds one per batch (Engine.encode_tokenized and its siblings)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from .dimensions import cut_and_normalize
from .encoded_inputs import ChunkEmbedding, EncodedInput, encoded_input
from .image_encoder import ImageInput
from .late_chunking import ChunkMeans, TextChunks
from .output_options import OutputHeads, OutputOptions, PreparedRequest
from .pooling import pool
from .quantize import quantize
from .rows import RowOutput
from .tokenizer import TokenizedInput
from .windows import Windows


@dataclass
class EncodeReply:
    embeddings: np.ndarray  # (N, D) float32: D is `dimensions`, or the model's embedding_size
    inputs: list[EncodedInput]  # one per input, in request order
    tokens: int  # all inputs' tokens: what the request cost
    options: OutputOptions  # what was asked, resolved: attention layers and heads as non-negative indices
    model: str = ""  # the name of the model that answered, as it is served
    # Each embedding type asked -> the embeddings in it (engine/quantize.py): (N, D) float32, int8 or uint8, or
    # (N, ceil(D / 8)) for the binary types. "float" is `embeddings`.
    typed: dict[str, np.ndarray] = field(default_factory=dict)


def build_reply(rows: Sequence[RowOutput], prepared: PreparedRequest, heads: OutputHeads, model: str = ""
                ) -> EncodeReply:
    """rows: the batches', one per prepared input (one per window where an input is windowed: prepared.windows);
    chunks: late chunking's spans and token ranges per input. heads: the model's tokenizer, a ColBERT model's
    inputs (which of each input's vectors it keeps), bge-m3's heads (its sparse and multi-vector outputs from the
    rows' last hidden states)."""
    inputs, options = prepared.inputs, prepared.options
    # An embedder's rows (their token states where the request needs them: PreparedRequest.token_states); a
    # reranker's carry its scores and attention only (prepare() asks it for attention alone).
    if rows and all(row.sentence_embedding is None for row in rows):
        assert options.attention and options.pooling is None, "a reranker's rows have no embeddings"
        return EncodeReply(np.zeros((len(rows), 0), np.float32),
                           [encoded_input(row, item, options, heads) for row, item in zip(rows, inputs, strict=True)],
                           prepared.tokens, options, model, {"float": np.zeros((len(rows), 0), np.float32)})
    assert all(row.sentence_embedding is not None for row in rows), "a reranker's rows have no embeddings"
    if (options.pooling is None and prepared.windows is None and options.normalize and options.dimensions is None
            and all(row.normalized is not None for row in rows)):
        # Normalised full vectors of the graph's pipeline, as most requests ask: normalised with their batch
        # (engine/rows.py normalized_rows).
        # np.array, not np.stack: the same (N, D) copy at a seventh of np.stack's cost for a row or two
        sentences = np.array([row.normalized for row in rows])  # (N, D)
        typed = {kind: quantize(sentences, kind, options.ranges) for kind in options.embedding_types}
        return EncodeReply(sentences, [encoded_input(row, item, options, heads)
                                       for row, item in zip(rows, inputs, strict=True)],
                           prepared.tokens, options, model, typed)
    sentences = _pooled(rows, options)
    if prepared.windows is None:
        encoded = [encoded_input(row, item, options, heads) for row, item in zip(rows, inputs, strict=True)]
    else:
        # windows are texts': a request with images is never windowed (embed_requests.prepare)
        sentences, encoded = _windowed(rows, cast(Sequence[TokenizedInput], inputs), sentences, prepared.windows,
                                       prepared.chunks, options, heads)
    sentences, typed = sentence_outputs(sentences, options)
    return EncodeReply(sentences, encoded, prepared.tokens, options, model, typed)


def sentence_outputs(sentences: np.ndarray, options: OutputOptions) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(N, H) pooled sentence embeddings, not normalised -> (N, D) float32 cut to `dimensions` and normalised as
    asked, and each embedding type asked of them: Matryoshka first, then quantization, as sentence-transformers
    orders them."""
    sentences = cut_and_normalize(sentences, options.dimensions, options.normalize)  # (N, D): Matryoshka
    sentences = np.ascontiguousarray(sentences, dtype=np.float32)
    return sentences, {kind: quantize(sentences, kind, options.ranges) for kind in options.embedding_types}


def _pooled(rows: Sequence[RowOutput], options: OutputOptions) -> np.ndarray:
    """(N, D) the rows' sentence embeddings: the graph's pipeline, or pooled at request time as asked."""
    if options.pooling is None:
        return np.array([row.sentence_embedding for row in rows])  # (N, D)
    # each row's padding is cut off already: all T tokens are real
    states = [row.token_embeddings for row in rows if row.token_embeddings is not None]
    assert len(states) == len(rows), "pooling at request time keeps the token states"
    return np.stack([pool(tokens[None], np.array([len(tokens)]), options.pooling)[0]
                     for tokens in states])  # (1, T, H) -> (H,) each


def _windowed(rows: Sequence[RowOutput], inputs: Sequence[TokenizedInput], pooled: np.ndarray,
              windows: Sequence[Windows | None], chunks: Sequence[TextChunks] | None, options: OutputOptions,
              heads: OutputHeads) -> tuple[np.ndarray, list[EncodedInput]]:
    """(R, D) the rows' pooled embeddings -> (N, D) the request inputs', a windowed one's the average of its
    windows' weighted by the text's tokens in each (vLLM's chunked processing); and each input's EncodedInput,
    with its late chunks."""
    out, encoded, r = [], [], 0
    for i, w in enumerate(windows):
        if w is None:
            out.append(pooled[r])
            encoded.append(encoded_input(rows[r], inputs[r], options, heads))
            r += 1
            continue
        n = len(w.inputs)
        weights = np.asarray(w.text_tokens, dtype=np.float64)  # (n,)
        out.append((weights @ pooled[r:r + n].astype(np.float64) / weights.sum()).astype(np.float32))  # (D,)
        item = EncodedInput(num_tokens=sum(len(x) for x in inputs[r:r + n]), truncated=False, tokens=None,
                            token_embeddings=None, attentions=None, windows=n)
        if chunks is not None:
            spans, ranges = chunks[i]
            item.chunks = chunk_embeddings(window_means(rows[r:r + n], w, ranges), spans, ranges, options)
        encoded.append(item)
        r += n
    return np.stack(out), encoded


def window_means(rows: Sequence[RowOutput], w: Windows, ranges: Sequence[tuple[int, int]]) -> ChunkMeans:
    """A text's chunks' means from its windows' rows, in window order: the text's tokens in each window."""
    means, first = ChunkMeans(ranges, rows[0].token_embeddings.shape[1]), 0  # type: ignore[union-attr]
    for row, k in zip(rows, w.text_tokens, strict=True):
        means.add(row.token_embeddings[w.text_start:w.text_start + k], first)  # type: ignore[index]
        first += k
    return means


def chunk_embeddings(means: ChunkMeans, spans: Sequence[tuple[int, int]], ranges: Sequence[tuple[int, int]],
                     options: OutputOptions) -> list[ChunkEmbedding]:
    """A text's chunks, their means cut and normalised as its own embedding is."""
    pooled = chunk_vectors(means, options)  # (k, D)
    return [ChunkEmbedding(start, stop, b - a, np.ascontiguousarray(vector, dtype=np.float32))
            for (start, stop), (a, b), vector in zip(spans, ranges, pooled, strict=True)]


def chunk_vectors(means: ChunkMeans | np.ndarray, options: OutputOptions) -> np.ndarray:
    """A text's chunk means (ChunkMeans, or their (k, H) means) -> (k, D) float32, cut and normalised as its own
    embedding is."""
    vectors = means.means() if isinstance(means, ChunkMeans) else means  # (k, H)
    return np.ascontiguousarray(cut_and_normalize(vectors, options.dimensions, options.normalize), dtype=np.float32)


def unwindowed(inputs: Sequence[TokenizedInput | ImageInput], options: OutputOptions) -> PreparedRequest:
    """A batch of inputs, each its own row, as offline encoding assembles one."""
    return PreparedRequest(list(inputs), options)
