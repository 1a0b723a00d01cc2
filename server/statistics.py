"""One model's inference statistics, as Triton's statistics extension reports them (KServe v2's ModelStatistics,
GET /v2/models/NAME/stats), which perf_analyzer reads around every measurement. Every counter is one the server
measures; none is made up:

  success, fail      each request that reached the model (found), by how it ended (an error, a deadline passed or
                     the client gone are failures), with its time in the core from then to its reply rendered
                     (admission, tokenizing, queue, batches, reply);
  queue              each input's wait in the batcher's queue, until its batch started;
  compute_input      each input's share of a batch: the batch's time building its padded tensors (Engine.run);
  compute_infer      the same for the batch's onnxruntime run;
  compute_output     the same for cutting the batch's outputs into each input's rows (the batcher);
  inference_count    inputs computed (Triton: "each inference in a batched request is counted");
  execution_count    batches run;
  batch_stats        per batch size: batches run, with their three durations;
  last_inference     when the last request ended well, milliseconds since the epoch;
  cache_hit, cache_miss  zero: the server keeps no response cache.

The queue and compute counts are per input, as Triton attributes a batch's time to each request in it; with one
input per request (perf_analyzer's default) they are per request. Batches that failed count in no compute
duration; their requests count as failures. Only the event loop records, so there is no lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        """count events of `seconds` each."""
        self.count += count
        self.ns += round(seconds * 1e9) * count

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchTimes:
    """Where one batch's time went, in seconds."""

    input: float  # building its padded tensors
    infer: float  # the graph's run
    output: float  # cutting the outputs into each input's rows


@dataclass
class _BatchSize:
    """Batches of one size: each duration's count is the batches run."""

    input: Duration = field(default_factory=Duration)
    infer: Duration = field(default_factory=Duration)
    output: Duration = field(default_factory=Duration)


class InferenceStatistics:
    def __init__(self) -> None:
        self.success, self.fail, self.queue = Duration(), Duration(), Duration()
        self.compute_input, self.compute_infer, self.compute_output = Duration(), Duration(), Duration()
        self.inference_count = self.execution_count = self.last_inference_ms = 0
        self._sizes: dict[int, _BatchSize] = {}

    def request(self, ok: bool, seconds: float) -> None:
        (self.success if ok else self.fail).add(seconds)
        if ok:
            self.last_inference_ms = int(time.time() * 1e3)

    def queued(self, seconds: float) -> None:
        self.queue.add(seconds)

    def batch(self, size: int, times: BatchTimes) -> None:
        self.execution_count += 1
        self.inference_count += size
        self.compute_input.add(times.input, size)
        self.compute_infer.add(times.infer, size)
        self.compute_output.add(times.output, size)
        stats = self._sizes.setdefault(size, _BatchSize())
        stats.input.add(times.input)
        stats.infer.add(times.infer)
        stats.output.add(times.output)

    def as_dict(self, name: str, version: str) -> dict:
        """Triton's ModelStatistics in its JSON form (protobuf's field names; the gRPC door parses it)."""
        zero = Duration().as_dict()
        return {
            "name": name, "version": version, "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count, "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(), "fail": self.fail.as_dict(), "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(), "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(), "cache_hit": zero, "cache_miss": zero},
            "batch_stats": [{"batch_size": size, "compute_input": s.input.as_dict(),
                             "compute_infer": s.infer.as_dict(), "compute_output": s.output.as_dict()}
                            for size, s in sorted(self._sizes.items())],
        }
