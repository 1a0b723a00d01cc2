"""Rows from the batcher -> the protocol-neutral reply: pooled, cut to `dimensions`, normalised, attention chosen.

Built off the event loop, in the same thread-pool job as the door's serialization of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from attnserve.attention_analyses import head_stats, norm_weighted, rollout
from attnserve.engine.bge_m3 import BgeM3Heads
from attnserve.engine.dimensions import cut_and_normalize
from attnserve.engine.image_encoder import ImageInput, PatchLayout
from attnserve.engine.late_chunking import ChunkMeans
from attnserve.engine.multi_vector import MultiVectorTokenizer, maxsim
from attnserve.engine.pooling import pool
from attnserve.engine.quantize import quantize
from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput
from attnserve.engine.windows import Windows

from .batcher import RowOutput
from .requests import ReplyOptions, TextChunks
from .score_requests import PreparedPredict, PreparedRerank

# A reranker's CrossEncoder activations (model/cross_encoder.py names them in the manifest), on (N,) float32 logits.
SCORE_ACTIVATIONS = {
    "sigmoid": lambda logits: 1.0 / (1.0 + np.exp(-logits)),
    "identity": lambda logits: logits,
}


@dataclass
class EncodedInput:
    num_tokens: int  # special tokens included, after truncation
    truncated: bool
    tokens: list[str] | None  # the word pieces, when token embeddings or attention were asked for
    token_embeddings: np.ndarray | None  # (T, H) float32
    attentions: np.ndarray | None  # (layers, heads or 1, T, T) float32, each row summing to 1
    pair_start: int | None = None  # a pair's index of the first token of segment b; None: not a pair
    sparse: SparseEmbedding | None = None  # a SPLADE model's weights, when sparse embeddings were asked for
    multi_vector: np.ndarray | None = None  # (K, d) float32 a ColBERT model's vectors, when they were asked for
    # The attention analyses asked for (attnserve/attention_analyses.py): "rollout" (T, T), "head_stats"
    # {name: (L, nh)}, "norms" (layers, heads, T, T) and "norms_summed" (layers, T, T)
    analyses: dict[str, object] = field(default_factory=dict)
    # The windows of max_seq_length tokens a long text was embedded in (--long-inputs chunk), its embedding their
    # average weighted by the text's tokens in each; 1: the input as it is.
    windows: int = 1
    chunks: list[ChunkEmbedding] | None = None  # late chunking's, in the order of the spans
    # An image's: where its positions (the maps' axes) lie in the image its tower takes (with attention).
    layout: PatchLayout | None = None


@dataclass
class ChunkEmbedding:
    """A chunk of a late-chunked text: its span and its tokens' mean embedding, cut and normalised as the text's."""

    start: int  # the span's first character (a Unicode code point's index)
    stop: int  # one past its last
    num_tokens: int  # the text's tokens that start in it, whose embeddings it pools
    embedding: np.ndarray  # (D,) float32


@dataclass
class SparseEmbedding:
    indices: np.ndarray  # (K,) int32 vocabulary ids with a weight above 0, ascending
    values: np.ndarray  # (K,) float32 their weights
    tokens: list[str] | None  # the vocabulary's token of each index, when asked


def sparse_of(weights: np.ndarray, top_k: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(V,) SPLADE weights -> the (indices, values) above 0, ascending by index; with top_k, the k largest (ties
    to the lower index), as sentence-transformers' max_active_dims keeps them."""
    indices = np.flatnonzero(weights > 0)  # (K,)
    return keep_top(indices.astype(np.int32), weights[indices].astype(np.float32), top_k)


