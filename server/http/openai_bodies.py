"""OpenAI's embeddings API (POST /v1/embeddings, vLLM's `messages` form too), Infinity's POST /embeddings_image,
GET /v1/models and OpenAI's error envelope, as pydantic models (bodies.py)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from .bodies import (
    IMAGE_FORMS,
    INPUTS_FORMS,
    POOLING_DESCRIPTION,
    TRUNCATE_UNSET,
    ContentParts,
    Dimensions,
    EncodingFormat,
    ImageString,
    Inputs,
    MultimodalInputs,
    PromptName,
    RequestPooling,
    StrictBody,
    StrictPart,
    TaskName,
    Text,
    Usage,
    given_one_of,
    marked,
    prompted_texts,
)

OPENAI_INPUTS_FORMS = INPUTS_FORMS.replace(" or a list of lists", ", a list of lists") + (
    " or (an image-text model's, as Jina's API) a list of {\"text\": ...} and {\"image\": ...} objects")


class ChatMessage(StrictPart):
    """vLLM's multimodal embeddings request: the message's content is one input, a text or one image."""

    role: str
    content: Union[Text, ContentParts]


def _input_or_messages(schema: dict) -> None:
    """`input`, or vLLM's `messages`: one of them."""
    schema.setdefault("allOf", []).extend(prompted_texts("input")["allOf"])
    given_one_of(schema, ("input", "messages"))


class OpenAIEmbeddingsBody(StrictBody):
    model_config = ConfigDict(json_schema_extra=_input_or_messages)  # a prompt goes before texts
    input: Union[Inputs, MultimodalInputs, None] = Field(
        None, description=f"{OPENAI_INPUTS_FORMS}; token ids include the special tokens ([CLS] ... [SEP])")
    messages: Annotated[list[ChatMessage] | None, Field(json_schema_extra={"minItems": 1, "maxItems": 1})] = Field(
        None, description="vLLM's form, instead of input: one input, the content of the messages (a text, or an "
                          "image-text model's one image as an image_url part)")
    model: str = Field(description="a served model's name or alias (GET /v1/models lists them); \"\": the "
                                   "server's default model")
    encoding_format: EncodingFormat | None = Field(
        None, description="float (the default) or base64: the little-endian float32 bytes of each vector")
    dimensions: Dimensions = Field(None, description="keep the first N dimensions, then L2-normalise")
    user: str | None = Field(None, description="accepted and ignored")
    truncate: bool | None = Field(None, description="attnserve's: true cuts inputs longer than max_seq_length, "
                                                    "false refuses them; " + TRUNCATE_UNSET)
    prompt_name: PromptName = Field(None, description="attnserve's, as sentence-transformers and TEI name it: a "
                                                      "prompt of the model's to put before each text; unset: the "
                                                      "model's default prompt, if any")
    prompt: str | None = Field(None, description="attnserve's: a raw prompt to put before each text, instead of "
                                                 "prompt_name")
    task: TaskName = Field(None, description="attnserve's: the task adapter to encode with (gRPC GetModelInfo.tasks; "
                                               "jina-embeddings-v3: retrieval.query, retrieval.passage, separation, "
                                               "classification, text-matching); unset: no adapter")
    pooling: Annotated[RequestPooling, marked("pooling")] = Field("default", description=POOLING_DESCRIPTION)


class InfinityImagesBody(StrictBody):
    """Infinity's POST /embeddings_image: images (URLs, data URIs or base64) -> OpenAI's reply."""

    input: Annotated[Union[ImageString, Annotated[list[ImageString], Field(json_schema_extra={"minItems": 1})]],
                     marked("images")] = Field(description=f"{IMAGE_FORMS}, or a list of them")
    model: str = Field(description="a served model's name or alias; \"\": the server's default model")
    encoding_format: EncodingFormat | None = Field(
        None, description="float (the default) or base64: the little-endian float32 bytes of each vector")
    dimensions: Dimensions = Field(None, description="keep the first N dimensions, then L2-normalise")
    user: str | None = Field(None, description="accepted and ignored")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class OpenAIEmbeddingsReply(BaseModel):
    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    outputs: list[str] = Field(description="attnserve's: what the model answers (embed, attention, similarity; "
                                           "rerank, predict)")
    image_tower: dict[str, int] | None = Field(None, description="attnserve's, an image-text model's: its image "
                                                                 "tower's image_size, patch_size, num_layers, "
                                                                 "num_heads and max_patches (SigLIP 2's NaFlex: each "
                                                                 "image at its own size, up to that many patches; "
                                                                 "image_size 0)")


class OpenAIModelList(BaseModel):
    object: Literal["list"]
    data: list[OpenAIModel]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail
