"""URL slugs from titles."""

from slugs.slug import slugify

__all__ = ["slugify"]