def keep_top(indices: np.ndarray, values: np.ndarray, top_k: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(K,) ascending indices and their values -> the top_k largest (ties to the lower index), still ascending;
    all of them where top_k is None."""
    if top_k is None or len(indices) <= top_k:
        return indices, values
    kept = np.sort(np.argsort(-values, kind="stable")[:top_k])  # the largest, ties to the lower index
    return indices[kept], values[kept]


@dataclass
class EncodeReply:
    embeddings: np.ndarray  # (N, D) float32: D is `dimensions`, or the model's embedding_size
    inputs: list[EncodedInput]  # one per input, in request order
    tokens: int  # all inputs' tokens: what the request cost
    options: ReplyOptions  # what was asked, resolved: attention layers and heads as non-negative indices
    model: str = ""  # the name of the model that answered, as it is served
    # Each embedding type asked -> the embeddings in it (engine/quantize.py): (N, D) float32, int8 or uint8, or
    # (N, ceil(D / 8)) for the binary types. "float" is `embeddings`.
    typed: dict[str, np.ndarray] = field(default_factory=dict)


def build_reply(rows: Sequence[RowOutput], inputs: Sequence[TokenizedInput | ImageInput], options: ReplyOptions,
                tokenizer: TextTokenizer, model: str = "", multi_vector: MultiVectorTokenizer | None = None,
                windows: Sequence[Windows | None] | None = None, chunks: Sequence[TextChunks] | None = None,
                bge_m3: BgeM3Heads | None = None) -> EncodeReply:
    """rows and inputs: the batcher's, one per window where an input is windowed (windows: each request input's,
    PreparedRequest.windows); chunks: late chunking's spans and token ranges per input.

    multi_vector: a ColBERT model's tokenizer, which says which of each input's vectors it keeps. bge_m3: bge-m3's
    heads, which give its sparse and multi-vector outputs from the rows' last hidden states."""
    # An embedder's rows (their token states where the request needs them: PreparedRequest.token_states); a
    # reranker's carry its scores and attention only (prepare() asks it for attention alone).
    embedded = [(row.sentence_embedding, row.token_embeddings) for row in rows if row.sentence_embedding is not None]
    if not embedded and rows:
        assert options.attention and options.pooling is None, "a reranker's rows have no embeddings"
        return EncodeReply(np.zeros((len(rows), 0), np.float32),
                           [_encoded(row, item, options, tokenizer, None, None) for row, item in zip(rows, inputs,
                                                                                               strict=True)],
                           sum(len(x) for x in inputs), options, model, {"float": np.zeros((len(rows), 0), np.float32)})
    assert len(embedded) == len(rows), "a reranker's rows have no embeddings"
    if (options.pooling is None and windows is None and options.normalize and options.dimensions is None
            and all(row.normalized is not None for row in rows)):
        # Normalised full vectors of the graph's pipeline, as most requests ask: the batcher normalised them with
        # their batch (Batcher._answer).
        sentences = np.stack([row.normalized for row in rows])  # type: ignore[misc]  # (N, D)
        typed = {kind: quantize(sentences, kind, options.ranges) for kind in options.embedding_types}
        return EncodeReply(sentences, [_encoded(row, item, options, tokenizer, multi_vector, bge_m3)
                                       for row, item in zip(rows, inputs, strict=True)],
                           sum(len(x) for x in inputs), options, model, typed)
    if options.pooling is None:
        sentences = np.stack([sentence for sentence, _ in embedded])  # (N, D) the graph's pipeline
    else:  # each row's padding is cut off already: all T tokens are real
        states = [tokens for _, tokens in embedded if tokens is not None]
        assert len(states) == len(embedded), "pooling at request time keeps the token states"
        sentences = np.stack([pool(tokens[None], np.array([len(tokens)]), options.pooling)[0]
                              for tokens in states])  # (1, T, H) -> (H,) each
    if windows is None:
        encoded = [_encoded(row, item, options, tokenizer, multi_vector, bge_m3)
                   for row, item in zip(rows, inputs, strict=True)]
    else:
        # windows are texts': a request with images is never windowed (embed_requests.prepare)
        sentences, encoded = _windowed(rows, cast(Sequence[TokenizedInput], inputs), sentences, windows, chunks,
                                       options, tokenizer, multi_vector)
    sentences = cut_and_normalize(sentences, options.dimensions, options.normalize)  # (N, D): Matryoshka
    sentences = np.ascontiguousarray(sentences, dtype=np.float32)
    # Matryoshka first, then quantization, as sentence-transformers orders them.
    typed = {kind: quantize(sentences, kind, options.ranges) for kind in options.embedding_types}
    return EncodeReply(sentences, encoded, sum(len(x) for x in inputs), options, model, typed)


def _windowed(rows: Sequence[RowOutput], inputs: Sequence[TokenizedInput], pooled: np.ndarray,
              windows: Sequence[Windows | None], chunks: Sequence[TextChunks] | None, options: ReplyOptions,
              tokenizer: TextTokenizer, multi_vector: MultiVectorTokenizer | None
              ) -> tuple[np.ndarray, list[EncodedInput]]:
    """(R, D) the rows' pooled embeddings -> (N, D) the request inputs', a windowed one's the average of its
    windows' weighted by the text's tokens in each (vLLM's chunked processing); and each input's EncodedInput,
    with its late chunks."""
    out, encoded, r = [], [], 0
    for i, w in enumerate(windows):
        if w is None:
            out.append(pooled[r])
            encoded.append(_encoded(rows[r], inputs[r], options, tokenizer, multi_vector, None))
            r += 1
            continue
        n = len(w.inputs)
        weights = np.asarray(w.text_tokens, dtype=np.float64)  # (n,)
        out.append((weights @ pooled[r:r + n].astype(np.float64) / weights.sum()).astype(np.float32))  # (D,)
        item = EncodedInput(num_tokens=sum(len(x) for x in inputs[r:r + n]), truncated=False, tokens=None,
                            token_embeddings=None, attentions=None, windows=n)
        if chunks is not None:
            spans, ranges = chunks[i]
            item.chunks = _late_chunks(rows[r:r + n], w, spans, ranges, options)
        encoded.append(item)
        r += n
    return np.stack(out), encoded


