"""attnserve's own routes: attention (POST /v1/attention) and its maps, multi-vector embeddings (POST
/embed_multi), late chunking (POST /embed_chunks) and zero-shot classification (POST /v1/zero_shot), as pydantic
models (bodies.py)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from .bodies import (
    IMAGE_FORMS,
    ONE_PROMPT,
    PAIR_INPUTS_FORMS,
    TRUNCATE_UNSET,
    Dimensions,
    EncodingFormat,
    Head,
    ImageString,
    Layer,
    MultimodalInputs,
    PairInputs,
    Positive,
    PromptName,
    StrictBody,
    TaskName,
    Text,
    Texts,
    TruncationDirection,
    Usage,
)


class AttentionBody(StrictBody):
    # weights false with no analyses asks for nothing, and is refused.
    model_config = ConfigDict(json_schema_extra={
        "if": {"properties": {"weights": {"const": False}}, "required": ["weights"]},
        "then": {"properties": {"analyses": {"minItems": 1}}, "required": ["analyses"]}})
    inputs: Union[PairInputs, MultimodalInputs] = Field(
        description=PAIR_INPUTS_FORMS + " or (an image-text model's) a list of {\"image\": ...} objects")
    model: str | None = Field(None, description="a served model's name or alias; unset: the default model")
    layers: list[Layer] = Field(default_factory=list, description="layers in this order; empty: the last; "
                                                                "negative indices count from the end")
    heads: list[Head] = Field(default_factory=list, description="heads in this order; empty: every head")
    average_heads: bool = Field(False, description="average the chosen heads: the heads axis has size 1")
    analyses: list[Literal["rollout", "head_stats", "norms"]] = Field(
        default_factory=list, description="analyses computed in the server: of every layer's every head, rollout "
                                          "(Abnar & Zuidema, 2020: [tokens, tokens]) and head_stats ([layers, heads] "
                                          "grids, docs/attention.md); of the layers and heads asked, norms "
                                          "(Kobayashi et al., 2020: [layers, heads, tokens, tokens], and "
                                          "norms_summed, [layers, tokens, tokens])")
    weights: bool = Field(True, description="return the chosen layers' and heads' weights; false: the analyses "
                                            "alone")
    truncate: bool | None = Field(None, description="true cuts inputs longer than max_seq_length, false refuses "
                                                    "them; " + TRUNCATE_UNSET)
    truncation_direction: TruncationDirection = "Right"
    encoding_format: EncodingFormat = Field(
        "float", description="float: nested lists; base64: the little-endian float32 bytes, row-major in `shape`")


class PatchPositions(BaseModel):
    size: int | None = Field(description="the side of the square image the tower takes (after resize and crop); "
                                         "null where it is not square (SigLIP 2's NaFlex: height and width)")
    patch_size: int
    grid: int | None = Field(description="patches along a side of a square image; null where it is not square")
    height: int = Field(description="the image the tower takes, in pixels")
    width: int
    rows: int = Field(description="its patches: rows x cols in row-major order")
    cols: int
    class_token: bool = Field(description="whether the first position is the class token (CLIP), not a patch")
    fit: Literal["crop", "stretch", "patches"] = Field(
        description="how the picture became that image: its shortest edge resized to size, then the center square "
                    "(crop: CLIP), resized to size x size (stretch: SigLIP), or resized to whole patches, its "
                    "aspect ratio kept as near as they allow (patches: SigLIP 2's NaFlex)")
    boxes: list[list[int]] = Field(description="each position's [top, left, bottom, right] in that image, in the "
                                               "maps' order (the class token's: the whole image)")


class AttentionMap(BaseModel):
    index: int
    tokens: list[str] = Field(description="the word pieces, special tokens included: the labels of both axes")
    num_tokens: int
    truncated: bool
    pair_start: int | None = Field(None, description="for a pair: the index of the first token of segment b")
    layers: list[int] = Field(description="the layers returned, as non-negative indices")
    heads: list[int] | None = Field(description="the heads returned or averaged")
    reach: list[list[int | None]] | None = Field(
        None, description="a text's: per layer returned, [behind, ahead], how far before and after a query its keys "
                          "may lie (null: no bound; [null, 0] causal): cells beyond it are masked by the model's "
                          "structure, not weights that came out 0. Unset where the artifacts predate it")
    shape: list[int] | None = Field(None, description="[layers, heads or 1, tokens, tokens]; each row sums to 1; "
                                                      "unset with weights false")
    attentions: list | str | None = Field(None, description="the weights, unset with weights false")
    rollout: list | str | None = Field(None, description="[tokens, tokens], if asked; rows sum to 1")
    head_stats: dict[str, list | str] | None = Field(None, description="statistic -> [layers, heads], if asked")
    norms: list | str | None = Field(None, description="[layers, heads, tokens, tokens] ||a_ij f_h(x_j)||, if asked")
    norms_summed: list | str | None = Field(None, description="[layers, tokens, tokens]: norms summed over each "
                                                              "layer's heads, if asked")
    image: PatchPositions | None = Field(None, description="an image's: where its positions lie")


class AttentionReply(BaseModel):
    object: Literal["list"]
    model: str
    data: list[AttentionMap]
    usage: Usage


class MultiVectorBody(StrictBody):
    inputs: Union[Text, Texts] = Field(description="a text or a list of texts")
    input_type: Literal["query", "document"] = Field(
        "document", description="encode the texts as queries (the model's query prompt, length and expansion) or "
                                "as documents (its document prompt and length; its skip-list tokens left out)")
    encoding_format: EncodingFormat = Field(
        "float", description="float: each input's [tokens, dim] vectors; base64: their row-major little-endian "
                             "float32 bytes (tokens x dim floats)")
    truncate: bool | None = Field(None, description="false: an input over its type's length is refused; true: it "
                                                    "is cut; unset: as the server's --long-inputs says")
    model: str = Field("", description="a served model's name or alias; \"\": the server's default model")


# A chunk of a text: its characters [start, stop), counted in Unicode code points (as JSON indexes a string); the
# server refuses a span past the text's end, or one no token starts in (engine/late_chunking.py).
Span = Annotated[list[Annotated[int, Field(json_schema_extra={"minimum": 0})]],
                 Field(json_schema_extra={"minItems": 2, "maxItems": 2})]
TextSpans = Annotated[list[Span], Field(json_schema_extra={"minItems": 1})]


class LateChunkingBody(StrictBody):
    """attnserve's POST /embed_chunks: late chunking (Günther et al., 2024)."""

    # spans or a chunker, one of them; chunk_tokens with the tokens chunker only; prompt or prompt_name
    model_config = ConfigDict(json_schema_extra={"allOf": [
        ONE_PROMPT, {"oneOf": [{"properties": {"spans": {"type": "array"}}, "required": ["spans"]},
                               {"properties": {"chunker": {"type": "string"}}, "required": ["chunker"]}]},
        {"if": {"properties": {"chunk_tokens": {"type": "integer"}}, "required": ["chunk_tokens"]},
         "then": {"properties": {"chunker": {"const": "tokens"}}, "required": ["chunker"]}}]})
    inputs: Union[Text, Texts] = Field(description="a text (a document) or a list of texts, each read whole, in "
                                                   "windows of max_seq_length tokens where it is longer")
    spans: list[TextSpans] | None = Field(
        None, description="one list per input of its chunks' [start, stop) character spans (Unicode code points); "
                          "each must lie in its text, and some token of the text must start in it")
    chunker: Literal["sentences", "tokens"] | None = Field(
        None, description="instead of spans: sentences (a sentence ends at . ! ? followed by white space, or at a "
                          "line break) or tokens (every chunk_tokens of the text's tokens)")
    chunk_tokens: Positive | None = Field(None, description="the tokens chunker's chunk size; unset: 64")
    normalize: bool = Field(True, description="L2-normalise the text's and each chunk's embedding")
    dimensions: Dimensions = Field(None, description="keep the first N dimensions, then normalise")
    prompt_name: PromptName = Field(None, description="a prompt of the model's to put before each window of the "
                                                      "text; unset: the model's default prompt, if any")
    prompt: str | None = Field(None, description="a raw prompt to put before each window of the text")
    task: TaskName = Field(None, description="the task adapter to encode with (jina-embeddings-v3); unset: none")
    encoding_format: EncodingFormat = Field(
        "float", description="float, or base64: the little-endian float32 bytes of each vector")
    model: str = Field("", description="a served model's name or alias; \"\": the server's default model")


