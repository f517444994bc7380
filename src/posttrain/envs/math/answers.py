r"""Final answers in text: extraction (``\boxed{}`` / ``####``), normalisation, exact numbers, prose references.

Pure string functions, safe from any thread and cheap: ``verify.verify_answer`` runs them
in-process before anything reaches a math-verify worker.

* ``extract_answer`` pulls the final answer out of a model response (the last balanced
  ``\boxed{...}``, or the rest of the line after the last ``####``).
* ``parse_plain_number`` reads plain decimal numbers exactly (``1,000``, ``-3.5``, ``\$18``), so
  GSM8K-style answers are compared with rational arithmetic and never parsed symbolically.
* ``reference_is_prose`` flags references that math-verify cannot compare ("all odd $n$").

Example: ``extract_answer(r"so \boxed{\frac{1}{2}}.")`` is ``'\\frac{1}{2}'``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Literal

AnswerStyle = Literal["boxed", "hashes", "auto"]
"""Where the final answer sits: the last ``\\boxed{}``, after the last ``####``, or whichever comes last."""

MAX_ANSWER_CHARS = 2000
"""Longest extracted answer or reference handed to math-verify (characters); longer text is cut."""

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUMBER_THEN_WORDS_RE = re.compile(r"([+-]?[\d,]*\.?\d+)\s+[A-Za-z][A-Za-z ]*")
_LATEX_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]+")
_MATH_WORDS = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp sqrt max min gcd lcm "
    "mod floor ceil det deg dim ker arg sup inf lim infty pi".split()
)
_PROSE_WORDS = frozenset(
    "is of or no if and all for odd the are any not with even some where which when only none "
    "each every such that otherwise than there".split()
)


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------


def _last_boxed(text: str) -> tuple[str, int] | None:
    r"""Content and start offset of the last ``\boxed{...}`` whose braces balance.

    One pass matches every brace (escaped ``\{``/``\}`` are skipped), so the cost is linear in
    the text even when it holds thousands of unclosed boxes.
    """
    opens = [m for m in _BOXED_RE.finditer(text)]
    if not opens:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    i, n = opens[0].end() - 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    for m in reversed(opens):
        end = closing.get(m.end() - 1)
        if end is not None:
            return text[m.end() : end].strip(), m.start()
    return None


def _last_hashes(text: str) -> tuple[str, int] | None:
    """Text after the last ``####`` up to the end of that line, and the marker's offset."""
    pos = text.rfind("####")
    if pos < 0:
        return None
    rest = text[pos + 4 :].split("\n", 1)[0].strip()
    return (rest, pos) if rest else None


def extract_with_marker(response: str, style: AnswerStyle) -> tuple[str, str] | None:
    """``(answer, marker)`` with marker ``boxed`` or ``hashes``, or ``None`` (no checks of the arguments).

    ``verify_answer`` needs the marker: after ``####`` a trailing unit word is allowed.
    """
    boxed = _last_boxed(response) if style in ("boxed", "auto") else None
    hashes = _last_hashes(response) if style in ("hashes", "auto") else None
    if boxed and boxed[0] and (hashes is None or boxed[1] > hashes[1]):
        return boxed[0], "boxed"
    if hashes:
        return hashes[0], "hashes"
    return None


def extract_answer(response: str, style: AnswerStyle = "auto") -> str | None:
    r"""Find the final answer in a model response.

    Args:
        response: The assistant's text.
        style: ``boxed``: content of the last ``\boxed{...}`` (or ``\fbox{...}``) whose braces
            balance (escaped ``\{``/``\}`` do not count); ``hashes``: the rest of the line after
            the last ``####``; ``auto``: whichever of the two markers occurs last.

    Returns:
        The stripped answer text, or ``None`` when no non-empty answer is marked.

    Raises:
        TypeError: ``response`` is not a string.
        ValueError: unknown ``style``.

    Example:
        >>> extract_answer(r"so \boxed{\frac{1}{2}}.", "boxed")
        '\\frac{1}{2}'
    """
    if not isinstance(response, str):
        raise TypeError(f"response: expected str, got {type(response).__name__}")
    if style not in ("boxed", "hashes", "auto"):
        raise ValueError(f"style: expected boxed, hashes or auto, got {style!r}")
    found = extract_with_marker(response, style)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# Normalisation and the in-process fast paths
# ---------------------------------------------------------------------------------------------


def normalise_answer(text: str) -> str:
    """Remove dollar signs (math delimiters or currency), outer whitespace and a final period."""
    t = text.replace("\\$", "").replace("$", "").strip()
    t = t.rstrip(".").strip()
    return t[:MAX_ANSWER_CHARS]


def parse_plain_number(text: str, *, allow_unit_words: bool = False) -> Fraction | None:
    r"""Exact value of a plain decimal number (``1,000``, ``-3.5``, ``\$18``), else ``None``.

    With ``allow_unit_words`` a number followed by words (``18 dollars``) gives the number.
    """
    t = normalise_answer(text)
    for thin in ("\\,", "\\!", "\\;", "~"):
        t = t.replace(thin, "")
    t = t.strip()
    if allow_unit_words:
        m = _NUMBER_THEN_WORDS_RE.fullmatch(t)
        if m:
            t = m.group(1)
    if _THOUSANDS_RE.fullmatch(t):
        t = t.replace(",", "")
    if not _NUMBER_RE.fullmatch(t):
        return None
    try:
        return Fraction(Decimal(t))
    except (InvalidOperation, ValueError):
        return None


def reference_is_prose(reference: str) -> bool:
    r"""Whether a reference answer is prose that math-verify cannot grade ("all odd $n$").

    The heuristic drops LaTeX commands (``\frac``, ``\text``...), then looks for an English
    connective (``is``, ``for``, ``all``, ``odd``...) or any word of four or more letters that is
    not a math function name. Products of symbols (``pq``, ``abc``) are not prose.

    Raises:
        TypeError: ``reference`` is not a string.
    """
    if not isinstance(reference, str):
        raise TypeError(f"reference: expected str, got {type(reference).__name__}")
    words = _WORD_RE.findall(_LATEX_COMMAND_RE.sub(" ", reference))
    for word in words:
        low = word.lower()
        if low in _PROSE_WORDS or (len(low) >= 4 and low not in _MATH_WORDS):
            return True
    return False
