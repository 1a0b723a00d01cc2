"""The protocol-neutral requests every front door hands the core, the server's limits on them, and what every kind
of request shares: the rules of long inputs, counts and pairs, tokenizing texts, token ids and pairs, the errors,
and whether a request is small enough to prepare on the event loop (light).

A door (gRPC in grpc/, HTTP in http/) translates its wire format into these dataclasses and nothing else. Each kind
is prepared in its own module: embed_requests.py (embeddings: prepare(), with attention_requests.py,
image_requests.py and chunk_requests.py), score_requests.py (rerank, predict, similarity) and token_requests.py
(tokenize, decode). Preparing checks what can be checked before a request costs compute and tokenizes it, raising an
InvalidInputError that names the input and the problem. Each error also carries the field it is about, as a
neutral path ("inputs[3].text", "inputs", "pooling", "dimensions", "attention.layers[1]") that a door may rename
to its own wire names; the message names the place as a user reads it ("input 3: empty text").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from attnserve.engine.image_encoder import ImageInput
from attnserve.engine.manifest import REQUEST_POOLINGS, Manifest
from attnserve.engine.output_options import PreparedRequest, SparseOptions
from attnserve.engine.prompts import prompt_text, unpooled_prompt
from attnserve.engine.tokenizer import TRUNCATION_DIRECTIONS, TextTokenizer, TokenizedInput
from attnserve.engine.windows import Windows
from attnserve.errors import DeadlineExpiredError, InputTooLongError, InvalidInputError
from attnserve.images import DEFAULT_MAX_PIXELS

from .image_inputs import ImageBytes, ImageUrl

# "default" is the model's own pooling, as its graph computes it.
POOLINGS = ("default", *REQUEST_POOLINGS)

# An input is a text, token ids (special tokens included), a sentence pair (text a, text b) as a tuple, an image (an
# image-text model's: its bytes, or a URL the core fetches first), or None where the wire format allows none of them.
Input = str | Sequence[int] | tuple[str, str] | ImageBytes | ImageUrl | None


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
    # Analyses of every layer's every head, computed here (attnserve/attention_analyses.py): rollout, head_stats.
    analyses: Sequence[str] = ()
    weights: bool = True  # the chosen layers' and heads' weights too; False: the analyses alone


@dataclass(frozen=True)
class LateChunking:
    """Late chunking (engine/late_chunking.py): each text read whole, its chunks' token embeddings mean-pooled. The
    chunks are given (spans) or cut by a built-in chunker, one of the two."""

    spans: Sequence[Sequence[Sequence[int]]] | None = None  # per input, its chunks' [start, stop) character spans
    chunker: str | None = None  # "sentences" or "tokens" (CHUNKERS), where spans are not given
    chunk_tokens: int | None = None  # the "tokens" chunker's chunk size in tokens (unset: DEFAULT_CHUNK_TOKENS)


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
class RequestLimits:
    """The server's limits on one request (ServerConfig)."""

    max_inputs: int
    max_response_bytes: int
    long_inputs: str = "truncate"  # what an over-long input of a request that does not say `truncate` gets
    max_image_pixels: int = DEFAULT_MAX_PIXELS  # an image's width x height (attnserve/images.py)


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


def text_chars(inputs: Sequence[Input]) -> int:
    """The characters of a request's texts (both of a pair's): what tokenizing them cost the heaps (memory.py)."""
    chars = 0
    for item in inputs:
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, tuple):  # a pair; what is not one prepare() refuses
            chars += sum(len(part) for part in item if isinstance(part, str))
    return chars


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


def check_truncation_direction(direction: str | int) -> str:
    """A request's truncation_direction, one of TRUNCATION_DIRECTIONS (a door passes an unknown wire value on)."""
    if direction not in TRUNCATION_DIRECTIONS:
        raise invalid("truncation_direction", f"truncation_direction {direction!r} is not one "
                                              f"of {', '.join(TRUNCATION_DIRECTIONS)}")
    return str(direction)


def check_embedder(manifest: Manifest) -> None:
    """Embeddings are asked of, or described for, an embedding model only. The refusal says what the model is and
    what it answers: a reranker (one label) reranks, a classifier (several labels) predicts."""
    if manifest.kind != "reranker":
        return
    if manifest.num_labels == 1:
        raise invalid("model", f"{manifest.model} is a reranker (a cross-encoder of one label) and has no "
                               "embeddings: it scores (query, document) pairs through rerank (/rerank, /v1/rerank, "
                               "/v2/rerank, gRPC Rerank)")
    raise invalid("model", f"{manifest.model} is a classifier with {manifest.num_labels} labels and has no "
                           "embeddings: it scores texts and pairs through predict (/predict, gRPC Classify)")


