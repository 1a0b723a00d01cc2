"""The load over gRPC: the Embed method on one channel (round_robin over every address of the target)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc

from attnserve.client.client import Input, make_request, open_channel
from attnserve.client.health import NotServing, wait_until_serving
from attnserve.client.status import error_details
from attnserve.config import ClientConfig, LoadTestConfig
from attnserve.errors import AttnserveError
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from .generator import Answer, Call
from .target import MODEL_INFO_TIMEOUT_SECONDS, Target

EMBED_METHOD = "/attnserve.v1.Encoder/Embed"


def wait_for_target(client: ClientConfig, seconds: float) -> None:
    """Until the target's health service says SERVING; seconds 0: ask once."""
    with open_channel(client, health_checked=False) as channel:  # it asks for the health itself
        try:
            wait_until_serving(channel, client.target, seconds)
        except NotServing as error:
            hint = "" if seconds or error.explained else " (--wait-ready waits for it)"
            raise NotServing(f"{error}{hint}", error.status, error.explained) from None


def serialized_call(channel: grpc.aio.Channel, path: str, reply_type: Any, tokens: Callable[[Any], int]) -> Call:
    """The unary method at path, with the request already serialized, so the generator spends its time waiting, not
    encoding; tokens(reply): the tokens a reply counts. A refusal is retryable as its status details say
    (client/status.py): the same statuses and details over attnserve.v1 and KServe v2 (kserve_call.py)."""
    method = channel.unary_unary(path, request_serializer=None, response_deserializer=reply_type.FromString)

    async def call(request: bytes, timeout: float) -> Answer:
        try:
            reply = await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            details = error_details(error)
            return Answer(error.code().name, ok=False, refused=details.retryable, retry_after=details.retry_delay)
        return Answer("OK", ok=True, tokens=tokens(reply))

    return call


def embed_call(channel: grpc.aio.Channel) -> Call:
    return serialized_call(channel, EMBED_METHOD, pb.EmbedResponse,
                           lambda reply: sum(e.num_tokens for e in reply.embeddings))


@asynccontextmanager
async def grpc_target(config: LoadTestConfig, client: ClientConfig) -> AsyncIterator[Target]:
    await asyncio.to_thread(wait_for_target, client, config.wait_ready)
    async with open_channel(client, aio=True) as channel:
        try:  # also connects the channel, so that the first requests of the load do not pay for it
            info = await encoder_pb2_grpc.EncoderStub(channel).GetModelInfo(pb.GetModelInfoRequest(),
                                                                             timeout=MODEL_INFO_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as error:
            raise AttnserveError(f"{client.target}: no model info: {error.code().name}: {error.details()}") from None

        def serialize(inputs: Sequence[Input]) -> bytes:
            return make_request(inputs, truncate=config.truncate).SerializeToString()

        yield Target(embed_call(channel), serialize, f"{info.model}, {info.provider} {info.precision}",
                     f"grpc, {client.lb_policy}")
