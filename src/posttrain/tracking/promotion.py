"""Promotion: ``promote_if_better`` moves the ``champion`` alias only to a version that beats it.

The comparison reads the ``eval.<benchmark>.<metric>`` tags that registration stored; the
decision, promoted or not, is recorded on the candidate as the tag ``posttrain.promotion``.
The command line is ``posttrain models promote``. ``register_and_promote`` is what ``posttrain run``
does at its end, the rule the pipeline's register step applies: register (once per checkpoint),
then promote on ``heldout.accuracy``, so a registered model's first version is its champion.

Example: ``promote_if_better("team-a-policy", 3, metric="gsm8k.avg@1", margin=0.01)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from posttrain.tracking.client import (
    CHALLENGER,
    CHAMPION,
    EVAL_PREFIX,
    LINEAGE_PREFIX,
    TrackingError,
    metric_key,
    mlflow_client,
)
from posttrain.tracking.registry import Lineage, get_alias_version, get_model_version, register_checkpoint

HELDOUT_METRIC = "heldout.accuracy"
"""The score ``posttrain run`` registers every technique's final model with and promotes on (tag
``eval.heldout.accuracy``: accuracy on ``data.env``'s held-out tasks); also the pipeline's default ``promote_on``."""


class PromotionDecision(msgspec.Struct, kw_only=True):
    """Outcome of ``promote_if_better``.

    Attributes:
        promoted: Whether the candidate now holds ``champion``.
        champion_version: The version holding ``champion`` afterwards.
        previous_champion: The version that held it before, or None.
        candidate_score: The candidate's value of the metric.
        champion_score: The previous champion's value, or None.
        reason: One sentence, also stored as the tag ``posttrain.promotion`` on the candidate.
    """

    promoted: bool
    champion_version: int
    previous_champion: int | None
    candidate_score: float
    champion_score: float | None
    reason: str


def _score(mv: Any, metric: str) -> float:
    key = metric_key(metric if metric.startswith(EVAL_PREFIX) else f"{EVAL_PREFIX}{metric}")
    value = (mv.tags or {}).get(key)
    if value is None:
        raise TrackingError(f"{mv.name} version {mv.version}: no tag {key!r}; cannot compare on metric {metric!r}")
    try:
        return float(value)
    except ValueError as exc:
        raise TrackingError(f"{mv.name} version {mv.version}: tag {key!r}={value!r} is not a number") from exc


def promote_if_better(
    registered_model: str,
    version: int | str,
    *,
    metric: str,
    margin: float = 0.0,
    higher_is_better: bool = True,
    tracking_uri: str | None = None,
    force: bool = False,
) -> PromotionDecision:
    """Move ``champion`` to ``version`` if it beats the current champion on ``metric`` by ``margin``.

    With ``delta = candidate - champion`` (negated when lower is better), the candidate is
    promoted when there is no champion yet, or when ``delta > 0`` and ``delta >= margin``. A tie
    never promotes. ``force`` promotes without comparing (the metric is still read if present).
    The decision is stored on the candidate as the tag ``posttrain.promotion``.

    Not atomic: two promotions of the same model at once can both read the old champion. Run
    promotions of one model one at a time (the pipeline's register step does).

    Args:
        registered_model: Registered model name.
        version: Candidate version.
        metric: ``<benchmark>.<metric>`` (``gsm8k.avg@1``) or the full tag key ``eval.gsm8k.avg_at_1``.
        margin: Least improvement required (same units as the metric), >= 0.
        higher_is_better: Direction of the metric.
        tracking_uri: MLflow URI; None uses ``default_tracking_uri()``.
        force: Promote regardless of scores.

    Raises:
        TrackingError: unknown model or version, or a version without the metric tag.
        ValueError: negative ``margin``.
    """
    if margin < 0:
        raise ValueError(f"margin: must be >= 0, got {margin}")
    client = mlflow_client(tracking_uri)
    candidate = get_model_version(client, registered_model, version)
    current = get_alias_version(client, registered_model, CHAMPION)
    try:
        cand_score = _score(candidate, metric)
    except TrackingError:
        if not force:
            raise
        cand_score = float("nan")
    key = metric_key(metric if metric.startswith(EVAL_PREFIX) else f"{EVAL_PREFIX}{metric}")
    if current is not None and int(current.version) == int(candidate.version):
        return PromotionDecision(
            promoted=False,
            champion_version=int(current.version),
            previous_champion=int(current.version),
            candidate_score=cand_score,
            champion_score=cand_score,
            reason=f"version {candidate.version} already holds {CHAMPION}",
        )
    champ_score = None
    if force:
        promote, reason = True, f"forced promotion of version {candidate.version}"
    elif current is None:
        promote, reason = True, f"first {CHAMPION}: version {candidate.version} with {key}={cand_score:.4f}"
    else:
        champ_score = _score(current, metric)
        delta = (cand_score - champ_score) if higher_is_better else (champ_score - cand_score)
        promote = delta > 0 and delta >= margin
        verb = "beats" if promote else "does not beat"
        reason = (
            f"version {candidate.version} {verb} {CHAMPION} version {current.version} on {key}: "
            f"{cand_score:.4f} vs {champ_score:.4f} (improvement {delta:+.4f}, margin {margin:.4f}, "
            f"{'higher' if higher_is_better else 'lower'} is better)"
        )
    client.set_model_version_tag(registered_model, str(candidate.version), f"{LINEAGE_PREFIX}promotion", reason)
    if promote:
        client.set_registered_model_alias(registered_model, CHAMPION, str(candidate.version))
    if promote or current is None:
        champion_version = int(candidate.version)
    else:
        champion_version = int(current.version)
    return PromotionDecision(
        promoted=promote,
        champion_version=champion_version,
        previous_champion=int(current.version) if current is not None else None,
        candidate_score=cand_score,
        champion_score=champ_score,
        reason=reason,
    )


class Registration(msgspec.Struct, kw_only=True):
    """What ``register_and_promote`` did with a run's final model.

    Attributes:
        version: The model version (new, or the earlier one of the same checkpoint when ``reused``).
        alias: ``champion`` when the version holds it afterwards, else ``challenger``.
        reused: The checkpoint was registered already; nothing was created or promoted.
        reason: The promotion decision, or why there was none (one sentence).
    """

    version: int
    alias: str
    reused: bool
    reason: str

    def describe(self) -> str:
        """The summary's ``registered model version`` value, e.g. ``2, champion (first champion: ...)``."""
        if self.reused:
            return f"{self.version} (already registered: same checkpoint, nothing new registered)"
        return f"{self.version}, {self.alias} ({self.reason})"


def register_and_promote(
    source: str,
    *,
    registered_model: str,
    lineage: Lineage,
    eval_scores: Mapping[str, float],
    tracking_uri: str,
    metric: str = HELDOUT_METRIC,
) -> Registration:
    """Register a run's final model once, then promote it when it beats the champion on ``metric``.

    ``register_checkpoint(..., skip_if_registered=True)``: a checkpoint registered before (a re-run of
    a finished run) is left as it is, aliases included. A new version gets ``challenger`` and then
    ``champion`` when there is none yet or it beats the champion on ``metric`` (``promote_if_better``,
    margin 0; a tie never promotes). A champion without a ``metric`` score (promoted on another
    benchmark) is not compared: the new version stays ``challenger`` and the reason says why.

    Raises:
        TrackingError: the checkpoint is missing or not a transformers model, or ``eval_scores`` has no
            ``metric``.
    """
    if metric not in eval_scores:
        raise TrackingError(f"eval_scores: no {metric!r} to promote on (got {sorted(eval_scores)})")
    info = register_checkpoint(source, registered_model=registered_model, lineage=lineage, eval_scores=eval_scores,
                               tracking_uri=tracking_uri, skip_if_registered=True)
    if info.reused:
        alias = CHAMPION if CHAMPION in info.aliases else CHALLENGER
        return Registration(version=info.version, alias=alias, reused=True,
                            reason=f"version {info.version} holds this checkpoint already")
    try:
        decision = promote_if_better(registered_model, info.version, metric=metric, tracking_uri=tracking_uri)
    except TrackingError as exc:  # the champion has no score on ``metric``
        return Registration(version=info.version, alias=CHALLENGER, reused=False,
                            reason=f"not compared with the {CHAMPION}: {exc}")
    return Registration(version=info.version, alias=CHAMPION if decision.promoted else CHALLENGER, reused=False,
                        reason=decision.reason)
