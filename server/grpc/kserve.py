"""The inference.GRPCInferenceService servicer: KServe's Open Inference Protocol (v2) over gRPC, as Triton serves it
(with its model_configuration, model_repository and statistics extensions), beside attnserve.v1.Encoder on the same
port, so that tritonclient.grpc, KServe's InferenceGRPCClient and perf_analyzer call attnserve unchanged.

It translates protobuf and nothing else: a model's tensors and how they become the core's requests are
open_inference.py's, shared with the HTTP door; the core validates, batches by length across requests (a ModelInfer
of 500 texts of mixed length is batched like any other request) and answers. Errors map through status.py, as the
encoder service's do; calls are counted in flight and in the metrics (protocol "kserve-grpc") by calls.py.

ModelInfer reads its inputs from `contents` (bytes_contents for BYTES) or from `raw_input_contents`, one entry per
input, as Triton does; replies carry each output in raw_output_contents, little-endian, as Triton's do. A reply is
built and serialized in the core's thread pool, off the event loop.
"""

from __future__ import annotations

import grpc
import numpy as np
from google.protobuf import json_format

from attnserve.errors import InvalidInputError, ModelNotFoundError
from attnserve.kserve import grpc_service_pb2 as pb
from attnserve.kserve import grpc_service_pb2_grpc, model_config_pb2

from .. import open_inference as oip
from ..core import Core
from ..metrics import Metrics
from ..models import VERSION, ModelInfo, check_version
from ..requests import EncodeRequest
from ..score_requests import PredictRequest, RerankRequest
from .calls import Calls, deadline

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name  # "inference.GRPCInferenceService"
REQUEST_TYPES = {m.name: m.input_type.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
PROTOCOL = "kserve-grpc"
# Answered without an API key and while draining, as HTTP's /v2/health/live and /ready: probes need no key.
OPEN_METHODS = (f"/{SERVICE_NAME}/ServerLive", f"/{SERVICE_NAME}/ServerReady")
TRUNCATE_HOW = "set the request parameter truncate (bool_param: true)"


class InferenceService(grpc_service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: Core, metrics: Metrics):
        self._core = core
        self._calls = Calls(core, metrics, PROTOCOL, REQUEST_TYPES, TRUNCATE_HOW)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ServerLiveResponse:
        return await self._calls.quick("ServerLive", context, lambda: pb.ServerLiveResponse(live=True))

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ServerReadyResponse:
        # False before warm-up and from the drain's start: a load balancer stops sending here.
        return await self._calls.quick("ServerReady", context,
                                       lambda: pb.ServerReadyResponse(ready=self._core.serving))

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ModelReadyResponse:
        def ready() -> pb.ModelReadyResponse:
            try:
                self._info(request.name, request.version)
            except ModelNotFoundError:  # as Triton: a model not served is not ready, no error
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=self._core.serving)

        return await self._calls.quick("ModelReady", context, ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
                             ) -> pb.ServerMetadataResponse:
        return await self._calls.quick("ServerMetadata", context, lambda: pb.ServerMetadataResponse(
            name="attnserve", version=self._core.info.version, extensions=oip.EXTENSIONS))

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
                            ) -> pb.ModelMetadataResponse:
        return await self._calls.quick("ModelMetadata", context, lambda: json_format.ParseDict(
            oip.model_metadata(self._info(request.name, request.version)), pb.ModelMetadataResponse()))

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ModelConfigResponse:
        return await self._calls.quick("ModelConfig", context, lambda: pb.ModelConfigResponse(
            config=json_format.ParseDict(oip.model_config(self._info(request.name, request.version)),
                                         model_config_pb2.ModelConfig())))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
                              ) -> pb.ModelStatisticsResponse:
        async def answer() -> pb.ModelStatisticsResponse:
            return json_format.ParseDict(await self._core.models.statistics(request.name, request.version),
                                         pb.ModelStatisticsResponse())
        return await self._calls.quick("ModelStatistics", context, answer)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
                              ) -> pb.RepositoryIndexResponse:
        return await self._calls.quick("RepositoryIndex", context, lambda: pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=model.name, version=VERSION, state="READY")
            for model in self._core.models.all]))

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> bytes:
        async def infer() -> tuple[bytes, int]:
            info = self._info(request.model_name, request.model_version)
            with self._core.counted(info.model):  # from here the request reached the model: its statistics count it
                return await infer_found(info)

        async def infer_found(info: ModelInfo) -> tuple[bytes, int]:
            call = oip.read_call(info, _inputs(request), _parameters(request.parameters, "parameters"),
                                 [oip.RequestedOutput(o.name, _parameters(o.parameters, f"outputs[{i}].parameters"))
                                  for i, o in enumerate(request.outputs)])

            def render(arrays: dict[str, tuple[str, np.ndarray]]) -> bytes:
                return _reply(arrays, info.model, request.id, call.outputs)

            if isinstance(call.request, RerankRequest):
                reply = await self._core.rerank(call.request, deadline(context))
                return render(oip.rerank_outputs(reply, len(call.request.texts))), reply.tokens
            if isinstance(call.request, PredictRequest):
                predicted = await self._core.predict(call.request, deadline(context))
                return render(oip.predict_outputs(predicted, info.labels)), predicted.tokens
            assert isinstance(call.request, EncodeRequest)
            return await self._core.encode(call.request, deadline(context),
                                           lambda r: render(oip.encode_outputs(r, call.outputs)))

        return await self._calls.unary("ModelInfer", _count(request), context, infer)

    def _info(self, name: str, version: str):
        info = self._core.model(name).info
        check_version(info, version)
        return info