def _late_chunks(rows: Sequence[RowOutput], w: Windows, spans: list[tuple[int, int]],
                 ranges: list[tuple[int, int]], options: ReplyOptions) -> list[ChunkEmbedding]:
    """A text's chunks from its windows' rows: the text's tokens in each window, mean-pooled per chunk."""
    means, first = ChunkMeans(ranges, rows[0].token_embeddings.shape[1]), 0  # type: ignore[union-attr]
    for row, k in zip(rows, w.text_tokens, strict=True):
        means.add(row.token_embeddings[w.text_start:w.text_start + k], first)  # type: ignore[index]
        first += k
    pooled = cut_and_normalize(means.means(), options.dimensions, options.normalize)  # (k, D)
    return [ChunkEmbedding(start, stop, b - a, np.ascontiguousarray(vector, dtype=np.float32))
            for (start, stop), (a, b), vector in zip(spans, ranges, pooled, strict=True)]


def _encoded(row: RowOutput, item: TokenizedInput | ImageInput, options: ReplyOptions, tokenizer: TextTokenizer,
             multi_vector: MultiVectorTokenizer | None, bge_m3: BgeM3Heads | None) -> EncodedInput:
    attentions = None
    analyses: dict[str, object] = {}
    if options.attention_analyses:  # of every layer's every head, as the attention graph gives them
        assert row.attentions is not None
        if "rollout" in options.attention_analyses:  # the last-layer graph's, or computed from every layer's maps
            analyses["rollout"] = row.rollout if row.rollout is not None else rollout(row.attentions)  # (T, T)
        if "head_stats" in options.attention_analyses:
            assert isinstance(item, TokenizedInput), "prepare() refuses head_stats for images"
            analyses["head_stats"] = head_stats(row.attentions, tokenizer.special_mask(item.ids), item.pair_start)
        if "norms" in options.attention_analyses:  # the layers and heads asked, and each layer's sum over heads
            assert row.value_norms is not None and options.attention_layers is not None
            layers = list(options.attention_layers)
            weighted = norm_weighted(row.attentions[layers], row.value_norms[layers])  # (layers, nh, T, T)
            analyses["norms_summed"] = weighted.sum(axis=1)  # (layers, T, T)
            analyses["norms"] = weighted if options.every_head or options.attention_heads is None else \
                np.ascontiguousarray(weighted[:, list(options.attention_heads)])  # (layers, heads, T, T)
    if options.attention_layers is not None and options.attention_weights:  # spelled so that mypy sees the layers
        # A request for attention queues in the attention lane, whose batches run the graph that returns them.
        assert row.attentions is not None
        attentions = row.layer_maps(options.attention_layers)  # (layers, nh, T, T)
        if not options.every_head and options.attention_heads is not None:
            attentions = attentions[:, list(options.attention_heads)]  # (layers, heads, T, T)
        if options.average_heads:
            attentions = attentions.mean(axis=1, keepdims=True)  # (layers, 1, T, T)
    if isinstance(item, ImageInput):  # its maps' axes are its positions: the class token, then the patches
        return EncodedInput(num_tokens=len(item), truncated=False,
                            tokens=item.layout.labels() if options.tokens and item.layout else None,
                            token_embeddings=None, attentions=attentions, analyses=analyses,
                            layout=item.layout if options.attention else None)
    sparse = None
    if options.sparse is not None and bge_m3 is not None:  # bge-m3's: each token's weight, the most per id
        assert row.token_embeddings is not None
        indices, values = keep_top(*bge_m3.sparse(item.ids, row.token_embeddings), options.sparse.top_k)
        sparse = SparseEmbedding(indices, values, tokenizer.tokens(indices) if options.sparse.return_tokens else None)
    elif options.sparse is not None:
        assert row.sentence_embedding is not None  # an embedder's row
        indices, values = sparse_of(row.sentence_embedding, options.sparse.top_k)
        sparse = SparseEmbedding(indices, values, tokenizer.tokens(indices) if options.sparse.return_tokens else None)
    vectors = None
    if options.multi_vector is not None and bge_m3 is not None:  # its ColBERT head's, every token's but CLS
        assert row.token_embeddings is not None
        vectors = bge_m3.colbert(row.token_embeddings)  # (T - 1, d)
    elif options.multi_vector is not None:
        assert multi_vector is not None and row.token_embeddings is not None  # a ColBERT model's row
        vectors = np.ascontiguousarray(row.token_embeddings[multi_vector.kept(item.ids, options.multi_vector)],
                                       dtype=np.float32)  # (K, d)
    return EncodedInput(
        num_tokens=len(item), truncated=item.truncated,
        tokens=tokenizer.tokens(item.ids) if options.tokens else None,
        token_embeddings=row.token_embeddings if options.token_embeddings else None,
        attentions=attentions, pair_start=item.pair_start, sparse=sparse, multi_vector=vectors, analyses=analyses)


