"""Errors a user can cause and fix: each carries a one-line message for them.

Anything else that escapes is a bug. The CLI prints these as one line and exits
non-zero; each server front door maps them to its protocol's statuses in one function
(server/errors.py for gRPC), from the protocol-neutral `reason` and `field` they carry.
"""

from __future__ import annotations


class AttnserveError(Exception):
    """Base: the message is shown to the user as it is."""

    # Why a request failed, named the same for every front door (gRPC's ErrorInfo.reason, client/status.py
    # REASONS): set on the errors a request can meet, None on the rest.
    reason: str | None = None


class CheckpointError(AttnserveError):
    """A model checkpoint is missing, corrupt or not of a supported layout."""


class ArtifactError(AttnserveError):
    """An exported artifact directory is missing a file, tampered with, or inconsistent."""


class InvalidInputError(AttnserveError):
    """An input text, token sequence or input file cannot be encoded as given.

    In a request, `field` is where the problem is, as a path in the request message ("inputs[3].text",
    "attention.layers[1]", "inputs" for their number, "" for the whole message), and `description` the problem
    alone ("empty text"), while the message names both ("input 3: empty text"). field is None where the input
    is not a request (a line of a file).
    """

    reason = "INVALID_INPUT"

    def __init__(self, message: str, *, field: str | None = None, description: str | None = None):
        super().__init__(message)
        self.field = field
        self.description = message if description is None else description


class ExportVerificationError(AttnserveError):
    """An exported graph does not match PyTorch within its tolerance."""


class ConfigError(AttnserveError):
    """A flag, environment variable or option has a value that cannot work."""
