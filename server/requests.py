"""The protocol-neutral requests every front door hands the core, and every rule and limit that applies to them.

A door (gRPC in grpc/, HTTP in http/) translates its wire format into these dataclasses and nothing else;
prepare() checks what can be checked before a request costs compute and tokenizes it, raising an
InvalidInputError that names the input and the problem. Each error also carries the field it is about, as a
neutral path ("inputs[3].text", "inputs", "pooling", "dimensions", "attention.layers[1]") that a door may rename
to its own wire names; the message names the place as a user reads it ("input 3: empty text").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import cast

import numpy as np

from attnserve.engine.attention_analyses import ANALYSES, HEAD_STATS, PAIR_STATS
from attnserve.engine.dimensions import check_dimensions
from attnserve.engine.image_encoder import ImageEncoder, ImageInput
from attnserve.engine.images import DEFAULT_MAX_PIXELS, ImageError
from attnserve.engine.late_chunking import (
    CHUNKERS,
    DEFAULT_CHUNK_TOKENS,
    NO_TOKEN_TO_CHUNK,
    check_spans,
    chunker_spans,
    token_ranges,
)
from attnserve.engine.manifest import REQUEST_POOLINGS, Manifest
from attnserve.engine.multi_vector import INPUT_TYPES, MultiVectorTokenizer
from attnserve.engine.prompts import apply_prompt, prompt_text
from attnserve.engine.quantize import RANGED, check_embedding_types, check_ranges, quantized_size
from attnserve.engine.tokenizer import TRUNCATION_DIRECTIONS, TextTokenizer, Token, TokenizedInput, check_texts
from attnserve.engine.windows import Windows
from attnserve.errors import AttentionTooLongError, DeadlineExpiredError, InputTooLongError, InvalidInputError

from .image_inputs import ImageBytes, ImageUrl

# "default" is the model's own pooling, as its graph computes it.
POOLINGS = ("default", *REQUEST_POOLINGS)

# An input is a text, token ids (special tokens included), a sentence pair (text a, text b) as a tuple, an image (an
# image-text model's: its bytes, or a URL the core fetches first), or None where the wire format allows none of them.
Input = str | Sequence[int] | tuple[str, str] | ImageBytes | ImageUrl | None

# Per-embedding overhead of a reply beyond its arrays: tags, lengths, shapes.
EMBEDDING_OVERHEAD_BYTES = 64


@dataclass(frozen=True)
class Deadline:
    """When a request must be answered by: the core runs the request under it (core.py), whatever the door."""

    at: float  # a time.monotonic() value
    name: str = "deadline"  # what the client set, as its door calls it ("X-Request-Timeout"), for the error

    def expired(self) -> DeadlineExpiredError:
        return DeadlineExpiredError(f"the request's {self.name} passed before it was answered")


@dataclass(frozen=True)
class AttentionOptions:
    layers: Sequence[int] = ()  # empty: the last layer; negative indices count from the end
    heads: Sequence[int] = ()  # empty: every head; negative indices count from the end
    average_heads: bool = False  # average over the chosen heads: the heads axis has size 1
    # Analyses of every layer's every head, computed here (engine/attention_analyses.py): rollout, head_stats.
    analyses: Sequence[str] = ()
    weights: bool = True  # the chosen layers' and heads' weights too; False: the analyses alone


@dataclass(frozen=True)
class SparseOptions:
    top_k: int | None = None  # keep the k largest weights of each input (sentence-transformers' max_active_dims)
    return_tokens: bool = False  # name each index's vocabulary token, for inspection


@dataclass(frozen=True)
class LateChunking:
    """Late chunking (engine/late_chunking.py): each text read whole, its chunks' token embeddings mean-pooled. The
    chunks are given (spans) or cut by a built-in chunker, one of the two."""

    spans: Sequence[Sequence[Sequence[int]]] | None = None  # per input, its chunks' [start, stop) character spans
    chunker: str | None = None  # "sentences" or "tokens" (CHUNKERS), where spans are not given
    chunk_tokens: int | None = None  # the "tokens" chunker's chunk size in tokens (unset: DEFAULT_CHUNK_TOKENS)


# A text's late chunks: their character spans [start, stop), and their tokens' ranges [a, b) in the text's tokens.
TextChunks = tuple[list[tuple[int, int]], list[tuple[int, int]]]


@dataclass(frozen=True)
class EncodeRequest:
    inputs: Sequence[Input]
    pooling: str | int = "default"  # one of POOLINGS; a door passes an unknown wire value on as it is
    normalize: bool | None = None  # None: as the model's own pipeline does
    truncate: bool | None = None  # False: an input longer than max_seq_length is refused; None: as the server says
    truncation_direction: str | int = "right"  # one of TRUNCATION_DIRECTIONS; a door passes an unknown wire value on
    dimensions: int | None = None  # keep the first N dimensions of the sentence embedding (before normalising)
    token_embeddings: bool = False
    attention: AttentionOptions | None = None  # None: no attention weights
    prompt_name: str | None = None  # a prompt of the model's to put before each text (engine/prompts.py)
    prompt: str | None = None  # a raw prompt to put before each text; None with prompt_name None: the default one
    model: str | None = None  # the served model's name or alias; None: the server's default model
    # jina-embeddings-v3's adapter (engine/tasks.py): retrieval.query, ...; None: no adapter. Refused by a model
    # without adapters.
    task: str | None = None
    # The sentence embedding's types (engine/quantize.py): float, int8, uint8, binary, ubinary; a door passes what
    # its wire says, checked in prepare(). ranges: a request's own int8 / uint8 ranges, (2, D) minima and maxima
    # of the embeddings returned; None: the model's calibrated ones.
    embedding_types: Sequence[str] = ("float",)
    ranges: object = None
    # A SPLADE model's sparse embeddings (TEI's /embed_sparse) instead of its dense vocabulary-sized vector; None:
    # the dense one.
    sparse: SparseOptions | None = None
    # A ColBERT model's vectors, one per token (engine/multi_vector.py), of inputs of this type: "query" or
    # "document"; None: not asked (a door passes an unknown wire value on, checked in prepare()).
    multi_vector: str | None = None
    # Each text read whole and its chunks embedded apart (EncodedInput.chunks), beside its own embedding; None: not.
    late_chunking: LateChunking | None = None


@dataclass(frozen=True)
class RerankRequest:
    """Score each text against the query with a reranker (a cross-encoder) and sort them, best first."""

    query: str
    texts: Sequence[str]
    raw_scores: bool = False  # False: the model's CrossEncoder activation applied (a sigmoid for one label)
    return_text: bool = False
    truncate: bool | None = None  # False: a pair longer than max_seq_length is refused; None: as the server says
    truncation_direction: str | int = "right"
    top_n: int | None = None  # None: every text; more than there are texts: every text, as Cohere's API does
    model: str | None = None  # None: the server's default model
    # Cohere v2's: each text cut to its first N tokens (special tokens aside) before it is paired; None: uncut.
    max_tokens_per_doc: int | None = None


@dataclass(frozen=True)
class PredictRequest:
    """A classifier's scores for each input, a text or a sentence pair (TEI's /predict), every label sorted best
    first."""

    inputs: Sequence[str | tuple[str, str]]
    raw_scores: bool = False  # True: the logits; False: softmax, or sigmoid for multi-label (transformers' rule)
    truncate: bool | None = None  # False: an input longer than max_seq_length is refused; None: as the server says
    truncation_direction: str | int = "right"
    model: str | None = None  # None: the server's default model


@dataclass(frozen=True)
class PreparedPredict:
    inputs: list[TokenizedInput]  # in the request's order
    raw_scores: bool

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


def prepare_predict(request: PredictRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits,
                    takes_token_types: bool) -> PreparedPredict:
    """Check a predict request before it costs compute and tokenize its texts and pairs."""
    if manifest.kind != "reranker" or manifest.pair_template is not None:
        what = ("an embedding model: it has no classifier" if manifest.kind != "reranker" else
                "a reranker that scores a templated (query, document) pair: ask rerank")
        raise _invalid("model", f"{manifest.model} is {what}; predict needs a model with a sequence-classification "
                                "head (a *ForSequenceClassification checkpoint)")
    if request.truncation_direction not in TRUNCATION_DIRECTIONS:
        raise _invalid("truncation_direction", f"truncation_direction {request.truncation_direction!r} is not one "
                                               f"of {', '.join(TRUNCATION_DIRECTIONS)}")
    check_count(len(request.inputs), limits.max_inputs)
    inputs, _ = _flatten(_tokenize(EncodeRequest(inputs=request.inputs), tokenizer, manifest,
                                   truncates(request.truncate, limits), request.truncation_direction,
                                   images=False))
    _check_token_types(inputs, takes_token_types, manifest)
    return PreparedPredict(cast(list[TokenizedInput], inputs), request.raw_scores)  # texts: images refused


@dataclass(frozen=True)
class SimilarityRequest:
    """The cosine of each sentence's embedding with the source sentence's (TEI's /similarity), all of them encoded
    in one request through the batcher."""

    source_sentence: Input  # a text, or (an image-text model's) an image
    sentences: Sequence[Input]
    truncate: bool | None = None  # False: an input longer than max_seq_length is refused; None: as the server says
    truncation_direction: str | int = "right"
    prompt_name: str | None = None
    prompt: str | None = None
    model: str | None = None  # None: the server's default model

    def to_encode(self) -> EncodeRequest:
        """The source sentence first, then the sentences: one encode request (checked as any is)."""
        if not isinstance(self.source_sentence, str | ImageBytes | ImageUrl):
            raise _invalid("source_sentence", "source_sentence must be a string")
        if not isinstance(self.sentences, Sequence) or isinstance(self.sentences, str):
            raise _invalid("sentences", "sentences must be a list of strings")
        if not self.sentences:
            raise _invalid("sentences", "no sentences: send 1 or more to compare with source_sentence")
        for i, sentence in enumerate(self.sentences):
            if not isinstance(sentence, str | ImageBytes | ImageUrl):
                raise _invalid(f"sentences[{i}]", "must be a string", label=f"sentence {i}")
        return EncodeRequest(inputs=[self.source_sentence, *self.sentences], normalize=True, truncate=self.truncate,
                             truncation_direction=self.truncation_direction, prompt_name=self.prompt_name,
                             prompt=self.prompt, model=self.model)


def similarity_error(error: InvalidInputError) -> InvalidInputError:
    """An error about the encode request of a SimilarityRequest, named as the similarity request names its
    inputs: input 0 is source_sentence, input i + 1 is sentence i; "inputs" is the sentences."""
    field, message = error.field or "", str(error)
    match = re.match(r"inputs\[(\d+)\](.*)", field)
    if match:
        row = int(match.group(1))
        field = "source_sentence" if row == 0 else f"sentences[{row - 1}]"
        label = "source_sentence" if row == 0 else f"sentence {row - 1}"
        message = re.sub(rf"^input {row}(?=:)", label, message)
    elif field == "inputs":
        field = "sentences"
        message = message.replace("inputs", "sentences (with source_sentence)", 1)
    if isinstance(error, InputTooLongError):
        return InputTooLongError(message, field=field, description=error.description,
                                 server_default=error.server_default)
    return InvalidInputError(message, field=field, description=error.description)


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


@dataclass(frozen=True)
class RequestLimits:
    """The server's limits on one request (ServerConfig)."""

    max_inputs: int
    max_response_bytes: int
    long_inputs: str = "truncate"  # what an over-long input of a request that does not say `truncate` gets
    max_image_pixels: int = DEFAULT_MAX_PIXELS  # an image's width x height (engine/images.py)


@dataclass(frozen=True)
class ReplyOptions:
    pooling: str | None  # None: the model's own, as the graph computes it
    normalize: bool
    dimensions: int | None  # None: all of them
    token_embeddings: bool
    attention_layers: tuple[int, ...] | None  # non-negative indices, in the order asked; None: no attention
    attention_heads: tuple[int, ...] | None = None  # non-negative indices, every head when none was asked
    every_head: bool = True  # attention_heads are all the model's heads in order: nothing to select
    average_heads: bool = False
    attention_analyses: tuple[str, ...] = ()  # engine/attention_analyses.py's, in ANALYSES order
    attention_weights: bool = True  # the chosen layers' and heads' weights; False: only the analyses
    # What was asked needs no map but the last layer's, and rollout: the last-layer graph answers it (engine.py
    # LAST_LAYER_VARIANT), at about the embeddings graph's cost.
    last_layer_only: bool = False
    embedding_types: tuple[str, ...] = ("float",)  # the sentence embedding's types, in the order asked
    ranges: np.ndarray | None = None  # (2, D) int8 / uint8 ranges, where one of them was asked
    sparse: SparseOptions | None = None  # (index, value) pairs of a SPLADE model's weights, instead of its vector
    multi_vector: str | None = None  # a ColBERT model's vectors of inputs of this type, instead of its embedding
    dense: bool = True  # the sentence embedding is in the reply (not where sparse or multi_vector replace it)

    @property
    def attention(self) -> bool:
        return self.attention_layers is not None

    @property
    def tokens(self) -> bool:
        """Word pieces label token embeddings and attention maps; plain embeddings go without."""
        return self.token_embeddings or self.attention


# (needs: "attention", "quantization"; what needs them) -> the manifest once they are built (Engine.require).
Require = Callable[[Sequence[str], str], Manifest]


@dataclass(frozen=True)
class PreparedRequest:
    # What the batcher runs: an input, or each window of a windowed one, in order; an image as its ImageInput.
    inputs: list[TokenizedInput | ImageInput]
    options: ReplyOptions
    # Per request input: its windows (--long-inputs chunk, late chunking), or None where it is inputs' one row.
    # None: no input is windowed (inputs are the request's, one each).
    windows: list[Windows | None] | None = None
    # Per request input, with late chunking: its chunks' character spans and their token ranges in the text.
    chunks: list[TextChunks] | None = None
    # The reply needs the rows' token states (the last hidden state), not only their sentence embeddings: token
    # embeddings, pooling at request time, attention, multi-vector or bge-m3's sparse output, late chunking.
    token_states: bool = True

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


# A request at most this large is prepared, and its reply built, on the event loop: a hop to a thread and back costs
# more than the work (about 40 us of handoff under load against 25 us to tokenize a short text) and one Python
# process pays it on every request. 4,096 characters tokenize in well under a millisecond of the loop's time.
INLINE_CHARACTERS = 4096
INLINE_INPUTS = 16


def light(request: EncodeRequest) -> bool:
    """Small enough to prepare on the event loop (INLINE_*): few inputs of few characters (a token id counts as
    one), and nothing asked whose preparation may cost more than tokenizing or wait for a graph (attention, late
    chunking, quantized types and their ranges: prepare() may call require(), which in a worker of `serve
    --workers` asks the engine process and waits). What does not look like an input is left to prepare(), which
    refuses it, off the loop."""
    inputs = request.inputs
    if (len(inputs) > INLINE_INPUTS or request.attention is not None or request.late_chunking is not None
            or request.ranges is not None or tuple(request.embedding_types) != ("float",)):
        return False
    characters = 0
    for item in inputs:
        if isinstance(item, str):
            characters += len(item)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], str):
            characters += len(item[0]) + len(item[1])
        elif isinstance(item, Sequence):
            characters += len(item)
        else:
            return False
        if characters > INLINE_CHARACTERS:
            return False
    return True


