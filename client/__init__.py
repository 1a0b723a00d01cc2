"""The Python client: `from attnserve.client import Client`."""

from .client import Client, EmbeddingResult, RequestError

__all__ = ["Client", "EmbeddingResult", "RequestError"]
