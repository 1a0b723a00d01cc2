"""API keys: the one check that both front doors make (the gRPC interceptor in grpc/auth.py, the HTTP middleware
in http/app.py), on the same value: `Bearer KEY`, in the `authorization` header or metadata.

Keys are compared as SHA-256 digests with hmac.compare_digest, against every key each time, so neither the time
taken nor its length says how much of a key was right or which key matched; a key is never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from attnserve.errors import UnauthenticatedError

SCHEME = "bearer"


class ApiKeys:
    def __init__(self, keys: Sequence[str]):
        self._digests = [_digest(key) for key in keys]

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> None:
        """Raise UnauthenticatedError unless keys are off or `authorization` is `Bearer KEY` with a known key."""
        if not self._digests:
            return
        if not authorization:
            raise UnauthenticatedError("no API key: send `authorization: Bearer KEY` (an HTTP header, or gRPC "
                                       "metadata)")
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != SCHEME or not key.strip():
            raise UnauthenticatedError("the authorization value must be `Bearer KEY`")
        presented = _digest(key.strip())
        matched = False
        for digest in self._digests:  # no early exit: every key costs the same
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            raise UnauthenticatedError("invalid API key")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