def light_reply(prepared: PreparedRequest) -> bool:
    """A reply small enough to build on the event loop: sentence embeddings (or scores) of few inputs, without
    token embeddings, maps, windows or chunks."""
    options = prepared.options
    return (len(prepared.inputs) <= INLINE_INPUTS and not options.tokens and prepared.windows is None
            and prepared.chunks is None and options.sparse is None and options.multi_vector is None)


def long_input_rule(asked: bool | None, limits: RequestLimits) -> str:
    """The one rule of every door for an input longer than max_seq_length: a request's own `truncate` when it says
    one (true "truncate", false "refuse"), else the server's --long-inputs: truncate (the default, as in TEI since
    1.9: LangChain and LlamaIndex send chunks longer than max_seq_length and expect them cut, not the whole request
    refused), chunk or refuse."""
    return limits.long_inputs if asked is None else "truncate" if asked else "refuse"


def truncates(asked: bool | None, limits: RequestLimits) -> bool:
    """Whether an over-long input is cut rather than refused, where it cannot be chunked (a pair, token ids, a
    reranker's or a classifier's input, a multi-vector text, token embeddings or attention): --long-inputs chunk
    cuts it, as truncate does, and marks it truncated."""
    return long_input_rule(asked, limits) != "refuse"


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
    if manifest.kind == "reranker":
        _check_reranker_attention(request, manifest)
    _check_multi_vector(request, manifest)
    if request.pooling not in POOLINGS:
        raise _invalid("pooling", f"pooling {request.pooling} is not one of {', '.join(POOLINGS)}")
    # The model's own pooling comes from its graph; another is computed from the token embeddings, which
    # gives what the model would with that pooling only when nothing but normalisation follows its pooling.
    pooling = None if request.pooling in ("default", manifest.pooling) else request.pooling
    if pooling is not None and not manifest.poolable_at_request_time:
        raise _invalid("pooling", f"pooling {pooling} is not available for this model: its pipeline is "
                                  f"{' -> '.join(manifest.modules)}; ask for the default pooling")
    if request.truncation_direction not in TRUNCATION_DIRECTIONS:
        raise _invalid("truncation_direction", f"truncation_direction {request.truncation_direction!r} is not one "
                                               f"of {', '.join(TRUNCATION_DIRECTIONS)}")
    check_dimensions(request.dimensions, manifest.embedding_size)
    _check_sparse(request, manifest)
    normalize = manifest.normalize if request.normalize is None else request.normalize
    types = check_embedding_types(tuple(request.embedding_types))
    ranges, model_ranges = _ranges(request, types, manifest, pooling, normalize)
    attention = request.attention
    layers = heads = None
    analyses: tuple[str, ...] = ()
    image_rows = [row for row, item in enumerate(request.inputs) if isinstance(item, ImageBytes | ImageUrl)]
    # The maps of the tower the inputs go through: the image tower's over the patches for images (all of them images)
    num_layers, num_heads = (manifest.num_layers, manifest.num_heads) if not (image_rows and images) else (
        images.num_layers, images.num_heads)
    if attention is not None:  # none asked: the last layer, and every head, named in the reply as asked ones are
        if image_rows and len(image_rows) != len(request.inputs):
            raise _invalid("inputs", "attention over texts and images in one request: their towers' maps differ; "
                                     "send the texts and the images apart")
        layers = _indices(attention.layers or [-1], num_layers, "layer", "attention.layers")
        heads = (_indices(attention.heads, num_heads, "head", "attention.heads") if attention.heads
                 else tuple(range(num_heads)))
        analyses = _analyses(attention, manifest)
        if image_rows and "head_stats" in analyses:
            raise _invalid("attention.analyses", "head_stats reads word pieces (special tokens, pairs): ask images "
                                                 "for rollout or norms")
    options = ReplyOptions(
        pooling=pooling,
        normalize=normalize,
        dimensions=request.dimensions,
        token_embeddings=request.token_embeddings,
        attention_layers=layers,
        attention_heads=heads,
        every_head=heads == tuple(range(num_heads)),
        average_heads=attention is not None and attention.average_heads,
        attention_analyses=analyses,
        attention_weights=attention is None or attention.weights,
        last_layer_only=attention is not None and not image_rows and set(analyses) <= {"rollout"} and (
            not attention.weights or layers == (manifest.num_layers - 1,)),
        embedding_types=types,
        ranges=ranges,
        sparse=request.sparse,
        multi_vector=request.multi_vector,
        # A SPLADE model's sparse embedding, or a ColBERT model's vectors, is its answer; bge-m3's come beside its
        # dense embedding, all from one pass.
        dense=not ((request.sparse is not None and manifest.sparse) or
                   (request.multi_vector is not None and manifest.multi_vector is not None)),
    )
    rule = long_input_rule(request.truncate, limits)
    if request.late_chunking is not None:
        _check_late_chunking(request, manifest)
    # Windows where the sentence embedding is all that is asked: chunked for a long text (--long-inputs chunk), or
    # every text, read whole, for late chunking.
    windowed = ("all" if request.late_chunking is not None else
                "long" if rule == "chunk" and _sentence_embeddings_only(request) and not image_rows
                and not manifest.pad_to_length else None)  # a fixed-length model's texts are cut (SigLIP's)
    if image_rows:
        _check_images(request, options, manifest, images, image_rows[0])
    if request.multi_vector is not None and manifest.multi_vector is not None:
        assert multi_vector is not None, "a multi-vector model's engine has its tokenizer"
        items: list[TokenizedInput | Windows] = list(_tokenize_multi_vector(request, multi_vector, rule != "refuse"))
    else:
        items = _tokenize(request, tokenizer, manifest, rule != "refuse", request.truncation_direction,
                          windowed)  # a str now: checked above
    queued: list[TokenizedInput | Windows | ImageInput] = list(items)
    if image_rows:
        assert images is not None, "_check_images refuses images without a tower"
        for row in image_rows:
            queued[row] = _image_input(images, request.inputs[row], row, limits)
    inputs, windows = _flatten(queued)
    _check_token_types(inputs, takes_token_types, manifest)
    needs_attention = options.attention and not image_rows  # the image tower's attention graph is exported with it
    if needs_attention:
        _check_attention_length(inputs, manifest)
    chunks = _late_chunks(request, windows) if windows is not None and request.late_chunking is not None else None
    reply_bytes = sum(_reply_bytes(len(x.inputs[0]) if isinstance(x, Windows) else len(x), options, manifest,
                                   float_bytes) for x in queued)
    reply_bytes += int(sum(len(spans) for spans, _ in chunks or ()) * (
        EMBEDDING_OVERHEAD_BYTES + float_bytes * (request.dimensions or manifest.embedding_size)))
    if reply_bytes > limits.max_response_bytes:
        raise _invalid(
            "", f"the reply would be about {reply_bytes / 2**20:.1f} MiB, over this server's max_response_bytes "
            f"({limits.max_response_bytes / 2**20:.1f} MiB); ask for fewer inputs, fewer attention layers or "
            "average_heads" + (", or fewer chunks" if chunks else ""))
    # Last, once nothing else can refuse the request: the graphs it needs, which may have to be built first (a
    # request refused anyway starts no build).
    needs = {**({"attention": "attention weights"} if needs_attention else {}),
             **({"quantization": f"{model_ranges} embeddings"} if model_ranges else {})}
    if needs:
        manifest = require(tuple(needs), " and ".join(needs.values()))
        if model_ranges:
            options = replace(options, ranges=_model_ranges(manifest, request.dimensions, normalize, model_ranges))
    token_states = (options.token_embeddings or options.pooling is not None or options.attention
                    or options.multi_vector is not None or chunks is not None
                    or (options.sparse is not None and manifest.bge_m3 is not None))
    return PreparedRequest(inputs, options, windows, chunks, token_states)


