"""KServe's Open Inference Protocol (v2), apart from its wire: each served model's signature (its tensors), Triton's
model configuration of it, and the translation of a request's tensors and parameters to the core's requests and of
the core's replies to output tensors. The HTTP door (http/kserve.py: JSON, Triton's binary tensors) and the gRPC door
(grpc/kserve.py: protobuf, raw contents) each only read and write their wire around this.

An embedding model takes one input, `text`: a BYTES tensor of N texts, shape [N] or [N, 1]. It gives `embedding`,
FP32 [N, D], the sentence embeddings as the model's pipeline makes them (INT8 / UINT8 with the parameter
`embedding_type`), and `num_tokens`, INT32 [N]; and, only when asked for by name, `token_embeddings`, FP32 [N, T, H],
each input's last hidden states padded with zeros after its num_tokens rows.

An image-text model (CLIP, SigLIP) takes `image` too, BYTES [N]: each element an image file's bytes (raw, or in
JSON a data URI or base64 string; an http(s) URL where the server allows its host). A request gives `text`, `image`
or both; `embedding`'s rows are the texts in order, then the images, all in the space the model's towers share.

A multi-vector (ColBERT) model gives `token_embeddings`, FP32 [N, K, d], each input's vectors (engine/multi_vector.py)
padded with zeros, and `num_vectors`, INT32 [N], which MaxSim must read (a zero vector would win the max over negative
products). The parameter `input_type` ("document", the default, or "query") says how the texts are taken.

A reranker (a cross-encoder) takes `query`, BYTES [1], and `text`, BYTES [N], the documents, and gives `score`, FP32
[N], each document's score in the order sent (the model's activation applied; the parameter `raw_scores` gives the
logits).

Request parameters, as on the other doors: `truncate`, `normalize` (booleans; `truncate` unset: as the server's
--long-inputs says), `dimensions` (an integer), `prompt_name`, `task` (strings), `embedding_type` (int8, uint8,
binary, ubinary; engine/quantize.py).

Every model has one version, "1". Tensors are row-major; a BYTES element in raw form is a 4-byte little-endian length
and its bytes (Triton's serialize_byte_tensor).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from attnserve.engine.outputs import EncodeReply
from attnserve.engine.scores import PredictReply, RerankReply
from attnserve.errors import InvalidInputError

from .image_inputs import ImageBytes, ImageUrl, image_of
from .models import VERSION, ModelInfo
from .requests import EncodeRequest, Input
from .score_requests import PredictRequest, RerankRequest

PLATFORM = "attnserve_onnxruntime"
TEXT, QUERY, IMAGE = "text", "query", "image"
# BYTES elements' length prefix: uint32, little-endian.
LENGTH_PREFIX = struct.Struct("<I")
# Triton's model configuration names datatypes its own way.
CONFIG_DATATYPES = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT32": "TYPE_INT32", "INT8": "TYPE_INT8",
                    "UINT8": "TYPE_UINT8"}
# What each door serves beyond the core protocol (Triton's extension names), reported by server metadata.
EXTENSIONS = ("model_configuration", "model_repository", "statistics")
P = TypeVar("P", bool, int, str)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: any size
    optional: bool = False  # an image-text model's text and image: either, or both


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    default_outputs: tuple[str, ...]  # what a request that names no output gets

    def datatype(self, output: str) -> str:
        return next(spec.datatype for spec in self.outputs if spec.name == output)


def signature(info: ModelInfo) -> Signature:
    if is_classifier(info):  # several labels: each text's score of every label, in label order
        return Signature((TensorSpec(TEXT, "BYTES", (-1,)),),
                         (TensorSpec("scores", "FP32", (-1, info.num_labels)),), ("scores",))
    if info.kind == "reranker":
        return Signature((TensorSpec(QUERY, "BYTES", (1,)), TensorSpec(TEXT, "BYTES", (-1,))),
                         (TensorSpec("score", "FP32", (-1,)),), ("score",))
    text: tuple[TensorSpec, ...] = (TensorSpec(TEXT, "BYTES", (-1,)),)
    if "embed_image" in info.outputs:
        text = (TensorSpec(TEXT, "BYTES", (-1,), optional=True), TensorSpec(IMAGE, "BYTES", (-1,), optional=True))
    if "embed_multi" in info.outputs:
        return Signature(text, (TensorSpec("token_embeddings", "FP32", (-1, -1, info.embedding_size)),
                                TensorSpec("num_vectors", "INT32", (-1,))), ("token_embeddings", "num_vectors"))
    return Signature(text, (TensorSpec("embedding", "FP32", (-1, info.embedding_size)),
                            TensorSpec("num_tokens", "INT32", (-1,)),
                            TensorSpec("token_embeddings", "FP32", (-1, -1, info.hidden_size))),
                     ("embedding", "num_tokens"))


def is_classifier(info: ModelInfo) -> bool:
    """A sequence classifier of several labels: it predicts, it does not rerank."""
    return info.kind == "reranker" and "predict" in info.outputs and "rerank" not in info.outputs


def model_metadata(info: ModelInfo) -> dict:
    """The model's metadata, in v2's JSON form (the gRPC door fills its message from it)."""
    def tensors(specs: Iterable[TensorSpec]) -> list[dict]:
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

    sig = signature(info)
    return {"name": info.model, "versions": [VERSION], "platform": PLATFORM, "inputs": tensors(sig.inputs),
            "outputs": tensors(sig.outputs)}


def model_config(info: ModelInfo) -> dict:
    """Triton's model configuration of the model, in its JSON form (protobuf's, field names as in the .proto), which
    tritonclient and perf_analyzer read. max_batch_size 0: Triton makes no batch dimension, the dims are the whole
    shape, and -1 is any size; the server batches by length across requests instead (its parameters say how)."""
    sig = signature(info)

    def dims(spec: TensorSpec) -> list[int]:
        return list(spec.shape)  # numbers, as Triton writes them (perf_analyzer reads them so)

    return {
        "name": info.model, "platform": PLATFORM, "backend": "attnserve", "max_batch_size": 0,
        "input": [{"name": s.name, "data_type": CONFIG_DATATYPES[s.datatype], "dims": dims(s),
                   **({"optional": True} if s.optional else {})} for s in sig.inputs],
        "output": [{"name": s.name, "data_type": CONFIG_DATATYPES[s.datatype], "dims": dims(s)}
                   for s in sig.outputs],
        "parameters": {name: {"string_value": str(value)} for name, value in (
            ("batching", "length-sorted, across requests"), ("max_batch_tokens", info.max_batch_tokens),
            ("max_inputs_per_request", info.max_inputs_per_request), ("max_seq_length", info.max_seq_length),
            ("max_wait_ms", info.max_wait_ms), ("precision", info.precision), ("provider", info.provider))},
    }


@dataclass(frozen=True)
class InputTensor:
    """A request's input tensor as its wire gave it: elements typed (`data`, flat or nested) or raw bytes."""

    name: str
    datatype: str
    shape: Sequence[int]
    data: Sequence[object] | None = None
    raw: memoryview | bytes | None = None


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    parameters: dict


