from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InputType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INPUT_TYPE_DOCUMENT: _ClassVar[InputType]
    INPUT_TYPE_QUERY: _ClassVar[InputType]

class EmbeddingType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EMBEDDING_TYPE_FLOAT: _ClassVar[EmbeddingType]
    EMBEDDING_TYPE_INT8: _ClassVar[EmbeddingType]
    EMBEDDING_TYPE_UINT8: _ClassVar[EmbeddingType]
    EMBEDDING_TYPE_BINARY: _ClassVar[EmbeddingType]
    EMBEDDING_TYPE_UBINARY: _ClassVar[EmbeddingType]

class TruncationDirection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRUNCATE_RIGHT: _ClassVar[TruncationDirection]
    TRUNCATE_LEFT: _ClassVar[TruncationDirection]

class Pooling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOLING_DEFAULT: _ClassVar[Pooling]
    MEAN: _ClassVar[Pooling]
    CLS: _ClassVar[Pooling]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    INT8: _ClassVar[DType]
    UINT8: _ClassVar[DType]
INPUT_TYPE_DOCUMENT: InputType
INPUT_TYPE_QUERY: InputType
EMBEDDING_TYPE_FLOAT: EmbeddingType
EMBEDDING_TYPE_INT8: EmbeddingType
EMBEDDING_TYPE_UINT8: EmbeddingType
EMBEDDING_TYPE_BINARY: EmbeddingType
EMBEDDING_TYPE_UBINARY: EmbeddingType
TRUNCATE_RIGHT: TruncationDirection
TRUNCATE_LEFT: TruncationDirection
POOLING_DEFAULT: Pooling
MEAN: Pooling
CLS: Pooling
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT16: DType
INT8: DType
UINT8: DType

class EmbedRequest(_message.Message):
    __slots__ = ("inputs", "pooling", "normalize", "return_token_embeddings", "attention", "truncate", "dimensions", "truncation_direction", "model", "prompt_name", "prompt", "task", "embedding_type", "ranges", "sparse", "multi_vector", "late_chunking")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    RETURN_TOKEN_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_TYPE_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    MULTI_VECTOR_FIELD_NUMBER: _ClassVar[int]
    LATE_CHUNKING_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    pooling: Pooling
    normalize: bool
    return_token_embeddings: bool
    attention: AttentionOptions
    truncate: bool
    dimensions: int
    truncation_direction: TruncationDirection
    model: str
    prompt_name: str
    prompt: str
    task: str
    embedding_type: EmbeddingType
    ranges: Tensor
    sparse: SparseOptions
    multi_vector: MultiVectorOptions
    late_chunking: LateChunking
    def __init__(self, inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ..., pooling: _Optional[_Union[Pooling, str]] = ..., normalize: _Optional[bool] = ..., return_token_embeddings: _Optional[bool] = ..., attention: _Optional[_Union[AttentionOptions, _Mapping]] = ..., truncate: _Optional[bool] = ..., dimensions: _Optional[int] = ..., truncation_direction: _Optional[_Union[TruncationDirection, str]] = ..., model: _Optional[str] = ..., prompt_name: _Optional[str] = ..., prompt: _Optional[str] = ..., task: _Optional[str] = ..., embedding_type: _Optional[_Union[EmbeddingType, str]] = ..., ranges: _Optional[_Union[Tensor, _Mapping]] = ..., sparse: _Optional[_Union[SparseOptions, _Mapping]] = ..., multi_vector: _Optional[_Union[MultiVectorOptions, _Mapping]] = ..., late_chunking: _Optional[_Union[LateChunking, _Mapping]] = ...) -> None: ...

class LateChunking(_message.Message):
    __slots__ = ("spans", "chunker", "chunk_tokens")
    SPANS_FIELD_NUMBER: _ClassVar[int]
    CHUNKER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[Spans]
    chunker: str
    chunk_tokens: int
    def __init__(self, spans: _Optional[_Iterable[_Union[Spans, _Mapping]]] = ..., chunker: _Optional[str] = ..., chunk_tokens: _Optional[int] = ...) -> None: ...

