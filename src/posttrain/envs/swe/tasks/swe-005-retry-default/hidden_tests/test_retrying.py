"""Hidden tests for retrying."""

import pytest
from retrying import retry


def _flaky(failures: int):
    """Return a function that raises ``failures`` times, then returns "ok"."""
    state = {"calls": 0}

    def call() -> str:
        state["calls"] += 1
        if state["calls"] <= failures:
            raise ConnectionError("not yet")
        return "ok"

    return call


def test_default_tries_three_times():
    """Two failures, then success on the third (default) attempt."""
    assert retry(_flaky(2)) == "ok"


def test_default_gives_up_after_three_failures():
    """Three failures exhaust the three default attempts."""
    with pytest.raises(ConnectionError):
        retry(_flaky(3))


def test_explicit_single_attempt():
    """attempts=1 does not retry."""
    with pytest.raises(ConnectionError):
        retry(_flaky(1), attempts=1)
