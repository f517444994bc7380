"""Hidden tests for wordfreq."""

from wordfreq import most_common, word_counts


def test_counts_ignore_case():
    """"The" and "the" are the same word."""
    assert word_counts("The cat saw the hat.") == {"the": 2, "cat": 1, "saw": 1, "hat": 1}


def test_most_common():
    """"a" three times, "b" twice."""
    assert most_common("A b a B a c", 2) == [("a", 3), ("b", 2)]
