"""One input's outputs beside its sentence embedding, from its row (engine/rows.py): its tokens, token embeddings,
attention weights and analyses, sparse weights, multi-vector vectors; an image's patch layout."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnserve.attention_analyses import head_stats, norm_weighted, rollout

from .image_encoder import ImageInput, PatchLayout
from .output_options import OutputHeads, OutputOptions
from .rows import RowOutput
from .tokenizer import TokenizedInput


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


def encoded_input(row: RowOutput, item: TokenizedInput | ImageInput, options: OutputOptions, heads: OutputHeads,
                  per_token: bool = True) -> EncodedInput:
    """An input's outputs from its row. per_token False: a windowed input's window, whose sparse and multi-vector
    outputs are not asked (prepare() refuses them with windows)."""
    analyses = _analyses(row, item, options, heads) if options.attention_analyses else {}
    attentions = _attention_weights(row, options)
    if isinstance(item, ImageInput):  # its maps' axes are its positions: the class token, then the patches
        return EncodedInput(num_tokens=len(item), truncated=False,
                            tokens=item.layout.labels() if options.tokens and item.layout else None,
                            token_embeddings=None, attentions=attentions, analyses=analyses,
                            layout=item.layout if options.attention else None)
    return EncodedInput(
        num_tokens=len(item), truncated=item.truncated,
        tokens=heads.tokenizer.tokens(item.ids) if options.tokens else None,
        token_embeddings=row.token_embeddings if options.token_embeddings else None,
        attentions=attentions, pair_start=item.pair_start,
        sparse=_sparse(row, item, options, heads) if per_token else None,
        multi_vector=_multi_vector(row, item, options, heads) if per_token else None, analyses=analyses)


def _analyses(row: RowOutput, item: TokenizedInput | ImageInput, options: OutputOptions, heads: OutputHeads
              ) -> dict[str, object]:
    """The analyses asked, of every layer's every head, as the attention graph gives them."""
    analyses: dict[str, object] = {}
    assert row.attentions is not None
    if "rollout" in options.attention_analyses:  # the last-layer graph's, or computed from every layer's maps
        analyses["rollout"] = row.rollout if row.rollout is not None else rollout(row.attentions)  # (T, T)
    if "head_stats" in options.attention_analyses:
        assert isinstance(item, TokenizedInput), "prepare() refuses head_stats for images"
        analyses["head_stats"] = head_stats(row.attentions, heads.tokenizer.special_mask(item.ids), item.pair_start)
    if "norms" in options.attention_analyses:  # the layers and heads asked, and each layer's sum over heads
        assert row.value_norms is not None and options.attention_layers is not None
        layers = list(options.attention_layers)
        weighted = norm_weighted(row.attentions[layers], row.value_norms[layers])  # (layers, nh, T, T)
        analyses["norms_summed"] = weighted.sum(axis=1)  # (layers, T, T)
        analyses["norms"] = weighted if options.every_head or options.attention_heads is None else \
            np.ascontiguousarray(weighted[:, list(options.attention_heads)])  # (layers, heads, T, T)
    return analyses


def _attention_weights(row: RowOutput, options: OutputOptions) -> np.ndarray | None:
    if options.attention_layers is None or not options.attention_weights:
        return None
    # A request for attention queues in the attention lane, whose batches run the graph that returns them.
    assert row.attentions is not None
    attentions = row.layer_maps(options.attention_layers)  # (layers, nh, T, T)
    if not options.every_head and options.attention_heads is not None:
        attentions = attentions[:, list(options.attention_heads)]  # (layers, heads, T, T)
    if options.average_heads:
        attentions = attentions.mean(axis=1, keepdims=True)  # (layers, 1, T, T)
    return attentions


def _sparse(row: RowOutput, item: TokenizedInput, options: OutputOptions, heads: OutputHeads
            ) -> SparseEmbedding | None:
    if options.sparse is None:
        return None
    if heads.bge_m3 is not None:  # bge-m3's: each token's weight, the most per id
        assert row.token_embeddings is not None
        indices, values = keep_top(*heads.bge_m3.sparse(item.ids, row.token_embeddings), options.sparse.top_k)
    else:  # a SPLADE model's row: its vocabulary-sized sentence embedding
        assert row.sentence_embedding is not None
        indices, values = sparse_of(row.sentence_embedding, options.sparse.top_k)
    return SparseEmbedding(indices, values,
                           heads.tokenizer.tokens(indices) if options.sparse.return_tokens else None)


def _multi_vector(row: RowOutput, item: TokenizedInput, options: OutputOptions, heads: OutputHeads
                  ) -> np.ndarray | None:
    if options.multi_vector is None:
        return None
    assert row.token_embeddings is not None
    if heads.bge_m3 is not None:  # its ColBERT head's, every token's but CLS
        return heads.bge_m3.colbert(row.token_embeddings)  # (T - 1, d)
    assert heads.multi_vector is not None  # a ColBERT model's row
    return np.ascontiguousarray(row.token_embeddings[heads.multi_vector.kept(item.ids, options.multi_vector)],
                                dtype=np.float32)  # (K, d)
