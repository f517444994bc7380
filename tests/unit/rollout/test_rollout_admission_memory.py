"""The pure parts of staleness control: ``capacity``, ``is_stale`` and ``StalenessStats``.

The admission controllers themselves (in-memory and Redis: tickets, consume / release / refund,
leases) are checked by the contract suite, ``tests/contracts/test_admission_contract.py``.

Run: .venv/bin/python -m pytest -q tests/unit/rollout/test_rollout_admission_memory.py
"""

from __future__ import annotations

import pytest

from posttrain.rollout.admission import StalenessStats, batch_staleness_metrics, capacity, is_stale


def test_capacity_is_learner_version_plus_tau_plus_one_batches():
    """(v + tau + 1) * B: (0+1+1)*4 = 8; (2+1+1)*4 = 16; tau=0: (3+0+1)*128 = 512."""
    assert capacity(0, 1, 4) == 8
    assert capacity(2, 1, 4) == 16
    assert capacity(3, 0, 128) == 512
    with pytest.raises(ValueError, match="batch_size"):
        capacity(0, 1, 0)
    with pytest.raises(ValueError, match="max_staleness"):
        capacity(0, -1, 4)


def test_is_stale_only_beyond_max_staleness():
    """tau=2, learner 5: versions 3 (lag 2) kept, 2 (lag 3) stale; a rollout ahead (6) is not stale."""
    assert not is_stale(3, 5, 2)
    assert is_stale(2, 5, 2)
    assert not is_stale(6, 5, 2)
    assert not is_stale(5, 5, 0) and is_stale(4, 5, 0)


def test_staleness_stats_histogram_and_drops():
    """tau=2, learner at 5, rollout versions 5,4,4,3,1 -> lags 0,1,1,2,4 and one ahead (6).

    mean = (0+1+1+2+4)/5 = 1.6, max 4, hist [1,2,1], over 1, ahead 1; 2 drops recorded.
    """
    stats = StalenessStats(max_staleness=2)
    for v in (5, 4, 4, 3, 1, 6):
        stats.observe(v, learner_version=5)
    stats.record_dropped(2)
    assert stats.as_metrics() == {
        "staleness/mean": 1.6,
        "staleness/max": 4.0,
        "staleness/count": 5.0,
        "staleness/dropped_total": 2.0,
        "staleness/ahead_total": 1.0,
        "staleness/hist_0": 1.0,
        "staleness/hist_1": 2.0,
        "staleness/hist_2": 1.0,
        "staleness/hist_over": 1.0,
    }


def test_staleness_stats_empty_is_all_zero():
    assert set(StalenessStats(0).as_metrics().values()) == {0.0}


def test_batch_staleness_metrics_histogram_one_batch():
    """Lags 0, 1, 1, 2, 3 and -1 with tau = 2: mean (0 + 1 + 1 + 2 + 3) / 5 = 1.4 over the lags >= 0,
    max 3, bins 1 / 2 / 1, one over tau, one ahead (not in the mean)."""
    m = batch_staleness_metrics([0, 1, 1, 2, 3, -1], max_staleness=2)
    assert m == {
        "staleness/batch_mean": pytest.approx(1.4), "staleness/batch_max": 3.0,
        "staleness/batch_hist_0": 1.0, "staleness/batch_hist_1": 2.0, "staleness/batch_hist_2": 1.0,
        "staleness/batch_hist_over": 1.0, "staleness/batch_ahead": 1.0,
    }
    assert set(batch_staleness_metrics([], 0).values()) == {0.0}
