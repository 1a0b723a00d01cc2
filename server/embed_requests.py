"""Requests of embeddings: prepare(), the one funnel of every encode request (a sentence embedding, pooled at
request time, cut to `dimensions`, quantized; token embeddings; a SPLADE model's sparse weights; a ColBERT model's
vectors; attention, images and late chunks through their own modules)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from attnserve.attention_analyses import HEAD_STATS, PAIR_STATS
from attnserve.engine.dimensions import check_dimensions
from attnserve.engine.image_encoder import ImageEncoder, ImageInput
from attnserve.engine.late_chunking import TextChunks
from attnserve.engine.manifest import Manifest
from attnserve.engine.multi_vector import INPUT_TYPES, MultiVectorTokenizer
from attnserve.engine.output_options import OutputOptions, PreparedRequest
from attnserve.engine.quantize import RANGED, check_embedding_types, check_ranges, quantized_size
from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput
from attnserve.engine.windows import Windows
from attnserve.errors import InvalidInputError

from .attention_requests import AttentionChoice, check_attention_length, check_reranker_attention, choose_attention
from .chunk_requests import check_late_chunking, late_chunks, windowing
from .image_requests import check_images, image_input, image_rows
from .requests import (
    POOLINGS,
    EncodeRequest,
    RequestLimits,
    check_count,
    check_token_types,
    check_truncation_direction,
    flatten,
    invalid,
    located,
    long_input_rule,
    tokenize,
)

# Per-embedding overhead of a reply beyond its arrays: tags, lengths, shapes.
EMBEDDING_OVERHEAD_BYTES = 64

# (needs: "attention", "quantization"; what needs them) -> the manifest once they are built (Engine.require).
Require = Callable[[Sequence[str], str], Manifest]


def prepare(request: EncodeRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits,
            float_bytes: float, takes_token_types: bool = False, multi_vector: MultiVectorTokenizer | None = None,
            require: Require | None = None, images: ImageEncoder | None = None) -> PreparedRequest:
    """Check everything about a request that can be checked before it costs compute; tokenize it.

    float_bytes: what one float of the reply costs on the door's wire (4 in binary), for the reply size limit.
    multi_vector: a ColBERT model's tokenizer (Engine.multi_vector).
    require(names, what): the manifest, once the variants a request needs are built (Engine.require: the
    attention graphs, the quantized embeddings' ranges); it raises GraphBuildingError while they are built.
    images: an image-text model's image tower (Engine.images), which decodes and preprocesses the request's images.
    """
    require = require or (lambda names, what: manifest)
    check_count(len(request.inputs), limits.max_inputs)
    pooling = _check_asked(request, manifest)
    normalize = manifest.normalize if request.normalize is None else request.normalize
    types = check_embedding_types(tuple(request.embedding_types))
    ranges, model_ranges = _ranges(request, types, manifest, pooling, normalize)
    rows = image_rows(request)
    attention = choose_attention(request, manifest, images, rows)
    options = _reply_options(request, manifest, pooling, normalize, types, ranges, attention,
                             None if rows else _reach(manifest, attention.layers))
    if request.late_chunking is not None:
        check_late_chunking(request, manifest)
    if rows:
        check_images(request, options, manifest, images, rows[0])
    queued = _queued(request, tokenizer, manifest, limits, multi_vector, images, rows)
    inputs, windows = flatten(queued)
    check_token_types(inputs, takes_token_types, manifest)
    needs_attention = options.attention and not rows  # the image tower's attention graph is exported with it
    if needs_attention:
        check_attention_length(inputs, manifest)
    chunks = late_chunks(request, windows) if windows is not None and request.late_chunking is not None else None
    _check_reply_size(queued, chunks, options, manifest, limits, float_bytes)
    # Last, once nothing else can refuse the request: the graphs it needs, which may have to be built first (a
    # request refused anyway starts no build).
    needs = {}
    if needs_attention:
        needs["attention"] = "attention weights"
    if model_ranges:
        needs["quantization"] = f"{model_ranges} embeddings"
    if needs:
        manifest = require(tuple(needs), " and ".join(needs.values()))
        if model_ranges:
            options = replace(options, ranges=_model_ranges(manifest, request.dimensions, normalize, model_ranges))
    return PreparedRequest(inputs, options, windows, chunks, _token_states(options, chunks, manifest))


def _reach(manifest: Manifest, layers: tuple[int, ...] | None) -> tuple[tuple[int | None, int | None], ...] | None:
    """The text model's declared reach of each layer asked (None: no attention asked, or none declared)."""
    if layers is None or manifest.attention_reach is None:
        return None
    return tuple(manifest.attention_reach[layer] for layer in layers)


def _check_asked(request: EncodeRequest, manifest: Manifest) -> str | None:
    """What the request asks of the model's embedding, checked in turn; the pooling to compute at request time (None:
    the model's own)."""
    if manifest.kind == "reranker":
        check_reranker_attention(request, manifest)
    _check_multi_vector(request, manifest)
    if request.pooling not in POOLINGS:
        raise invalid("pooling", f"pooling {request.pooling} is not one of {', '.join(POOLINGS)}")
    # The model's own pooling comes from its graph; another is computed from the token embeddings, which
    # gives what the model would with that pooling only when nothing but normalisation follows its pooling.
    pooling = None if request.pooling in ("default", manifest.pooling) else request.pooling
    if pooling is not None and not manifest.poolable_at_request_time:
        raise invalid("pooling", f"pooling {pooling} is not available for this model: its pipeline is "
                                 f"{' -> '.join(manifest.modules)}; ask for the default pooling")
    check_truncation_direction(request.truncation_direction)
    check_dimensions(request.dimensions, manifest.embedding_size)
    _check_sparse(request, manifest)
    return pooling


def _reply_options(request: EncodeRequest, manifest: Manifest, pooling: str | None, normalize: bool,
                   types: tuple[str, ...], ranges: np.ndarray | None, attention: AttentionChoice,
                   reach: tuple[tuple[int | None, int | None], ...] | None) -> OutputOptions:
    return OutputOptions(
        pooling=pooling,
        normalize=normalize,
        dimensions=request.dimensions,
        token_embeddings=request.token_embeddings,
        attention_layers=attention.layers,
        attention_heads=attention.heads,
        every_head=attention.every_head,
        average_heads=attention.average_heads,
        attention_analyses=attention.analyses,
        attention_weights=attention.weights,
        last_layer_only=attention.last_layer_only,
        attention_reach=reach,
        embedding_types=types,
        ranges=ranges,
        sparse=request.sparse,
        multi_vector=request.multi_vector,
        # A SPLADE model's sparse embedding, or a ColBERT model's vectors, is its answer; bge-m3's come beside its
        # dense embedding, all from one pass.
        dense=not ((request.sparse is not None and manifest.sparse) or
                   (request.multi_vector is not None and manifest.multi_vector is not None)),
    )


def _queued(request: EncodeRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits,
            multi_vector: MultiVectorTokenizer | None, images: ImageEncoder | None, image_rows: list[int]
            ) -> list[TokenizedInput | Windows | ImageInput]:
    """Each request input as the batcher takes it, in the request's order: tokenized (in windows where it is
    windowed), or an image decoded and preprocessed."""
    rule = long_input_rule(request.truncate, limits)
    if request.multi_vector is not None and manifest.multi_vector is not None:
        assert multi_vector is not None, "a multi-vector model's engine has its tokenizer"
        items: list[TokenizedInput | Windows] = list(_tokenize_multi_vector(request, multi_vector, rule != "refuse"))
    else:
        items = tokenize(request, tokenizer, manifest, rule != "refuse", str(request.truncation_direction),
                         windowing(request, manifest, rule, image_rows))  # the direction is one of them: checked
    queued: list[TokenizedInput | Windows | ImageInput] = list(items)
    if image_rows:
        assert images is not None, "check_images refuses images without a tower"
        for row in image_rows:
            queued[row] = image_input(images, request.inputs[row], row, limits)
    return queued


def _check_reply_size(queued: Sequence[TokenizedInput | Windows | ImageInput], chunks: list[TextChunks] | None,
                      options: OutputOptions, manifest: Manifest, limits: RequestLimits, float_bytes: float) -> None:
    """The reply's size, counted before it costs compute, against this server's max_response_bytes."""
    fixed, per_token, per_cell = _reply_cost(options, manifest, float_bytes)
    lengths = [len(x.inputs[0]) if isinstance(x, Windows) else len(x) for x in queued]
    reply_bytes = int(fixed * len(lengths) + per_token * sum(lengths)
                      + (per_cell * sum(t * t for t in lengths) if per_cell else 0))
    if options.sparse is not None and manifest.bge_m3 is not None:  # (index, value) pairs: at most one per token
        top_k = options.sparse.top_k
        reply_bytes += int(2 * float_bytes * sum(min(top_k or t, t) for t in lengths))
    reply_bytes += int(sum(len(spans) for spans, _ in chunks or ()) * (
        EMBEDDING_OVERHEAD_BYTES + float_bytes * (options.dimensions or manifest.embedding_size)))
    if reply_bytes > limits.max_response_bytes:
        raise invalid(
            "", f"the reply would be about {reply_bytes / 2**20:.1f} MiB, over this server's max_response_bytes "
            f"({limits.max_response_bytes / 2**20:.1f} MiB); ask for fewer inputs, fewer attention layers or "
            "average_heads" + (", or fewer chunks" if chunks else ""))


def _token_states(options: OutputOptions, chunks: list[TextChunks] | None, manifest: Manifest) -> bool:
    """Whether the reply needs the rows' token states, not only their sentence embeddings (PreparedRequest)."""
    return (options.token_embeddings or options.pooling is not None or options.attention
            or options.multi_vector is not None or chunks is not None
            or (options.sparse is not None and manifest.bge_m3 is not None))


def _check_sparse(request: EncodeRequest, manifest: Manifest) -> None:
    """Sparse embeddings are a SPLADE model's, whole: no other pooling, cut, normalisation or type."""
    if request.sparse is None:
        return
    if not manifest.sparse and manifest.bge_m3 is None:
        raise invalid("sparse", f"{manifest.model} is a dense embedding model ({manifest.pooling} pooling): it has "
                                "no sparse embeddings; ask for its embeddings")
    top_k = request.sparse.top_k
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise invalid("top_k", f"top_k {top_k!r} is not a positive integer (keep 1 or more weights)")
    for field, asked in (("pooling", request.pooling != "default"), ("dimensions", request.dimensions is not None),
                         # bge-m3's dense embedding comes beside them: normalize is its
                         ("normalize", bool(request.normalize) and manifest.bge_m3 is None),
                         ("embedding_types", tuple(request.embedding_types) != ("float",))):
        if asked:
            raise invalid(field, f"{field} does not apply to sparse embeddings (top_k keeps the largest weights)")


def _check_multi_vector(request: EncodeRequest, manifest: Manifest) -> None:
    """A ColBERT model gives its vectors, one per token, of texts taken as queries or documents, and nothing else
    (its graph's sentence embedding is no embedding it was trained to give)."""
    if manifest.multi_vector is None:
        if request.multi_vector is not None and manifest.bge_m3 is None:
            raise invalid("multi_vector", f"{manifest.model} is not a multi-vector (ColBERT) model: it gives one "
                                          "embedding per input; ask for its embeddings")
        if request.multi_vector is not None:  # bge-m3's ColBERT vectors, beside its dense embedding
            if request.multi_vector not in INPUT_TYPES:
                raise invalid("input_type", f"input_type {request.multi_vector!r} is not one of "
                                            f"{', '.join(INPUT_TYPES)}")
            # normalize is the dense embedding's (the vectors are normalised, as FlagEmbedding's); a cut or another
            # pooling would leave the dense embedding and the vectors disagreeing on what was asked
            for field, asked in (("pooling", request.pooling != "default"),
                                 ("dimensions", request.dimensions is not None),
                                 ("token_embeddings", request.token_embeddings),
                                 ("embedding_types", tuple(request.embedding_types) != ("float",)),
                                 ("attention", request.attention is not None)):
                if asked:
                    raise invalid(field, f"{field} does not apply with {manifest.model}'s multi-vector "
                                         "embeddings (its ColBERT head's vectors, each normalised)")
        return
    if request.multi_vector is None:
        raise invalid("model", f"{manifest.model} is a multi-vector (ColBERT) model: it gives a vector per token, "
                               "not one embedding per input; ask for its multi-vector embeddings (POST /embed_multi, "
                               "gRPC multi_vector) or rerank with it")
    if request.multi_vector not in INPUT_TYPES:
        raise invalid("input_type", f"input_type {request.multi_vector!r} is not one of {', '.join(INPUT_TYPES)}")
    for field, asked in (("pooling", request.pooling != "default"), ("dimensions", request.dimensions is not None),
                         ("normalize", request.normalize is not None), ("token_embeddings", request.token_embeddings),
                         ("embedding_types", tuple(request.embedding_types) != ("float",)),
                         ("sparse", request.sparse is not None), ("attention", request.attention is not None),
                         ("prompt", request.prompt is not None), ("prompt_name", request.prompt_name is not None),
                         ("task", request.task is not None),
                         ("truncation_direction", request.truncation_direction != "right")):
        if asked:
            raise invalid(field, f"{field} does not apply to multi-vector embeddings: the model's query or document "
                                 "prompt, length and vectors are its own")


def _tokenize_multi_vector(request: EncodeRequest, tokenizer: MultiVectorTokenizer, truncate: bool
                           ) -> list[TokenizedInput]:
    """Texts as the model's queries or documents (engine/multi_vector.py); token ids and pairs are refused."""
    for row, item in enumerate(request.inputs):
        if not isinstance(item, str):
            raise invalid(f"inputs[{row}]", "multi-vector embeddings are of texts (a query or a document), not "
                                            "token ids or pairs", label=f"input {row}")
    texts = [item for item in request.inputs if isinstance(item, str)]  # all of them, as checked
    labels = [f"input {r}" for r in range(len(texts))]
    try:
        return tokenizer.encode(texts, request.multi_vector or "document", truncate, labels)
    except InvalidInputError as error:
        raise located(error, labels, [f"inputs[{r}].text" for r in range(len(labels))],
                      request.truncate is None) from None


def _ranges(request: EncodeRequest, types: tuple[str, ...], manifest: Manifest, pooling: str | None,
            normalize: bool) -> tuple[np.ndarray | None, str | None]:
    """(The int8 / uint8 ranges of a request, its own or the model's calibrated ones (engine/quantize.py), the type
    that needs them); (None, the type) where the model's must be built first: prepare() requires them last, once
    nothing else refuses the request."""
    size = request.dimensions or manifest.embedding_size
    ranged = [t for t in types if t in RANGED]
    if request.ranges is not None:
        if not ranged:
            raise invalid("ranges", "ranges apply to the int8 and uint8 embedding types only, and neither was "
                                    "asked for")
        return check_ranges(request.ranges, size), None
    if not ranged:
        return None, None
    if pooling is not None:
        raise invalid("ranges", f"{ranged[0]} embeddings with pooling {pooling} need ranges: the model's are "
                                "calibrated on its own pooling; pass ranges, or ask for the default pooling")
    if manifest.source is not None and manifest.quantization is None:  # built as needed: PyTorch's embeddings
        return None, ranged[0]
    return _model_ranges(manifest, request.dimensions, normalize, ranged[0]), None


def _model_ranges(manifest: Manifest, dimensions: int | None, normalize: bool, ranged: str) -> np.ndarray:
    ranges = manifest.quantization_ranges(dimensions, normalize)
    if ranges is None:
        raise invalid("ranges", f"{ranged} embeddings need per-dimension ranges, and {manifest.model}'s "
                                "artifacts hold no calibration embeddings (exported before quantized embeddings): "
                                "pass ranges, or re-export the model with `attnserve export`")
    return ranges


def _reply_cost(options: OutputOptions, manifest: Manifest, float_bytes: float) -> tuple[float, float, float]:
    """An input's reply bytes as (fixed, per token, per token squared): a reply of inputs of T_i tokens costs
    n * fixed + per_token * sum(T_i) + per_cell * sum(T_i^2), counted once for the request, not per input."""
    heads = len(options.attention_heads or ())
    dims = options.dimensions or manifest.embedding_size
    fixed = per_token = per_cell = 0.0  # in floats, but for `tokens`' word pieces
    if options.dense:  # a code counted as a float
        fixed += sum(quantized_size(kind, dims) for kind in options.embedding_types)
    if options.sparse is not None and manifest.bge_m3 is None:  # (index, value) pairs: at most top_k, one per word
        fixed += 2 * min(options.sparse.top_k or dims, dims)  # of the vocabulary (bge-m3's: _check_reply_size)
    if options.multi_vector is not None:  # a vector per token at most
        per_token += manifest.bge_m3["colbert_dim"] if manifest.bge_m3 is not None else manifest.embedding_size
    if options.token_embeddings:
        per_token += manifest.hidden_size  # token embeddings are hidden states, whatever the pipeline
    if options.attention_layers is not None and options.attention_weights:  # spelled so that mypy sees the layers
        per_cell += len(options.attention_layers) * (1 if options.average_heads else heads)
    if "rollout" in options.attention_analyses:
        per_cell += 1
    if "head_stats" in options.attention_analyses:
        fixed += (len(HEAD_STATS) + len(PAIR_STATS)) * manifest.num_layers * manifest.num_heads
    if "norms" in options.attention_analyses and options.attention_layers is not None:
        per_cell += len(options.attention_layers) * (heads + 1)
    return (EMBEDDING_OVERHEAD_BYTES + float_bytes * fixed, float_bytes * per_token + (8 if options.tokens else 0),
            float_bytes * per_cell)  # a word piece and its tag, on average, where tokens are named
