"""The gateway's batching gate: the turns of open episodes reach a whole-batch engine together.

The ``hf`` engine runs each padded batch to its last row's end and batches what is queued when it
starts one. A generator's episodes ask for their next turns at once, as the previous batch
returns; a gateway's come back spread out, each after its own HTTP round trip, so the engine
would start a batch on the first to arrive and run the rest in a second batch, and the two halves
would keep alternating (issue 33: 8 concurrent episodes ran 4.2 requests per batch, a direct
caller 8). The gate holds each turn before the engine and lets the held turns through together:

* at once when every expected episode has a turn held here (no other episode can join the batch).
  The expected number is the most episodes open at any moment since the last group was let
  through, not only those open now: an agent that closes an episode and opens its next one
  leaves a dip between the two (issue 33: with 8 agents each running episodes back to back, the
  first new episode's turn went alone, a batch of 1, and the other 7 queued behind it);
* never while turns it let through are still in the engine: a whole-batch engine would only
  queue them behind that batch, and the episodes coming back from it can still join;
* else once the engine has been idle, with turns held, for ``max_wait_s`` (an episode that is in
  a tool call, or whose client is slow, delays the others by at most that much per batch).

A held turn therefore waits at most for the group in the engine plus ``max_wait_s``. With ``max_wait_s``
0 the gate is open: every turn goes to the engine as it arrives. Engines that batch continuously
(vLLM adds requests at every decoding step) need no gate (``serve``: it is used only for
engines whose ``whole_batches`` attribute is true).

Not thread-safe: used on the gateway's event loop. Counted in ``GatewayStats``: ``gate_releases``
(groups let through), ``gate_released`` (turns in them), ``gate_timeouts`` (groups let through at
the wait's end, with an open episode missing) and ``gate_wait_s`` (seconds turns were held, summed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from posttrain.generator.gateway.stats import GatewayStats
from posttrain.inference.base import GenerationRequest, GenerationResult, InferenceEngine


class BatchGate:
    """Holds engine calls so that the open episodes' turns run in one engine batch (module docstring).

    Args:
        engine: The engine the turns go to.
        max_wait_s: Longest engine-idle wait for the missing episodes' turns (seconds, >= 0; 0: no gate).
        open_episodes: The number of open episodes now (the turns that may still join a batch); the gate
            expects the most it returned since its last release.
        stats: Where the gate's counters go.

    Raises:
        ValueError: ``max_wait_s`` negative or not finite.
    """

    def __init__(self, engine: InferenceEngine, max_wait_s: float, open_episodes: Callable[[], int],
                 stats: GatewayStats) -> None:
        if not 0.0 <= max_wait_s < float("inf"):
            raise ValueError(f"max_wait_s: must be a finite number of seconds >= 0, got {max_wait_s}")
        self.engine = engine
        self.max_wait_s = max_wait_s
        self._open_episodes = open_episodes
        self._stats = stats
        self._held: list[tuple[asyncio.Future[None], float]] = []
        self._expected = 0  # the most episodes open at once since the last release (module docstring)
        self._in_engine = 0
        self._idle_since = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def held(self) -> int:
        """Turns waiting at the gate now."""
        return len(self._held)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """``engine.generate(request)`` once the gate lets the turn through (module docstring).

        Raises:
            Whatever the engine raises; ``asyncio.CancelledError`` when the caller is cancelled
            (a held turn then leaves the gate without reaching the engine).
        """
        if self.max_wait_s == 0:
            return await self.engine.generate(request)
        passed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held.append((passed, time.monotonic()))
        self.check()
        try:
            await passed
        except asyncio.CancelledError:
            if passed.done() and not passed.cancelled():  # let through, cancelled before it could run
                self._left_engine()
            else:
                self._held = [h for h in self._held if h[0] is not passed]
                self.check()
            raise
        try:
            return await self.engine.generate(request)
        finally:
            self._left_engine()

    def check(self) -> None:
        """Let the held turns through if the rule says so now, else time the next look.

        Called on each arrival and engine return, and by the service when an episode closes or is
        abandoned (one fewer open episode; the gate still expects the most open since its last
        release, so such a batch goes at the wait's end, and the next group expects one fewer).
        """
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._expected = max(self._expected, self._open_episodes())
        if not self._held:
            return
        if len(self._held) >= self._expected and self._in_engine == 0:
            self._release(timed_out=False)
            return
        if self._in_engine:
            return  # looked at again when the engine's batch returns
        deadline = max(self._idle_since, self._held[0][1]) + self.max_wait_s
        now = time.monotonic()
        if now >= deadline:
            self._release(timed_out=True)
        else:
            self._timer = asyncio.get_running_loop().call_later(deadline - now, self.check)

    def _release(self, timed_out: bool) -> None:
        now = time.monotonic()
        held, self._held = self._held, []
        for passed, since in held:
            self._stats.gate_wait_s += now - since
            passed.set_result(None)
        self._in_engine += len(held)
        self._expected = self._open_episodes()  # a pool that shrank is waited for no longer than one group
        self._stats.gate_releases += 1
        self._stats.gate_released += len(held)
        self._stats.gate_timeouts += int(timed_out)

    def _left_engine(self) -> None:
        self._in_engine -= 1
        if self._in_engine == 0:
            self._idle_since = time.monotonic()
            self.check()