def _check_images(request: EncodeRequest, options: ReplyOptions, manifest: Manifest, images: ImageEncoder | None,
                  row: int) -> None:
    """What a request with images may ask: an image's embedding (in the model's shared space with its texts), cut
    to `dimensions`, normalised or not, as float or binary, and the image tower's maps over its patches (with
    attention; prepare() holds them to the tower's layers and heads). Its patches' states are not served."""
    if images is None:
        raise _invalid(f"inputs[{row}]", f"{manifest.model} is a text model: it embeds no images", f"input {row}")
    refused = [name for name, asked in (
        ("token_embeddings", options.token_embeddings),
        ("pooling", options.pooling is not None), ("late_chunking", request.late_chunking is not None),
        ("sparse", request.sparse is not None), ("multi_vector", request.multi_vector is not None)) if asked]
    if refused:
        raise _invalid(refused[0], f"{refused[0]} is not served for images (input {row} is one): an image's "
                                   "embedding is its tower's pooled output in the space it shares with texts")
    calibrated = [t for t in options.embedding_types if t in ("int8", "uint8")]
    if calibrated and request.ranges is None:
        raise _invalid("embedding_types", f"{calibrated[0]} embeddings of images need the request's own ranges: "
                                          "the model's are calibrated on texts (binary and float need none)")


