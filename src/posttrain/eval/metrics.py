"""Evaluation metrics: avg@k, unbiased pass@k, confidence intervals, response-length statistics.

Pure functions over per-sample correctness and lengths; no I/O. ``summarize_scores`` turns a
``[tasks][samples]`` correctness table into the headline numbers of an eval report.

* avg@k: mean correctness over all k samples of all tasks (the expected accuracy of one sample).
* pass@k: probability that at least one of k samples is correct, estimated without bias from
  n >= k samples with c correct (Chen et al. 2021, "Evaluating Large Language Models Trained on
  Code", arXiv 2107.03374, eq. 1): pass@k = E_tasks[1 - C(n - c, k) / C(n, k)].
* Confidence intervals: Wilson score interval for one sample per task (a binomial proportion);
  a percentile bootstrap over tasks when tasks have several samples (samples of one task are
  correlated, so resampling tasks is the honest unit).

Run: ``python -c "from posttrain.eval.metrics import pass_at_k; print(pass_at_k(10, 3, 2))"``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

import msgspec


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from n samples with c correct (Chen et al. 2021, eq. 1).

    pass@k = 1 - C(n - c, k) / C(n, k), computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i)
    to avoid huge binomials.

    Args:
        n: Samples drawn for the task (>= 1).
        c: Correct samples among them (0 <= c <= n).
        k: Budget of the metric (1 <= k <= n).

    Returns:
        A probability in [0, 1].

    Raises:
        ValueError: ``n < 1``, ``c`` outside [0, n], or ``k`` outside [1, n]; the message names the argument.
    """
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c: must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k: must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks.

    Args:
        correct: ``[num_tasks][n_i]`` bool. Correctness of each sample of each task; every task
            needs ``n_i >= k`` samples.
        k: Budget.

    Raises:
        ValueError: no tasks, or a task with fewer than ``k`` samples (the message names its index).
    """
    if not correct:
        raise ValueError("correct: no tasks")
    total = 0.0
    for i, samples in enumerate(correct):
        if len(samples) < k:
            raise ValueError(f"correct[{i}]: {len(samples)} samples, pass@{k} needs >= {k}")
        total += pass_at_k(len(samples), sum(bool(s) for s in samples), k)
    return total / len(correct)


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """avg@k: mean over tasks of the fraction of correct samples.

    With the same k for every task this equals the mean over all samples.

    Args:
        correct: ``[num_tasks][k_i]`` bool, each task with >= 1 sample.

    Raises:
        ValueError: no tasks, or a task without samples (named by index).
    """
    if not correct:
        raise ValueError("correct: no tasks")
    total = 0.0
    for i, samples in enumerate(correct):
        if not samples:
            raise ValueError(f"correct[{i}]: no samples")
        total += sum(bool(s) for s in samples) / len(samples)
    return total / len(correct)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    With p = successes / trials and z the two-sided normal quantile of ``confidence``:
    centre = (p + z^2 / 2n) / (1 + z^2 / n), half = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2).

    Raises:
        ValueError: ``trials < 1``, ``successes`` outside [0, trials], or ``confidence`` outside (0, 1).
    """
    if trials < 1:
        raise ValueError(f"trials: must be >= 1, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes: must be in [0, trials={trials}], got {successes}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    n = trials
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At p = 0 (or 1) the bound is exactly 0 (or 1); pin it against rounding.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == trials else min(1.0, centre + half)
    return lo, hi


def bootstrap_interval(
    values: Sequence[float], confidence: float = 0.95, num_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampling with replacement).

    Deterministic for a given ``seed``.

    Args:
        values: ``[num_tasks]`` float. One score per task (for example its fraction of correct samples).
        confidence: Two-sided coverage.
        num_resamples: Bootstrap replicates.
        seed: RNG seed.

    Raises:
        ValueError: empty ``values``, ``confidence`` outside (0, 1), or ``num_resamples < 1``.
    """
    if not values:
        raise ValueError("values: empty")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples: must be >= 1, got {num_resamples}")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(num_resamples))
    alpha = (1.0 - confidence) / 2.0
    lo = means[min(num_resamples - 1, max(0, math.floor(alpha * num_resamples)))]
    hi = means[min(num_resamples - 1, max(0, math.ceil((1.0 - alpha) * num_resamples) - 1))]
    return lo, hi


class LengthStats(msgspec.Struct, kw_only=True):
    """Distribution of response lengths (tokens, or characters where stated).

    Attributes:
        count: Number of responses.
        mean: Mean length.
        std: Population standard deviation.
        min: Shortest.
        p50: Median.
        p90: 90th percentile (nearest rank).
        max: Longest.
    """

    count: int
    mean: float
    std: float
    min: int
    p50: float
    p90: int
    max: int


def length_stats(lengths: Sequence[int]) -> LengthStats:
    """Summarise response lengths (tokens).

    Args:
        lengths: ``[num_samples]`` int. Length of each response (>= 0).

    Raises:
        ValueError: empty input or a negative length (named by index).
    """
    if not lengths:
        raise ValueError("lengths: empty")
    for i, n in enumerate(lengths):
        if n < 0:
            raise ValueError(f"lengths[{i}]: negative ({n})")
    ordered = sorted(lengths)
    rank90 = max(0, math.ceil(0.9 * len(ordered)) - 1)
    return LengthStats(
        count=len(ordered),
        mean=statistics.fmean(ordered),
        std=statistics.pstdev(ordered),
        min=ordered[0],
        p50=float(statistics.median(ordered)),
        p90=ordered[rank90],
        max=ordered[-1],
    )


class ScoreSummary(msgspec.Struct, kw_only=True):
    """Headline numbers of one benchmark run (or one category of it).

    Attributes:
        num_tasks: Tasks whose every sample was graded (the denominator of the scores).
        samples_per_task: k.
        avg_at_k: Mean correctness over samples (avg@k), in [0, 1].
        pass_at_k: ``{k': pass@k'}`` for k' in 1, 2, 4, ... up to k (and k itself).
        ci_low: Lower end of the confidence interval of ``avg_at_k``.
        ci_high: Upper end of the confidence interval of ``avg_at_k``.
        ci_method: ``wilson`` (k = 1) or ``bootstrap`` (k > 1, resampling tasks).
        confidence: Coverage of the interval (0.95).
    """

    num_tasks: int
    samples_per_task: int
    avg_at_k: float
    pass_at_k: dict[int, float]
    ci_low: float
    ci_high: float
    ci_method: str
    confidence: float


def pass_k_values(k: int) -> list[int]:
    """The budgets reported for ``k`` samples: powers of two below ``k``, and ``k`` itself."""
    values = []
    b = 1
    while b < k:
        values.append(b)
        b *= 2
    values.append(k)
    return values


def summarize_scores(correct: Sequence[Sequence[bool]], confidence: float = 0.95, seed: int = 0) -> ScoreSummary:
    """avg@k, pass@k for the standard budgets, and a confidence interval on avg@k.

    Args:
        correct: ``[num_tasks][k]`` bool. Every task has the same number k >= 1 of graded samples.
        confidence: Coverage of the interval.
        seed: Bootstrap seed (used when k > 1).

    Raises:
        ValueError: no tasks, or tasks with different sample counts (the first offender is named).
    """
    if not correct:
        raise ValueError("correct: no tasks")
    k = len(correct[0])
    for i, samples in enumerate(correct):
        if len(samples) != k:
            raise ValueError(f"correct[{i}]: {len(samples)} samples, expected {k} like correct[0]")
    score = avg_at_k(correct)
    if k == 1:
        lo, hi = wilson_interval(sum(bool(s[0]) for s in correct), len(correct), confidence)
        method = "wilson"
    else:
        per_task = [sum(bool(x) for x in s) / k for s in correct]
        lo, hi = bootstrap_interval(per_task, confidence, seed=seed)
        method = "bootstrap"
    return ScoreSummary(
        num_tasks=len(correct),
        samples_per_task=k,
        avg_at_k=score,
        pass_at_k={b: mean_pass_at_k(correct, b) for b in pass_k_values(k)},
        ci_low=lo,
        ci_high=hi,
        ci_method=method,
        confidence=confidence,
    )
