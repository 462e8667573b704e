"""The async client: ``await HecateClient.connect(url)`` then ``await client.infer(...)``."""

from hecate.client.sdk import RETRYABLE, HecateClient

__all__ = ["RETRYABLE", "HecateClient"]
