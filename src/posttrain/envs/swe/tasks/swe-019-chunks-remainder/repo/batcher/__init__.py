"""Split sequences into batches."""

from batcher.chunking import chunks

__all__ = ["chunks"]
