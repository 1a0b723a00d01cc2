"""The JSON bodies of the HTTP routes, as pydantic models: what parses a request, and what /openapi.json
describes (openapi.py builds the spec from these same classes, so the description cannot drift from the parser).

Models are strict: a string is not a number, a number is not a boolean, 8.0 is not an integer. OpenAI's route,
Cohere's and attnserve's own refuse unknown fields, as OpenAI's API does; TEI's routes and KServe's ignore them, as
TEI and Triton do (their clients send fields that some routes do not take: tei-client sends `normalize` to
/embed_all). parsing.py reads a body with these and words what is wrong with it. The reply models are for the
description only: replies are written with orjson straight from numpy (replies.py in this package), and the tests
check them against these.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

# What the description says of a field beyond its type, where the server refuses more than the type does: an
# empty or blank text, an empty list of inputs, a negative token id. Said in the schema only (json_schema_extra):
# the parser lets them through to the checks every door shares, whose messages name the input ("input 3: empty
# text"), so /openapi.json and the answers agree (schemathesis checks both, tests/test_http_schemathesis.py).
Text = Annotated[str, Field(json_schema_extra={"minLength": 1, "pattern": r"\S"})]  # not empty, not all blanks
# What the default model allows, put in by openapi.py where a field carries its mark (MODEL_MARK): a token id
# below its vocabulary size, a length from its max_seq_length up, dimensions up to its embedding size, the prompt
# names and tasks it has, ranges of its embedding size.
MODEL_MARK = "x-attnserve-model"


def _marked(what: str) -> Field:  # type: ignore[valid-type]
    return Field(json_schema_extra={MODEL_MARK: what})


# A request's integers are JSON integers, 8 and not 8.0 or 8e0, on every door (strict: a float is refused, naming the
# integer to send), as OpenAI's API and TEI's serde read them. JSON Schema counts 8.0 an integer and has no word for
# how a number is written: /openapi.json says the rule in its description (openapi.py), docs/http.md too.
Positive = Annotated[int, Field(json_schema_extra={"minimum": 1})]
TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0, MODEL_MARK: "token_id"})]
Layer = Annotated[int, _marked("layer")]  # -layers..layers-1
Head = Annotated[int, _marked("head")]
PromptName = Annotated[str | None, _marked("prompt_name")]
TaskName = Annotated[str | None, _marked("task")]
Dimensions = Annotated[int | None, _marked("dimensions")]
Ranges = Annotated[list[list[float]] | None, _marked("ranges")]
MaxTokens = Annotated[int | None, _marked("max_seq_length")]
Texts = Annotated[list[Text], Field(json_schema_extra={"minItems": 1})]
TokenIds = Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})]
TokenIdLists = Annotated[list[TokenIds], Field(json_schema_extra={"minItems": 1})]
# Sentence pairs take no prompt: none where the model has a default prompt (openapi.py).
Pairs = Annotated[list[tuple[Text, Text]], Field(json_schema_extra={"minItems": 1, MODEL_MARK: "pairs"})]
# /decode's ids: one text's, or several texts' (an empty list among them is the empty text).
DecodeIds = Union[TokenIds, Annotated[list[list[TokenId]], Field(json_schema_extra={"minItems": 1})]]

# A text, texts, one input's token ids (special tokens included) or several inputs' token ids.
Inputs = Union[Text, Texts, TokenIds, TokenIdLists]
INPUTS_FORMS = "a string, a list of strings, a list of token ids or a list of lists of token ids"
# An image as clients send one: a data URI (data:image/png;base64,...), bare base64, or an http(s) URL (fetched only
# from hosts the server allows: --allow-image-urls). Image forms are described where the default model embeds images
# (openapi.py leaves out what carries the "images" mark otherwise); a text model refuses them, naming why.
ImageString = Annotated[str, Field(json_schema_extra={"minLength": 1})]
IMAGE_FORMS = "an image: a data URI (data:image/png;base64,...), bare base64, or an http(s) URL the server allows"


class _StrictPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class JinaText(_StrictPart):
    """Jina's and Infinity's multimodal input: a text ..."""

    text: Text


class JinaImage(_StrictPart):
    """... or an image."""

    image: ImageString = Field(description=IMAGE_FORMS)


class ImageUrlField(_StrictPart):
    url: ImageString = Field(description=IMAGE_FORMS)
    detail: str | None = Field(None, description="accepted and ignored")


class ContentText(_StrictPart):
    """OpenAI chat's content parts, as vLLM's embeddings `messages` and Cohere's `inputs` take them: a text ..."""

    type: Literal["text"]
    text: Text


