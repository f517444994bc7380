"""``AsyncTicketGate``: waits for admission tickets on an asyncio event loop without parking a thread.

One coroutine at a time polls the controller with a non-blocking ``acquire(0)`` (one Lua call for
Redis); between polls it sleeps on the loop with exponential backoff (``min_interval_s`` doubling
up to ``max_interval_s``), and ``wake()`` (a new policy version was announced, so capacity grew)
cuts the sleep short. The other waiting coroutines queue on an ``asyncio.Lock`` in arrival order,
so a generator with 64 episode slots makes at most one poll per interval instead of 64. The gate
never blocks a thread of the default executor: the engine's own work runs there.

Example: see ``tests/unit/rollout/test_admission_async_gate.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from posttrain.rollout.admission.tickets import AdmissionController, Ticket


class AsyncTicketGate:
    """Waits for admission tickets on an asyncio event loop, with no thread parked (module docstring).

    Each poll is one non-blocking ``controller.acquire(0.0)`` run on the loop itself (for Redis,
    one loopback round trip, about 0.1 ms); the gate never uses an executor. Only the coroutine
    holding the gate's lock polls; the others wait for the lock in arrival order. Polls per
    ``acquire(timeout_s)`` are bounded by ``1 + ceil(log2(max/min)) + timeout_s / max_interval_s``
    (plus one per ``wake()``).

    Args:
        controller: The run's admission controller (Redis or in-memory).
        min_interval_s: First sleep after a refused poll (seconds, > 0).
        max_interval_s: Longest sleep between polls (seconds, >= ``min_interval_s``).
        served_version: Returns the policy version the generator's engine serves now; passed to
            every poll (``AdmissionController.acquire``), so no ticket is granted while the engine
            is more than tau versions behind the learner. None: not checked.

    Attributes:
        polls: Controller checks made so far (granted or refused).
        granted: Tickets handed out so far.

    Raises:
        ValueError: an interval out of range (the message names it).
    """

    def __init__(self, controller: AdmissionController, min_interval_s: float = 0.005,
                 max_interval_s: float = 0.1, served_version: Callable[[], int] | None = None) -> None:
        if not min_interval_s > 0:
            raise ValueError(f"min_interval_s: must be > 0 seconds, got {min_interval_s}")
        if not max_interval_s >= min_interval_s:
            raise ValueError(f"max_interval_s: must be >= min_interval_s={min_interval_s}, got {max_interval_s}")
        self.controller = controller
        self.served_version = served_version
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.polls = 0
        self.granted = 0
        self._lock: asyncio.Lock | None = None
        self._woken: asyncio.Event | None = None

    def _bind(self) -> tuple[asyncio.Lock, asyncio.Event]:
        # Created lazily so the gate can be built outside the loop that uses it.
        if self._lock is None or self._woken is None:
            self._lock, self._woken = asyncio.Lock(), asyncio.Event()
        return self._lock, self._woken

    def wake(self) -> None:
        """Capacity may have grown (a new policy version, refunds): poll again now, backoff reset."""
        _, woken = self._bind()
        woken.set()

    async def acquire(self, timeout_s: float) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds (``>= 0``) for a ticket; None on timeout.

        The wait for the gate's lock counts against ``timeout_s`` (but lasts at least
        ``min_interval_s``); then polls continue until the deadline.

        Raises:
            ValueError: ``timeout_s < 0``.
            QueueError / QueueConnectionError: from the controller (Redis controller only).
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s: must be >= 0 seconds, got {timeout_s}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        lock, woken = self._bind()
        if lock.locked() and timeout_s == 0:
            return None
        try:
            # At least one backoff interval, so a zero timeout still gets a free lock.
            await asyncio.wait_for(lock.acquire(), timeout=max(timeout_s, self.min_interval_s))
        except TimeoutError:
            return None
        try:
            interval = self.min_interval_s
            while True:
                woken.clear()
                self.polls += 1
                if self.served_version is None:
                    ticket = self.controller.acquire(0.0)
                else:
                    ticket = self.controller.acquire(0.0, served_version=self.served_version())
                if ticket is not None:
                    self.granted += 1
                    return ticket
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    await asyncio.wait_for(woken.wait(), timeout=min(interval, remaining))
                    interval = self.min_interval_s
                except TimeoutError:
                    interval = min(2 * interval, self.max_interval_s)
        finally:
            lock.release()

