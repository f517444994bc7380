"""Cut text to a display width."""


def truncate(text: str, width: int, placeholder: str = "...") -> str:
    """Return ``text`` if it fits in ``width`` characters, else a cut ending in ``placeholder``."""
    if width < len(placeholder):
        raise ValueError("width is smaller than the placeholder")
    if len(text) < width:
        return text
    return text[:width - len(placeholder)] + placeholder