class ContentImage(_StrictPart):
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


class ChatMessage(_StrictPart):
    """vLLM's multimodal embeddings request: the message's content is one input, a text or one image."""

    role: str
    content: Union[Text, ContentParts]


# TEI's routes and attnserve's own also take sentence pairs, written as TEI's /predict writes them: [[a, b], ...]
# (a list of two strings alone already means two texts).
PairInputs = Union[Text, Texts, TokenIds, TokenIdLists, Pairs]
PAIR_INPUTS_FORMS = INPUTS_FORMS.replace(" or a list", ", a list") + " or a list of [text a, text b] pairs"
# A multi-vector model cuts at the end only, as sentence-transformers does (openapi.py).
TruncationDirection = Annotated[Literal["Right", "Left", "right", "left"], Field(
    json_schema_extra={MODEL_MARK: "truncation_direction"})]
TRUNCATE_UNSET = "unset: as the server's --long-inputs says (cut, by default)"
EncodingFormat = Literal["float", "base64"]
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
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
_ONE_PROMPT: dict[str, Any] = {"not": {"allOf": [_given("prompt"), _given("prompt_name")]}}


def _prompted_texts(field: str) -> dict:
    """The conditions on a body with `prompt` and `prompt_name`: one of them at most, and with one, texts in
    `field`, not token ids or pairs (a prompt goes before texts, and a pair takes none: refused)."""
    return {"allOf": [_ONE_PROMPT, {"if": {"anyOf": [_given("prompt"), _given("prompt_name")]},
                                    "then": {"properties": {field: _TEXTS}}}]}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _TeiBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _TeiModelBody(_TeiBody):
    """A TEI route's body. TEI serves one model and has no `model` field; attnserve serves several, so the field
    names one (never ignored: a body naming a model not served is refused with the names of those served)."""

    model: str | None = Field(None, description="attnserve's: a served model's name or alias (GET /v1/models lists "
                                                "them); unset or \"\": the server's default model")


# --- OpenAI -----------------------------------------------------------------

OPENAI_INPUTS_FORMS = INPUTS_FORMS.replace(" or a list of lists", ", a list of lists") + (
    " or (an image-text model's, as Jina's API) a list of {\"text\": ...} and {\"image\": ...} objects")


