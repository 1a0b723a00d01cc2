"""Request bodies read as their models (bodies.py), and what is wrong with one that does not parse: parse().

What is wrong with a body that does not parse is told in one line that names the field as the route names it and
says what to send instead:
- a field that another door names so (OpenAI's `input` sent to TEI's /embed, TEI's `inputs` to /v1/embeddings,
  Cohere's `documents` to TEI's /rerank): whose name it is, and this route's name to send;
- an unknown field, on the routes that refuse them: the route's fields (on TEI's and KServe's routes, which ignore
  unknown fields as TEI and Triton do, they are named when a required field is missing beside them);
- a float where an integer belongs: the integer to send (8, not 8.0);
- an image sent to a route of texts: what the route takes and where images go;
- a union's forms in one sentence, rather than one complaint per form the value failed to be.
Every message is in the route's own words: an error here is a WireFieldError, never renamed from the core's names.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Annotated, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from attnserve.errors import MalformedMessageError

from ..open_inference import not_an_integer
from .attnserve_bodies import AttentionBody, LateChunkingBody, MultiVectorBody
from .bodies import INPUTS_FORMS, PAIR_INPUTS_FORMS, Body, Inputs, PairInputs
from .cohere_bodies import CohereEmbedBody, CohereRerankBody, CohereV2RerankBody
from .errors import WireFieldError
from .openai_bodies import OPENAI_INPUTS_FORMS, InfinityImagesBody, OpenAIEmbeddingsBody
from .tei_bodies import (
    PREDICT_FORMS,
    DecodeIds,
    PredictInputs,
    TeiEmbedAllBody,
    TeiEmbedBody,
    TeiEmbedSparseBody,
    TeiPredictBody,
    TeiRerankBody,
    TeiTokenizeBody,
)

Loc = Sequence[str | int]
OPENAI_INPUT = "OpenAI's name, for /v1/embeddings"
TEI_INPUTS = "TEI's name, for /embed"
COHERE_EMBED = "Cohere's name, for /v2/embed"
COHERE_DOCUMENTS = "Cohere's name, for /v1/rerank and /v2/rerank"
TEI_TEXTS = "TEI's name, for /rerank"
_TEXT_INPUTS = {"input": ("inputs", OPENAI_INPUT), "texts": ("inputs", COHERE_EMBED)}
# Each body's fields as other doors name them: the other name -> (this route's name, whose the other is). Said when
# such a name is sent and the body does not parse (on TEI's routes, which ignore unknown fields, when it lacks the
# field it meant).
OTHER_NAMES: dict[type[BaseModel], dict[str, tuple[str, str]]] = {
    OpenAIEmbeddingsBody: {"inputs": ("input", TEI_INPUTS), "texts": ("input", COHERE_EMBED),
                           "output_dimension": ("dimensions", COHERE_EMBED)},
    InfinityImagesBody: {"inputs": ("input", TEI_INPUTS), "images": ("input", COHERE_EMBED)},
    CohereEmbedBody: {"input": ("texts", OPENAI_INPUT), "dimensions": ("output_dimension", "OpenAI's and TEI's name")},
    TeiRerankBody: {"documents": ("texts", COHERE_DOCUMENTS)},
    CohereRerankBody: {"texts": ("documents", TEI_TEXTS)},
    CohereV2RerankBody: {"texts": ("documents", TEI_TEXTS)},
    **dict.fromkeys((TeiEmbedBody, TeiEmbedAllBody, TeiEmbedSparseBody, TeiTokenizeBody, TeiPredictBody,
                     LateChunkingBody, MultiVectorBody, AttentionBody), _TEXT_INPUTS),
}
_OPENAI_INPUT = OpenAIEmbeddingsBody.model_fields["input"].annotation  # texts, ids, or Jina's texts and images
_ATTENTION_INPUTS = AttentionBody.model_fields["inputs"].annotation  # as TEI's, or images
_UNION_FORMS: dict[object, str] = {  # keyed by the annotation: typing's union forms
    Inputs: INPUTS_FORMS, _OPENAI_INPUT: OPENAI_INPUTS_FORMS, PairInputs: PAIR_INPUTS_FORMS,
    _ATTENTION_INPUTS: PAIR_INPUTS_FORMS + " or a list of {\"image\": ...} objects",
    TeiTokenizeBody.model_fields["inputs"].annotation: "a string or a list of strings", PredictInputs: PREDICT_FORMS,
    DecodeIds: "a list of token ids or a list of lists of token ids"}
_TAKE_IMAGES = (_OPENAI_INPUT, _ATTENTION_INPUTS)
IMAGES_GO = ("an image-text model's images go to /v1/embeddings (input: [{\"image\": ...}]), /embeddings_image, "
             "/v2/embed (images), /similarity and /v1/attention ({\"image\": ...}), or KServe's image tensor")
_IMAGE_NOTES: dict[type[BaseModel], str] = {TeiEmbedAllBody: " (token embeddings are served for texts only)"}


def parse(model: type[Body], body: bytes, route: str = "this route") -> Body:
    """The body as `model`, or a MalformedMessageError / WireFieldError naming the field and the problem; route:
    the path the body was sent to, as its messages name it."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise _error(model, e.errors(include_url=False), route) from None


