"""Cohere's v2 embed (POST /v2/embed) and rerank (POST /v2/rerank), and Cohere's and Infinity's v1 rerank
(POST /v1/rerank), as pydantic models (bodies.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from .bodies import (
    IMAGE_FORMS,
    TRUNCATE_UNSET,
    ContentParts,
    Dimensions,
    ImageString,
    MaxTokens,
    Positive,
    StrictBody,
    StrictPart,
    Text,
    Texts,
    Usage,
    given_one_of,
    marked,
)

# Cohere's v2 embed API (POST /v2/embed): its embedding types, base64 among them (the float32 bytes of each vector).
CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
CohereInputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
# "image" is Cohere's too, and refused here with a message (this server embeds texts): the description leaves it out.
TEXT_INPUT_TYPES = ["search_document", "search_query", "classification", "clustering"]


def _one_input_field(schema: dict) -> None:
    """texts, images or inputs: one of them, not null (images where the default model embeds images: openapi.py
    leaves only their null otherwise; inputs' image parts likewise)."""
    given_one_of(schema, ("texts", "images", "inputs"))


class CohereInput(StrictPart):
    """Cohere's `inputs` entry: its content parts, one embedding per entry (an image-text model embeds one part: a
    text or an image)."""

    content: ContentParts


class CohereEmbedBody(StrictBody):
    model: str = Field(description="a served model's name or alias; \"\": the server's default model")
    input_type: Annotated[CohereInputType | None, WithJsonSchema({"anyOf": [{"enum": TEXT_INPUT_TYPES},
                                                                         {"type": "null"}]}),
                          marked("cohere_input_type")] = Field(
        None, description="the model's prompt of that purpose where it has one (search_query: \"query\", "
                          "search_document: \"document\" or \"passage\", classification, clustering); otherwise "
                          "its default prompt; image (an image-text model's): the inputs are images")
    # Cohere's texts, images or inputs: one of them (the parser takes none or several, so that it is answered as
    # the door words it); a text model takes texts only (openapi.py leaves the other two out of its description).
    model_config = ConfigDict(json_schema_extra=lambda schema: _one_input_field(schema))
    texts: Texts | None = Field(None, description="the texts to embed")
    images: Annotated[list[ImageString] | None, Field(json_schema_extra={"minItems": 1}),
                      marked("nullable_images")] = Field(
        None, description=f"an image-text model's: the images to embed, each {IMAGE_FORMS}")
    inputs: Annotated[list[CohereInput] | None, Field(json_schema_extra={"minItems": 1})] = Field(
        None, description="inputs of content parts, one part each: a text part, or (an image-text model's) an "
                          "image_url part")
    embedding_types: Annotated[list[CohereEmbeddingType] | None, marked("cohere_types")] = Field(
        None, description="unset: float. int8 and uint8 use the model's calibrated ranges (engine/quantize.py); "
                          "binary and ubinary pack 8 dimensions a byte; base64: the float32 bytes of each vector")
    output_dimension: Dimensions = Field(None, description="keep the first N dimensions (Matryoshka), then "
                                                           "normalise, then quantize")
    max_tokens: MaxTokens = Field(None, description="refused unless at least max_seq_length: inputs are cut at "
                                                    "max_seq_length")
    truncate: Literal["NONE", "START", "END"] | None = Field(
        None, description="NONE refuses an input over max_seq_length; START cuts its start, END (the default) its "
                          "end")
    priority: int | None = Field(None, description="accepted and ignored")


class CohereEmbeddings(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    float_: list[list[float]] | None = Field(None, alias="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereEmbedReply(BaseModel):
    id: str
    embeddings: CohereEmbeddings = Field(description="each type asked, one list per text")
    texts: list[str]
    meta: dict
    response_type: Literal["embeddings_by_type"]


class RerankDocument(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    text: Text


class CohereRerankBody(StrictBody):
    query: Text
    documents: Annotated[list[Text | RerankDocument], Field(json_schema_extra={"minItems": 1})] = Field(
        description="strings, or objects with a `text`")
    model: str | None = Field(None, description="the served model's name or an alias; unset: the default model")
    top_n: Positive | None = Field(None, description="how many of the best results to return; unset: all")
    return_documents: bool = Field(False, description="return each document with its result")
    truncate: bool | None = Field(None, description="attnserve's: false refuses a (query, document) pair over "
                                                    "max_seq_length; " + TRUNCATE_UNSET)


class CohereV2RerankBody(StrictBody):
    """Cohere's v2 rerank (POST /v2/rerank), as cohere.ClientV2.rerank sends it."""

    model: str = Field(description="a served model's name or alias; \"\": the server's default model")
    query: Text
    documents: Texts = Field(description="each scored as the pair (query, document)")
    top_n: Positive | None = Field(None, description="how many of the best results to return; unset: all")
    max_tokens_per_doc: Positive | None = Field(
        None, description="each document cut to its first N tokens before it is scored; unset: as it is (a pair "
                          "over the model's max_seq_length is cut, as Cohere cuts long documents)")


class CohereV2RerankResult(BaseModel):
    index: int
    relevance_score: float


class CohereV2RerankReply(BaseModel):
    id: str
    results: list[CohereV2RerankResult] = Field(description="best first")
    meta: dict = Field(description="Cohere's ApiMeta: api_version and billed_units (search_units: 1)")


class CohereRerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = Field(None, description="present when return_documents")


class CohereRerankReply(BaseModel):
    id: str
    object: Literal["rerank"]
    results: list[CohereRerankResult] = Field(description="best first")
    model: str
    usage: Usage
