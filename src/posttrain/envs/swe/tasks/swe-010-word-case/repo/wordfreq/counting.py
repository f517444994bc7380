"""Count words in text."""

import re


def word_counts(text: str) -> dict[str, int]:
    """Return how often each word occurs; punctuation is not part of a word."""
    counts: dict[str, int] = {}
    for word in re.findall(r"[A-Za-z']+", text):
        counts[word] = counts.get(word, 0) + 1
    return counts


def most_common(text: str, n: int) -> list[tuple[str, int]]:
    """Return the ``n`` most frequent words, ties in alphabetical order."""
    ranked = sorted(word_counts(text).items(), key=lambda item: (-item[1], item[0]))
    return ranked[:n]
