"""Records -> output rows: the schema, the table, and the engine call that local and Ray encoding share."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from attnserve.engine.batch_outputs import object_array
from attnserve.engine.engine import Encoded, Engine
from attnserve.engine.late_chunking import DEFAULT_CHUNK_TOKENS, NO_TOKEN_TO_CHUNK, chunker_spans, token_ranges
from attnserve.engine.output_options import OutputOptions
from attnserve.engine.prompts import prompt_text, unpooled_prompt
from attnserve.engine.quantize import quantized_size
from attnserve.engine.tokenizer import TokenizedInput
from attnserve.engine.windows import Windows
from attnserve.errors import InvalidInputError

from .image_encode import encode_images
from .readers import Input, Record

LABEL = "input"  # what the tokenizer's messages are prefixed with; cut off again to keep the reason alone


@dataclass(frozen=True)
class LateChunks:
    """`encode --late-chunking`: a built-in chunker (engine/late_chunking.py) and its chunk size in tokens."""

    chunker: str  # "sentences" or "tokens"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS


@dataclass(frozen=True)
class Prompt:
    """The prompt `encode --prompt-name / --prompt` asks for; neither: the model's default prompt, if any."""

    name: str | None = None
    text: str | None = None

    @property
    def asked(self) -> bool:
        return self.name is not None or self.text is not None


# The embedding column's values by embedding type (engine/quantize.py): float32, or one byte a code.
EMBEDDING_ARROW_TYPES = {"float": pa.float32(), "int8": pa.int8(), "uint8": pa.uint8(), "binary": pa.int8(),
                         "ubinary": pa.uint8()}


# A SPLADE model's column: its weights above 0 as (vocabulary id, weight), ascending by id.
SPARSE_TYPE = pa.list_(pa.struct([pa.field("index", pa.int32(), nullable=False),
                                  pa.field("value", pa.float32(), nullable=False)]))


def multi_vector_type(dimension: int) -> pa.DataType:
    """A ColBERT model's column: each row's vectors, [tokens][dimension] float32."""
    return pa.list_(pa.list_(pa.float32(), dimension))


# The columns a bge-m3 model's run may write at once (`encode --outputs`), from one pass.
BGE_M3_COLUMNS = ("embedding", "sparse_embedding", "multi_vector")


def output_schema(id_type: type, embedding_size: int, metadata: dict, embedding_type: str = "float",
                  sparse: bool = False, multi_vector: bool = False, columns: tuple[str, ...] = (),
                  vector_size: int | None = None) -> pa.Schema:
    """embedding_size: D; the binary types hold ceil(D / 8) bytes a row. sparse: a SPLADE model's
    `sparse_embedding` column instead of `embedding`; multi_vector: a ColBERT model's `multi_vector` column of
    vectors of size D. columns: a bge-m3 model's, some of BGE_M3_COLUMNS, in that order (its vectors of size
    vector_size)."""
    width = quantized_size(embedding_type, embedding_size)
    kinds = {"sparse_embedding": pa.field("sparse_embedding", SPARSE_TYPE, nullable=False),
             "multi_vector": pa.field("multi_vector", multi_vector_type(vector_size or embedding_size),
                                      nullable=False),
             "embedding": pa.field("embedding", pa.list_(EMBEDDING_ARROW_TYPES[embedding_type], width),
                                   nullable=False)}
    columns = columns or (("sparse_embedding",) if sparse else ("multi_vector",) if multi_vector else ("embedding",))
    return pa.schema(
        [
            pa.field("id", pa.int64() if id_type is int else pa.string(), nullable=False),
            *(kinds[name] for name in BGE_M3_COLUMNS if name in columns),
            pa.field("num_tokens", pa.int32(), nullable=False),
            pa.field("truncated", pa.bool_(), nullable=False),
        ],
        metadata={"attnserve": json.dumps(metadata)},
    )


def late_chunks_schema(id_type: type, embedding_size: int, metadata: dict) -> pa.Schema:
    """`encode --late-chunking`'s rows: one per chunk, in the input's order, then the text's: the text's id, the
    chunk's position in the text, its character span [start, stop), its embedding and its token count."""
    return pa.schema(
        [
            pa.field("id", pa.int64() if id_type is int else pa.string(), nullable=False),
            pa.field("chunk", pa.int32(), nullable=False),
            pa.field("start", pa.int32(), nullable=False),
            pa.field("stop", pa.int32(), nullable=False),
            pa.field("embedding", pa.list_(pa.float32(), embedding_size), nullable=False),
            pa.field("num_tokens", pa.int32(), nullable=False),
        ],
        metadata={"attnserve": json.dumps(metadata)},
    )


