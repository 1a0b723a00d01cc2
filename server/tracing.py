"""OpenTelemetry traces of the requests a server answers, as TEI and vLLM export them (--otlp-endpoint).

A request's spans: `request` (its protocol's method, the model, inputs and tokens), `tokenize`, `queue wait` (from
its inputs' admission to the first batch that runs them), `batch run` (one per batch, with its size, tokens and
graph, linked to every request it served: a batch mixes requests) and `reply`. A caller's W3C `traceparent` (an HTTP
header, gRPC metadata) makes the request span its child. Without --otlp-endpoint no span is made at all (span() and
incoming() are an empty context): even the API's no-op tracer cost a few microseconds a span, several a request.

The spans go to an OTLP/gRPC receiver (the OpenTelemetry Collector, Jaeger, Tempo) through the SDK's batch span
processor, off the request path; the OTEL_* environment variables the SDK reads (OTEL_BSP_SCHEDULE_DELAY,
OTEL_EXPORTER_OTLP_HEADERS, ...) apply.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

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


def enabled() -> bool:
    """Spans are exported (setup() was given an endpoint)."""
    return _provider is not None


class _Off:
    """The context of a span not made: its `as` value takes set_attribute(s) and set_status and does nothing."""

    __slots__ = ()

    def __enter__(self) -> trace.Span:
        return trace.INVALID_SPAN

    def __exit__(self, *exc) -> None:
        return None


OFF = _Off()


def span(tracer_: trace.Tracer, name: str, **options):
    """tracer_.start_as_current_span(name, **options) where spans are exported, OFF otherwise."""
    return tracer_.start_as_current_span(name, **options) if _provider is not None else OFF


def incoming(carrier: Callable[[], Mapping[str, str]]):
    """A request's trace context from its carrier (HTTP headers, gRPC metadata: W3C traceparent and tracestate;
    read only where spans are exported), current for the block."""
    return _incoming(carrier()) if _provider is not None else OFF


@contextlib.contextmanager
def _incoming(carrier: Mapping[str, str]) -> Iterator[None]:
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