def _error(model: type[BaseModel], errors: list[ErrorDetails], route: str) -> Exception:
    first = errors[0]
    if first["type"] == "json_invalid":
        return MalformedMessageError(f"the body is not JSON: {first['msg'].removeprefix('Invalid JSON: ')}")
    if not first["loc"]:
        return MalformedMessageError("the body must be a JSON object")
    sent = _sent_names(errors)
    misnamed = _misnamed(model, sent, route)
    if misnamed is not None:
        return misnamed
    unknown = next((str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1), None)
    if unknown is not None:  # first: a misspelt field is more often the trouble than what its absence leaves
        return _invalid(unknown, f"not a field of {route}; its fields: {_fields(model)}")
    name = str(first["loc"][0])
    if first["type"] == "missing" and len(first["loc"]) == 1:
        return _invalid(name, "required" + _ignored(model, sent, route))
    annotation = model.model_fields[name].annotation if name in model.model_fields else None
    if annotation in _UNION_FORMS:
        return _union_error(model, name, annotation, errors, route)
    return _nested_error(model, first, errors)


def _ignored(model: type[BaseModel], sent: list[str], route: str) -> str:
    """The names sent that the route ignores (TEI's and KServe's), said beside a field found missing: perhaps one of
    them was meant."""
    ignored = [name for name in sent if name not in model.model_fields]
    if not ignored:
        return ""
    return f" ({', '.join(ignored)}: not {'a field' if len(ignored) == 1 else 'fields'} of {route}; its fields: " \
           f"{_fields(model)})"


def _invalid(field: str, problem: str) -> WireFieldError:
    return WireFieldError(f"{field}: {problem}", field=field, description=problem)


def _fields(model: type[BaseModel]) -> str:
    return ", ".join(model.model_fields)


def _sent_names(errors: list[ErrorDetails]) -> list[str]:
    """The body's top-level names, as far as its errors show them: a missing field's error holds the whole object,
    an unknown field's names it (pydantic parsed the body once; it is not parsed again)."""
    names: dict[str, None] = {}
    for error in errors:
        if len(error["loc"]) != 1:
            continue
        if error["type"] == "missing" and isinstance(error["input"], dict):
            names.update(dict.fromkeys(map(str, error["input"])))
        elif error["type"] == "extra_forbidden":
            names[str(error["loc"][0])] = None
    return list(names)


def _misnamed(model: type[BaseModel], sent: list[str], route: str) -> WireFieldError | None:
    others = OTHER_NAMES.get(model, {})
    name = next((n for n in sent if n in others and n not in model.model_fields), None)
    if name is None:
        return None
    ours, whose = others[name]
    return _invalid(name, f"not a field of {route} (it is {whose}): send {ours}")


def _union_error(model: type[BaseModel], name: str, annotation: object, errors: list[ErrorDetails],
                 route: str) -> WireFieldError:
    """One message for a union field (the inputs' forms), rather than one per form it failed to be; an image sent
    to a route of texts, or a float among token ids, said as such."""
    forms = _UNION_FORMS[annotation]
    # Each form's error sits under the field and a tag naming the form; its input is the field's whole value.
    value = next((e["input"] for e in errors if len(e["loc"]) == 2 and e["loc"][0] == name), None)
    where = _image_at(value) if annotation not in _TAKE_IMAGES else None
    if where is not None:
        return _invalid(name + where, f"an image, which {route} does not take: its inputs are "
                                      f"{forms}{_IMAGE_NOTES.get(model, '')}; {IMAGES_GO}")
    problem = f"must be {forms}"
    floats = [e["input"] for e in errors if e["type"] == "int_type" and isinstance(e["input"], float)]
    if floats:
        problem += f"; a token id {not_an_integer(floats[0])}"
    return _invalid(name, problem)