def late_chunks_table(schema: pa.Schema, records: Sequence[Record], embeddings: Sequence[np.ndarray] | np.ndarray,
                      chunks: Sequence[np.ndarray] | np.ndarray) -> pa.Table:
    """The chunk rows of `records`, in their order: each record's (k_i, D) float32 embeddings and (k_i, 3) start,
    stop and token count."""
    counts = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    spans = np.concatenate([*chunks, np.zeros((0, 3), np.int32)]).astype(np.int32)  # (K, 3)
    vectors = np.concatenate([*(np.asarray(e, np.float32).reshape(-1) for e in embeddings), np.zeros(0, np.float32)])
    positions = np.concatenate([np.arange(n, dtype=np.int32) for n in counts]) if len(counts) else \
        np.zeros(0, np.int32)
    ids = [r.id for r, n in zip(records, counts, strict=True) for _ in range(n)]
    id_type = schema.field("id").type
    width = schema.field("embedding").type.list_size
    return pa.Table.from_arrays(
        [_from_numpy(np.array(ids, np.int64), pa.int64()) if id_type == pa.int64() else pa.array(ids, type=id_type),
         _from_numpy(positions, pa.int32()), _from_numpy(np.ascontiguousarray(spans[:, 0]), pa.int32()),
         _from_numpy(np.ascontiguousarray(spans[:, 1]), pa.int32()),
         pa.FixedSizeListArray.from_arrays(_from_numpy(vectors, pa.float32()), width),
         _from_numpy(np.ascontiguousarray(spans[:, 2]), pa.int32())], schema=schema)


def output_table(schema: pa.Schema, records: Sequence[Record], embeddings: np.ndarray, num_tokens: np.ndarray,
                 truncated: np.ndarray, sparse: np.ndarray | None = None, multi_vector: np.ndarray | None = None
                 ) -> pa.Table:
    """The output rows of `records`, in their order: embeddings (N, D) float32 (or the codes of the schema's
    embedding type; a SPLADE model's (N, V) weights; a ColBERT model's (N,) of (K_i, d) vectors), num_tokens (N,),
    truncated (N,); a bge-m3 model's sparse ((N,) of (indices, values)) and multi_vector ((N,) of (T_i - 1, d))
    where its schema has their columns."""
    id_type = schema.field("id").type
    ids = [r.id for r in records]
    columns = []
    for name in schema.names[1:-2]:
        if name == "sparse_embedding":
            columns.append(_sparse_column(np.asarray(embeddings, np.float32)) if sparse is None
                           else _sparse_pairs_column(sparse))
        elif name == "multi_vector":
            columns.append(_multi_vector_column(embeddings if multi_vector is None else multi_vector,
                                                schema.field("multi_vector").type))
        else:
            embedding = schema.field("embedding").type  # fixed_size_list<float32 | int8 | uint8>[D]
            values = np.asarray(embeddings, embedding.value_type.to_pandas_dtype()).reshape(-1)
            columns.append(pa.FixedSizeListArray.from_arrays(_from_numpy(values, embedding.value_type),
                                                             embedding.list_size))
    return pa.Table.from_arrays(
        [_from_numpy(np.array(ids, np.int64), pa.int64()) if id_type == pa.int64() else pa.array(ids, type=id_type),
         *columns,
         _from_numpy(np.asarray(num_tokens, np.int32), pa.int32()),
         pa.Array.from_buffers(pa.bool_(), len(truncated),
                               [None, pa.py_buffer(np.packbits(np.asarray(truncated, bool), bitorder="little"))])],
        schema=schema)


def _sparse_column(weights: np.ndarray) -> pa.Array:
    """(N, V) SPLADE weights -> list<struct<index, value>>: each row's weights above 0, ascending by index."""
    rows, indices = np.nonzero(weights > 0)  # row-major: each row's indices ascending
    offsets = np.zeros(len(weights) + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=len(weights)), out=offsets[1:])
    pairs = pa.StructArray.from_arrays(
        [_from_numpy(indices.astype(np.int32), pa.int32()), _from_numpy(weights[rows, indices], pa.float32())],
        fields=list(SPARSE_TYPE.value_type))
    return pa.ListArray.from_arrays(_from_numpy(offsets, pa.int32()), pairs, type=SPARSE_TYPE)


