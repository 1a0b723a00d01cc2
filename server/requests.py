"""EmbedRequest -> validated, tokenized work, or an InvalidInputError that names the input and the problem.

Each error also carries the field of the request it is about (attnserve/errors.py): "inputs[3].text" where the
message says "input 3".
"""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.engine.manifest import Manifest
from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput
from attnserve.errors import InvalidInputError
from attnserve.v1 import encoder_pb2 as pb

POOLING = {pb.POOLING_DEFAULT: None, pb.MEAN: "mean", pb.CLS: "cls"}

# Per-embedding overhead of a reply beyond its arrays: tags, lengths, shapes.
EMBEDDING_OVERHEAD_BYTES = 64


@dataclass(frozen=True)
class ReplyOptions:
    pooling: str | None  # None: the model's own, as the graph computes it
    normalize: bool
    token_embeddings: bool
    attention_layers: tuple[int, ...] | None  # non-negative indices, in the order asked; None: no attention
    average_heads: bool

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


def prepare(request: pb.EmbedRequest, tokenizer: TextTokenizer, manifest: Manifest, max_inputs: int,
            max_response_bytes: int) -> PreparedRequest:
    """Check everything about a request that can be checked before it costs compute; tokenize it."""
    n = len(request.inputs)
    if n == 0:
        raise _invalid("inputs", f"no inputs: send 1 to {max_inputs} inputs")
    if n > max_inputs:
        raise _invalid("inputs", f"too many inputs: {n}; this server takes at most {max_inputs} per request")
    if request.pooling not in POOLING:
        raise _invalid("pooling", f"pooling {request.pooling} is not one of POOLING_DEFAULT, MEAN, CLS")
    options = ReplyOptions(
        pooling=POOLING[request.pooling],
        normalize=request.normalize if request.HasField("normalize") else manifest.normalize,
        token_embeddings=request.return_token_embeddings,
        attention_layers=_attention_layers(request, manifest.num_layers) if request.HasField("attention") else None,
        average_heads=request.attention.average_heads,
    )
    inputs = _tokenize(request, tokenizer)
    reply_bytes = sum(_reply_bytes(len(x), options, manifest) for x in inputs)
    if reply_bytes > max_response_bytes:
        raise _invalid(
            "", f"the reply would be about {reply_bytes / 2**20:.1f} MiB, over this server's max_response_bytes "
            f"({max_response_bytes / 2**20:.1f} MiB); ask for fewer inputs, fewer attention layers or average_heads")
    return PreparedRequest(inputs, options)


def _attention_layers(request: pb.EmbedRequest, num_layers: int) -> tuple[int, ...]:
    layers = []
    for i, layer in enumerate(request.attention.layers or [-1]):
        if not -num_layers <= layer < num_layers:
            raise _invalid(
                f"attention.layers[{i}]", f"layer {layer} does not exist; the model has {num_layers} layers "
                f"(0..{num_layers - 1}, or -{num_layers}..-1 from the end)", label=f"attention.layers[{i}]")
        layers.append(layer % num_layers)
    return tuple(layers)


def _tokenize(request: pb.EmbedRequest, tokenizer: TextTokenizer) -> list[TokenizedInput]:
    texts, text_rows, ids, id_rows = [], [], [], []
    for row, item in enumerate(request.inputs):
        kind = item.WhichOneof("content")
        if kind == "text":
            texts.append(item.text)
            text_rows.append(row)
        elif kind == "token_ids":
            ids.append(item.token_ids.ids)
            id_rows.append(row)
        else:
            raise _invalid(f"inputs[{row}]", "neither text nor token_ids is set", label=f"input {row}")
    out: list[TokenizedInput | None] = [None] * len(request.inputs)
    for rows, kind, encode, items in ((text_rows, "text", tokenizer.encode_texts, texts),
                                      (id_rows, "token_ids", tokenizer.encode_ids, ids)):
        if not rows:
            continue
        labels = [f"input {r}" for r in rows]
        try:
            encoded = encode(items, request.truncate, labels)
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


def _reply_bytes(tokens: int, options: ReplyOptions, manifest: Manifest) -> int:
    hidden, heads = manifest.hidden_size, manifest.num_heads
    size = EMBEDDING_OVERHEAD_BYTES + 4 * hidden
    if options.token_embeddings:
        size += 4 * tokens * hidden
    if options.attention:
        size += 4 * len(options.attention_layers) * (1 if options.average_heads else heads) * tokens * tokens
    if options.tokens:
        size += 8 * tokens  # a word piece and its tag, on average
    return size
