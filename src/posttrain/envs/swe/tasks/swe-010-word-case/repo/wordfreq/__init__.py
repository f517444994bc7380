"""Word frequencies."""

from wordfreq.counting import most_common, word_counts

__all__ = ["most_common", "word_counts"]
