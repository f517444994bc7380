"""Hidden tests for leaderboard."""

from leaderboard import Entry, rank


def test_highest_score_first_ties_by_name():
    """Scores 7 > 5 = 5; the tied pair in name order."""
    entries = [Entry("cat", 5), Entry("amy", 7), Entry("bob", 5)]
    assert [e.name for e in rank(entries)] == ["amy", "bob", "cat"]


def test_score_beats_alphabet():
    """Player zed scores 9, abe scores 2: zed first."""
    assert [e.name for e in rank([Entry("abe", 2), Entry("zed", 9)])] == ["zed", "abe"]
