"""The JSON bodies of the HTTP routes, as pydantic models: what parses a request, and what /openapi.json
describes (openapi.py builds the spec from these same classes, so the description cannot drift from the parser).
This module holds what every door's bodies share: the field types, the input forms and their wording, the strict
and lenient bases; each door's bodies and replies are in a module of its own: openai_bodies.py, tei_bodies.py,
kserve_bodies.py, cohere_bodies.py (Cohere's embed and rerank, Infinity's rerank) and attnserve_bodies.py
(attention, multi-vector, late chunking, zero-shot).

Models are strict: a string is not a number, a number is not a boolean, 8.0 is not an integer. OpenAI's route,
Cohere's and attnserve's own refuse unknown fields, as OpenAI's API does; TEI's routes and KServe's ignore them, as
TEI and Triton do (their clients send fields that some routes do not take: tei-client sends `normalize` to
/embed_all). parsing.py reads a body with these and words what is wrong with it. The reply models are for the
description only: replies are written with orjson straight from numpy (replies.py in this package), and the tests
check them against these.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field

# What the description says of a field beyond its type, where the server refuses more than the type does: an
# empty or blank text, an empty list of inputs, a negative token id. Said in the schema only (json_schema_extra):
# the parser lets them through to the checks every door shares, whose messages name the input ("input 3: empty
# text"), so /openapi.json and the answers agree (schemathesis checks both, tests/test_http_schemathesis.py).
Text = Annotated[str, Field(json_schema_extra={"minLength": 1, "pattern": r"\S"})]  # not empty, not all blanks
# What the default model allows, put in by openapi.py where a field carries its mark (MODEL_MARK): a token id
# below its vocabulary size, a length from its max_seq_length up, dimensions up to its embedding size, the prompt
# names and tasks it has, ranges of its embedding size.
MODEL_MARK = "x-attnserve-model"


def marked(what: str) -> Field:  # type: ignore[valid-type]
    return Field(json_schema_extra={MODEL_MARK: what})


# A request's integers are JSON integers, 8 and not 8.0 or 8e0, on every door (strict: a float is refused, naming the
# integer to send), as OpenAI's API and TEI's serde read them. JSON Schema counts 8.0 an integer and has no word for
# how a number is written: /openapi.json says the rule in its description (openapi.py), docs/http.md too.
Positive = Annotated[int, Field(json_schema_extra={"minimum": 1})]
TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0, MODEL_MARK: "token_id"})]
Layer = Annotated[int, marked("layer")]  # -layers..layers-1
Head = Annotated[int, marked("head")]
PromptName = Annotated[str | None, marked("prompt_name")]
TaskName = Annotated[str | None, marked("task")]
Dimensions = Annotated[int | None, marked("dimensions")]
Ranges = Annotated[list[list[float]] | None, marked("ranges")]
MaxTokens = Annotated[int | None, marked("max_seq_length")]
Texts = Annotated[list[Text], Field(json_schema_extra={"minItems": 1})]
TokenIds = Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})]
TokenIdLists = Annotated[list[TokenIds], Field(json_schema_extra={"minItems": 1})]
# Sentence pairs take no prompt: none where the model has a default prompt (openapi.py).
Pairs = Annotated[list[tuple[Text, Text]], Field(json_schema_extra={"minItems": 1, MODEL_MARK: "pairs"})]

# A text, texts, one input's token ids (special tokens included) or several inputs' token ids.
Inputs = Union[Text, Texts, TokenIds, TokenIdLists]
INPUTS_FORMS = "a string, a list of strings, a list of token ids or a list of lists of token ids"
# An image as clients send one: a data URI (data:image/png;base64,...), bare base64, or an http(s) URL (fetched only
# from hosts the server allows: --allow-image-urls). Image forms are described where the default model embeds images
# (openapi.py leaves out what carries the "images" mark otherwise); a text model refuses them, naming why.
ImageString = Annotated[str, Field(json_schema_extra={"minLength": 1})]
IMAGE_FORMS = "an image: a data URI (data:image/png;base64,...), bare base64, or an http(s) URL the server allows"


class StrictPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class JinaText(StrictPart):
    """Jina's and Infinity's multimodal input: a text ..."""

    text: Text


class JinaImage(StrictPart):
    """... or an image."""

    image: ImageString = Field(description=IMAGE_FORMS)


class ImageUrlField(StrictPart):
    url: ImageString = Field(description=IMAGE_FORMS)
    detail: str | None = Field(None, description="accepted and ignored")


class ContentText(StrictPart):
    """OpenAI chat's content parts, as vLLM's embeddings `messages` and Cohere's `inputs` take them: a text ..."""

    type: Literal["text"]
    text: Text


