"""Split item lists into pages."""

from pager.pages import page_count, page_slice

__all__ = ["page_count", "page_slice"]
