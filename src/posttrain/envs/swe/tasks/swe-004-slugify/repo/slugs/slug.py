"""Turn titles into URL slugs."""

import re


def slugify(title: str) -> str:
    """Return the lower-case words of ``title`` joined by single dashes."""
    words = re.sub(r"[^a-z0-9]+", " ", title.lower()).split(" ")
    return "-".join(words)
