"""Convert integers to Roman numerals."""

_SYMBOLS = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]


def to_roman(number: int) -> str:
    """Return ``number`` (1 to 3999) as a Roman numeral."""
    if not 1 <= number <= 3999:
        raise ValueError("Roman numerals cover 1 to 3999")
    parts = []
    for value, symbol in _SYMBOLS:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)
