"""The protocol-neutral requests every front door hands the core, and every rule and limit that applies to them.

A door (gRPC in service.py, HTTP in http/) translates its wire format into these dataclasses and nothing else;
prepare() checks what can be checked before a request costs compute and tokenizes it, raising an
InvalidInputError that names the input and the problem. Each error also carries the field it is about, as a
neutral path ("inputs[3].text", "inputs", "pooling", "dimensions", "attention.layers[1]") that a door may rename
to its own wire names; the message names the place as a user reads it ("input 3: empty text").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from attnserve.engine.dimensions import check_dimensions
from attnserve.engine.manifest import REQUEST_POOLINGS, Manifest
from attnserve.engine.prompts import apply_prompt
from attnserve.engine.tokenizer import TRUNCATION_DIRECTIONS, TextTokenizer, Token, TokenizedInput
from attnserve.errors import InvalidInputError

# "default" is the model's own pooling, as its graph computes it.
POOLINGS = ("default", *REQUEST_POOLINGS)

# An input is a text, token ids (special tokens included), or None where the wire format allows neither.
Input = str | Sequence[int] | None

# Per-embedding overhead of a reply beyond its arrays: tags, lengths, shapes.
EMBEDDING_OVERHEAD_BYTES = 64


@dataclass(frozen=True)
class AttentionOptions:
    layers: Sequence[int] = ()  # empty: the last layer; negative indices count from the end
    heads: Sequence[int] = ()  # empty: every head; negative indices count from the end
    average_heads: bool = False  # average over the chosen heads: the heads axis has size 1


@dataclass(frozen=True)
class EncodeRequest:
    inputs: Sequence[Input]
    pooling: str | int = "default"  # one of POOLINGS; a door passes an unknown wire value on as it is
    normalize: bool | None = None  # None: as the model's own pipeline does
    truncate: bool = False  # False: an input longer than max_seq_length is refused
    truncation_direction: str | int = "right"  # one of TRUNCATION_DIRECTIONS; a door passes an unknown wire value on
    dimensions: int | None = None  # keep the first N dimensions of the sentence embedding (before normalising)
    token_embeddings: bool = False
    attention: AttentionOptions | None = None  # None: no attention weights
    prompt_name: str | None = None  # a prompt of the model's to put before each text (engine/prompts.py)
    prompt: str | None = None  # a raw prompt to put before each text; None with prompt_name None: the default one
    model: str | None = None  # the served model's name or alias; None: the server's default model


@dataclass(frozen=True)
class TokenizeRequest:
    texts: Sequence[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class DecodeRequest:
    ids: Sequence[Sequence[int]]
    skip_special_tokens: bool = True


@dataclass(frozen=True)
class RequestLimits:
    """The server's limits on one request (ServerConfig)."""

    max_inputs: int
    max_response_bytes: int


@dataclass(frozen=True)
class ReplyOptions:
    pooling: str | None  # None: the model's own, as the graph computes it
    normalize: bool
    dimensions: int | None  # None: all of them
    token_embeddings: bool
    attention_layers: tuple[int, ...] | None  # non-negative indices, in the order asked; None: no attention
    attention_heads: tuple[int, ...] | None = None  # non-negative indices; None: every head
    average_heads: bool = False

    @property
    def attention(self) -> bool:
        return self.attention_layers is not None

    @property
    def tokens(self) -> bool:
        """Word pieces label token embeddings and attention maps; plain embeddings go without."""
        return self.token_embeddings or self.attention


@dataclass(frozen=True)
class PreparedRequest:
    inputs: list[TokenizedInput]
    options: ReplyOptions

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


def prepare(request: EncodeRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits,
            float_bytes: float) -> PreparedRequest:
    """Check everything about a request that can be checked before it costs compute; tokenize it.

    float_bytes: what one float of the reply costs on the door's wire (4 in binary), for the reply size limit.
    """
    check_count(len(request.inputs), limits.max_inputs)
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
    attention = request.attention
    options = ReplyOptions(
        pooling=pooling,
        normalize=manifest.normalize if request.normalize is None else request.normalize,
        dimensions=request.dimensions,
        token_embeddings=request.token_embeddings,
        attention_layers=None if attention is None else _indices(
            attention.layers or [-1], manifest.num_layers, "layer", "attention.layers"),
        attention_heads=None if attention is None or not attention.heads else _indices(
            attention.heads, manifest.num_heads, "head", "attention.heads"),
        average_heads=attention is not None and attention.average_heads,
    )
    inputs = _tokenize(request, tokenizer, manifest, request.truncation_direction)  # a str now: checked above
    reply_bytes = sum(_reply_bytes(len(x), options, manifest, float_bytes) for x in inputs)
    if reply_bytes > limits.max_response_bytes:
        raise _invalid(
            "", f"the reply would be about {reply_bytes / 2**20:.1f} MiB, over this server's max_response_bytes "
            f"({limits.max_response_bytes / 2**20:.1f} MiB); ask for fewer inputs, fewer attention layers or "
            "average_heads")
    return PreparedRequest(inputs, options)


