"""The Python client: `from attnserve.client import Client`."""

from .client import Client, EmbeddingResult, RequestError
from .status import ErrorDetails, error_details

__all__ = ["Client", "EmbeddingResult", "ErrorDetails", "RequestError", "error_details"]
