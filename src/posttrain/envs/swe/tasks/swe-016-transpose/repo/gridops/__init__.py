"""List-of-lists matrix operations."""

from gridops.matrix import identity, transpose

__all__ = ["identity", "transpose"]