def check_count(n: int, max_inputs: int) -> None:
    if n == 0:
        raise _invalid("inputs", f"no inputs: send 1 to {max_inputs} inputs")
    if n > max_inputs:
        raise _invalid("inputs", f"too many inputs: {n}; this server takes at most {max_inputs} per request")


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


def _indices(asked: Sequence[int], size: int, what: str, field: str) -> tuple[int, ...]:
    """Indices into an axis of `size`, negative ones counting from the end, as non-negative indices."""
    out = []
    for i, index in enumerate(asked):
        if not -size <= index < size:
            raise _invalid(f"{field}[{i}]", f"{what} {index} does not exist; the model has {size} {what}s "
                                            f"(0..{size - 1}, or -{size}..-1 from the end)", label=f"{field}[{i}]")
        out.append(index % size)
    return tuple(out)


def _tokenize(request: EncodeRequest, tokenizer: TextTokenizer, manifest: Manifest, direction: str
              ) -> list[TokenizedInput]:
    """Texts (each after the prompt) and token ids through their own paths, back in request order."""
    texts, text_rows, ids, id_rows = [], [], [], []
    for row, item in enumerate(request.inputs):
        if isinstance(item, str):
            texts.append(item)
            text_rows.append(row)
        elif item is not None:
            ids.append(item)
            id_rows.append(row)
        else:
            raise _invalid(f"inputs[{row}]", "neither text nor token_ids is set", label=f"input {row}")
    asked = "prompt" if request.prompt is not None else "prompt_name" if request.prompt_name is not None else None
    if asked and id_rows:  # token ids are what the model sees already; a prompt would be silently left out
        raise _invalid(asked, f"a {asked} goes before texts; input {id_rows[0]} is token ids: put the prompt's "
                              "tokens in them instead")
    texts = apply_prompt(manifest, texts, request.prompt_name, request.prompt)
    out: list[TokenizedInput | None] = [None] * len(request.inputs)
    for rows, kind, encode in ((text_rows, "text", partial(tokenizer.encode_texts, texts)),
                               (id_rows, "token_ids", partial(tokenizer.encode_ids, ids))):
        if not rows:
            continue
        labels = [f"input {r}" for r in rows]
        try:
            encoded = encode(request.truncate, labels, direction)
        except InvalidInputError as error:
            raise _located(error, labels, [f"inputs[{r}].{kind}" for r in rows]) from None
        for row, x in zip(rows, encoded, strict=True):
            out[row] = x
    return out  # type: ignore[return-value]


def _invalid(field: str, description: str, label: str | None = None) -> InvalidInputError:
    """The error for field; its message names the place as the user reads it (label), then the problem."""
    return InvalidInputError(f"{label}: {description}" if label else description, field=field,
                             description=description)


def _located(error: InvalidInputError, labels: list[str], fields: list[str]) -> InvalidInputError:
    """The tokenizer names an input by the label it was given ("input 3: empty text"): add that input's field."""
    message = str(error)
    for label, field in zip(labels, fields, strict=True):
        if message.startswith(f"{label}: "):
            return _invalid(field, message[len(label) + 2:], label)
    return _invalid("inputs", message)


def _reply_bytes(tokens: int, options: ReplyOptions, manifest: Manifest, float_bytes: float) -> int:
    heads = len(options.attention_heads) if options.attention_heads else manifest.num_heads
    floats = options.dimensions or manifest.embedding_size
    if options.token_embeddings:
        floats += tokens * manifest.hidden_size  # token embeddings are hidden states, whatever the pipeline
    if options.attention_layers is not None:  # options.attention, spelled so that mypy sees the layers are set
        floats += len(options.attention_layers) * (1 if options.average_heads else heads) * tokens * tokens
    size = EMBEDDING_OVERHEAD_BYTES + float_bytes * floats
    if options.tokens:
        size += 8 * tokens  # a word piece and its tag, on average
    return int(size)
