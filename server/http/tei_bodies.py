"""text-embeddings-inference's routes (/embed, /embed_all, /embed_sparse, /predict, /rerank, /similarity,
/tokenize, /decode, /info) and its error body, as pydantic models (bodies.py); attnserve's additions are described
as its own."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from .bodies import (
    MODEL_MARK,
    ONE_PROMPT,
    PAIR_INPUTS_FORMS,
    POOLING_DESCRIPTION,
    TRUNCATE_UNSET,
    Dimensions,
    JinaImage,
    LenientBody,
    PairInputs,
    Positive,
    PromptName,
    Ranges,
    RequestPooling,
    TaskName,
    Text,
    Texts,
    TokenId,
    TokenIds,
    TruncationDirection,
    marked,
    prompted_texts,
)

# /decode's ids: one text's, or several texts' (an empty list among them is the empty text).
DecodeIds = Union[TokenIds, Annotated[list[list[TokenId]], Field(json_schema_extra={"minItems": 1})]]
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]


class _TeiModelBody(LenientBody):
    """A TEI route's body. TEI serves one model and has no `model` field; attnserve serves several, so the field
    names one (never ignored: a body naming a model not served is refused with the names of those served)."""

    model: str | None = Field(None, description="attnserve's: a served model's name or alias (GET /v1/models lists "
                                                "them); unset or \"\": the server's default model")


class TeiEmbedBody(_TeiModelBody):
    # ranges are for int8 and uint8 only (refused beside another type, which they would not change); a prompt goes
    # before texts.
    # int8 and uint8 under another pooling than the model's need ranges (openapi.py: MODEL_MARK "ranged_pooling").
    model_config = ConfigDict(json_schema_extra={MODEL_MARK: "ranged_pooling", "allOf": [
        {"if": {"properties": {"embedding_type": {"enum": ["float", "binary", "ubinary"]}}},
         "then": {"properties": {"ranges": {"type": "null"}}}}, *prompted_texts("inputs")["allOf"]]})
    inputs: PairInputs = Field(description=PAIR_INPUTS_FORMS)
    normalize: bool = True
    truncate: bool | None = Field(None, description="false: an input over max_seq_length is refused; true: it "
                                                    "is cut; " + TRUNCATE_UNSET)
    truncation_direction: TruncationDirection = "Right"
    dimensions: Dimensions = None
    prompt_name: PromptName = Field(None, description="a prompt of the model's to put before each text; unset: "
                                                      "the model's default prompt, if any")
    prompt: str | None = Field(None, description="attnserve's: a raw prompt to put before each text")
    task: TaskName = Field(None, description="attnserve's: the task adapter to encode with (gRPC GetModelInfo.tasks; "
                                               "jina-embeddings-v3: retrieval.query, retrieval.passage, separation, "
                                               "classification, text-matching); unset: no adapter")
    embedding_type: EmbeddingType = Field(
        "float", description="attnserve's: float, or int8, uint8 (the model's calibrated ranges, or `ranges`), binary "
                             "or ubinary (8 dimensions a byte), as sentence-transformers' quantize_embeddings gives")
    ranges: Ranges = Field(
        None, description="attnserve's: int8 / uint8 ranges, [minima, maxima] of each dimension returned: as many "
                          "columns as `dimensions` says where it is set, else the embedding's size; each minimum at "
                          "most its maximum")
    pooling: Annotated[RequestPooling, marked("pooling")] = Field("default", description=POOLING_DESCRIPTION)


class TeiEmbedAllBody(_TeiModelBody):
    model_config = ConfigDict(json_schema_extra=prompted_texts("inputs"))  # a prompt goes before texts
    inputs: PairInputs = Field(description=PAIR_INPUTS_FORMS)
    truncate: bool | None = Field(None, description=TRUNCATE_UNSET)
    truncation_direction: TruncationDirection = "Right"
    prompt_name: PromptName = None
    prompt: str | None = None


class TeiTokenizeBody(_TeiModelBody):
    model_config = ConfigDict(json_schema_extra=ONE_PROMPT)
    inputs: Union[Text, Texts]
    add_special_tokens: bool = True
    prompt_name: PromptName = None
    prompt: str | None = None


class TeiDecodeBody(_TeiModelBody):
    ids: DecodeIds
    skip_special_tokens: bool = True


class TeiRerankBody(_TeiModelBody):
    query: Text
    texts: Texts = Field(description="each scored as the pair (query, text)")
    raw_scores: bool = Field(False, description="the raw logits rather than the model's activation (a sigmoid)")
    return_text: bool = False
    truncate: bool | None = Field(None, description="false: a pair over max_seq_length is refused; true: it is "
                                                    "cut; " + TRUNCATE_UNSET)
    truncation_direction: TruncationDirection = "Right"


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = Field(None, description="present when return_text")


class TeiToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="character offset into the input; null for a special token")
    stop: int | None


class TeiEmbeddingModel(BaseModel):
    pooling: str


class TeiClassifierModel(BaseModel):
    id2label: dict[str, str]
    label2id: dict[str, int]


class TeiModelType(BaseModel):
    embedding: TeiEmbeddingModel | None = Field(None, description="an embedding model")
    reranker: TeiClassifierModel | None = Field(None, description="a reranker (a cross-encoder of one label)")
    classifier: TeiClassifierModel | None = Field(None, description="a classifier (several labels: /predict)")


class TeiInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: TeiModelType
    served_model_name: str = Field(description="the name the model is served under (TEI's --served-model-name)")
    max_concurrent_requests: int = Field(description="the most requests the queue can hold at once: its token "
                                                     "budget (max_queue_tokens), since each holds a token at least")
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    long_inputs: Literal["truncate", "chunk", "refuse"] = Field(
        description="attnserve's: what an over-long input gets when its request does not say truncate (--long-inputs)")
    tokenization_workers: int = Field(description="the threads that tokenize requests and render replies")
    version: str
    sha: str | None
    docker_label: str | None
    outputs: list[str] = Field(description="attnserve's: what the model answers (embed, attention, similarity; "
                                           "rerank, predict)")
    embedding_types: list[str] = Field(description="attnserve's: the embedding types a request may ask for "
                                                   "without ranges of its own")


class TeiError(BaseModel):
    error: str
    error_type: str


class TeiEmbedSparseBody(_TeiModelBody):
    model_config = ConfigDict(json_schema_extra=prompted_texts("inputs"))  # a prompt goes before texts
    inputs: PairInputs = Field(description=PAIR_INPUTS_FORMS)
    truncate: bool | None = Field(None, description="false: an input over max_seq_length is refused; true: it "
                                                    "is cut; " + TRUNCATE_UNSET)
    truncation_direction: TruncationDirection = "Right"
    prompt_name: PromptName = Field(None, description="a prompt of the model's to put before each text; unset: "
                                                      "the model's default prompt, if any")
    prompt: str | None = Field(None, description="attnserve's: a raw prompt to put before each text")
    top_k: Positive | None = Field(None, description="attnserve's: keep the k largest weights of each input "
                                                "(sentence-transformers' max_active_dims); unset: all above 0")
    return_tokens: bool = Field(False, description="attnserve's: each weight's vocabulary token, as `token`")


# /predict's: a text, a pair [a, b], or a batch of texts, [text] and [a, b] lists.
PredictInputs = Union[Text, Annotated[list[Union[Text, Annotated[list[Text], Field(json_schema_extra={
    "minItems": 1, "maxItems": 2})]]], Field(json_schema_extra={"minItems": 1})]]
PREDICT_FORMS = "a text, a pair [a, b], or a list of texts, [text] and [a, b] lists"


class TeiPredictBody(_TeiModelBody):
    inputs: PredictInputs = Field(
        description="a text; a pair [a, b]; or a batch: a list of texts, [text] and [a, b] lists (TEI's forms: a "
                    "list of exactly two strings is one pair)")
    raw_scores: bool = Field(False, description="the logits; false: softmax over the labels, or a sigmoid for one "
                                                "label or a multi-label classifier, as transformers' pipeline")
    truncate: bool | None = Field(None, description="false: an input over max_seq_length is refused; true: it "
                                                    "is cut; " + TRUNCATE_UNSET)
    truncation_direction: TruncationDirection = "Right"


# A sentence of /similarity: a text, or (an image-text model's) an image as {"image": ...}.
ImageObject = Annotated[JinaImage, marked("images")]


class TeiSimilarityInputs(LenientBody):
    source_sentence: Union[Text, ImageObject] = Field(description="a text, or (an image-text model's) {\"image\": "
                                                                  "...}")
    sentences: Annotated[list[Union[Text, ImageObject]], Field(json_schema_extra={"minItems": 1})] = Field(
        description="each compared with source_sentence: texts, or (an image-text model's) {\"image\": ...} too")


class TeiSimilarityParameters(LenientBody):
    """TEI's SimilarityParameters: where TEI's /similarity takes its options."""

    model_config = ConfigDict(json_schema_extra=ONE_PROMPT)

    truncate: bool | None = Field(None, description="false: an input over max_seq_length is refused; true: it "
                                                    "is cut; " + TRUNCATE_UNSET)
    truncation_direction: TruncationDirection | None = Field(None, description="Right (the default) or Left")
    prompt_name: PromptName = Field(None, description="a prompt of the model's to put before each sentence; unset: "
                                                      "the model's default prompt, if any")
    prompt: str | None = Field(None, description="attnserve's: a raw prompt to put before each sentence")


def _nested(name: str) -> dict:
    # "type": "object": properties and required hold of any non-object, so parameters: null would count as given
    return {"properties": {"parameters": {"type": "object", "properties": {name: {"not": {"type": "null"}}},
                                          "required": [name]}},
            "required": ["parameters"]}


def _one_place(schema: dict) -> None:
    """Each option in `parameters` or at the top level, not both; prompt_name or prompt, wherever given."""
    def top(name: str) -> dict:
        return {"properties": {name: {"not": {"type": "null"}}}, "required": [name]}

    options = ("truncate", "truncation_direction", "prompt_name", "prompt")
    schema["allOf"] = [*({"not": {"allOf": [top(n), _nested(n)]}} for n in options),
                       {"not": {"allOf": [{"anyOf": [top("prompt"), _nested("prompt")]},
                                          {"anyOf": [top("prompt_name"), _nested("prompt_name")]}]}}]
    schema.pop("not", None)  # the parameters' own rule, inherited, is in allOf's last


class TeiSimilarityBody(TeiSimilarityParameters, _TeiModelBody):
    """The options TEI takes under `parameters`, also taken at the top level (attnserve's older place)."""

    model_config = ConfigDict(json_schema_extra=lambda schema: _one_place(schema))

    inputs: TeiSimilarityInputs
    parameters: TeiSimilarityParameters | None = Field(
        None, description="TEI's place for truncate, truncation_direction and prompt_name; each may be given at the "
                          "top level instead (attnserve's), but not both ways with different values")
