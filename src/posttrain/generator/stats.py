"""Generator throughput accounting: busy fraction, rollouts/s, tokens/s, episodes in flight.

The engine counts as *busy* while at least one generation request is inside it; the busy
fraction is busy time over wall time since the generator started serving. Generators publish
their stats as JSON to a Redis hash (``<prefix>:<run>:generator_stats``) that the learner logs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from posttrain.generator.engines.base import GenerationRequest, GenerationResult, InferenceEngine
from posttrain.runtime import RunContext


def stats_key(ctx: RunContext) -> str:
    """Redis hash of generator id → JSON stats of one run."""
    return f"{ctx.keys.base}:generator_stats"


def stop_key(ctx: RunContext) -> str:
    """Redis key whose presence tells the run's generators to finish."""
    return f"{ctx.keys.base}:stop"


@dataclass
class GeneratorStats:
    """Counters of one generator process (seconds, tokens, rollouts).

    Attributes:
        started_at: Unix time (s) the generator began serving.
        busy_s: Seconds with at least one request inside the engine.
        rollouts: Rollouts put on the stream.
        rejected: Rollouts rejected before sending (invalid record, e.g. a NaN logprob).
        failed: Episodes that raised (environment or engine error), counted, not sent.
        action_tokens: Sampled tokens in sent rollouts.
        total_tokens: All tokens in sent rollouts.
        in_flight: Episodes running now.
        max_in_flight: Most episodes ever running at once.
        weight_reloads: In-place weight updates applied.
        admission_wait_s: Seconds spent waiting for admission tickets (summed over episode slots).
    """

    started_at: float = field(default_factory=time.time)
    busy_s: float = 0.0
    rollouts: int = 0
    rejected: int = 0
    failed: int = 0
    action_tokens: int = 0
    total_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    weight_reloads: int = 0
    admission_wait_s: float = 0.0
    _active: int = 0
    _busy_since: float = 0.0

    def request_started(self) -> None:
        """Mark a request entering the engine."""
        if self._active == 0:
            self._busy_since = time.monotonic()
        self._active += 1

    def request_finished(self) -> None:
        """Mark a request leaving the engine."""
        self._active -= 1
        if self._active == 0:
            self.busy_s += time.monotonic() - self._busy_since

    def episode_started(self) -> None:
        """Mark an episode starting."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def episode_finished(self) -> None:
        """Mark an episode ending (sent, rejected or failed)."""
        self.in_flight -= 1

    def snapshot(self) -> dict[str, float]:
        """Flat metrics: ``busy_fraction``, ``rollouts_per_s``, ``tokens_per_s`` and the raw counters."""
        wall = max(time.time() - self.started_at, 1e-9)
        busy = self.busy_s + (time.monotonic() - self._busy_since if self._active else 0.0)
        out = {k: float(v) for k, v in asdict(self).items() if not k.startswith("_")}
        out.update(
            busy_fraction=min(1.0, busy / wall),
            rollouts_per_s=self.rollouts / wall,
            tokens_per_s=self.action_tokens / wall,
            wall_s=wall,
        )
        return out


class MeteredEngine:
    """Wraps an ``InferenceEngine`` and records busy time in ``GeneratorStats``."""

    def __init__(self, engine: InferenceEngine, stats: GeneratorStats) -> None:
        self._engine = engine
        self._stats = stats

    @property
    def policy_version(self) -> int:
        """Version of the weights the wrapped engine serves."""
        return self._engine.policy_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Forward to the engine, counting the time it is busy."""
        self._stats.request_started()
        try:
            return await self._engine.generate(request)
        finally:
            self._stats.request_finished()

    async def update_weights(self, weights_dir, policy_version: int) -> None:  # noqa: ANN001
        """Forward a weight update and count it."""
        await self._engine.update_weights(weights_dir, policy_version)
        self._stats.weight_reloads += 1

    def close(self) -> None:
        """Close the wrapped engine."""
        self._engine.close()