def _sparse_pairs_column(pairs: np.ndarray) -> pa.Array:
    """(N,) of ((K_i,) int32 indices ascending, (K_i,) float32 values) -> list<struct<index, value>>."""
    offsets = np.zeros(len(pairs) + 1, dtype=np.int32)
    np.cumsum([len(indices) for indices, _ in pairs], out=offsets[1:])
    indices = np.concatenate([np.zeros(0, np.int32), *(np.asarray(i, np.int32) for i, _ in pairs)])
    values = np.concatenate([np.zeros(0, np.float32), *(np.asarray(v, np.float32) for _, v in pairs)])
    structs = pa.StructArray.from_arrays([_from_numpy(indices, pa.int32()), _from_numpy(values, pa.float32())],
                                         fields=list(SPARSE_TYPE.value_type))
    return pa.ListArray.from_arrays(_from_numpy(offsets, pa.int32()), structs, type=SPARSE_TYPE)


def _multi_vector_column(vectors: np.ndarray, arrow_type: pa.ListType) -> pa.Array:
    """(N,) of (K_i, d) float32 -> list<fixed_size_list<float32, d>>, each row's vectors in token order."""
    dimension = arrow_type.value_type.list_size
    offsets = np.zeros(len(vectors) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in vectors], out=offsets[1:])
    flat = (np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in vectors]) if len(vectors)
            else np.zeros(0, np.float32))
    inner = pa.FixedSizeListArray.from_arrays(_from_numpy(flat, pa.float32()), dimension)
    return pa.ListArray.from_arrays(_from_numpy(offsets, pa.int32()), inner, type=arrow_type)


def _from_numpy(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """A numeric column over its numpy buffer, without pa.array(): its first call imports pandas, which cost
    `attnserve encode` 0.2-0.4 s of a 10 s run. A text id column still goes through pa.array."""
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(np.ascontiguousarray(values))])


def inputs_of(records: Sequence[Record]) -> list[Input]:
    """What the model sees of each record: its text, its token ids or its image's bytes."""
    return [r.input for r in records]


def encode_inputs(engine: Engine, inputs: Sequence[Input], options: OutputOptions, on_batch: Callable[[int], None],
                  prompt: Prompt = Prompt(), input_type: str = "document", late: LateChunks | None = None,
                  outputs: tuple[str, ...] = (), image_pixels: int | None = None) -> tuple[Encoded, dict[int, str]]:
    """One chunk's inputs through the engine, batched by length: (the encoded rows, {position: reason}).

    The refused positions (inputs the tokenizer rejects) are left out of the encoded rows, which keep
    the order of the rest. Same inputs in, same bits out: local and Ray runs both come through here. options: the
    outputs' dimensions, normalisation and embedding type, assembled as a server's are (engine/outputs.py).
    A prompt goes before every text (engine/prompts.py); an unknown prompt name stops the run here, at once.
    A ColBERT model's texts are its queries or documents (input_type; engine/multi_vector.py), with their prompt.
    late: late chunking, Encoded as engine.encode_late_chunks gives it, with each text's chunks. outputs: a bge-m3
    model's columns (BGE_M3_COLUMNS), all from one pass (engine.encode_bge_m3). image_pixels: the inputs are image
    files' bytes, each decoded within this many pixels (offline/image_encode.py); None: texts or token ids.
    """
    if image_pixels is not None:
        return encode_images(engine, inputs, options, on_batch, image_pixels)  # type: ignore[arg-type]
    if late is not None:
        return _late_chunks(engine, inputs, prompt_text(engine.manifest, prompt.name, prompt.text), late, on_batch,
                            options)
    return encode_tokenized_inputs(engine, tokenize_inputs(engine, inputs, prompt, input_type), options, on_batch,
                                   input_type, outputs)


@dataclass(frozen=True)
class TokenizedChunk:
    """A chunk's inputs tokenized (its refused positions, {position: reason}, left out): what encoding it takes."""

    inputs: list[TokenizedInput]
    refused: dict[int, str]


def tokenize_inputs(engine: Engine, inputs: Sequence[Input], prompt: Prompt = Prompt(),
                    input_type: str = "document") -> TokenizedChunk:
    """encode_inputs' first half (not for late chunking, which tokenizes as it encodes): the tokenizer's work, which
    a local run does for the next chunk while the engine runs this one (offline/encode.py)."""
    if engine.multi_vector is not None:
        def tokenize(items: Sequence[Input]) -> list[TokenizedInput]:
            return _tokenize_multi_vector(engine, items, input_type)
    else:
        before = prompt_text(engine.manifest, prompt.name, prompt.text)

        def tokenize(items: Sequence[Input]) -> list[TokenizedInput]:
            return _tokenize(engine, items, before, prompt.asked)
    refused: dict[int, str] = {}
    try:
        tokenized = tokenize(inputs)
    except InvalidInputError:  # rare: find the inputs it was, one by one, and encode the rest
        tokenized = []
        for i, item in enumerate(inputs):
            try:
                tokenized.extend(tokenize([item]))
            except InvalidInputError as e:
                refused[i] = str(e).removeprefix(f"{LABEL}: ")
    return TokenizedChunk(tokenized, refused)


