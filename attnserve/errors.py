"""Errors a user can cause and fix: each carries a one-line message for them.

Anything else that escapes is a bug. The CLI prints these as one line and exits
non-zero; the gRPC front end maps them to status codes in one function.
"""


class AttnserveError(Exception):
    """Base: the message is shown to the user as it is."""


class CheckpointError(AttnserveError):
    """A model checkpoint is missing, corrupt or not of a supported layout."""


class ArtifactError(AttnserveError):
    """An exported artifact directory is missing a file, tampered with, or inconsistent."""


class InvalidInputError(AttnserveError):
    """An input text, token sequence or input file cannot be encoded as given."""


class ExportVerificationError(AttnserveError):
    """An exported graph does not match PyTorch within its tolerance."""


class ConfigError(AttnserveError):
    """A flag, environment variable or option has a value that cannot work."""
