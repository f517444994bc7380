"""Per-rollout staleness: the SAO drop rule, its histogram over the run and over one batch.

``is_stale`` is the rule, ``StalenessStats`` the run's histogram, ``batch_staleness_metrics`` a batch's.

Staleness is ``learner_version - version``: of a rollout's oldest turn (``rollout.policy_version``;
the histograms, and SAO's drop under ``staleness_rule: episode``), of its newest turn (the drop
under the token rule, ``learner.batch_source.trainable``), or of one token (the loss's mask,
``learner.sao_step.stale_tokens``); each is bounded by tau (``max_staleness``). Admission control keeps most rollouts inside the bound, but the
learner still checks each one, because a generator's engine may lag the version key.

Example: ``is_stale(rollout_policy_version=3, learner_version=5, max_staleness=1)`` is True.
"""

from __future__ import annotations

from collections.abc import Sequence


def is_stale(rollout_policy_version: int, learner_version: int, max_staleness: int) -> bool:
    """True when ``learner_version - rollout_policy_version > max_staleness`` (too old to train).

    A rollout newer than the learner (negative staleness, e.g. after a learner restarted from an
    older checkpoint) is not stale.
    """
    return learner_version - rollout_policy_version > max_staleness


class StalenessStats:
    """Histogram of ``learner_version - rollout.policy_version`` over consumed rollouts, and drops.

    Args:
        max_staleness: tau; bins ``hist_0`` .. ``hist_<tau>``, plus ``hist_over`` for larger lags.

    Raises:
        ValueError: ``max_staleness < 0``.
    """

    def __init__(self, max_staleness: int) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness: must be >= 0, got {max_staleness}")
        self.max_staleness = max_staleness
        self.hist = [0] * (max_staleness + 1)
        self.over = 0
        self.ahead = 0
        self.count = 0
        self.total = 0
        self.max = 0
        self.dropped = 0

    def observe(self, rollout_policy_version: int, learner_version: int) -> int:
        """Record one rollout; return its staleness (policy versions, may be negative).

        A negative staleness (rollout newer than the learner, after a learner restart from an
        older checkpoint) is counted in ``staleness/ahead_total`` only, not in the histogram.
        """
        s = learner_version - rollout_policy_version
        if s < 0:
            self.ahead += 1
            return s
        self.count += 1
        self.total += s
        self.max = max(self.max, s)
        if s <= self.max_staleness:
            self.hist[s] += 1
        else:
            self.over += 1
        return s

    def record_dropped(self, count: int = 1) -> None:
        """Count ``count`` rollouts the learner dropped (``>= 0``; raises ValueError otherwise)."""
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        self.dropped += count

    def as_metrics(self) -> dict[str, float]:
        """Cumulative flat metrics for MLflow.

        Keys: ``staleness/mean``, ``/max``, ``/count`` (non-negative observations),
        ``/dropped_total``, ``/ahead_total``, ``/hist_0`` .. ``/hist_<tau>``, ``/hist_over``.
        """
        out = {
            "staleness/mean": self.total / self.count if self.count else 0.0,
            "staleness/max": float(self.max),
            "staleness/count": float(self.count),
            "staleness/dropped_total": float(self.dropped),
            "staleness/ahead_total": float(self.ahead),
        }
        for s, c in enumerate(self.hist):
            out[f"staleness/hist_{s}"] = float(c)
        out["staleness/hist_over"] = float(self.over)
        return out


def batch_staleness_metrics(lags: Sequence[int], max_staleness: int) -> dict[str, float]:
    """One batch's per-rollout staleness (``learner_version - rollout.policy_version`` when it trains).

    Keys: ``staleness/batch_mean`` and ``/batch_max`` over lags >= 0, ``/batch_hist_0`` ..
    ``/batch_hist_<tau>`` (rollouts of each lag), ``/batch_hist_over`` (lag > tau, which the
    learner drops) and ``/batch_ahead`` (negative lags, after a restart from an older checkpoint).

    Raises:
        ValueError: ``max_staleness < 0``.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness: must be >= 0, got {max_staleness}")
    behind = [s for s in lags if s >= 0]
    hist = [0] * (max_staleness + 1)
    for s in behind:
        if s <= max_staleness:
            hist[s] += 1
    out = {
        "staleness/batch_mean": sum(behind) / len(behind) if behind else 0.0,
        "staleness/batch_max": float(max(behind, default=0)),
    }
    out.update({f"staleness/batch_hist_{s}": float(c) for s, c in enumerate(hist)})
    out["staleness/batch_hist_over"] = float(sum(1 for s in behind if s > max_staleness))
    out["staleness/batch_ahead"] = float(len(lags) - len(behind))
    return out