@dataclass(frozen=True)
class Call:
    """An infer request, translated: the core's request and the outputs to send (name -> the wire's binary flag,
    which the HTTP door reads)."""

    request: EncodeRequest | RerankRequest | PredictRequest
    outputs: dict[str, bool]


def read_call(info: ModelInfo, inputs: Sequence[InputTensor], params: dict,
              requested: Sequence[RequestedOutput] | None, binary_default: bool = False) -> Call:
    """The core's request for the model's infer, its tensors and parameters checked against its signature."""
    sig = signature(info)
    texts = _read_inputs(info, sig, inputs)
    outputs = _outputs(sig, requested, binary_default)
    if is_classifier(info):
        return Call(PredictRequest(inputs=texts[TEXT], model=info.model,
                                   raw_scores=bool(parameter(params, "raw_scores", bool)),
                                   truncate=parameter(params, "truncate", bool)), outputs)
    if info.kind == "reranker":
        (query,) = texts[QUERY]
        return Call(RerankRequest(query=query, texts=texts[TEXT], model=info.model,
                                  raw_scores=bool(parameter(params, "raw_scores", bool)),
                                  truncate=parameter(params, "truncate", bool)), outputs)
    if "embed_multi" in info.outputs:  # a ColBERT model: the core refuses the other parameters for it
        return Call(EncodeRequest(inputs=texts[TEXT], model=info.model, truncate=parameter(params, "truncate", bool),
                                  multi_vector=parameter(params, "input_type", str) or "document"), outputs)
    items: list[Input] = [*texts.get(TEXT, []), *texts.get(IMAGE, [])]  # (texts and images both: the image model's)
    return Call(EncodeRequest(inputs=items, model=info.model, normalize=parameter(params, "normalize", bool),
                              truncate=parameter(params, "truncate", bool),
                              dimensions=parameter(params, "dimensions", int),
                              prompt_name=parameter(params, "prompt_name", str),
                              task=parameter(params, "task", str),
                              token_embeddings="token_embeddings" in outputs,
                              embedding_types=(parameter(params, "embedding_type", str) or "float",)), outputs)


