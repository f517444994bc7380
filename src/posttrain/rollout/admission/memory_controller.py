"""``MemoryAdmissionController``: admission tickets inside one process (thread-safe).

The in-process twin of ``redis_controller.RedisAdmissionController`` with the same counters and
lease rules; tests and single-process runs use it. Leases expire by an injectable clock.

Example: see ``tests/unit/rollout/test_rollout_admission_memory.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from posttrain.rollout.admission.tickets import (
    AdmissionState,
    OpenTickets,
    Ticket,
    capacity,
    check_controller_args,
    poll_until_granted,
)
from posttrain.rollout.queue import PolicyVersionStore


class MemoryAdmissionController:
    """``AdmissionController`` in one process (thread-safe), reading ``version_store`` for v.

    Args:
        version_store: Source of the learner's policy version.
        batch_size: B, rollouts per optimizer step (``>= 1``).
        max_staleness: tau, policy versions (``>= 0``).
        lease_s: Seconds after which an unconsumed ticket expires (``> 0``).
        poll_interval_s: Sleep between capacity checks while waiting (seconds, ``> 0``).
        clock: Seconds clock for leases (``time.monotonic``; tests pass a hand-driven one).

    Raises:
        ValueError: an argument out of range (the message names it).
    """

    def __init__(
        self,
        version_store: PolicyVersionStore,
        batch_size: int,
        max_staleness: int,
        lease_s: float = 3600.0,
        poll_interval_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_controller_args(batch_size, max_staleness, lease_s, poll_interval_s)
        self.version_store = version_store
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.lease_s = lease_s
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._leases: dict[str, float] = {}  # ticket_id -> expiry, clock() seconds
        self._open = OpenTickets()
        self._consumed = 0
        self._totals = {"granted": 0, "released": 0, "expired": 0, "refunded": 0, "late": 0, "unticketed": 0,
                        "rebased": 0}
        self._base_version = 0

    def _expire(self, now: float) -> None:
        dead = [t for t, exp in self._leases.items() if exp <= now]
        for t in dead:
            del self._leases[t]
        self._totals["expired"] += len(dead)

    def _try_once(self) -> Ticket | None:
        version = self.version_store.get()
        cap = capacity(version, self.max_staleness, self.batch_size)
        with self._lock:
            now = self.clock()
            self._expire(now)
            started = self._consumed + len(self._leases)
            if started >= cap:
                return None
            ticket = Ticket(uuid.uuid4().hex, version, started + 1, cap)
            self._leases[ticket.ticket_id] = now + self.lease_s
            self._totals["granted"] += 1
        self._open.add(ticket.ticket_id)
        return ticket

    def acquire(self, timeout_s: float) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds (``>= 0``) for a ticket; None if capacity stayed full.

        Raises:
            ValueError: ``timeout_s < 0``.
        """
        return poll_until_granted(self._try_once, timeout_s, self.poll_interval_s)

    def consume(self, ticket: Ticket) -> None:
        """Count the ticket's rollout as consumed (call after ``queue.put``).

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
        """
        self._open.close(ticket, "consumed")
        with self._lock:
            if self._leases.pop(ticket.ticket_id, None) is None:
                self._totals["late"] += 1
            self._consumed += 1

    def release(self, ticket: Ticket) -> None:
        """Give the slot of a failed episode back.

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
        """
        self._open.close(ticket, "released")
        with self._lock:
            if self._leases.pop(ticket.ticket_id, None) is not None:
                self._totals["released"] += 1

    def refund(self, count: int) -> None:
        """Give back the slots of ``count`` consumed rollouts the learner dropped (at most ``consumed``).

        Refunds beyond ``consumed`` (entries put without a ticket) are counted in ``unticketed_total``.

        Raises:
            ValueError: ``count < 0``.
        """
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        with self._lock:
            back = min(count, self._consumed)
            self._consumed -= back
            self._totals["refunded"] += back
            self._totals["unticketed"] += count - back

    def rebase(self, learner_version: int) -> int:
        """Count the versions the counters never saw as consumed batches (``AdmissionController.rebase``).

        Raises:
            ValueError: ``learner_version < 0``.
        """
        if learner_version < 0:
            raise ValueError(f"learner_version: must be >= 0, got {learner_version}")
        known = self.version_store.get()
        with self._lock:
            known = max(known, self._base_version)
            if learner_version <= known:
                return 0
            added = (learner_version - known) * self.batch_size
            self._consumed += added
            self._totals["rebased"] += added
            self._base_version = learner_version
            return added

    def state(self) -> AdmissionState:
        """Current counters."""
        version = self.version_store.get()
        with self._lock:
            self._expire(self.clock())
            return AdmissionState(
                learner_version=version,
                capacity=capacity(version, self.max_staleness, self.batch_size),
                consumed=self._consumed,
                in_flight=len(self._leases),
                **{f"{k}_total": v for k, v in self._totals.items()},
            )