def _given_one_of(schema: dict, names: tuple[str, ...]) -> None:
    """Exactly one of the fields `names` given, and not null (a null is the parser's "not given", as the field
    left out)."""
    schema["oneOf"] = [{"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in names]


def _input_or_messages(schema: dict) -> None:
    """`input`, or vLLM's `messages`: one of them."""
    schema.setdefault("allOf", []).extend(_prompted_texts("input")["allOf"])
    _given_one_of(schema, ("input", "messages"))


class OpenAIEmbeddingsBody(_Strict):
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
    pooling: Annotated[RequestPooling, _marked("pooling")] = Field("default", description=POOLING_DESCRIPTION)


class InfinityImagesBody(_Strict):
    """Infinity's POST /embeddings_image: images (URLs, data URIs or base64) -> OpenAI's reply."""

    input: Annotated[Union[ImageString, Annotated[list[ImageString], Field(json_schema_extra={"minItems": 1})]],
                     _marked("images")] = Field(description=f"{IMAGE_FORMS}, or a list of them")
    model: str = Field(description="a served model's name or alias; \"\": the server's default model")
    encoding_format: EncodingFormat | None = Field(
        None, description="float (the default) or base64: the little-endian float32 bytes of each vector")
    dimensions: Dimensions = Field(None, description="keep the first N dimensions, then L2-normalise")
    user: str | None = Field(None, description="accepted and ignored")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int = Field(description="tokens the model saw, special tokens included")
    total_tokens: int


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


# --- text-embeddings-inference ----------------------------------------------

class TeiEmbedBody(_TeiModelBody):
    # ranges are for int8 and uint8 only (refused beside another type, which they would not change); a prompt goes
    # before texts.
    # int8 and uint8 under another pooling than the model's need ranges (openapi.py: MODEL_MARK "ranged_pooling").
    model_config = ConfigDict(json_schema_extra={MODEL_MARK: "ranged_pooling", "allOf": [
        {"if": {"properties": {"embedding_type": {"enum": ["float", "binary", "ubinary"]}}},
         "then": {"properties": {"ranges": {"type": "null"}}}}, *_prompted_texts("inputs")["allOf"]]})
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
    pooling: Annotated[RequestPooling, _marked("pooling")] = Field("default", description=POOLING_DESCRIPTION)


class TeiEmbedAllBody(_TeiModelBody):
    model_config = ConfigDict(json_schema_extra=_prompted_texts("inputs"))  # a prompt goes before texts
    inputs: PairInputs = Field(description=PAIR_INPUTS_FORMS)
    truncate: bool | None = Field(None, description=TRUNCATE_UNSET)
    truncation_direction: TruncationDirection = "Right"
    prompt_name: PromptName = None
    prompt: str | None = None


class TeiTokenizeBody(_TeiModelBody):
    model_config = ConfigDict(json_schema_extra=_ONE_PROMPT)
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


# --- KServe v2 (the Open Inference Protocol, as Triton speaks it) -------------

# A tensor's data in JSON: row-major, flat or nested as its shape (KServe allows both).
TensorData = list[Union[str, int, float, bool, list]]
# Request and tensor parameters: KServe's values are strings, numbers and booleans. Unknown ones are ignored, as
# Triton ignores those it does not know (its clients send some, such as binary_data_output).
Parameters = dict[str, Union[str, int, float, bool]]


class KServeTensor(_TeiBody):
    name: str
    shape: list[int] = Field(description="the tensor's shape; the number of elements is its product")
    datatype: str = Field(description="BYTES for texts")
    parameters: Parameters | None = Field(None, description="binary_data_size: the tensor's bytes follow the JSON "
                                                            "(Triton's binary tensor extension)")
    data: TensorData | None = Field(None, description="the elements, row-major; absent when binary_data_size is set")


class KServeRequestedOutput(_TeiBody):
    name: str = Field(description="one of the model's outputs (its metadata lists them)")
    parameters: Parameters | None = Field(None, description="binary_data: true sends the tensor as bytes after "
                                                            "the JSON")


class KServeInferBody(_TeiBody):
    # The described body is the default model's (openapi.py: its inputs' and outputs' names, its parameters).
    model_config = ConfigDict(json_schema_extra={MODEL_MARK: "kserve_infer"})
    id: str | None = None
    parameters: Parameters | None = Field(None, description="truncate (a boolean; unset: as the server's "
                                                            "--long-inputs says), normalize (a boolean), "
                                                            "dimensions (an integer), prompt_name, task, "
                                                            "embedding_type, input_type (strings), raw_scores (a "
                                                            "boolean, a reranker's), binary_data_output (a boolean)")
    inputs: list[KServeTensor] = Field(description="BYTES tensors: `text`, the texts, shape [N] or [N, 1]; a "
                                                   "reranker's `query` [1] and `text`, its documents")
    outputs: list[KServeRequestedOutput] | None = Field(None, description="unset: the model's usual outputs (all "
                                                                          "but token_embeddings, which is sent when "
                                                                          "named)")


class KServeRepositoryIndexBody(_TeiBody):
    repository_name: str | None = None
    ready: bool | None = Field(None, description="every served model is ready once the server is")


class KServeOutputTensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: list[float] | list[int] | None = None


class KServeInferReply(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[KServeOutputTensor]


class KServeError(BaseModel):
    error: str


# --- Cohere / Infinity rerank -------------------------------------------------

class RerankDocument(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    text: Text


class CohereRerankBody(_Strict):
    query: Text
    documents: Annotated[list[Text | RerankDocument], Field(json_schema_extra={"minItems": 1})] = Field(
        description="strings, or objects with a `text`")
    model: str | None = Field(None, description="the served model's name or an alias; unset: the default model")
    top_n: Positive | None = Field(None, description="how many of the best results to return; unset: all")
    return_documents: bool = Field(False, description="return each document with its result")
    truncate: bool | None = Field(None, description="attnserve's: false refuses a (query, document) pair over "
                                                    "max_seq_length; " + TRUNCATE_UNSET)


class CohereV2RerankBody(_Strict):
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


class TeiEmbedSparseBody(_TeiModelBody):
    model_config = ConfigDict(json_schema_extra=_prompted_texts("inputs"))  # a prompt goes before texts
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
ImageObject = Annotated[JinaImage, _marked("images")]


class TeiSimilarityInputs(_TeiBody):
    source_sentence: Union[Text, ImageObject] = Field(description="a text, or (an image-text model's) {\"image\": "
                                                                  "...}")
    sentences: Annotated[list[Union[Text, ImageObject]], Field(json_schema_extra={"minItems": 1})] = Field(
        description="each compared with source_sentence: texts, or (an image-text model's) {\"image\": ...} too")


class TeiSimilarityParameters(_TeiBody):
    """TEI's SimilarityParameters: where TEI's /similarity takes its options."""

    model_config = ConfigDict(json_schema_extra=_ONE_PROMPT)

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


# Cohere's v2 embed API (POST /v2/embed): its embedding types, base64 among them (the float32 bytes of each vector).
CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
CohereInputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
# "image" is Cohere's too, and refused here with a message (this server embeds texts): the description leaves it out.
TEXT_INPUT_TYPES = ["search_document", "search_query", "classification", "clustering"]


class MultiVectorBody(_Strict):
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


class LateChunkingBody(_Strict):
    """attnserve's POST /embed_chunks: late chunking (Günther et al., 2024)."""

    # spans or a chunker, one of them; chunk_tokens with the tokens chunker only; prompt or prompt_name
    model_config = ConfigDict(json_schema_extra={"allOf": [
        _ONE_PROMPT, {"oneOf": [{"properties": {"spans": {"type": "array"}}, "required": ["spans"]},
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


def _one_input_field(schema: dict) -> None:
    """texts, images or inputs: one of them, not null (images where the default model embeds images: openapi.py
    leaves only their null otherwise; inputs' image parts likewise)."""
    _given_one_of(schema, ("texts", "images", "inputs"))


class CohereInput(_StrictPart):
    """Cohere's `inputs` entry: its content parts, one embedding per entry (an image-text model embeds one part: a
    text or an image)."""

    content: ContentParts


class CohereEmbedBody(_Strict):
    model: str = Field(description="a served model's name or alias; \"\": the server's default model")
    input_type: Annotated[CohereInputType | None, WithJsonSchema({"anyOf": [{"enum": TEXT_INPUT_TYPES},
                                                                         {"type": "null"}]}),
                          _marked("cohere_input_type")] = Field(
        None, description="the model's prompt of that purpose where it has one (search_query: \"query\", "
                          "search_document: \"document\" or \"passage\", classification, clustering); otherwise "
                          "its default prompt; image (an image-text model's): the inputs are images")
    # Cohere's texts, images or inputs: one of them (the parser takes none or several, so that it is answered as
    # the door words it); a text model takes texts only (openapi.py leaves the other two out of its description).
    model_config = ConfigDict(json_schema_extra=lambda schema: _one_input_field(schema))
    texts: Texts | None = Field(None, description="the texts to embed")
    images: Annotated[list[ImageString] | None, Field(json_schema_extra={"minItems": 1}),
                      _marked("nullable_images")] = Field(
        None, description=f"an image-text model's: the images to embed, each {IMAGE_FORMS}")
    inputs: Annotated[list[CohereInput] | None, Field(json_schema_extra={"minItems": 1})] = Field(
        None, description="inputs of content parts, one part each: a text part, or (an image-text model's) an "
                          "image_url part")
    embedding_types: Annotated[list[CohereEmbeddingType] | None, _marked("cohere_types")] = Field(
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


class ZeroShotBody(_Strict):
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


# --- attnserve's own --------------------------------------------------------

class AttentionBody(_Strict):
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
