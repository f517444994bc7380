"""Shared pytest fixtures; model fixtures live in ``tests/fixtures_models.py``."""

from fixtures_models import tiny_model

__all__ = ["tiny_model"]