class ZeroShotBody(StrictBody):
    """Zero-shot classification by an image-text model: each image's score for each label, as CLIP's softmax over
    the labels or SigLIP's sigmoid of each."""

    model: str = Field("", description="a served model's name or alias; \"\": the server's default model")
    images: Annotated[list[ImageString], Field(json_schema_extra={"minItems": 1})] = Field(
        description=f"the images to classify, each {IMAGE_FORMS}")
    labels: Annotated[list[Text], Field(json_schema_extra={"minItems": 1})] = Field(
        description="the candidate labels, each a text")
    template: str = Field("{}", description="the text each label is put into ({} for the label), as CLIP's "
                                            "\"a photo of a {}.\"; default: the label alone")


class ZeroShotScore(BaseModel):
    label: str
    score: float = Field(description="CLIP: the softmax over the labels; SigLIP: the sigmoid of the label's logit")
    logit: float = Field(description="the cosine x the model's logit scale (+ its bias)")


class ZeroShotResult(BaseModel):
    index: int = Field(description="the image's, in the request")
    scores: list[ZeroShotScore] = Field(description="every label's, best first")


class ZeroShotReply(BaseModel):
    object: Literal["list"]
    data: list[ZeroShotResult]
    activation: Literal["softmax", "sigmoid"]
    model: str
    usage: Usage