def _count(request: pb.ModelInferRequest) -> int:
    """How many inputs a request holds, for the request log: the first input's first dimension."""
    return int(request.inputs[0].shape[0]) if request.inputs and request.inputs[0].shape else 0


def _inputs(request: pb.ModelInferRequest) -> list[oip.InputTensor]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInputError(f"raw_input_contents: {len(raw)} entries for {len(request.inputs)} inputs; give one "
                                "per input, in the order of inputs", field="raw_input_contents")
    tensors = []
    for i, tensor in enumerate(request.inputs):
        typed = tensor.HasField("contents")
        if raw and typed:
            raise InvalidInputError(f"inputs[{i}].contents: give every input's elements in raw_input_contents or "
                                    "every input's in contents, not both", field=f"inputs[{i}].contents")
        tensors.append(oip.InputTensor(tensor.name, tensor.datatype, tensor.shape,
                                       data=tensor.contents.bytes_contents if typed else None,
                                       raw=raw[i] if raw else None))
    return tensors


def _parameters(parameters, where: str) -> dict:
    """A map of InferParameter -> {name: bool | int | str | float}, as HTTP's JSON gives them."""
    values = {}
    for name, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidInputError(f"{where}.{name}: holds no value", field=f"{where}.{name}")
        values[name] = getattr(parameter, kind)
    return values


def _reply(arrays: dict[str, tuple[str, np.ndarray]], model: str, id: str, outputs: dict[str, bool]) -> bytes:
    """The serialized ModelInferResponse: each output's datatype and shape, its data in raw_output_contents."""
    reply = pb.ModelInferResponse(model_name=model, model_version=VERSION, id=id)
    for name in outputs:
        datatype, array = arrays[name]
        reply.outputs.add(name=name, datatype=datatype, shape=array.shape)
        reply.raw_output_contents.append(array.tobytes())
    return reply.SerializeToString()


def add_to_server(service: InferenceService, server: grpc.aio.Server) -> None:
    """The generated registration. ModelInfer's replies are bytes already: the server must run RequestGuard
    (guard.py), which passes bytes through the generated serializers as they are."""
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