def _image_input(images: ImageEncoder, item: object, row: int, limits: RequestLimits) -> ImageInput:
    """A request's image -> its ImageInput (decoded, preprocessed), or a 4xx naming the input."""
    if not isinstance(item, ImageBytes):  # the core fetches URLs before it prepares (Core._fetch_images)
        raise _invalid(f"inputs[{row}]", "this image URL was not fetched", f"input {row}")
    try:
        return images.prepare(item.data, item.declared, limits.max_image_pixels)
    except ImageError as error:
        raise _invalid(f"inputs[{row}]", str(error), f"input {row}") from None


def _sentence_embeddings_only(request: EncodeRequest) -> bool:
    """Whether the request asks for its inputs' sentence embeddings alone: what chunked embedding gives."""
    return not request.token_embeddings and request.attention is None and request.sparse is None and \
        request.multi_vector is None


def _flatten(items: Sequence[TokenizedInput | Windows | ImageInput]
             ) -> tuple[list[TokenizedInput | ImageInput], list[Windows | None] | None]:
    """The batcher's inputs (each window of a windowed input in turn) and, where any is windowed, each request
    input's windows."""
    if not any(isinstance(x, Windows) for x in items):
        return list(items), None  # type: ignore[arg-type]
    inputs: list[TokenizedInput | ImageInput] = []
    for x in items:
        inputs.extend(x.inputs if isinstance(x, Windows) else [x])
    return inputs, [x if isinstance(x, Windows) else None for x in items]


