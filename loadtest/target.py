"""What a protocol gives the load test: a way to send, a way to serialize a request, and what it talks to."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attnserve.client.client import Input

from .generator import Call

# The model's description, asked once the target serves (not the load's own --timeout).
MODEL_INFO_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Target:
    call: Call
    serialize: Callable[[Sequence[Input]], bytes]  # one request's inputs -> the bytes call sends
    model: str  # the model and how it runs, for the report
    route: str  # the protocol and how requests spread over the target's addresses, for the report