def check_count(n: int, max_inputs: int, field: str = "inputs") -> None:
    what = "texts" if field == "texts" else "inputs"
    if n == 0:
        raise invalid(field, f"no {what}: send 1 to {max_inputs} {what}")
    if n > max_inputs:
        raise invalid(field, f"too many {what}: {n}; this server takes at most {max_inputs} per request")


def check_token_types(inputs: Sequence[TokenizedInput | ImageInput], takes_token_types: bool,
                      manifest: Manifest) -> None:
    """A pair whose segment b has token type 1 needs a graph that takes token_type_ids, or it would be silently
    encoded as one segment. A reranker's graph takes them exactly where its family has token types
    (export/reranker.py); the other families' models ignore them, as transformers does."""
    if takes_token_types or manifest.kind == "reranker":
        return
    for i, x in enumerate(inputs):
        if x.type_ids is not None and x.type_ids.any():
            raise invalid(f"inputs[{i}]", f"{manifest.model}'s graphs take no token types, which this model's "
                                          "pairs need; re-export it with this version of attnserve to encode pairs",
                          label=f"input {i}")


def out_of_range(what: str, index: int, size: int, named: str | None = None) -> str | None:
    """Why index (negative ones counting from the end) does not pick one of a model's `size` layers or heads, with
    the range that does; None when it does. The one wording of every door and of `attnserve attention`, which
    names its flag (named "--layer")."""
    if -size <= index < size:
        return None
    return f"{named or what} {index} is out of range: this model has {size} {what}s, 0..{size - 1} or -{size}..-1"


def tokenize(request: EncodeRequest, tokenizer: TextTokenizer, manifest: Manifest, truncate: bool, direction: str,
             windowed: str | None = None, images: bool = True) -> list[TokenizedInput | Windows]:
    """Texts (each after the prompt), token ids and pairs through their own paths, back in request order.

    windowed: "long", a text longer than max_seq_length in windows (--long-inputs chunk; token ids and pairs are
    cut as truncate cuts them); "all", every input a text in windows (late chunking); None: none.
    images: whether images may be among the inputs (left for prepare() to decode); False: refused, naming the input."""
    (texts, text_rows), (ids, id_rows), (pairs, pair_rows) = _by_kind(request.inputs, images)
    asked = "prompt" if request.prompt is not None else "prompt_name" if request.prompt_name is not None else None
    if asked and id_rows:  # token ids are what the model sees already; a prompt would be silently left out
        raise invalid(asked, f"a {asked} goes before texts; input {id_rows[0]} is token ids: put the prompt's "
                             "tokens in them instead")
    if windowed == "all" and (id_rows or pair_rows):
        row = (id_rows or pair_rows)[0]
        raise invalid(f"inputs[{row}]", "late chunking reads texts: this input is "
                                        f"{'token ids' if id_rows else 'a pair'}", label=f"input {row}")
    before = prompt_text(manifest, request.prompt_name, request.prompt)
    raw, texts = texts, [before + text for text in texts] if before else texts
    if pair_rows and (asked or manifest.default_prompt_name is not None):
        # sentence-transformers defines no prompt for a pair: where one would go is not known, so none is guessed
        raise invalid(asked or "inputs", f"input {pair_rows[0]} is a sentence pair, which takes no prompt"
                                         + ("" if asked else f"; {manifest.model} puts its default prompt "
                                            f"{manifest.default_prompt_name!r} before every text"))
    out: list[TokenizedInput | Windows | None] = [None] * len(request.inputs)
    unpooled = unpooled_prompt(manifest, before)
    if unpooled and windowed is not None:  # each window would begin with the prompt, a length its pooling needs
        raise invalid(asked or "inputs", f"{manifest.model} leaves its prompt out of its pooling: its texts are not "
                                         "encoded in windows with one")
    for rows, kind in ((text_rows, "text"), (id_rows, "token_ids"), (pair_rows, "pair")):
        if not rows:
            continue
        if kind == "text":
            encode = (partial(tokenizer.encode_texts, texts, unpooled_prompt=unpooled) if windowed is None else
                      partial(_windowed_texts, tokenizer, raw, texts, before, windowed == "all"))
        elif kind == "token_ids":
            encode = partial(tokenizer.encode_ids, ids)
        else:
            encode = (partial(tokenizer.encode_pairs, pairs) if manifest.pair_template is None else
                      partial(tokenizer.encode_templated_pairs, pairs, manifest.pair_template))
        # Each input named by its row in errors; where every input is of this kind, the tokenizer's own "input i"
        # names it without a label made per input.
        labels = None if len(rows) == len(request.inputs) else [f"input {r}" for r in rows]
        try:
            encoded = encode(truncate, labels, direction)
        except InvalidInputError as error:
            raise located(error, labels or [f"input {r}" for r in rows], [f"inputs[{r}].{kind}" for r in rows],
                          request.truncate is None) from None
        for row, x in zip(rows, encoded, strict=True):
            out[row] = x
    return out  # type: ignore[return-value]