def _check_late_chunking(request: EncodeRequest, manifest: Manifest) -> None:
    """Late chunking mean-pools token embeddings into each chunk's: a dense model whose embedding is a pooling of
    them, texts, and nothing asked that the chunks would not have."""
    late = request.late_chunking
    assert late is not None
    if not manifest.late_chunkable:
        raise _invalid("late_chunking", f"late chunking mean-pools token embeddings, and {manifest.model}'s "
                                        f"embedding is not a pooling of them (its pipeline is "
                                        f"{' -> '.join(manifest.modules)})")
    for field, asked in (("pooling", request.pooling != "default"), ("token_embeddings", request.token_embeddings),
                         ("attention", request.attention is not None), ("sparse", request.sparse is not None),
                         ("embedding_types", tuple(request.embedding_types) != ("float",)),
                         ("truncate", request.truncate is not None),
                         ("truncation_direction", request.truncation_direction != "right")):
        if asked:
            raise _invalid(field, f"{field} does not apply to late chunking: each text is read whole (in windows "
                                  "where it is longer than max_seq_length) and its chunks mean-pooled")
    if (late.spans is None) == (late.chunker is None):
        raise _invalid("late_chunking", "late chunking takes the chunks' spans or a chunker "
                                        f"({', '.join(CHUNKERS)}), one of them")
    if late.chunker is not None and late.chunker not in CHUNKERS:
        raise _invalid("late_chunking.chunker", f"chunker {late.chunker!r} is not one of {', '.join(CHUNKERS)}")
    size = late.chunk_tokens
    if size is not None and (late.chunker != "tokens" or isinstance(size, bool) or not isinstance(size, int)
                             or size < 1):
        raise _invalid("late_chunking.chunk_tokens", f"chunk_tokens {size!r} is not a positive integer"
                       if late.chunker == "tokens" else "chunk_tokens goes with the tokens chunker")
    if late.spans is not None and (isinstance(late.spans, str) or not isinstance(late.spans, Sequence)
                                   or len(late.spans) != len(request.inputs)):
        raise _invalid("late_chunking.spans", f"give one list of spans per input ({len(request.inputs)})")


def _late_chunks(request: EncodeRequest, windows: list[Windows | None]) -> list[TextChunks]:
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
                raise _invalid(f"inputs[{row}].text", NO_TOKEN_TO_CHUNK, label)
        out.append((spans, token_ranges(spans, w.offsets, label, field)))
    return out


def _check_sparse(request: EncodeRequest, manifest: Manifest) -> None:
    """Sparse embeddings are a SPLADE model's, whole: no other pooling, cut, normalisation or type."""
    if request.sparse is None:
        return
    if not manifest.sparse and manifest.bge_m3 is None:
        raise _invalid("sparse", f"{manifest.model} is a dense embedding model ({manifest.pooling} pooling): it has "
                                 "no sparse embeddings; ask for its embeddings")
    top_k = request.sparse.top_k
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise _invalid("top_k", f"top_k {top_k!r} is not a positive integer (keep 1 or more weights)")
    for field, asked in (("pooling", request.pooling != "default"), ("dimensions", request.dimensions is not None),
                         # bge-m3's dense embedding comes beside them: normalize is its
                         ("normalize", bool(request.normalize) and manifest.bge_m3 is None),
                         ("embedding_types", tuple(request.embedding_types) != ("float",))):
        if asked:
            raise _invalid(field, f"{field} does not apply to sparse embeddings (top_k keeps the largest weights)")


def _check_reranker_attention(request: EncodeRequest, manifest: Manifest) -> None:
    """A reranker (a cross-encoder) has no embeddings; what it shows is the attention of what it scores."""
    if request.attention is None:
        check_embedder(manifest)  # its refusal
    if manifest.pair_template is not None:
        for row, item in enumerate(request.inputs):
            if not isinstance(item, tuple):
                raise _invalid(f"inputs[{row}]", f"{manifest.model} scores a (query, document) pair put through its "
                                                 "template: send pairs", label=f"input {row}")
    for field, asked in (("token_embeddings", request.token_embeddings), ("dimensions", request.dimensions is not None),
                         ("pooling", request.pooling != "default"), ("normalize", request.normalize is not None),
                         ("embedding_types", tuple(request.embedding_types) != ("float",)),
                         ("prompt", request.prompt is not None), ("prompt_name", request.prompt_name is not None)):
        if asked:
            raise _invalid(field, f"{field} does not apply to {manifest.model}, a reranker: it has no embeddings, "
                                  "only the attention of the pairs it scores")


def _analyses(attention: AttentionOptions, manifest: Manifest) -> tuple[str, ...]:
    """The analyses asked for, known and each once, in ANALYSES order; weights false needs one."""
    asked = list(attention.analyses)
    for i, name in enumerate(asked):
        if name not in ANALYSES:
            raise _invalid(f"attention.analyses[{i}]", f"analysis {name!r} is not one of {', '.join(ANALYSES)}",
                           label=f"attention.analyses[{i}]")
        if name == "norms" and not manifest.has_value_norms:
            raise _invalid(f"attention.analyses[{i}]", f"norms need each head's value norms, which {manifest.model}'s "
                                                       "attention graph does not give (exported before them): "
                                                       "re-export it with `attnserve export`",
                           label=f"attention.analyses[{i}]")
    if not attention.weights and not asked:
        raise _invalid("attention.weights", "weights false asks for nothing: ask for the weights, or for analyses "
                                            f"({', '.join(ANALYSES)})")
    return tuple(name for name in ANALYSES if name in asked)


