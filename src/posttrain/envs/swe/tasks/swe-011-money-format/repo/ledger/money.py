"""Format integer cent amounts as dollars."""


def format_cents(cents: int) -> str:
    """Format ``cents`` as dollars with thousands separators, e.g. -123456 -> "-$1,234.56"."""
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(cents), 100)
    return f"{sign}${dollars:,}.{rest}"
