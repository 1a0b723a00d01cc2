"""The load over KServe v2 (the Open Inference Protocol), as Triton's clients send it, so that the same load runs
against attnserve, Triton or any v2 server:

  kserve       gRPC: inference.GRPCInferenceService/ModelInfer, the texts in raw_input_contents, on one channel
               (round_robin over every address of the target, as the Embed load);
  kserve-http  HTTP: POST /v2/models/NAME/infer with Triton's binary tensor extension, the texts as BYTES after the
               JSON, `embedding` back as binary, `num_tokens` as JSON (the tokens the report counts).

The model is the first the repository index lists, its readiness the protocol's own (ServerReady,
/v2/health/ready). A server that gives no `num_tokens` output (Triton serving another model) is answered with 0
tokens: requests per second still compare.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import grpc
import numpy as np
import orjson

from attnserve.client.client import Input, open_channel
from attnserve.client.health import NotServing
from attnserve.config import ClientConfig, LoadTestConfig
from attnserve.errors import AttnserveError
from attnserve.kserve import grpc_service_pb2 as pb

from .generator import Call
from .grpc_call import serialized_call
from .http_call import open_sender
from .target import MODEL_INFO_TIMEOUT_SECONDS, Target

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
READY_POLL_SECONDS = 0.25
LENGTH = struct.Struct("<I")  # a BYTES element's length prefix, and kserve-http's framing of a request


def texts_of(inputs: Sequence[Input]) -> list[str]:
    texts = [text for text in inputs if isinstance(text, str)]
    if len(texts) != len(inputs):
        raise AttnserveError("KServe v2 takes texts: token ids and sentence pairs load only over grpc or http")
    return texts


def bytes_tensor(texts: Sequence[str]) -> bytes:
    """Texts as a raw BYTES tensor: each a 4-byte little-endian length and its UTF-8."""
    return b"".join(LENGTH.pack(len(data)) + data for data in (text.encode() for text in texts))


# --- gRPC ------------------------------------------------------------------------------------------------------

def infer_call(channel: grpc.aio.Channel) -> Call:
    return serialized_call(channel, INFER_METHOD, pb.ModelInferResponse, _num_tokens)


def _num_tokens(reply: pb.ModelInferResponse) -> int:
    """The sum of the num_tokens output; 0 where the server gives none."""
    return next((int(np.frombuffer(raw, "<i4").sum()) for output, raw in
                 zip(reply.outputs, reply.raw_output_contents, strict=False) if output.name == "num_tokens"), 0)


async def _first_model_when_ready(channel: grpc.aio.Channel, target: str, seconds: float) -> str:
    ready = channel.unary_unary("/inference.GRPCInferenceService/ServerReady",
                                request_serializer=pb.ServerReadyRequest.SerializeToString,
                                response_deserializer=pb.ServerReadyResponse.FromString)
    index = channel.unary_unary("/inference.GRPCInferenceService/RepositoryIndex",
                                request_serializer=pb.RepositoryIndexRequest.SerializeToString,
                                response_deserializer=pb.RepositoryIndexResponse.FromString)
    end, last = time.monotonic() + seconds, ""
    while True:
        try:
            if (await ready(pb.ServerReadyRequest(), timeout=MODEL_INFO_TIMEOUT_SECONDS)).ready:
                models = (await index(pb.RepositoryIndexRequest(), timeout=MODEL_INFO_TIMEOUT_SECONDS)).models
                if not models:
                    raise AttnserveError(f"{target}: the repository index lists no model")
                return models[0].name
            last = "ServerReady: false"
        except grpc.aio.AioRpcError as error:
            last = f"{error.code().name}: {error.details()}"
        if time.monotonic() >= end:
            raise NotServing(f"{target} is not serving KServe v2: {last}"
                             + ("" if seconds else " (--wait-ready waits for it)"), None)
        await asyncio.sleep(READY_POLL_SECONDS)


@asynccontextmanager
async def kserve_grpc_target(config: LoadTestConfig, client: ClientConfig) -> AsyncIterator[Target]:
    async with open_channel(client, aio=True) as channel:
        model = await _first_model_when_ready(channel, client.target, config.wait_ready)
        parameters = {} if config.truncate is None else {"truncate": pb.InferParameter(bool_param=config.truncate)}
        outputs = [pb.ModelInferRequest.InferRequestedOutputTensor(name=name) for name in ("embedding", "num_tokens")]

        def serialize(inputs: Sequence[Input]) -> bytes:
            texts = texts_of(inputs)
            return pb.ModelInferRequest(
                model_name=model, parameters=parameters, outputs=outputs,
                inputs=[pb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[len(texts)])],
                raw_input_contents=[bytes_tensor(texts)]).SerializeToString()

        yield Target(infer_call(channel), serialize, model, f"kserve v2 grpc, {client.lb_policy}")


# --- HTTP ------------------------------------------------------------------------------------------------------

def kserve_tokens(body: bytes, headers: Mapping[str, str]) -> int:
    """The num_tokens of a binary reply, sent as JSON in its header part."""
    length = headers.get("Inference-Header-Content-Length")
    header = orjson.loads(body[:int(length)] if length is not None else body)
    return next((int(sum(output["data"])) for output in header["outputs"] if output["name"] == "num_tokens"), 0)


@asynccontextmanager
async def kserve_http_target(config: LoadTestConfig, client: ClientConfig) -> AsyncIterator[Target]:
    async with open_sender(config, client, health_path="/v2/health/ready", tokens_of=kserve_tokens,
                           framed=True) as (sender, target, addresses):
        (base,) = sender.bases(1)
        status, body = await sender.post(base, "/v2/repository/index", b"", MODEL_INFO_TIMEOUT_SECONDS)
        models = orjson.loads(body) if status == 200 else None
        if not models:
            raise AttnserveError(f"{client.target}: no model in the repository index: HTTP {status}")
        model = models[0]["name"]
        sender.path = f"/v2/models/{model}/infer"
        parameters = {} if config.truncate is None else {"truncate": config.truncate}
        outputs = [{"name": "embedding", "parameters": {"binary_data": True}},
                   {"name": "num_tokens", "parameters": {"binary_data": False}}]

        def serialize(inputs: Sequence[Input]) -> bytes:
            data = bytes_tensor(texts_of(inputs))
            header = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(inputs)],
                                               "parameters": {"binary_data_size": len(data)}}],
                                   "outputs": outputs, "parameters": parameters})
            return LENGTH.pack(len(header)) + header + data

        yield Target(sender.call, serialize, model,
                     f"kserve v2 http (binary), round robin over {addresses} address(es) of {target.host}")