def _check_multi_vector(request: EncodeRequest, manifest: Manifest) -> None:
    """A ColBERT model gives its vectors, one per token, of texts taken as queries or documents, and nothing else
    (its graph's sentence embedding is no embedding it was trained to give)."""
    if manifest.multi_vector is None:
        if request.multi_vector is not None and manifest.bge_m3 is None:
            raise _invalid("multi_vector", f"{manifest.model} is not a multi-vector (ColBERT) model: it gives one "
                                           "embedding per input; ask for its embeddings")
        if request.multi_vector is not None:  # bge-m3's ColBERT vectors, beside its dense embedding
            if request.multi_vector not in INPUT_TYPES:
                raise _invalid("input_type", f"input_type {request.multi_vector!r} is not one of "
                                             f"{', '.join(INPUT_TYPES)}")
            # normalize is the dense embedding's (the vectors are normalised, as FlagEmbedding's); a cut or another
            # pooling would leave the dense embedding and the vectors disagreeing on what was asked
            for field, asked in (("pooling", request.pooling != "default"),
                                 ("dimensions", request.dimensions is not None),
                                 ("token_embeddings", request.token_embeddings),
                                 ("embedding_types", tuple(request.embedding_types) != ("float",)),
                                 ("attention", request.attention is not None)):
                if asked:
                    raise _invalid(field, f"{field} does not apply with {manifest.model}'s multi-vector "
                                          "embeddings (its ColBERT head's vectors, each normalised)")
        return
    if request.multi_vector is None:
        raise _invalid("model", f"{manifest.model} is a multi-vector (ColBERT) model: it gives a vector per token, "
                                "not one embedding per input; ask for its multi-vector embeddings (POST /embed_multi, "
                                "gRPC multi_vector) or rerank with it")
    if request.multi_vector not in INPUT_TYPES:
        raise _invalid("input_type", f"input_type {request.multi_vector!r} is not one of {', '.join(INPUT_TYPES)}")
    for field, asked in (("pooling", request.pooling != "default"), ("dimensions", request.dimensions is not None),
                         ("normalize", request.normalize is not None), ("token_embeddings", request.token_embeddings),
                         ("embedding_types", tuple(request.embedding_types) != ("float",)),
                         ("sparse", request.sparse is not None), ("attention", request.attention is not None),
                         ("prompt", request.prompt is not None), ("prompt_name", request.prompt_name is not None),
                         ("task", request.task is not None),
                         ("truncation_direction", request.truncation_direction != "right")):
        if asked:
            raise _invalid(field, f"{field} does not apply to multi-vector embeddings: the model's query or document "
                                  "prompt, length and vectors are its own")