def _image_at(value: object) -> str | None:
    """Where an image is in a field's value ("" the value itself, "[2]" an element), in the forms other routes take
    one ({"image": ...}, an image_url part); None: there is none."""
    if _is_image(value):
        return ""
    if isinstance(value, list):
        return next((f"[{i}]" for i, item in enumerate(value) if _is_image(item)), None)
    return None


def _is_image(value: object) -> bool:
    return isinstance(value, dict) and ("image" in value or "image_url" in value)


def _nested_error(model: type[BaseModel], first: ErrorDetails, errors: list[ErrorDetails]) -> WireFieldError:
    error, parts, holder = _deepest(model, first, errors)
    field = _path(parts)
    kind = error["type"]
    if kind == "extra_forbidden":
        problem = f"not a field of {_path(parts[:-1])}" + (f"; its fields: {_fields(holder)}" if holder else "")
    elif kind == "missing":
        problem = "required"
    elif kind == "int_type" and isinstance(error["input"], float):
        problem = not_an_integer(error["input"])
    else:
        problem = error["msg"][0].lower() + error["msg"][1:]
    return _invalid(field, problem)


def _deepest(model: type[BaseModel], first: ErrorDetails, errors: list[ErrorDetails]
             ) -> tuple[ErrorDetails, list[str | int], type[BaseModel] | None]:
    """The error to tell, its path as the body names it, and the model holding its last part. Past a union, the
    error of the form the value came nearest to (the deepest: {"text": ..., "extra": 1} is an object with a field
    too many, rather than not a string)."""
    parts, holder, tag_at = _walk(model, first["loc"])
    if tag_at is None:
        return first, parts, holder
    prefix = tuple(first["loc"][:tag_at])
    deepest = max((e for e in errors if tuple(e["loc"][:tag_at]) == prefix), key=lambda e: len(e["loc"]))
    parts, holder, _ = _walk(model, deepest["loc"])
    return deepest, parts, holder


def _walk(model: type[BaseModel], loc: Loc) -> tuple[list[str | int], type[BaseModel] | None, int | None]:
    """pydantic's error location -> (the path as the body names it, pydantic's union tags left out; the model
    whose field, or unknown name, its last part is (None where the walk loses its way); where the first union tag
    was)."""
    parts: list[str | int] = []
    node: object = model
    holder: type[BaseModel] | None = None
    tag_at: int | None = None
    for i, part in enumerate(loc):
        node = _unwrap(node)
        if _is_union(node):  # several forms: pydantic's tag names the one this error is of
            tag_at = i if tag_at is None else tag_at
            node = _member(node, part)
            continue
        holder = node if isinstance(node, type) and issubclass(node, BaseModel) else None
        parts.append(part)
        node = _child(node, part)
    return parts, holder, tag_at


def _child(node: object, part: str | int) -> object:
    """The type of `part` of a value of type `node`; None where the walk cannot follow."""
    if isinstance(node, type) and issubclass(node, BaseModel):
        field = node.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field is not None else None
    origin, args = get_origin(node), get_args(node)
    if origin is list and isinstance(part, int):
        return args[0]
    if origin is tuple and isinstance(part, int) and args:
        return args[min(part, len(args) - 1)]
    if origin is dict and isinstance(part, str):
        return args[1]
    return None


def _unwrap(node: object) -> object:
    """Annotated's metadata dropped, and `X | None` read as X (pydantic's location names no form for it)."""
    while True:
        if get_origin(node) is Annotated:
            node = get_args(node)[0]
        elif _is_union(node) and len(_members(node)) == 1:
            node = _members(node)[0]
        else:
            return node


def _is_union(node: object) -> bool:
    return get_origin(node) in (Union, types.UnionType)


def _members(union: object) -> list[object]:
    return [member for member in get_args(union) if member is not type(None)]


def _member(union: object, tag: str | int) -> object:
    """The form pydantic's tag names: a model by its class name or its `type` (a discriminated union's tag), or the
    one form of its kind ("list[...]", "str"); None where that is not one form."""
    members = _members(union)
    for member in members:
        form = _unwrap(member)
        if isinstance(form, type) and issubclass(form, BaseModel) and (
                form.__name__ == tag or "type" in form.model_fields
                and tag in get_args(form.model_fields["type"].annotation)):
            return member
    kind = str(tag).split("[", 1)[0]
    same = [m for m in members if getattr(get_origin(_unwrap(m)) or _unwrap(m), "__name__", None) == kind]
    return same[0] if len(same) == 1 else None


def _path(parts: Sequence[str | int]) -> str:
    return str(parts[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[1:]) if parts else ""
