"""KServe v2's HTTP routes (the Open Inference Protocol, as Triton serves it) over the core, so that Triton's and
KServe's clients (tritonclient.http, KServe's InferenceRESTClient, perf_analyzer) call it unchanged. What a model's
tensors and parameters are, and how they become the core's requests, is open_inference.py's, shared with the gRPC
door; this module reads and writes HTTP.

Tensors travel as JSON or, with Triton's binary tensor extension, as raw bytes after the JSON: the request's
`Inference-Header-Content-Length` header says where the JSON ends, and a tensor with the parameter
`binary_data_size` takes that many bytes from there, in input order. A BYTES element is a 4-byte little-endian
length and its bytes. An output asked for with `binary_data: true` (or every output, with the request parameter
`binary_data_output`) comes back the same way, little-endian.

Triton's model_configuration extension (GET .../config), its statistics (GET .../stats, server/statistics.py) and
model_repository's index (POST /v2/repository/index) are served for tritonclient and perf_analyzer; models are not
loaded or unloaded at run time.

Model names may hold a slash (sentence-transformers/all-MiniLM-L6-v2): tritonclient does not escape it, so the
name is the whole path between /v2/models/ and the route's last part. Every model has one version, "1".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from aiohttp import web

from attnserve.errors import InvalidInputError, MalformedMessageError

from .. import open_inference as oip
from ..core import BINARY_FLOAT_BYTES, Core
from ..models import VERSION, ModelInfo, check_version
from ..score_requests import PredictRequest, RerankRequest
from .errors import KSERVE
from .kserve_bodies import KServeInferBody, KServeInferReply, KServeRepositoryIndexBody, KServeTensor
from .parsing import parse
from .route import Route
from .wire import JSON_FLOAT_BYTES, BodyReader, InputMarks, deadline, dumps, json_response

HEADER_LENGTH = "Inference-Header-Content-Length"
EXTENSIONS = ["binary_tensor_data", *oip.EXTENSIONS]
NAME = r"{name:.+}"  # a model name, slashes included
VERSIONED = r"{name:.+}/versions/{version:[^/]+}"
# The metadata route's model name: any name but one ending in a suffixed route's word, which would make
# GET /v2/models/M/infer the metadata of a model "M/infer", and a 405 there (or an OPTIONS) advertise GET. So the
# router's 405 names the methods the path takes (Allow: POST for .../infer). A model whose name ends so has no
# metadata route.
METADATA_NAME = r"{name:(?!.*/(?:infer|config|ready|stats)$).+}"


def _one_of(names: list[str]) -> dict:
    """One of the names; none at all where there are none (the parameter is then refused)."""
    return {"enum": names} if names else {"not": {}}


def infer_body_schema(info: ModelInfo) -> dict:
    """The JSON body of an infer request to this model, as far as JSON Schema can say it: its input tensors by
    name (each once, BYTES, shape [N] or [N, 1], or [1] for a reranker's query; texts, not empty), the outputs it
    can name, and the parameters it reads with their types. That a shape's product is its data's length, JSON
    Schema cannot say (the door refuses a shape that lies, naming both); nor the binary form of a tensor, which a
    body of another content type carries (Inference-Header-Content-Length)."""
    sig = oip.signature(info)
    text = {"type": "string", "minLength": 1, "pattern": r"\S"}
    scalar = {"type": ["string", "number", "boolean"]}

    def tensor(spec: oip.TensorSpec) -> dict:
        one = spec.shape == (1,)
        return {"type": "object", "required": ["name", "shape", "datatype", "data"], "properties": {
            "name": {"const": spec.name},
            "shape": {"type": "array", "minItems": 1, "maxItems": 2, "prefixItems": [
                {"type": "integer", "minimum": 1, "maximum": 1 if one else info.max_inputs_per_request},
                {"const": 1}]},
            "datatype": {"const": "BYTES"},
            "parameters": {"type": ["object", "null"], "properties": {"binary_data_size": {"not": {}}},
                           "additionalProperties": scalar},
            "data": {"type": "array", "minItems": 1, "maxItems": 1 if one else info.max_inputs_per_request,
                     "items": {"anyOf": [text, {
                "type": "array", "items": text, "minItems": 1, "maxItems": 1}]}}}}

    # Parameter values are strings, numbers and booleans (bodies.Parameters); unknown names are ignored.
    flag: dict = {"type": "boolean"}
    word: dict = {"type": ["string", "null"]}
    parameters: dict[str, dict] = {"truncate": flag, "binary_data_output": flag}
    if info.kind == "reranker":
        parameters["raw_scores"] = flag
    elif "embed_multi" in info.outputs:
        parameters["input_type"] = {"enum": ["query", "document"]}
    else:
        parameters.update(normalize=flag, dimensions={"type": "integer", "minimum": 1, "maximum": info.embedding_size},
                          prompt_name=_one_of(list(info.prompts)), task=_one_of(list(info.tasks)),
                          embedding_type={"enum": [*info.embedding_types]})
    return {"type": "object", "required": ["inputs"], "properties": {
        "id": word,
        "parameters": {"type": ["object", "null"], "properties": parameters, "additionalProperties": scalar},
        "inputs": {"type": "array", "minItems": 1 if all(s.optional for s in sig.inputs) else len(sig.inputs),
                   "maxItems": len(sig.inputs), "items": {"anyOf": [tensor(spec) for spec in sig.inputs]},
                   "allOf": [{"contains": {"properties": {"name": {"const": spec.name}}}} for spec in sig.inputs
                             if not spec.optional]},
        "outputs": {"anyOf": [{"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"enum": [spec.name for spec in sig.outputs]},
            "parameters": {"type": ["object", "null"], "properties": {"binary_data": flag},
                           "additionalProperties": scalar}}}},
            {"type": "null"}]}}}


class KServeRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        def route(method: str, path: str, handler, summary: str, **kwargs) -> Route:
            return Route(method, path, handler, KSERVE, summary, **kwargs)

        # Outputs asked for as binary data come after the JSON header in an application/octet-stream reply.
        infer = dict(body=KServeInferBody, reply=KServeInferReply,
                     content_types=("application/json", "application/octet-stream"))
        infer_summary = "the model's outputs for its inputs: embeddings of `text`, a reranker's scores (KServe v2)"
        config_summary = "the model's configuration, as Triton gives it (KServe v2, model_configuration)"
        stats_summary = "the model's inference statistics, as Triton counts them (KServe v2, statistics)"
        obj = {"type": "object"}
        # The versioned and suffixed paths first: a model name may hold slashes, so /v2/models/{name:.+} would
        # also match them.
        return [
            route("GET", "/v2", self.server_metadata, "the server's name, version and extensions (KServe v2)",
                  reply_schema=obj),
            route("GET", "/v2/health/live", self.live, "200 while the process runs (KServe v2)", open=True),
            route("GET", "/v2/health/ready", self.ready, "200 when serving; 503 before warm-up and while draining "
                                                         "(KServe v2)", open=True, readiness=True),
            route("POST", "/v2/repository/index", self.repository_index,
                  "every served model, READY (KServe v2, model_repository)", body=KServeRepositoryIndexBody,
                  body_required=False,  # tritonclient's get_model_repository_index posts none
                  reply_schema={"type": "array", "items": obj}),
            route("GET", "/v2/models/stats", self.statistics,
                  "every model's inference statistics, as Triton counts them (KServe v2, statistics)",
                  reply_schema=obj),
            route("GET", f"/v2/models/{VERSIONED}/stats", self.statistics, stats_summary, reply_schema=obj),
            route("GET", f"/v2/models/{NAME}/stats", self.statistics, stats_summary, reply_schema=obj),
            route("POST", f"/v2/models/{VERSIONED}/infer", self.infer, infer_summary, **infer),
            route("POST", f"/v2/models/{NAME}/infer", self.infer, infer_summary, **infer),
            route("GET", f"/v2/models/{VERSIONED}/config", self.model_config, config_summary, reply_schema=obj),
            route("GET", f"/v2/models/{NAME}/config", self.model_config, config_summary, reply_schema=obj),
            route("GET", f"/v2/models/{VERSIONED}/ready", self.model_ready, "200 when the model is ready "
                                                                            "(KServe v2)", readiness=True),
            route("GET", f"/v2/models/{NAME}/ready", self.model_ready, "200 when the model is ready (KServe v2)",
                  readiness=True),
            route("GET", f"/v2/models/{VERSIONED}", self.model_metadata,
                  "the model's inputs and outputs (KServe v2)", reply_schema=obj),
            route("GET", f"/v2/models/{METADATA_NAME}", self.model_metadata,
                  "the model's inputs and outputs (KServe v2)",
                  reply_schema=obj),
        ]

    def _info(self, request: web.Request) -> ModelInfo:
        """The model the path names, at its one version."""
        info = self._core.model(request.match_info["name"]).info
        check_version(info, request.match_info.get("version"))
        return info

    async def server_metadata(self, request: web.Request) -> web.Response:
        return json_response(dumps({"name": "attnserve", "version": self._core.info.version,
                                    "extensions": EXTENSIONS}))

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200)  # the door answered 503 for it unless ready (Route.readiness)

    async def model_ready(self, request: web.Request) -> web.Response:
        self._info(request)
        return web.Response(status=200)

    async def model_metadata(self, request: web.Request) -> web.Response:
        return json_response(dumps(oip.model_metadata(self._info(request))))

    async def model_config(self, request: web.Request) -> web.Response:
        return json_response(dumps(oip.model_config(self._info(request))))

    async def statistics(self, request: web.Request) -> web.Response:
        name = request.match_info.get("name", "")
        if name:
            self._info(request)  # a 405 for a wrong method on a suffixed path, as the other routes
        return json_response(dumps(await self._core.models.statistics(name, request.match_info.get("version"))))

    async def repository_index(self, request: web.Request) -> web.Response:
        # tritonclient sends no body at all; one that is sent must be the index request's JSON.
        await self._bodies.read_bytes(request, lambda body: body and parse(KServeRepositoryIndexBody, body,
                                                                           request.path))
        return json_response(dumps([{"name": model.name, "version": VERSION, "state": "READY"}
                                    for model in self._core.models.all]))

    async def infer(self, request: web.Request) -> web.Response:
        info = self._info(request)
        with self._core.counted(info.model):  # from here the request reached the model: its statistics count it
            return await self._infer(request, info)

    async def _infer(self, request: web.Request, info: ModelInfo) -> web.Response:
        header_length = _header_length(request)
        call, id = await self._bodies.read_bytes(request, lambda body: _read_call(body, header_length, info,
                                                                                  request.path))
        outputs = call.outputs
        json_header: list[int] = []  # render's: where its JSON ends, for the reply's header

        def render(arrays: dict[str, tuple[str, np.ndarray]]) -> bytes:
            header, tensors = _render(arrays, info.model, id, outputs)
            json_header.append(len(header))
            return b"".join([header, *tensors])  # one copy of the tensors' bytes

        binary = any(outputs.values())
        marks = InputMarks(lambda r: render(oip.encode_outputs(r, outputs)))  # an embedding request's long inputs
        if isinstance(call.request, RerankRequest):
            scores = oip.rerank_outputs(await self._core.rerank(call.request, deadline(request)),
                                        len(call.request.texts))
            reply = render(scores)
        elif isinstance(call.request, PredictRequest):
            reply = render(oip.predict_outputs(await self._core.predict(call.request, deadline(request)),
                                               info.labels))
        else:
            reply, _ = await self._core.encode(call.request, deadline(request), marks,
                                               BINARY_FLOAT_BYTES if binary else JSON_FLOAT_BYTES)
        if not binary:
            return json_response(reply, headers=marks.headers())
        return web.Response(body=reply, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(json_header[0]), **(marks.headers() or {})})


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):  # isdigit alone takes "²", which int() refuses
        raise MalformedMessageError(f"{HEADER_LENGTH}: {raw!r} is not a byte count")
    return int(raw)


def _read_call(body: bytes, header_length: int | None, info: ModelInfo, route: str) -> tuple[oip.Call, str | None]:
    """The body (JSON, then the binary tensors when header_length is set) -> (the core's request, the reply's id);
    route: the path it was sent to, as a parse error names it."""
    if header_length is not None and header_length > len(body):
        raise MalformedMessageError(f"{HEADER_LENGTH} is {header_length}, but the body holds {len(body)} bytes")
    split = len(body) if header_length is None else header_length
    infer = parse(KServeInferBody, body[:split], route)
    tail = memoryview(body)[split:]
    inputs: list[oip.InputTensor] = []
    for index, tensor in enumerate(infer.inputs):
        raw, tail = _tensor_bytes(tensor, index, tail)
        inputs.append(oip.InputTensor(tensor.name, tensor.datatype, tensor.shape, tensor.data, raw))
    if len(tail):
        raise MalformedMessageError(f"{len(tail)} bytes follow the binary tensors that the inputs' "
                                    "binary_data_size account for")
    params = infer.parameters or {}
    binary_default = bool(oip.parameter(params, "binary_data_output", bool))
    requested = [oip.RequestedOutput(o.name, o.parameters or {}) for o in infer.outputs or ()]
    return oip.read_call(info, inputs, params, requested, binary_default), infer.id


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


def _render(arrays: dict[str, tuple[str, np.ndarray]], model: str, id: str | None, outputs: dict[str, bool]
            ) -> tuple[bytes, Sequence[memoryview]]:
    """(the reply's JSON, the binary outputs' bytes to follow it, in the order of the JSON's outputs)."""
    tensors: list[dict[str, object]] = []
    tail: list[memoryview] = []
    for name, binary in outputs.items():
        datatype, array = arrays[name]
        tensor: dict[str, object] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
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