def _tokenize_multi_vector(request: EncodeRequest, tokenizer: MultiVectorTokenizer, truncate: bool
                           ) -> list[TokenizedInput]:
    """Texts as the model's queries or documents (engine/multi_vector.py); token ids and pairs are refused."""
    for row, item in enumerate(request.inputs):
        if not isinstance(item, str):
            raise _invalid(f"inputs[{row}]", "multi-vector embeddings are of texts (a query or a document), not "
                                             "token ids or pairs", label=f"input {row}")
    texts = [item for item in request.inputs if isinstance(item, str)]  # all of them, as checked
    labels = [f"input {r}" for r in range(len(texts))]
    try:
        return tokenizer.encode(texts, request.multi_vector or "document", truncate, labels)
    except InvalidInputError as error:
        raise _located(error, labels, [f"inputs[{r}].text" for r in range(len(labels))],
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
            raise _invalid("ranges", "ranges apply to the int8 and uint8 embedding types only, and neither was "
                                     "asked for")
        return check_ranges(request.ranges, size), None
    if not ranged:
        return None, None
    if pooling is not None:
        raise _invalid("ranges", f"{ranged[0]} embeddings with pooling {pooling} need ranges: the model's are "
                                 "calibrated on its own pooling; pass ranges, or ask for the default pooling")
    if manifest.source is not None and manifest.quantization is None:  # built as needed: PyTorch's embeddings
        return None, ranged[0]
    return _model_ranges(manifest, request.dimensions, normalize, ranged[0]), None


def _model_ranges(manifest: Manifest, dimensions: int | None, normalize: bool, ranged: str) -> np.ndarray:
    ranges = manifest.quantization_ranges(dimensions, normalize)
    if ranges is None:
        raise _invalid("ranges", f"{ranged} embeddings need per-dimension ranges, and {manifest.model}'s "
                                 "artifacts hold no calibration embeddings (exported before quantized embeddings): "
                                 "pass ranges, or re-export the model with `attnserve export`")
    return ranges


def check_embedder(manifest: Manifest) -> None:
    """Embeddings are asked of, or described for, an embedding model only. The refusal says what the model is and
    what it answers: a reranker (one label) reranks, a classifier (several labels) predicts."""
    if manifest.kind != "reranker":
        return
    if manifest.num_labels == 1:
        raise _invalid("model", f"{manifest.model} is a reranker (a cross-encoder of one label) and has no "
                                "embeddings: it scores (query, document) pairs through rerank (/rerank, /v1/rerank, "
                                "/v2/rerank, gRPC Rerank)")
    raise _invalid("model", f"{manifest.model} is a classifier with {manifest.num_labels} labels and has no "
                            "embeddings: it scores texts and pairs through predict (/predict, gRPC Classify)")


def check_count(n: int, max_inputs: int, field: str = "inputs") -> None:
    what = "texts" if field == "texts" else "inputs"
    if n == 0:
        raise _invalid(field, f"no {what}: send 1 to {max_inputs} {what}")
    if n > max_inputs:
        raise _invalid(field, f"too many {what}: {n}; this server takes at most {max_inputs} per request")


@dataclass(frozen=True)
class PreparedRerank:
    inputs: list[TokenizedInput]  # the pairs (query, text i), in the request's order
    texts: Sequence[str]
    raw_scores: bool
    return_text: bool
    top_n: int  # how many results the reply holds

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


def prepare_rerank(request: RerankRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits,
                   takes_token_types: bool) -> PreparedRerank:
    """Check a rerank request before it costs compute and tokenize its pairs (query, text)."""
    if manifest.kind != "reranker":
        raise _invalid("model", f"{manifest.model} is an embedding model, not a reranker (a cross-encoder) or a "
                                "multi-vector (ColBERT) model: it cannot rerank; ask a reranker, or embed the texts "
                                "and compare them")
    if manifest.num_labels != 1:
        raise _invalid("model", f"{manifest.model} is a classifier with {manifest.num_labels} labels; reranking "
                                "needs one score per pair (one label)")
    top_n, direction = _check_rerank(request, limits)
    labels = [f"text {i}" for i in range(len(request.texts))]
    try:
        check_texts(request.texts, labels)  # named as the request names them, not as sides of pairs
        texts = _first_tokens(request.texts, tokenizer, request.max_tokens_per_doc, labels)
        pairs = [(request.query, text) for text in texts]
        if manifest.pair_template is not None:  # one templated text per pair (Qwen3-Reranker)
            inputs = tokenizer.encode_templated_pairs(pairs, manifest.pair_template,
                                                      truncates(request.truncate, limits), labels, direction)
        else:
            inputs = tokenizer.encode_pairs(pairs, truncates(request.truncate, limits), labels, direction)
    except InvalidInputError as error:
        raise _located(error, labels, [f"texts[{i}]" for i in range(len(request.texts))],
                       request.truncate is None) from None
    _check_token_types(inputs, takes_token_types, manifest)
    return PreparedRerank(inputs, request.texts, request.raw_scores, request.return_text,
                          min(top_n, len(request.texts)))


def _first_tokens(texts: Sequence[str], tokenizer: TextTokenizer, most: int | None,
                  labels: Sequence[str]) -> Sequence[str]:
    """Each text cut after its first `most` tokens (Cohere v2's max_tokens_per_doc), at the end of the last token's
    characters; None: the texts as they are. Tokenizing whole costs what the request's size allows."""
    if most is None:
        return texts
    out = []
    for text, tokens in zip(texts, tokenizer.token_spans(texts, add_special_tokens=False, labels=labels),
                            strict=True):
        words = [t for t in tokens if not t.special]
        out.append(text if len(words) <= most else text[:words[most - 1].stop])
    return out


def _check_rerank(request: RerankRequest, limits: RequestLimits) -> tuple[int, str]:
    """What every rerank request must be, whatever scores it; returns top_n, as asked (maybe over the texts), and
    the truncation direction."""
    if not isinstance(request.texts, Sequence) or isinstance(request.texts, str):
        raise _invalid("texts", "texts must be a list of strings")
    check_count(len(request.texts), limits.max_inputs, "texts")
    top_n = len(request.texts) if request.top_n is None else request.top_n
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise _invalid("top_n", f"top_n {request.top_n!r} is not a positive integer (ask for 1 or more results)")
    most = request.max_tokens_per_doc
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
        raise _invalid("max_tokens_per_doc", f"max_tokens_per_doc {most!r} is not a positive integer")
    if request.truncation_direction not in TRUNCATION_DIRECTIONS:
        raise _invalid("truncation_direction", f"truncation_direction {request.truncation_direction!r} is not one "
                                               f"of {', '.join(TRUNCATION_DIRECTIONS)}")
    if not isinstance(request.query, str) or not request.query or request.query.isspace():
        raise _invalid("query", "the query must be a non-empty string", label="query")
    return top_n, str(request.truncation_direction)


def prepare_multi_vector_rerank(request: RerankRequest, multi_vector: MultiVectorTokenizer, limits: RequestLimits
                                ) -> PreparedRerank:
    """A rerank request to a ColBERT model (ranked by MaxSim): the query as a query, then each text as a document."""
    top_n, direction = _check_rerank(request, limits)
    if direction != "right":
        raise _invalid("truncation_direction", "a multi-vector model's queries and documents are cut at their end "
                                               "(truncation_direction right), as sentence-transformers cuts them")
    truncate = truncates(request.truncate, limits)
    labels = [f"text {i}" for i in range(len(request.texts))]
    try:
        query = multi_vector.encode([request.query], "query", truncate, ["query"])
        documents = multi_vector.encode(request.texts, "document", truncate, labels)
    except InvalidInputError as error:
        raise _located(error, ["query", *labels], ["query", *(f"texts[{i}]" for i in range(len(labels)))],
                       request.truncate is None) from None
    return PreparedRerank([*query, *documents], request.texts, request.raw_scores, request.return_text,
                          min(top_n, len(request.texts)))


def _check_token_types(inputs: Sequence[TokenizedInput | ImageInput], takes_token_types: bool,
                       manifest: Manifest) -> None:
    """A pair whose segment b has token type 1 needs a graph that takes token_type_ids, or it would be silently
    encoded as one segment. A reranker's graph takes them exactly where its family has token types
    (export/reranker.py); the other families' models ignore them, as transformers does."""
    if takes_token_types or manifest.kind == "reranker":
        return
    for i, x in enumerate(inputs):
        if x.type_ids is not None and x.type_ids.any():
            raise _invalid(f"inputs[{i}]", f"{manifest.model}'s graphs take no token types, which this model's "
                                           "pairs need; re-export it with this version of attnserve to encode pairs",
                           label=f"input {i}")


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
        raise _located(error, labels, [f"inputs[{i}]" for i in range(n)]) from None


def out_of_range(what: str, index: int, size: int, named: str | None = None) -> str | None:
    """Why index (negative ones counting from the end) does not pick one of a model's `size` layers or heads, with
    the range that does; None when it does. The one wording of every door and of `attnserve attention`, which
    names its flag (named "--layer")."""
    if -size <= index < size:
        return None
    return f"{named or what} {index} is out of range: this model has {size} {what}s, 0..{size - 1} or -{size}..-1"


def _indices(asked: Sequence[int], size: int, what: str, field: str) -> tuple[int, ...]:
    """Indices into an axis of `size`, negative ones counting from the end, as non-negative indices."""
    out = []
    for i, index in enumerate(asked):
        if problem := out_of_range(what, index, size):
            raise _invalid(f"{field}[{i}]", problem, label=f"{field}[{i}]")
        out.append(index % size)
    return tuple(out)


def _tokenize(request: EncodeRequest, tokenizer: TextTokenizer, manifest: Manifest, truncate: bool, direction: str,
              windowed: str | None = None, images: bool = True) -> list[TokenizedInput | Windows]:
    """Texts (each after the prompt), token ids and pairs through their own paths, back in request order.

    windowed: "long", a text longer than max_seq_length in windows (--long-inputs chunk; token ids and pairs are
    cut as truncate cuts them); "all", every input a text in windows (late chunking); None: none.
    images: whether images may be among the inputs (left for prepare() to decode); False: refused, naming the input."""
    texts, text_rows, ids, id_rows, pairs, pair_rows = [], [], [], [], [], []
    for row, item in enumerate(request.inputs):
        if isinstance(item, str):
            texts.append(item)
            text_rows.append(row)
        elif isinstance(item, tuple):
            pairs.append(item)
            pair_rows.append(row)
        elif isinstance(item, ImageBytes | ImageUrl):
            if not images:
                raise _invalid(f"inputs[{row}]", "an image: this request takes texts", f"input {row}")
            continue  # prepare() decodes the images
        elif item is not None:
            ids.append(item)
            id_rows.append(row)
        else:
            raise _invalid(f"inputs[{row}]", "neither text nor token_ids is set", label=f"input {row}")
    asked = "prompt" if request.prompt is not None else "prompt_name" if request.prompt_name is not None else None
    if asked and id_rows:  # token ids are what the model sees already; a prompt would be silently left out
        raise _invalid(asked, f"a {asked} goes before texts; input {id_rows[0]} is token ids: put the prompt's "
                              "tokens in them instead")
    if windowed == "all" and (id_rows or pair_rows):
        row = (id_rows or pair_rows)[0]
        raise _invalid(f"inputs[{row}]", "late chunking reads texts: this input is "
                                         f"{'token ids' if id_rows else 'a pair'}", label=f"input {row}")
    before = prompt_text(manifest, request.prompt_name, request.prompt)
    raw, texts = texts, [before + text for text in texts] if before else texts
    if pair_rows and (asked or manifest.default_prompt_name is not None):
        # sentence-transformers defines no prompt for a pair: where one would go is not known, so none is guessed
        raise _invalid(asked or "inputs", f"input {pair_rows[0]} is a sentence pair, which takes no prompt"
                                          + ("" if asked else f"; {manifest.model} puts its default prompt "
                                             f"{manifest.default_prompt_name!r} before every text"))
    out: list[TokenizedInput | Windows | None] = [None] * len(request.inputs)
    encode_texts = (partial(tokenizer.encode_texts, texts) if windowed is None else
                    partial(_windowed_texts, tokenizer, raw, texts, before, windowed == "all"))
    for rows, kind, encode in ((text_rows, "text", encode_texts),
                               (id_rows, "token_ids", partial(tokenizer.encode_ids, ids)),
                               (pair_rows, "pair", partial(tokenizer.encode_pairs, pairs) if manifest.pair_template
                                is None else partial(tokenizer.encode_templated_pairs, pairs, manifest.pair_template))):
        if not rows:
            continue
        labels = [f"input {r}" for r in rows]
        try:
            encoded = encode(truncate, labels, direction)
        except InvalidInputError as error:
            raise _located(error, labels, [f"inputs[{r}].{kind}" for r in rows], request.truncate is None) from None
        for row, x in zip(rows, encoded, strict=True):
            out[row] = x
    return out  # type: ignore[return-value]


def _windowed_texts(tokenizer: TextTokenizer, raw: list[str], texts: list[str], prompt: str, every: bool,
                    truncate: bool, labels: list[str], direction: str) -> list[TokenizedInput | Windows]:
    """Texts in windows (engine/windows.py): every one (late chunking), or those longer than max_seq_length with
    their prompt (--long-inputs chunk: the others encoded as they are, cut at no point)."""
    if every:
        return list[TokenizedInput | Windows](tokenizer.windows(raw, prompt, labels))
    encoded: list[TokenizedInput | Windows] = list(tokenizer.encode_texts(texts, True, labels, direction))
    for i, x in enumerate(encoded):
        if isinstance(x, TokenizedInput) and x.truncated:
            encoded[i] = tokenizer.windows([raw[i]], prompt, [labels[i]])[0]
    return encoded


def _invalid(field: str, description: str, label: str | None = None) -> InvalidInputError:
    """The error for field; its message names the place as the user reads it (label), then the problem."""
    return InvalidInputError(f"{label}: {description}" if label else description, field=field,
                             description=description)


def _located(error: InvalidInputError, labels: list[str], fields: list[str], server_default: bool = False
             ) -> InvalidInputError:
    """The tokenizer names an input by the label it was given ("input 3: empty text"): add that input's field.

    An over-long input stays an InputTooLongError, saying whether the server's default (the request left
    `truncate` unset) or the request refused it, for the doors to name the fix."""
    message = str(error)
    located = _invalid("inputs", message)
    for label, field in zip(labels, fields, strict=True):
        if message.startswith(f"{label}: "):
            located = _invalid(field, message[len(label) + 2:], label)
            break
    if isinstance(error, InputTooLongError):
        return InputTooLongError(str(located), field=located.field, description=located.description,
                                 server_default=server_default)
    return located


def _check_attention_length(inputs: Sequence[TokenizedInput | ImageInput], manifest: Manifest) -> None:
    """Attention maps only up to the model's attention_max_length (engine/manifest.py); embeddings go further."""
    for row, x in enumerate(inputs):
        if len(x) > manifest.attention_cap:
            description = (f"{len(x)} tokens exceed this model's attention_max_length {manifest.attention_cap}: "
                           f"attention maps are served up to it (embeddings up to max_seq_length "
                           f"{manifest.served_max_length})")
            raise AttentionTooLongError(f"input {row}: {description}", field=f"inputs[{row}]",
                                        description=description)


def _reply_bytes(tokens: int, options: ReplyOptions, manifest: Manifest, float_bytes: float) -> int:
    heads = len(options.attention_heads or ())
    dims = options.dimensions or manifest.embedding_size
    # a code counted as a float
    floats = sum(quantized_size(kind, dims) for kind in options.embedding_types) if options.dense else 0
    if options.sparse is not None:  # (index, value) pairs: at most top_k, one per word of the vocabulary or token
        most = tokens if manifest.bge_m3 is not None else dims
        floats += 2 * min(options.sparse.top_k or most, most)
    if options.multi_vector is not None:  # a vector per token at most
        floats += tokens * (manifest.bge_m3["colbert_dim"] if manifest.bge_m3 is not None else manifest.embedding_size)
    if options.token_embeddings:
        floats += tokens * manifest.hidden_size  # token embeddings are hidden states, whatever the pipeline
    if options.attention_layers is not None and options.attention_weights:  # spelled so that mypy sees the layers
        floats += len(options.attention_layers) * (1 if options.average_heads else heads) * tokens * tokens
    if "rollout" in options.attention_analyses:
        floats += tokens * tokens
    if "head_stats" in options.attention_analyses:
        floats += (len(HEAD_STATS) + len(PAIR_STATS)) * manifest.num_layers * manifest.num_heads
    if "norms" in options.attention_analyses and options.attention_layers is not None:
        floats += len(options.attention_layers) * (heads + 1) * tokens * tokens
    size = EMBEDDING_OVERHEAD_BYTES + float_bytes * floats
    if options.tokens:
        size += 8 * tokens  # a word piece and its tag, on average
    return int(size)