@dataclass
class RerankResult:
    index: int  # the text's position in the request
    score: float
    text: str | None  # the text, when the request asked for it


@dataclass
class RerankReply:
    results: list[RerankResult]  # best first: sorted by score descending (ties in request order), top_n of them
    tokens: int  # all pairs' tokens: what the request cost
    model: str  # the name of the model that answered


def build_rerank_reply(rows: Sequence[RowOutput], prepared: PreparedRerank, activation: str | None, model: str
                       ) -> RerankReply:
    logits = np.array([row.scores[0] for row in rows if row.scores is not None], dtype=np.float32)  # (N,)
    scores = logits if prepared.raw_scores else SCORE_ACTIVATIONS[activation or "identity"](logits)
    order = np.argsort(-scores, kind="stable")[: prepared.top_n]
    return RerankReply([RerankResult(int(i), float(scores[i]), prepared.texts[i] if prepared.return_text else None)
                        for i in order], prepared.tokens, model)


def build_multi_vector_rerank_reply(rows: Sequence[RowOutput], prepared: PreparedRerank,
                                    multi_vector: MultiVectorTokenizer, model: str) -> RerankReply:
    """A ColBERT model's rows, the query's first (prepare_multi_vector_rerank), ranked by MaxSim (or MeanMaxSim)."""
    vectors = [row.token_embeddings[multi_vector.kept(item.ids, kind)]  # (K_i, d)
               for row, item, kind in zip(rows, prepared.inputs, ["query"] + ["document"] * (len(rows) - 1),
                                          strict=True) if row.token_embeddings is not None]
    assert len(vectors) == len(rows), "a ColBERT model's rows have vectors"
    scores = maxsim(vectors[0], vectors[1:], multi_vector.settings.similarity)  # (N,)
    order = np.argsort(-scores, kind="stable")[: prepared.top_n]
    return RerankReply([RerankResult(int(i), float(scores[i]), prepared.texts[i] if prepared.return_text else None)
                        for i in order], prepared.tokens, model)


@dataclass
class SimilarityReply:
    scores: np.ndarray  # (N,) float32: the cosine of each sentence with the source sentence, in request order
    tokens: int  # the source's and the sentences' tokens: what the request cost
    model: str


def build_similarity_reply(reply: EncodeReply) -> SimilarityReply:
    """The encode reply of [source, *sentences] (normalised: SimilarityRequest.to_encode) -> their cosines."""
    embeddings = reply.embeddings  # (1 + N, D), unit length
    return SimilarityReply(embeddings[1:] @ embeddings[0], reply.tokens, reply.model)  # (N,)


@dataclass
class PredictReply:
    predictions: list[list[tuple[str, float]]]  # per input, in request order: every (label, score), best first
    tokens: int
    model: str


def classifier_scores(logits: np.ndarray, problem_type: str | None) -> np.ndarray:
    """(N, labels) logits -> scores as transformers' text-classification pipeline gives them: a sigmoid for one
    label or multi-label classification, else a softmax over the labels."""
    if problem_type == "multi_label_classification" or logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def build_predict_reply(rows: Sequence[RowOutput], prepared: PreparedPredict, labels: Sequence[str],
                        problem_type: str | None, model: str) -> PredictReply:
    logits = np.stack([row.scores for row in rows if row.scores is not None]).astype(np.float32)  # (N, labels)
    scores = logits if prepared.raw_scores else classifier_scores(logits, problem_type)
    predictions = []
    for row in scores:
        order = np.argsort(-row, kind="stable")  # best first; ties in label order
        predictions.append([(labels[i], float(row[i])) for i in order])
    return PredictReply(predictions, prepared.tokens, model)