def encode_tokenized_inputs(engine: Engine, chunk: TokenizedChunk, options: OutputOptions,
                            on_batch: Callable[[int], None],
                            input_type: str = "document", outputs: tuple[str, ...] = ()
                            ) -> tuple[Encoded, dict[int, str]]:
    """encode_inputs' second half: the tokenized inputs through the engine, batched by length."""
    tokenized, refused = chunk.inputs, chunk.refused
    if engine.multi_vector is not None:
        return engine.encode_multi_vector(tokenized, input_type, on_batch), refused
    if outputs:
        return engine.encode_bge_m3(tokenized, "sparse_embedding" in outputs, "multi_vector" in outputs,
                                    on_batch=on_batch, options=options), refused
    return engine.encode_tokenized(tokenized, on_batch=on_batch, options=options), refused


def _late_chunks(engine: Engine, inputs: Sequence[Input], before: str, late: LateChunks,
                 on_batch: Callable[[int], None], options: OutputOptions) -> tuple[Encoded, dict[int, str]]:
    """Each text read whole in windows, cut by the chunker, and its chunks' token embeddings mean-pooled; a row of
    token ids, or a text with no token to chunk, is refused (no row goes without an output row unsaid)."""
    refused: dict[int, str] = {}
    kept: list[Windows] = []
    spans: list[np.ndarray] = []
    ranges: list[list[tuple[int, int]]] = []
    for i, item in enumerate(inputs):
        if not isinstance(item, str):
            refused[i] = "late chunking reads texts: this input is token ids"  # as a server says it
            continue
        try:
            [windows] = engine.tokenizer.windows([item], before, [LABEL])
        except InvalidInputError as e:
            refused[i] = str(e).removeprefix(f"{LABEL}: ")
            continue
        cut = chunker_spans(item, windows.offsets, late.chunker, late.chunk_tokens)
        if not cut:
            refused[i] = NO_TOKEN_TO_CHUNK
            continue
        token_spans = token_ranges(cut, windows.offsets, LABEL, "text")  # each holds a token: the chunker's cuts
        kept.append(windows)
        ranges.append(token_spans)
        spans.append(np.asarray([(a, b, stop - start) for (a, b), (start, stop) in zip(cut, token_spans, strict=True)],
                                dtype=np.int32).reshape(-1, 3))
    encoded = engine.encode_late_chunks(kept, ranges, on_batch, options)  # (k_i, D) each, cut and normalised
    encoded.chunks = object_array(spans)
    return encoded, refused


def _tokenize_multi_vector(engine: Engine, inputs: Sequence[Input], input_type: str) -> list[TokenizedInput]:
    assert engine.multi_vector is not None
    if not all(isinstance(x, str) for x in inputs):
        raise InvalidInputError(f"{LABEL}: a multi-vector (ColBERT) model encodes texts, not token ids")
    return engine.multi_vector.encode(inputs, input_type, labels=[LABEL] * len(inputs))  # type: ignore[arg-type]


def _tokenize(engine: Engine, inputs: Sequence[Input], before: str, prompt_asked: bool) -> list[TokenizedInput]:
    """Texts (the prompt `before` each) and token ids through their own paths, back in input order."""
    texts = {i: x for i, x in enumerate(inputs) if isinstance(x, str)}
    encoded_texts = engine.tokenizer.encode_texts([before + t for t in texts.values()], labels=[LABEL] * len(texts),
                                                  unpooled_prompt=unpooled_prompt(engine.manifest, before))
    if len(texts) == len(inputs):
        return encoded_texts
    if prompt_asked:  # token ids are what the model sees: the prompt asked for would be silently left out
        raise InvalidInputError(f"{LABEL}: a prompt goes before texts; this row is token ids (put the prompt's "
                                "tokens in them instead)")
    id_lists = {i: x for i, x in enumerate(inputs) if not isinstance(x, str)}
    encoded_ids = engine.tokenizer.encode_ids(list(id_lists.values()), labels=[LABEL] * len(id_lists))
    by_position = dict(zip(texts, encoded_texts, strict=True)) | dict(zip(id_lists, encoded_ids, strict=True))
    return [by_position[i] for i in range(len(inputs))]