class Spans(_message.Message):
    __slots__ = ("spans",)
    SPANS_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("start", "stop", "num_tokens", "embedding")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    num_tokens: int
    embedding: Tensor
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ..., num_tokens: _Optional[int] = ..., embedding: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class MultiVectorOptions(_message.Message):
    __slots__ = ("input_type",)
    INPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    input_type: InputType
    def __init__(self, input_type: _Optional[_Union[InputType, str]] = ...) -> None: ...

class SparseOptions(_message.Message):
    __slots__ = ("top_k", "return_tokens")
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    RETURN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    top_k: int
    return_tokens: bool
    def __init__(self, top_k: _Optional[int] = ..., return_tokens: _Optional[bool] = ...) -> None: ...

class SparseEmbedding(_message.Message):
    __slots__ = ("indices", "values", "tokens")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("text", "token_ids", "pair", "image")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PAIR_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    pair: TextPair
    image: Image
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., pair: _Optional[_Union[TextPair, _Mapping]] = ..., image: _Optional[_Union[Image, _Mapping]] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("data", "url", "mime_type")
    DATA_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    url: str
    mime_type: str
    def __init__(self, data: _Optional[bytes] = ..., url: _Optional[str] = ..., mime_type: _Optional[str] = ...) -> None: ...

class TextPair(_message.Message):
    __slots__ = ("a", "b")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AttentionOptions(_message.Message):
    __slots__ = ("layers", "average_heads", "heads", "analyses", "weights")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    ANALYSES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedScalarFieldContainer[int]
    average_heads: bool
    heads: _containers.RepeatedScalarFieldContainer[int]
    analyses: _containers.RepeatedScalarFieldContainer[str]
    weights: bool
    def __init__(self, layers: _Optional[_Iterable[int]] = ..., average_heads: _Optional[bool] = ..., heads: _Optional[_Iterable[int]] = ..., analyses: _Optional[_Iterable[str]] = ..., weights: _Optional[bool] = ...) -> None: ...