def _read_inputs(info: ModelInfo, sig: Signature, inputs: Sequence[InputTensor]) -> dict[str, list]:
    specs = {spec.name: spec for spec in sig.inputs}
    names = " and ".join(f"{name!r}" for name in specs)
    texts: dict[str, list] = {}
    for index, tensor in enumerate(inputs):
        if tensor.name not in specs:
            raise InvalidInputError(f"inputs[{index}].name: {info.model} takes {names}, not {tensor.name!r}",
                                    field=f"inputs[{index}].name")
        if tensor.name in texts:
            raise InvalidInputError(f"inputs[{index}]: the input {tensor.name!r} is given twice",
                                    field=f"inputs[{index}]")
        texts[tensor.name] = _texts(tensor, index, specs[tensor.name])
    if not texts and all(spec.optional for spec in specs.values()):
        raise InvalidInputError(f"inputs: {info.model} takes {' or '.join(repr(n) for n in specs)} (BYTES), or both; "
                                "neither is given", field="inputs")
    missing = [name for name in specs if name not in texts and not specs[name].optional]
    if missing:
        raise InvalidInputError(f"inputs: {info.model} takes {names} (BYTES); {missing[0]!r} is missing",
                                field="inputs")
    return texts


def _texts(tensor: InputTensor, index: int, spec: TensorSpec) -> list:
    """The tensor's texts (or an `image` tensor's images), its shape, datatype and data checked against each other
    and against the spec."""
    where = f"inputs[{index}]"
    if tensor.datatype != "BYTES":
        kind = "images" if spec.name == IMAGE else "texts"
        raise InvalidInputError(f"{where}.datatype: {tensor.name!r} is BYTES ({kind}), not {tensor.datatype!r}",
                                field=f"{where}.datatype")
    shape = list(tensor.shape)
    one = spec.shape == (1,)  # the reranker's query: one text
    if (not 1 <= len(shape) <= 2 or any(d < 0 for d in shape) or (len(shape) == 2 and shape[1] != 1)
            or (one and shape[0] != 1)):
        allowed = "[1] or [1, 1]" if one else "[N] or [N, 1]"
        raise InvalidInputError(f"{where}.shape: {tensor.name!r} is {allowed}, got {shape}", field=f"{where}.shape")
    count = math.prod(shape)
    if (tensor.data is None) == (tensor.raw is None):
        raise InvalidInputError(f"{where}: give {tensor.name!r}'s elements once, either typed (data, contents) or as "
                                "raw bytes (binary_data_size, raw_input_contents)", field=where)
    elements: list[object]
    if tensor.raw is not None:
        elements = [*binary_elements(memoryview(tensor.raw), count, where)]
    else:
        assert tensor.data is not None
        elements = [*_flat(tensor.data)]
        if len(elements) != count:
            raise InvalidInputError(f"{where}.data: shape {shape} holds {count} elements, the data has "
                                    f"{len(elements)}", field=f"{where}.data")
    if spec.name == IMAGE:
        return [_image(element, f"{where}.data[{i}]") for i, element in enumerate(elements)]
    texts = []
    for i, element in enumerate(elements):
        if isinstance(element, str):
            texts.append(element)
            continue
        if not isinstance(element, bytes):
            raise InvalidInputError(f"{where}.data[{i}]: must be a string, got {type(element).__name__}",
                                    field=f"{where}.data[{i}]")
        try:
            texts.append(element.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise InvalidInputError(f"{where}.data[{i}]: not UTF-8 text ({e.reason} at byte {e.start})",
                                    field=f"{where}.data[{i}]") from None
    return texts


def _image(element: object, field: str) -> ImageBytes | ImageUrl:
    """An `image` element: a file's bytes (raw), or a data URI, base64 or URL string (JSON)."""
    if isinstance(element, bytes):
        return ImageBytes(element, None)
    if isinstance(element, str):
        return image_of(element, field)
    raise InvalidInputError(f"{field}: must be an image's bytes or a string, got {type(element).__name__}",
                            field=field)


def _flat(data: Sequence[object]) -> Iterator[object]:
    """Tensor data, row-major, flat or nested as the shape: its elements in order. The nesting is not held to the
    shape; the element count is, so nothing is dropped or made up."""
    stack: list[Iterator[object]] = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            yield item
        else:
            stack.pop()


def binary_elements(data: memoryview, count: int, where: str) -> list[bytes]:
    """`count` BYTES elements, each a uint32 length and its bytes, filling the data exactly."""
    # Each element takes at least its 4-byte prefix: a count beyond that cannot be right, whatever the shape says.
    if count > len(data) // LENGTH_PREFIX.size:
        raise InvalidInputError(f"{where}: shape holds {count} elements, but {len(data)} bytes cannot", field=where)
    elements, offset = [], 0
    for i in range(count):
        if offset + LENGTH_PREFIX.size > len(data):
            raise InvalidInputError(f"{where}: element {i}'s length runs past the tensor's bytes", field=where)
        (length,) = LENGTH_PREFIX.unpack_from(data, offset)
        offset += LENGTH_PREFIX.size
        if offset + length > len(data):
            raise InvalidInputError(f"{where}: element {i} is {length} bytes, past the tensor's bytes", field=where)
        elements.append(bytes(data[offset:offset + length]))
        offset += length
    if offset != len(data):
        raise InvalidInputError(f"{where}: {len(data) - offset} bytes follow the tensor's {count} elements",
                                field=where)
    return elements


def parameter(params: dict, name: str, kind: type[P], where: str = "parameters") -> P | None:
    value = params.get(name)
    if value is None:
        return None
    if type(value) is not kind:  # 8.0 is not an integer, on every door (docs/http.md): JSON's 8, gRPC's int64_param
        problem = (f"must be {({bool: 'a boolean', int: 'an integer', str: 'a string'}[kind])}, got {value!r}"
                   if not (kind is int and type(value) is float) else not_an_integer(value))
        raise InvalidInputError(f"{where}.{name}: {problem}", field=f"{where}.{name}")
    return value  # type(value) is kind


def not_an_integer(value: float) -> str:
    """What a float sent for an integer gets, on every door (the HTTP bodies' too): the integer to send, where it is
    one (8, not 8.0)."""
    if value.is_integer() and abs(value) < 2**63:
        return f"must be an integer, written without a fraction or exponent: {int(value)}, not {value!r}"
    return f"must be an integer, got {value!r}"


def _outputs(sig: Signature, requested: Sequence[RequestedOutput] | None, binary_default: bool) -> dict[str, bool]:
    """The outputs to send, each with whether it goes as binary data (the HTTP door's choice)."""
    if not requested:  # unset, or empty as protobuf cannot tell apart from unset: the model's usual outputs
        return dict.fromkeys(sig.default_outputs, binary_default)
    names = [spec.name for spec in sig.outputs]
    outputs: dict[str, bool] = {}
    for i, output in enumerate(requested):
        if output.name not in names:
            raise InvalidInputError(f"outputs[{i}].name: no output {output.name!r}; the outputs are "
                                    + ", ".join(names), field=f"outputs[{i}].name")
        binary = parameter(output.parameters, "binary_data", bool, f"outputs[{i}].parameters")
        outputs[output.name] = binary_default if binary is None else binary
    return outputs


def encode_outputs(reply: EncodeReply, names: Iterable[str]) -> dict[str, tuple[str, np.ndarray]]:
    """The outputs asked for, each (datatype, array): little-endian, C-contiguous, ready to send as bytes."""
    arrays: dict[str, tuple[str, np.ndarray]] = {}
    for name in names:
        if name == "embedding":
            kind = reply.options.embedding_types[0]
            codes = reply.typed.get(kind) if kind != "float" else None  # (N, D) or (N, D / 8) int8 / uint8
            arrays[name] = (("INT8" if codes.dtype == np.int8 else "UINT8", np.ascontiguousarray(codes))
                            if codes is not None else ("FP32", np.ascontiguousarray(reply.embeddings, dtype="<f4")))
        elif name == "num_tokens":
            arrays[name] = ("INT32", np.fromiter((item.num_tokens for item in reply.inputs), dtype="<i4",
                                                 count=len(reply.inputs)))
        elif name == "token_embeddings":
            rows = [item.multi_vector if reply.options.multi_vector is not None else item.token_embeddings
                    for item in reply.inputs]  # (K_i, d) each
            arrays[name] = ("FP32", _padded([r for r in rows if r is not None]))
        elif name == "num_vectors":
            arrays[name] = ("INT32", np.fromiter((len(item.multi_vector) for item in reply.inputs
                                                  if item.multi_vector is not None), dtype="<i4"))
    return arrays


def _padded(rows: list[np.ndarray]) -> np.ndarray:
    """[N, K, d] FP32, each row's vectors and then zeros; K the most any row has."""
    width = rows[0].shape[1] if rows else 0
    out = np.zeros((len(rows), max((len(r) for r in rows), default=0), width), dtype="<f4")
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def predict_outputs(reply: PredictReply, labels: Sequence[str]) -> dict[str, tuple[str, np.ndarray]]:
    """A classifier's `scores`, [N, labels] FP32, each row in label order (the core's are best first)."""
    column = {label: j for j, label in enumerate(labels)}
    scores = np.empty((len(reply.predictions), len(labels)), dtype="<f4")
    for i, prediction in enumerate(reply.predictions):
        for label, score in prediction:
            scores[i, column[label]] = score
    return {"scores": ("FP32", scores)}


def rerank_outputs(reply: RerankReply, count: int) -> dict[str, tuple[str, np.ndarray]]:
    """The reranker's `score`, [count] FP32, in the order the documents came (the core's reply is sorted)."""
    scores = np.empty(count, dtype="<f4")
    for result in reply.results:
        scores[result.index] = result.score
    return {"score": ("FP32", scores)}
