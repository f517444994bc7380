"""Order leaderboard entries."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """A player's name and score."""

    name: str
    score: int


def rank(entries: list[Entry]) -> list[Entry]:
    """Return ``entries`` by score, highest first; equal scores in alphabetical order of name."""
    by_score = sorted(entries, key=lambda entry: entry.score, reverse=True)
    return sorted(by_score, key=lambda entry: entry.name)
