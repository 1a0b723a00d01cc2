"""How the load test waits and retries after a refusal, as a well-behaved gRPC client does (gRFC A6).

A request answered with a retryable code (client/status.py: ErrorDetails.retryable, e.g. UNAVAILABLE or
RESOURCE_EXHAUSTED, never INVALID_ARGUMENT) is sent again, the same bytes, after a backoff: 50 ms, doubling
up to 1 s, each randomized by +-20% so that streams refused together do not all come back together; where the
server said how long to wait (gRPC's RetryInfo, HTTP's Retry-After), at least that, within the same 1 s cap. A
request is sent at most MAX_ATTEMPTS times. While most recent answers are refusals (a target that is down
or shedding), a RetryThrottle stops the retries, as gRPC's retry throttling does, so that an outage is not
answered with a multiple of the load: the waiting still applies, only the extra sends stop.
"""

from __future__ import annotations

import random

BACKOFF_FIRST_S, BACKOFF_MAX_S, BACKOFF_JITTER = 0.05, 1.0, 0.2
MAX_ATTEMPTS = 5  # gRPC's own cap on a retry policy's maxAttempts
# gRPC's retry throttling (its documented example values): a refusal (a retryable code) takes a token, a
# success gives back TOKEN_RATIO, other errors neither; retries go ahead only while over half of MAX_TOKENS remain.
MAX_TOKENS, TOKEN_RATIO = 10.0, 0.1


class Backoff:
    """The wait before the next send after a refusal; grows with each refusal in a row until reset()."""

    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()
        self._delay = 0.0

    def next(self, server_wait: float | None = None) -> float:
        """The wait; server_wait: what the server asked for, honoured up to the cap (a load test that slept
        out a long Retry-After would measure its own sleep)."""
        self._delay = min(BACKOFF_MAX_S, self._delay * 2 or BACKOFF_FIRST_S)
        wait = self._delay * self._rng.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
        return max(wait, min(server_wait or 0.0, BACKOFF_MAX_S))

    def reset(self) -> None:
        self._delay = 0.0


class RetryThrottle:
    """One per load: retries stop while refusals dominate the answers, and resume as answers succeed."""

    def __init__(self):
        self._tokens = MAX_TOKENS

    def refused(self) -> None:
        self._tokens = max(0.0, self._tokens - 1)

    def succeeded(self) -> None:
        self._tokens = min(MAX_TOKENS, self._tokens + TOKEN_RATIO)

    @property
    def allows_retry(self) -> bool:
        return self._tokens > MAX_TOKENS / 2