def _by_kind(inputs: Sequence[Input], images: bool) -> tuple[tuple[list, list[int]], ...]:
    """The request's texts, token ids and pairs, each with their rows; images are passed over (prepare() decodes
    them), or refused where the request takes none."""
    texts: tuple[list, list[int]] = ([], [])
    ids: tuple[list, list[int]] = ([], [])
    pairs: tuple[list, list[int]] = ([], [])
    for row, item in enumerate(inputs):
        if isinstance(item, ImageBytes | ImageUrl):
            if not images:
                raise invalid(f"inputs[{row}]", "an image: this request takes texts", f"input {row}")
            continue
        if item is None:
            raise invalid(f"inputs[{row}]", "neither text nor token_ids is set", label=f"input {row}")
        kind = texts if isinstance(item, str) else pairs if isinstance(item, tuple) else ids
        kind[0].append(item)
        kind[1].append(row)
    return texts, ids, pairs


def _windowed_texts(tokenizer: TextTokenizer, raw: list[str], texts: list[str], prompt: str, every: bool,
                    truncate: bool, labels: list[str] | None, direction: str) -> list[TokenizedInput | Windows]:
    """Texts in windows (engine/windows.py): every one (late chunking), or those longer than max_seq_length with
    their prompt (--long-inputs chunk: the others encoded as they are, cut at no point)."""
    if every:
        return list[TokenizedInput | Windows](tokenizer.windows(raw, prompt, labels))
    encoded: list[TokenizedInput | Windows] = list(tokenizer.encode_texts(texts, True, labels, direction))
    for i, x in enumerate(encoded):
        if isinstance(x, TokenizedInput) and x.truncated:
            encoded[i] = tokenizer.windows([raw[i]], prompt, [f"input {i}" if labels is None else labels[i]])[0]
    return encoded


def flatten(items: Sequence[TokenizedInput | Windows | ImageInput]
            ) -> tuple[list[TokenizedInput | ImageInput], list[Windows | None] | None]:
    """The batcher's inputs (each window of a windowed input in turn) and, where any is windowed, each request
    input's windows."""
    if not any(isinstance(x, Windows) for x in items):
        return list(items), None  # type: ignore[arg-type]
    inputs: list[TokenizedInput | ImageInput] = []
    for x in items:
        inputs.extend(x.inputs if isinstance(x, Windows) else [x])
    return inputs, [x if isinstance(x, Windows) else None for x in items]


def invalid(field: str, description: str, label: str | None = None) -> InvalidInputError:
    """The error for field; its message names the place as the user reads it (label), then the problem."""
    return InvalidInputError(f"{label}: {description}" if label else description, field=field,
                             description=description)


def located(error: InvalidInputError, labels: list[str], fields: list[str], server_default: bool = False
            ) -> InvalidInputError:
    """The tokenizer names an input by the label it was given ("input 3: empty text"): add that input's field.

    An over-long input stays an InputTooLongError, saying whether the server's default (the request left
    `truncate` unset) or the request refused it, for the doors to name the fix."""
    message = str(error)
    named = invalid("inputs", message)
    for label, field in zip(labels, fields, strict=True):
        if message.startswith(f"{label}: "):
            named = invalid(field, message[len(label) + 2:], label)
            break
    if isinstance(error, InputTooLongError):
        return InputTooLongError(str(named), field=named.field, description=named.description,
                                 server_default=server_default)
    return named
