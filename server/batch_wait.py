"""How long the batcher waits for company before it runs what is queued: max_wait under load, nothing when idle.

Waiting pays only when more requests come while it waits. The batcher runs one batch at a time, so the
question is how many requests arrive per batch: a lone client (or an idle server) sends one request, waits
for its answer and sends the next, so every batch sees one arrival and waiting would only add max_wait to
each request; under many clients dozens arrive per batch, and waiting for them is what fills the batches.
The arrivals of each batch's cycle (from one batch's start to the next's) are averaged with a moving
weight, so a change of load is followed within a few batches and one odd batch does not swing it.
"""

from __future__ import annotations

# Above this many requests per batch on average, waiting collects company: one is a lone caller (never
# worth a wait); two or more arrive per batch only when clients overlap.
ARRIVALS_TO_WAIT = 1.5
# Weight of the newest batch's arrivals: after a burst of 64 clients ends, about 6 batches bring the
# average under ARRIVALS_TO_WAIT, so an idle server stops waiting within a few requests.
ARRIVAL_WEIGHT = 0.5


class BatchWait:
    def __init__(self, max_wait_s: float):
        self.max_wait_s = max_wait_s
        self._arrivals = 0  # requests queued since the last batch started
        self.arrivals_per_batch = 0.0  # the moving average; 0 at start: an idle server answers at once

    def arrived(self) -> None:
        """A request entered the queue."""
        self._arrivals += 1

    def batch_started(self) -> None:
        """A batch was taken from the queue: its cycle's arrivals join the average."""
        self.arrivals_per_batch += ARRIVAL_WEIGHT * (self._arrivals - self.arrivals_per_batch)
        self._arrivals = 0

    @property
    def under_load(self) -> bool:
        return self.arrivals_per_batch > ARRIVALS_TO_WAIT

    def wait_s(self) -> float:
        """How long the oldest queued input may wait for a fuller batch."""
        return self.max_wait_s if self.under_load else 0.0
