"""Page arithmetic for list views."""


def page_count(total_items: int, per_page: int) -> int:
    """Return how many pages show ``total_items`` items with ``per_page`` items per page."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return total_items // per_page


def page_slice(items: list[str], page: int, per_page: int) -> list[str]:
    """Return the items on the 1-based page number ``page``."""
    if page < 1:
        raise ValueError("page numbers start at 1")
    start = (page - 1) * per_page
    return items[start:start + per_page]
