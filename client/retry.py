"""How attnserve's clients wait and retry after a refusal, as a well-behaved gRPC client does (gRFC A6): the one
retry policy of the load test (loadtest/generator.py) and of `encode --server` (offline/remote.py).

A request answered with a retryable code (client/status.py: ErrorDetails.retryable, e.g. UNAVAILABLE or
RESOURCE_EXHAUSTED, never INVALID_ARGUMENT) is sent again, the same bytes, after a backoff that doubles from a
first wait up to a cap, each randomized by +-20% so that streams refused together do not all come back
together; where the server said how long to wait (gRPC's RetryInfo, HTTP's Retry-After), at least that. The
defaults are the load test's: 50 ms doubling up to 1 s, the server's wait honoured within the same cap, a
request sent at most MAX_ATTEMPTS times. While most recent answers are refusals (a target that is down or
shedding), a RetryThrottle stops the retries, as gRPC's retry throttling does, so that an outage is not
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

    def __init__(self, first_s: float = BACKOFF_FIRST_S, max_s: float = BACKOFF_MAX_S,
                 cap_server_wait: bool = True, rng: random.Random | None = None):
        """cap_server_wait: honour the server's wait only up to max_s (a load test that slept out a long
        Retry-After would measure its own sleep); False: all of it (a job that must finish, not measure)."""
        self._first, self._max, self._cap_server_wait = first_s, max_s, cap_server_wait
        self._rng = rng or random.Random()
        self._delay = 0.0

    def next(self, server_wait: float | None = None) -> float:
        """The wait; server_wait: what the server asked for."""
        self._delay = min(self._max, self._delay * 2 or self._first)
        wait = self._delay * self._rng.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
        server_wait = server_wait or 0.0
        return max(wait, min(server_wait, self._max) if self._cap_server_wait else server_wait)

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
