"""Rank players by score."""

from leaderboard.ranking import Entry, rank

__all__ = ["Entry", "rank"]
