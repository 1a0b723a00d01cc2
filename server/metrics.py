"""Prometheus metrics, as docs/grpc.md's Metrics table lists them, in a registry of the server's own.

The metrics of a model's queue and batches carry a `model` label (the name it is served under): each model has
a batcher of its own, which records through its ModelMetrics.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .statistics import BatchTimes, InferenceStatistics

# Seconds: from a sub-millisecond idle request to a queue that is shedding load.
LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# How `serve --workers N` sums a gauge over its processes (prometheus_client's multiprocess mode): the queue's are
# set by the engine process alone, so the living processes' sum is its value, labelled as in one process.
ENGINE_GAUGE: Final = "livesum"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # protocol: "grpc" or "http"; method: the gRPC method's name or the HTTP route ("/v1/embeddings");
        # code: the gRPC status code's name or the HTTP status.
        self.requests = Counter("attnserve_requests", "Requests answered, by protocol, method and status code",
                                ["protocol", "method", "code"], registry=r)
        self.request_seconds = Histogram("attnserve_request_duration_seconds", "Total time of a request",
                                         ["protocol", "method"], buckets=LATENCY_BUCKETS, registry=r)
        # Per model (the name it is served under), through ModelMetrics.
        self.queue_seconds = Histogram("attnserve_queue_duration_seconds",
                                       "Time an input waited in the queue before its batch started", ["model"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.inference_seconds = Histogram("attnserve_inference_duration_seconds",
                                           "Time of one batch in onnxruntime", ["model", "graph"],
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("attnserve_batch_size", "Inputs in a batch", ["model", "graph"],
                                    buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("attnserve_batch_tokens", "Real tokens in a batch", ["model", "graph"],
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.tokens = Counter("attnserve_batch_tokens_computed", "Real tokens computed", ["model"], registry=r)
        self.cells = Counter("attnserve_batch_cells_computed",
                             "Token cells computed, padding included (batch size x longest input)", ["model"],
                             registry=r)
        self.padding_fraction = Gauge("attnserve_padding_fraction",
                                      "Padded cells / all cells computed, since the server started", ["model"],
                                      registry=r, multiprocess_mode=ENGINE_GAUGE)
        self.queue_requests = Gauge("attnserve_queue_depth_requests", "Requests with inputs waiting in the queue",
                                    ["model"], registry=r, multiprocess_mode=ENGINE_GAUGE)
        self.queue_tokens = Gauge("attnserve_queue_depth_tokens", "Tokens waiting in the queue", ["model"],
                                  registry=r, multiprocess_mode=ENGINE_GAUGE)
        self.queue_seconds_estimate = Gauge("attnserve_queue_depth_seconds",
                                            "Estimated time to run the work waiting in the queue", ["model"],
                                            registry=r, multiprocess_mode=ENGINE_GAUGE)
        self.dropped = Counter("attnserve_inputs_dropped", "Inputs dropped before they ran, by reason",
                               ["model", "reason"], registry=r)
        self.failed_batches = Counter("attnserve_batches_failed", "Batches whose session run failed", ["model"],
                                      registry=r)
        # Each label set's children, found once: labels() costs a lock and a dict lookup on every request. Bounded
        # as the labels are: the doors' methods and routes (one label for every unmatched path) and status codes.
        self._request_children: dict[tuple[str, str, str], tuple] = {}

    def observe_request(self, protocol: str, method: str, code: str, seconds: float | None = None) -> None:
        """One request answered; seconds None: not timed (refused before it began)."""
        key = (protocol, method, code)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (self.requests.labels(protocol, method, code),
                                                      self.request_seconds.labels(protocol, method))
        children[0].inc()
        if seconds is not None:
            children[1].observe(seconds)

    def for_model(self, model: str) -> ModelMetrics:
        return ModelMetrics(self, model)


class ModelMetrics:
    """One model's queue and batch metrics: what its batcher records, under its `model` label."""

    def __init__(self, metrics: Metrics, model: str):
        self._metrics, self.model = metrics, model
        self.queue_seconds = metrics.queue_seconds.labels(model)
        self.queue_requests = metrics.queue_requests.labels(model)
        self.queue_tokens = metrics.queue_tokens.labels(model)
        self.queue_seconds_estimate = metrics.queue_seconds_estimate.labels(model)
        self.failed_batches = metrics.failed_batches.labels(model)
        self._tokens_total = self._cells_total = 0  # the gauge's running ratio; counters are write-only
        # The same measurements in Triton's terms, for KServe v2's statistics (server/statistics.py).
        self.statistics = InferenceStatistics()

    def dropped(self, reason: str) -> Counter:
        return self._metrics.dropped.labels(self.model, reason)

    def observe_queue(self, seconds: float) -> None:
        """One input's wait in the queue, until its batch started."""
        self.queue_seconds.observe(seconds)
        self.statistics.queued(seconds)

    def observe_batch(self, graph: str, size: int, tokens: int, cells: int, seconds: float,
                      times: BatchTimes | None = None) -> None:
        """A batch that ran: its size, real tokens, cells computed (padding included) and time; times: where its
        time went (Engine.run and the batcher), for the statistics."""
        if times is not None:
            self.statistics.batch(size, times)
        m, model = self._metrics, self.model
        m.inference_seconds.labels(model, graph).observe(seconds)
        m.batch_size.labels(model, graph).observe(size)
        m.batch_tokens.labels(model, graph).observe(tokens)
        m.tokens.labels(model).inc(tokens)
        m.cells.labels(model).inc(cells)
        self._tokens_total += tokens
        self._cells_total += cells
        m.padding_fraction.labels(model).set((self._cells_total - self._tokens_total) / self._cells_total)