class ContentImage(StrictPart):
    """... or an image (image_url.url): an image-text model's (openapi.py leaves it out for a text model)."""

    model_config = ConfigDict(json_schema_extra={MODEL_MARK: "images"})
    type: Literal["image_url"]
    image_url: ImageUrlField


ContentPart = Annotated[Union[ContentText, ContentImage], Field(discriminator="type")]
# One part: an image-text model embeds a text or an image, not both as one (its two towers).
ContentParts = Annotated[list[ContentPart], Field(json_schema_extra={"minItems": 1, "maxItems": 1})]
# Jina's form of `input`: texts and images, each an object ({"text": ...} or {"image": ...}).
MultimodalInputs = Annotated[list[Union[JinaText, JinaImage]], Field(json_schema_extra={"minItems": 1,
                                                                                        MODEL_MARK: "images"})]


# TEI's routes and attnserve's own also take sentence pairs, written as TEI's /predict writes them: [[a, b], ...]
# (a list of two strings alone already means two texts).
PairInputs = Union[Text, Texts, TokenIds, TokenIdLists, Pairs]
PAIR_INPUTS_FORMS = INPUTS_FORMS.replace(" or a list", ", a list") + " or a list of [text a, text b] pairs"
# A multi-vector model cuts at the end only, as sentence-transformers does (openapi.py).
TruncationDirection = Annotated[Literal["Right", "Left", "right", "left"], Field(
    json_schema_extra={MODEL_MARK: "truncation_direction"})]
TRUNCATE_UNSET = "unset: as the server's --long-inputs says (cut, by default)"
EncodingFormat = Literal["float", "base64"]
# A request's pooling (gRPC's EmbedRequest.pooling): the model's own, or mean or CLS pooling of its token embeddings.
RequestPooling = Literal["default", "mean", "cls"]
POOLING_DESCRIPTION = ("attnserve's, as gRPC's EmbedRequest.pooling: default (the model's own), mean or cls, computed "
                       "from the token embeddings (refused where the model's pipeline does more than pool and "
                       "normalise)")
Body = TypeVar("Body", bound=BaseModel)  # a route's body model: parse() returns that class, not BaseModel


_TEXTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


def _given(name: str) -> dict:
    return {"properties": {name: {"type": "string"}}, "required": [name]}


# prompt_name or prompt, not both (refused).
ONE_PROMPT: dict[str, Any] = {"not": {"allOf": [_given("prompt"), _given("prompt_name")]}}


def prompted_texts(field: str) -> dict:
    """The conditions on a body with `prompt` and `prompt_name`: one of them at most, and with one, texts in
    `field`, not token ids or pairs (a prompt goes before texts, and a pair takes none: refused)."""
    return {"allOf": [ONE_PROMPT, {"if": {"anyOf": [_given("prompt"), _given("prompt_name")]},
                                   "then": {"properties": {field: _TEXTS}}}]}


class StrictBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class LenientBody(BaseModel):
    """Unknown fields ignored, as TEI and Triton ignore them: TEI's routes and KServe's."""

    model_config = ConfigDict(strict=True, extra="ignore")


def given_one_of(schema: dict, names: tuple[str, ...]) -> None:
    """Exactly one of the fields `names` given, and not null (a null is the parser's "not given", as the field
    left out)."""
    schema["oneOf"] = [{"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in names]


class Usage(BaseModel):
    prompt_tokens: int = Field(description="tokens the model saw, special tokens included")
    total_tokens: int
