"""KServe v2's HTTP routes (the Open Inference Protocol, as Triton serves it) over the core, so that Triton's and
KServe's clients (tritonclient.http, KServe's InferenceRESTClient) embed texts unchanged.

A model takes one input, `text`: a BYTES tensor of N texts, shape [N] or [N, 1]. It gives two outputs:
`embedding`, FP32 [N, D], the sentence embeddings as the model's pipeline makes them, and `num_tokens`, INT32 [N].
Request parameters: `truncate` and `normalize` (booleans), `dimensions` (an integer), as on the other doors;
`truncate` unset: as the server's --auto-truncate says. `embedding_type` (a string: int8, uint8, binary, ubinary;
engine/quantize.py) makes `embedding` INT8 or UINT8, [N, D] codes or [N, ceil(D / 8)] packed sign bits.

A multi-vector (ColBERT) model gives instead `token_embeddings`, FP32 [N, K, d]: each input's vectors
(engine/multi_vector.py), K the most any input has, the rows after an input's own count zeros; and `num_vectors`,
INT32 [N], that count, which MaxSim must read (a zero vector would win the max over negative products). The request
parameter `input_type` ("document", the default, or "query") says how the texts are taken.

Tensors travel as JSON or, with Triton's binary tensor extension, as raw bytes after the JSON: the request's
`Inference-Header-Content-Length` header says where the JSON ends, and a tensor with the parameter
`binary_data_size` takes that many bytes from there, in input order. A BYTES element is a 4-byte little-endian
length and its bytes. An output asked for with `binary_data: true` (or every output, with the request parameter
`binary_data_output`) comes back the same way, FP32 little-endian.

Model names may hold a slash (sentence-transformers/all-MiniLM-L6-v2): tritonclient does not escape it, so the
name is the whole path between /v2/models/ and the route's last part. Every model has one version, "1".
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator
from typing import TypeVar

import numpy as np
from aiohttp import web

from attnserve.errors import InvalidInputError, MalformedMessageError, MethodNotAllowedError, ModelNotFoundError

from ..core import BINARY_FLOAT_BYTES, Core
from ..models import ModelInfo
from ..replies import EncodeReply
from ..requests import EncodeRequest, check_embedder
from .bodies import KServeInferBody, KServeInferReply, KServeRequestedOutput, KServeTensor, parse
from .errors import KSERVE
from .route import Route
from .wire import JSON_FLOAT_BYTES, BodyReader, deadline, dumps, json_response

HEADER_LENGTH = "Inference-Header-Content-Length"
VERSION = "1"  # every model's one version
INPUT = "text"
OUTPUTS = {"embedding": "FP32", "num_tokens": "INT32"}
MULTI_VECTOR_OUTPUTS = {"token_embeddings": "FP32", "num_vectors": "INT32"}  # a ColBERT model's


def _outputs_of(info: ModelInfo) -> dict[str, str]:
    return MULTI_VECTOR_OUTPUTS if "embed_multi" in info.outputs else OUTPUTS
# A BYTES element's length prefix: uint32, little-endian (Triton's serialize_byte_tensor).
LENGTH_PREFIX = struct.Struct("<I")
P = TypeVar("P", bool, int, str)
NAME = r"{name:.+}"  # a model name, slashes included
VERSIONED = r"{name:.+}/versions/{version:[^/]+}"
# What a metadata route takes for a model name when it is an infer path: NAME[/versions/V]/infer.
INFER_PATH = re.compile(r"(?P<name>.+?)(?:/versions/[^/]+)?/infer")


class KServeRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        def route(method: str, path: str, handler, summary: str, **kwargs) -> Route:
            return Route(method, path, handler, KSERVE, summary, **kwargs)

        infer = dict(body=KServeInferBody, reply=KServeInferReply)
        # The versioned and suffixed paths first: a model name may hold slashes, so /v2/models/{name:.+} would
        # also match them.
        return [
            route("GET", "/v2", self.server_metadata, "the server's name, version and extensions (KServe v2)",
                  reply_schema={"type": "object"}),
            route("GET", "/v2/health/live", self.live, "200 while the process runs (KServe v2)", open=True),
            route("GET", "/v2/health/ready", self.ready, "200 when serving; 503 before warm-up and while draining "
                                                         "(KServe v2)", open=True, readiness=True),
            route("POST", f"/v2/models/{VERSIONED}/infer", self.infer, "sentence embeddings of the `text` tensor "
                                                                        "(KServe v2)", **infer),
            route("POST", f"/v2/models/{NAME}/infer", self.infer, "sentence embeddings of the `text` tensor "
                                                                  "(KServe v2)", **infer),
            route("GET", f"/v2/models/{VERSIONED}/ready", self.model_ready, "200 when the model is ready "
                                                                            "(KServe v2)", readiness=True),
            route("GET", f"/v2/models/{NAME}/ready", self.model_ready, "200 when the model is ready (KServe v2)",
                  readiness=True),
            route("GET", f"/v2/models/{VERSIONED}", self.model_metadata,
                  "the model's inputs and outputs (KServe v2)", reply_schema={"type": "object"}),
            route("GET", f"/v2/models/{NAME}", self.model_metadata, "the model's inputs and outputs (KServe v2)",
                  reply_schema={"type": "object"}),
        ]

    def _info(self, request: web.Request) -> ModelInfo:
        """The model the path names, at its one version.

        A GET or HEAD of a served model's infer path reaches here too, as the metadata route of a model named
        "NAME/infer" (names hold slashes): that is the infer route asked with the wrong method, a 405, not an
        unknown model."""
        version = request.match_info.get("version")
        try:
            info = self._core.model(request.match_info["name"]).info
        except ModelNotFoundError:
            infer = INFER_PATH.fullmatch(request.match_info["name"])
            if infer is not None and infer["name"] in self._core.models.names:
                raise MethodNotAllowedError(f"{request.method} is not allowed on {request.path}",
                                            allowed=("POST",)) from None
            raise
        if version is not None and version != VERSION:
            raise ModelNotFoundError(f"the model {info.model!r} has no version {version!r}; its one version is "
                                     f"{VERSION!r}")
        return info

    async def server_metadata(self, request: web.Request) -> web.Response:
        return json_response(dumps({"name": "attnserve", "version": self._core.info.version,
                                    "extensions": ["binary_tensor_data"]}))

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200)  # the door answered 503 for it unless ready (Route.readiness)

    async def model_ready(self, request: web.Request) -> web.Response:
        self._info(request)
        return web.Response(status=200)

    async def model_metadata(self, request: web.Request) -> web.Response:
        info = self._info(request)
        check_embedder(info.model, info.kind)  # the inputs and outputs below are an embedder's
        return json_response(dumps({
            "name": info.model, "versions": [VERSION], "platform": "attnserve_onnxruntime",
            "inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "token_embeddings", "datatype": "FP32", "shape": [-1, -1, info.embedding_size]},
                        {"name": "num_vectors", "datatype": "INT32", "shape": [-1]}]
            if "embed_multi" in info.outputs else
            [{"name": "embedding", "datatype": "FP32", "shape": [-1, info.embedding_size]},
             {"name": "num_tokens", "datatype": "INT32", "shape": [-1]}]}))

    async def infer(self, request: web.Request) -> web.Response:
        info = self._info(request)
        header_length = _header_length(request)
        # The model of the path computes: the core's request names it, as every door's does.
        call = await self._bodies.read_bytes(request, lambda body: _read_call(body, header_length, info.model,
                                                                              _outputs_of(info)))
        outputs = call.outputs
        json_header: list[int] = []  # render's: where its JSON ends, for the reply's header

        def render(reply: EncodeReply) -> bytes:
            header, tensors = _render(reply, info.model, call.id, outputs)
            json_header.append(len(header))
            return b"".join([header, *tensors])  # one copy of the tensors' bytes

        binary = any(outputs.values())
        reply, _ = await self._core.encode(call.request, deadline(request), render,
                                           BINARY_FLOAT_BYTES if binary else JSON_FLOAT_BYTES)
        if not binary:
            return json_response(reply)
        return web.Response(body=reply, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(json_header[0])})


class _Call:
    """An infer request, translated: the core's request, the reply's id and its outputs (name -> binary?)."""

    def __init__(self, request: EncodeRequest, id: str | None, outputs: dict[str, bool]):
        self.request, self.id, self.outputs = request, id, outputs


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):  # isdigit alone takes "²", which int() refuses
        raise MalformedMessageError(f"{HEADER_LENGTH}: {raw!r} is not a byte count")
    return int(raw)


def _read_call(body: bytes, header_length: int | None, model: str, outputs: dict[str, str] = OUTPUTS) -> _Call:
    """The body (JSON, then the binary tensors when header_length is set) -> the core's request. outputs: the
    model's (a ColBERT model's are MULTI_VECTOR_OUTPUTS)."""
    if header_length is not None and header_length > len(body):
        raise MalformedMessageError(f"{HEADER_LENGTH} is {header_length}, but the body holds {len(body)} bytes")
    split = len(body) if header_length is None else header_length
    infer = parse(KServeInferBody, body[:split])
    tail = memoryview(body)[split:]
    texts: list[str] | None = None
    for index, tensor in enumerate(infer.inputs):
        data, tail = _tensor_bytes(tensor, index, tail)
        if tensor.name != INPUT:
            raise InvalidInputError(f"inputs[{index}].name: {model} takes one input, {INPUT!r}, not "
                                    f"{tensor.name!r}", field=f"inputs[{index}].name")
        if texts is not None:
            raise InvalidInputError(f"inputs[{index}]: the input {INPUT!r} is given twice", field=f"inputs[{index}]")
        texts = _texts(tensor, index, data)
    if texts is None:
        raise InvalidInputError(f"inputs: {model} takes one input, {INPUT!r} (BYTES, shape [N])", field="inputs")
    if len(tail):
        raise MalformedMessageError(f"{len(tail)} bytes follow the binary tensors that the inputs' "
                                    "binary_data_size account for")
    params = infer.parameters or {}
    if outputs is MULTI_VECTOR_OUTPUTS:  # a ColBERT model: the core refuses the other parameters for it
        return _Call(EncodeRequest(inputs=texts, model=model, truncate=_parameter(params, "truncate", bool),
                                   multi_vector=_parameter(params, "input_type", str) or "document"),
                     infer.id, _outputs(infer.outputs, params, outputs))
    return _Call(EncodeRequest(inputs=texts, model=model, normalize=_parameter(params, "normalize", bool),
                               truncate=_parameter(params, "truncate", bool),
                               dimensions=_parameter(params, "dimensions", int),
                               task=_parameter(params, "task", str),
                               embedding_types=(_parameter(params, "embedding_type", str) or "float",)),
                 infer.id, _outputs(infer.outputs, params))


def _tensor_bytes(tensor: KServeTensor, index: int, tail: memoryview) -> tuple[memoryview | None, memoryview]:
    """(the tensor's binary data, or None when it is in JSON; what follows it)."""
    size = (tensor.parameters or {}).get("binary_data_size")
    if size is None:
        return None, tail
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInputError(f"inputs[{index}].parameters.binary_data_size: must be a byte count, got {size!r}",
                                field=f"inputs[{index}].parameters.binary_data_size")
    if size > len(tail):
        raise MalformedMessageError(f"inputs[{index}]: binary_data_size is {size}, but only {len(tail)} bytes "
                                    f"follow the JSON for it (is {HEADER_LENGTH} set?)")
    return tail[:size], tail[size:]


def _texts(tensor: KServeTensor, index: int, binary: memoryview | None) -> list[str]:
    """The tensor's N texts, its shape, datatype and data checked against each other."""
    where = f"inputs[{index}]"
    if tensor.datatype != "BYTES":
        raise InvalidInputError(f"{where}.datatype: {INPUT!r} is BYTES (texts), not {tensor.datatype!r}",
                                field=f"{where}.datatype")
    shape = tensor.shape
    if not 1 <= len(shape) <= 2 or any(d < 0 for d in shape) or (len(shape) == 2 and shape[1] != 1):
        raise InvalidInputError(f"{where}.shape: {INPUT!r} is [N] or [N, 1], got {shape}", field=f"{where}.shape")
    count = math.prod(shape)
    if (tensor.data is None) == (binary is None):
        raise InvalidInputError(f"{where}: give the elements either as data or as binary_data_size bytes",
                                field=where)
    elements: list[object]
    if binary is not None:
        elements = [*_binary_elements(binary, count, where)]
    else:
        assert tensor.data is not None
        elements = [*_flat(tensor.data)]
        if len(elements) != count:
            raise InvalidInputError(f"{where}.data: shape {shape} holds {count} elements, data has {len(elements)}",
                                    field=f"{where}.data")
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


def _flat(data: list) -> Iterator[object]:
    """JSON tensor data, row-major, flat or nested as the shape: its elements in order. The nesting is not held
    to the shape; the element count is, so nothing is dropped or made up."""
    stack: list[Iterator[object]] = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            yield item
        else:
            stack.pop()


def _binary_elements(data: memoryview, count: int, where: str) -> list[bytes]:
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


def _parameter(params: dict, name: str, kind: type[P]) -> P | None:
    value = params.get(name)
    if value is None:
        return None
    if type(value) is not kind:
        raise InvalidInputError(f"parameters.{name}: must be "
                                f"{ {bool: 'a boolean', int: 'an integer', str: 'a string'}[kind]}, got "
                                f"{value!r}", field=f"parameters.{name}")
    return value  # type(value) is kind


def _outputs(requested: list[KServeRequestedOutput] | None, params: dict, names: dict[str, str] = OUTPUTS
             ) -> dict[str, bool]:
    """The outputs to send (of the model's `names`), each with whether it goes as binary data."""
    binary_default = bool(_parameter(params, "binary_data_output", bool))
    if not requested:  # unset, or empty as protobuf cannot tell apart from unset: every output, as Triton does
        return dict.fromkeys(names, binary_default)
    outputs: dict[str, bool] = {}
    for i, output in enumerate(requested):
        if output.name not in names:
            raise InvalidInputError(f"outputs[{i}].name: no output {output.name!r}; the outputs are "
                                    + ", ".join(names), field=f"outputs[{i}].name")
        binary = _parameter(output.parameters or {}, "binary_data", bool)
        outputs[output.name] = binary_default if binary is None else binary
    return outputs


def _render(reply: EncodeReply, model: str, id: str | None, outputs: dict[str, bool]
            ) -> tuple[bytes, list[memoryview]]:
    """(the reply's JSON, the binary outputs' bytes to follow it, in the order of the JSON's outputs)."""
    if reply.options.multi_vector is not None:
        datatypes, arrays = MULTI_VECTOR_OUTPUTS, _multi_vector_arrays(reply)
    else:
        kind = reply.options.embedding_types[0]
        codes = reply.typed.get(kind) if kind != "float" else None  # (N, D) or (N, D / 8) int8 / uint8
        datatypes = {**OUTPUTS, **({"embedding": "INT8" if codes.dtype == np.int8 else "UINT8"} if codes is not None
                                   else {})}
        arrays = {
            "embedding": np.ascontiguousarray(reply.embeddings, dtype="<f4") if codes is None else codes,  # (N, D)
            "num_tokens": np.fromiter((item.num_tokens for item in reply.inputs), dtype="<i4",
                                      count=len(reply.inputs)),
        }
    tensors: list[dict[str, object]] = []
    tail: list[memoryview] = []
    for name, binary in outputs.items():
        array = arrays[name]
        tensor: dict[str, object] = {"name": name, "datatype": datatypes[name], "shape": list(array.shape)}
        if binary:
            tensor["parameters"] = {"binary_data_size": array.nbytes}
            tail.append(array.data)  # a view: the join in render is the one copy
        else:
            tensor["data"] = array.reshape(-1)  # row-major, flat
        tensors.append(tensor)
    header: dict[str, object] = {"model_name": model, "model_version": VERSION, "outputs": tensors}
    if id is not None:
        header["id"] = id
    return dumps(header), tail



def _multi_vector_arrays(reply: EncodeReply) -> dict[str, np.ndarray]:
    """A ColBERT model's vectors as v2 tensors: [N, K, d] zero-padded, and each input's count [N]."""
    vectors = [item.multi_vector for item in reply.inputs if item.multi_vector is not None]  # (K_i, d) each
    counts = np.fromiter((len(v) for v in vectors), dtype="<i4", count=len(vectors))
    padded = np.zeros((len(vectors), int(counts.max(initial=0)), reply.embeddings.shape[1]), dtype="<f4")
    for row, v in enumerate(vectors):
        padded[row, :len(v)] = v
    return {"token_embeddings": padded, "num_vectors": counts}
