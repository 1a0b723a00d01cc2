"""What an encode request may ask of attention: the layers and heads of its maps (negative indices counting from
the end), the analyses computed beside them (attnserve/attention_analyses.py), and the lengths the maps are served up
to; a reranker's, of the pairs it scores, are all it shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnserve.attention_analyses import ANALYSES
from attnserve.engine.image_encoder import ImageEncoder, ImageInput
from attnserve.engine.manifest import Manifest
from attnserve.engine.tokenizer import TokenizedInput
from attnserve.errors import AttentionTooLongError

from .requests import AttentionOptions, EncodeRequest, check_embedder, invalid, out_of_range


@dataclass(frozen=True)
class AttentionChoice:
    """The maps a request asks for, as OutputOptions holds them; the defaults: none asked."""

    layers: tuple[int, ...] | None = None  # non-negative indices, in the order asked
    heads: tuple[int, ...] | None = None  # non-negative indices, every head when none was asked
    every_head: bool = False  # heads are all the tower's heads in order: nothing to select
    average_heads: bool = False
    analyses: tuple[str, ...] = ()  # in ANALYSES order
    weights: bool = True
    last_layer_only: bool = False  # the last-layer graph answers it (OutputOptions.last_layer_only)


NO_ATTENTION = AttentionChoice()  # what most requests ask: one, not one made per request


def choose_attention(request: EncodeRequest, manifest: Manifest, images: ImageEncoder | None,
                     image_rows: Sequence[int]) -> AttentionChoice:
    """The layers, heads and analyses asked, checked against the tower the inputs go through: the image tower's maps
    over the patches for images (all of them images), the text model's otherwise. None asked: the last layer, and
    every head, named in the reply as asked ones are."""
    attention = request.attention
    if attention is None:
        return NO_ATTENTION
    if manifest.static is not None and not image_rows:
        raise invalid("attention", f"{manifest.model} is a static embedding model (a token table and a mean): it has "
                                   "no attention to show")
    num_layers, num_heads = (manifest.num_layers, manifest.num_heads) if not (image_rows and images) else (
        images.num_layers, images.num_heads)
    if image_rows and len(image_rows) != len(request.inputs):
        raise invalid("inputs", "attention over texts and images in one request: their towers' maps differ; "
                                "send the texts and the images apart")
    layers = _indices(attention.layers or [-1], num_layers, "layer", "attention.layers")
    heads = (_indices(attention.heads, num_heads, "head", "attention.heads") if attention.heads
             else tuple(range(num_heads)))
    analyses = _analyses(attention, manifest)
    if image_rows and "head_stats" in analyses:
        raise invalid("attention.analyses", "head_stats reads word pieces (special tokens, pairs): ask images "
                                            "for rollout or norms")
    return AttentionChoice(
        layers=layers, heads=heads, every_head=heads == tuple(range(num_heads)), average_heads=attention.average_heads,
        analyses=analyses, weights=attention.weights,
        last_layer_only=not image_rows and set(analyses) <= {"rollout"} and (
            not attention.weights or layers == (manifest.num_layers - 1,)))


def _indices(asked: Sequence[int], size: int, what: str, field: str) -> tuple[int, ...]:
    """Indices into an axis of `size`, negative ones counting from the end, as non-negative indices."""
    out = []
    for i, index in enumerate(asked):
        if problem := out_of_range(what, index, size):
            raise invalid(f"{field}[{i}]", problem, label=f"{field}[{i}]")
        out.append(index % size)
    return tuple(out)


def _analyses(attention: AttentionOptions, manifest: Manifest) -> tuple[str, ...]:
    """The analyses asked for, known and each once, in ANALYSES order; weights false needs one."""
    asked = list(attention.analyses)
    for i, name in enumerate(asked):
        if name not in ANALYSES:
            raise invalid(f"attention.analyses[{i}]", f"analysis {name!r} is not one of {', '.join(ANALYSES)}",
                          label=f"attention.analyses[{i}]")
        if name == "norms" and not manifest.has_value_norms:
            raise invalid(f"attention.analyses[{i}]", f"norms need each head's value norms, which {manifest.model}'s "
                                                      "attention graph does not give (exported before them): "
                                                      "re-export it with `attnserve export`",
                          label=f"attention.analyses[{i}]")
    if not attention.weights and not asked:
        raise invalid("attention.weights", "weights false asks for nothing: ask for the weights, or for analyses "
                                           f"({', '.join(ANALYSES)})")
    return tuple(name for name in ANALYSES if name in asked)


def check_attention_length(inputs: Sequence[TokenizedInput | ImageInput], manifest: Manifest) -> None:
    """Attention maps only up to the model's attention_max_length (engine/manifest.py); embeddings go further."""
    for row, x in enumerate(inputs):
        if len(x) > manifest.attention_cap:
            description = (f"{len(x)} tokens exceed this model's attention_max_length {manifest.attention_cap}: "
                           f"attention maps are served up to it (embeddings up to max_seq_length "
                           f"{manifest.served_max_length})")
            raise AttentionTooLongError(f"input {row}: {description}", field=f"inputs[{row}]",
                                        description=description)


def check_reranker_attention(request: EncodeRequest, manifest: Manifest) -> None:
    """A reranker (a cross-encoder) has no embeddings; what it shows is the attention of what it scores."""
    if request.attention is None:
        check_embedder(manifest)  # its refusal
    if manifest.pair_template is not None:
        for row, item in enumerate(request.inputs):
            if not isinstance(item, tuple):
                raise invalid(f"inputs[{row}]", f"{manifest.model} scores a (query, document) pair put through its "
                                                "template: send pairs", label=f"input {row}")
    for field, asked in (("token_embeddings", request.token_embeddings), ("dimensions", request.dimensions is not None),
                         ("pooling", request.pooling != "default"), ("normalize", request.normalize is not None),
                         ("embedding_types", tuple(request.embedding_types) != ("float",)),
                         ("prompt", request.prompt is not None), ("prompt_name", request.prompt_name is not None)):
        if asked:
            raise invalid(field, f"{field} does not apply to {manifest.model}, a reranker: it has no embeddings, "
                                 "only the attention of the pairs it scores")
