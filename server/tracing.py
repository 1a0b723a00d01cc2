"""OpenTelemetry traces of the requests a server answers, as TEI and vLLM export them (--otlp-endpoint).

A request's spans: `request` (its protocol's method, the model, inputs and tokens), `tokenize`, `queue wait` (from
its inputs' admission to the first batch that runs them), `batch run` (one per batch, with its size, tokens and
graph, linked to every request it served: a batch mixes requests) and `reply`. A caller's W3C `traceparent` (an HTTP
header, gRPC metadata) makes the request span its child. Without --otlp-endpoint the API's no-op tracer is used:
a span costs a function call.

The spans go to an OTLP/gRPC receiver (the OpenTelemetry Collector, Jaeger, Tempo) through the SDK's batch span
processor, off the request path; the OTEL_* environment variables the SDK reads (OTEL_BSP_SCHEDULE_DELAY,
OTEL_EXPORTER_OTLP_HEADERS, ...) apply.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry import context, propagate, trace

from attnserve import __version__

TRACER = "attnserve"
_provider = None  # the SDK's, once set up in this process


def setup(endpoint: str | None, service_name: str = "attnserve") -> None:
    """Export spans to the OTLP/gRPC receiver at endpoint ("http://host:4317", or "host:4317" for plaintext); None:
    no traces. Once a process."""
    global _provider
    if not endpoint or _provider is not None:
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    insecure = not endpoint.startswith("https://")
    _provider = TracerProvider(resource=Resource.create({"service.name": service_name,
                                                         "service.version": __version__}))
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure)))
    trace.set_tracer_provider(_provider)


def shutdown() -> None:
    """Send what is buffered (the drain's end)."""
    if _provider is not None:
        _provider.shutdown()


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER, __version__)


@contextlib.contextmanager
def incoming(carrier: Mapping[str, str]) -> Iterator[None]:
    """A request's trace context from its carrier (HTTP headers, gRPC metadata: W3C traceparent and tracestate),
    current for the block."""
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