class AttentionAnalyses(_message.Message):
    __slots__ = ("rollout", "head_stats", "norms", "norms_summed")
    class HeadStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    HEAD_STATS_FIELD_NUMBER: _ClassVar[int]
    NORMS_FIELD_NUMBER: _ClassVar[int]
    NORMS_SUMMED_FIELD_NUMBER: _ClassVar[int]
    rollout: Tensor
    head_stats: _containers.MessageMap[str, Tensor]
    norms: Tensor
    norms_summed: Tensor
    def __init__(self, rollout: _Optional[_Union[Tensor, _Mapping]] = ..., head_stats: _Optional[_Mapping[str, Tensor]] = ..., norms: _Optional[_Union[Tensor, _Mapping]] = ..., norms_summed: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("sentence_embedding", "token_embeddings", "attentions", "tokens", "num_tokens", "truncated", "pair_start", "sparse_embedding", "multi_vector", "analyses", "windows", "chunks", "patches", "reach")
    SENTENCE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    TOKEN_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    ATTENTIONS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PAIR_START_FIELD_NUMBER: _ClassVar[int]
    SPARSE_EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    MULTI_VECTOR_FIELD_NUMBER: _ClassVar[int]
    ANALYSES_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PATCHES_FIELD_NUMBER: _ClassVar[int]
    REACH_FIELD_NUMBER: _ClassVar[int]
    sentence_embedding: Tensor
    token_embeddings: Tensor
    attentions: Tensor
    tokens: _containers.RepeatedScalarFieldContainer[str]
    num_tokens: int
    truncated: bool
    pair_start: int
    sparse_embedding: SparseEmbedding
    multi_vector: Tensor
    analyses: AttentionAnalyses
    windows: int
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    patches: PatchPositions
    reach: _containers.RepeatedCompositeFieldContainer[LayerReach]
    def __init__(self, sentence_embedding: _Optional[_Union[Tensor, _Mapping]] = ..., token_embeddings: _Optional[_Union[Tensor, _Mapping]] = ..., attentions: _Optional[_Union[Tensor, _Mapping]] = ..., tokens: _Optional[_Iterable[str]] = ..., num_tokens: _Optional[int] = ..., truncated: _Optional[bool] = ..., pair_start: _Optional[int] = ..., sparse_embedding: _Optional[_Union[SparseEmbedding, _Mapping]] = ..., multi_vector: _Optional[_Union[Tensor, _Mapping]] = ..., analyses: _Optional[_Union[AttentionAnalyses, _Mapping]] = ..., windows: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., patches: _Optional[_Union[PatchPositions, _Mapping]] = ..., reach: _Optional[_Iterable[_Union[LayerReach, _Mapping]]] = ...) -> None: ...

class LayerReach(_message.Message):
    __slots__ = ("behind", "ahead")
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    behind: int
    ahead: int
    def __init__(self, behind: _Optional[int] = ..., ahead: _Optional[int] = ...) -> None: ...

class ImageTower(_message.Message):
    __slots__ = ("image_size", "patch_size", "num_layers", "num_heads", "max_patches")
    IMAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    MAX_PATCHES_FIELD_NUMBER: _ClassVar[int]
    image_size: int
    patch_size: int
    num_layers: int
    num_heads: int
    max_patches: int
    def __init__(self, image_size: _Optional[int] = ..., patch_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_heads: _Optional[int] = ..., max_patches: _Optional[int] = ...) -> None: ...

class PatchPositions(_message.Message):
    __slots__ = ("image_size", "patch_size", "grid", "class_token", "boxes", "fit", "height", "width", "rows", "cols")
    IMAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    GRID_FIELD_NUMBER: _ClassVar[int]
    CLASS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BOXES_FIELD_NUMBER: _ClassVar[int]
    FIT_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    image_size: int
    patch_size: int
    grid: int
    class_token: bool
    boxes: _containers.RepeatedScalarFieldContainer[int]
    fit: str
    height: int
    width: int
    rows: int
    cols: int
    def __init__(self, image_size: _Optional[int] = ..., patch_size: _Optional[int] = ..., grid: _Optional[int] = ..., class_token: _Optional[bool] = ..., boxes: _Optional[_Iterable[int]] = ..., fit: _Optional[str] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction", "top_n", "model")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    RETURN_TEXT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    query: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    raw_scores: bool
    return_text: bool
    truncate: bool
    truncation_direction: TruncationDirection
    top_n: int
    model: str
    def __init__(self, query: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., raw_scores: _Optional[bool] = ..., return_text: _Optional[bool] = ..., truncate: _Optional[bool] = ..., truncation_direction: _Optional[_Union[TruncationDirection, str]] = ..., top_n: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class RerankResult(_message.Message):
    __slots__ = ("index", "score", "text")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    text: str
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("results", "model")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RerankResult]
    model: str
    def __init__(self, results: _Optional[_Iterable[_Union[RerankResult, _Mapping]]] = ..., model: _Optional[str] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("inputs", "raw_scores", "truncate", "truncation_direction", "model")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    raw_scores: bool
    truncate: bool
    truncation_direction: TruncationDirection
    model: str
    def __init__(self, inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ..., raw_scores: _Optional[bool] = ..., truncate: _Optional[bool] = ..., truncation_direction: _Optional[_Union[TruncationDirection, str]] = ..., model: _Optional[str] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[LabelScore]
    def __init__(self, scores: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("predictions", "model")
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[Prediction]
    model: str
    def __init__(self, predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ..., model: _Optional[str] = ...) -> None: ...

class SimilarityRequest(_message.Message):
    __slots__ = ("source_sentence", "sentences", "truncate", "truncation_direction", "prompt_name", "prompt", "model")
    SOURCE_SENTENCE_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    source_sentence: str
    sentences: _containers.RepeatedScalarFieldContainer[str]
    truncate: bool
    truncation_direction: TruncationDirection
    prompt_name: str
    prompt: str
    model: str
    def __init__(self, source_sentence: _Optional[str] = ..., sentences: _Optional[_Iterable[str]] = ..., truncate: _Optional[bool] = ..., truncation_direction: _Optional[_Union[TruncationDirection, str]] = ..., prompt_name: _Optional[str] = ..., prompt: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class SimilarityResponse(_message.Message):
    __slots__ = ("scores", "model")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    model: str
    def __init__(self, scores: _Optional[_Iterable[float]] = ..., model: _Optional[str] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "model")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    model: str
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., model: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelList(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "hidden_size", "num_layers", "num_heads", "max_seq_length", "vocab_size", "pooling", "normalize", "provider", "precision", "limits", "version", "names", "prompts", "default_prompt_name", "embedding_size", "kind", "num_labels", "tasks", "labels", "outputs", "embedding_types", "multi_vector_size", "image_tower")
    class PromptsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_LABELS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_TYPES_FIELD_NUMBER: _ClassVar[int]
    MULTI_VECTOR_SIZE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOWER_FIELD_NUMBER: _ClassVar[int]
    model: str
    hidden_size: int
    num_layers: int
    num_heads: int
    max_seq_length: int
    vocab_size: int
    pooling: str
    normalize: bool
    provider: str
    precision: str
    limits: ServerLimits
    version: str
    names: _containers.RepeatedScalarFieldContainer[str]
    prompts: _containers.ScalarMap[str, str]
    default_prompt_name: str
    embedding_size: int
    kind: str
    num_labels: int
    tasks: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.RepeatedScalarFieldContainer[str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    embedding_types: _containers.RepeatedScalarFieldContainer[str]
    multi_vector_size: int
    image_tower: ImageTower
    def __init__(self, model: _Optional[str] = ..., hidden_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_heads: _Optional[int] = ..., max_seq_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., pooling: _Optional[str] = ..., normalize: _Optional[bool] = ..., provider: _Optional[str] = ..., precision: _Optional[str] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., version: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., prompts: _Optional[_Mapping[str, str]] = ..., default_prompt_name: _Optional[str] = ..., embedding_size: _Optional[int] = ..., kind: _Optional[str] = ..., num_labels: _Optional[int] = ..., tasks: _Optional[_Iterable[str]] = ..., labels: _Optional[_Iterable[str]] = ..., outputs: _Optional[_Iterable[str]] = ..., embedding_types: _Optional[_Iterable[str]] = ..., multi_vector_size: _Optional[int] = ..., image_tower: _Optional[_Union[ImageTower, _Mapping]] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_inputs_per_request", "max_batch_tokens", "max_batch_size", "max_queue_tokens", "max_request_bytes", "max_response_bytes", "max_wait_ms", "max_queue_wait_ms", "auto_truncate", "long_inputs")
    MAX_INPUTS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTO_TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    LONG_INPUTS_FIELD_NUMBER: _ClassVar[int]
    max_inputs_per_request: int
    max_batch_tokens: int
    max_batch_size: int
    max_queue_tokens: int
    max_request_bytes: int
    max_response_bytes: int
    max_wait_ms: float
    max_queue_wait_ms: float
    auto_truncate: bool
    long_inputs: str
    def __init__(self, max_inputs_per_request: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_queue_tokens: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., max_response_bytes: _Optional[int] = ..., max_wait_ms: _Optional[float] = ..., max_queue_wait_ms: _Optional[float] = ..., auto_truncate: _Optional[bool] = ..., long_inputs: _Optional[str] = ...) -> None: ...
