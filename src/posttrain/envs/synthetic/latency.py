r"""Seeded log-normal tool latency for the synthetic tool environments (``synthetic_longtail``, ``synthetic_tool``).

Real agentic tools (a sandbox starting, a test suite running, a web request) take seconds of wall
time while the model waits; that latency, more than the token count, is what makes agentic
rollouts long-tailed in wall time. An environment with ``tool_latency_median_s > 0`` gives each
tool call a delay, drawn deterministically from a key naming the call (the environment's choice,
e.g. task id and call index), and spends it with ``asyncio.sleep`` inside its async ``step`` (the
event loop, and so the generator's other episodes and its engine, keep running)::

    delay(key) = min(max_s, median_s * exp(sigma * z)),
    z ~ N(0, 1) drawn from random.Random(f"{namespace}:latency:{seed}:{key}")

so every method, generator and replay sees the same latencies for the same calls.
``median_s = 0`` (the environments' default) disables latency: every delay is 0.0 and nothing
is awaited.
"""

from __future__ import annotations

import asyncio
import math
import random


class ToolLatency:
    """Deterministic log-normal wall-time delay per tool call (module docstring).

    The arguments carry the environments' ``env_args`` names in their error messages.

    Args:
        median_s: ``tool_latency_median_s``, the median delay (seconds, >= 0; 0 disables latency).
        sigma: ``tool_latency_sigma``, standard deviation of the delay's logarithm (>= 0; larger
            means a longer tail; 0 gives every call the median).
        max_s: ``tool_latency_max_s``, cap on one delay (seconds, > 0).
        seed: ``tool_latency_seed``, seed of the draws.
        namespace: Prefix of every draw's seed (the environment's registry name), so two
            environments with the same seed and keys draw differently.

    Raises:
        ValueError: an argument out of range; the message names its ``tool_latency_*`` field.
    """

    def __init__(self, median_s: float, sigma: float, max_s: float, seed: int, namespace: str) -> None:
        if not median_s >= 0:
            raise ValueError(f"tool_latency_median_s: must be >= 0 seconds, got {median_s}")
        if not sigma >= 0:
            raise ValueError(f"tool_latency_sigma: must be >= 0, got {sigma}")
        if not max_s > 0:
            raise ValueError(f"tool_latency_max_s: must be > 0 seconds, got {max_s}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"tool_latency_seed: must be an integer, got {seed!r}")
        self.median_s, self.sigma, self.max_s = float(median_s), float(sigma), float(max_s)
        self.seed, self.namespace = seed, namespace

    @property
    def enabled(self) -> bool:
        """True when calls wait at all (``median_s > 0``)."""
        return self.median_s > 0

    def delay_s(self, key: str) -> float:
        """The delay (seconds) of the call named ``key``; the same key always gives the same delay.

        Returns:
            ``min(max_s, median_s * exp(sigma * z))`` with ``z`` seeded by (namespace, seed, key);
            0.0 when latency is disabled.
        """
        if not self.enabled:
            return 0.0
        z = random.Random(f"{self.namespace}:latency:{self.seed}:{key}").gauss(0.0, 1.0)
        return min(self.max_s, self.median_s * math.exp(self.sigma * z))

    async def wait(self, key: str) -> float:
        """Await ``asyncio.sleep(delay_s(key))`` (nothing when the delay is 0) and return the delay (seconds)."""
        delay = self.delay_s(key)
        if delay > 0:
            await asyncio.sleep(delay)  # models sandbox / test execution: wall time, no accelerator time
        return delay
