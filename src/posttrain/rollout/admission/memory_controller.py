"""``MemoryAdmissionController``: admission tickets inside one process (thread-safe).

The in-process twin of ``redis_controller.RedisAdmissionController`` with the same counters and
lease rules; tests and single-process runs use it. Leases expire by an injectable clock.

Example: see ``tests/unit/rollout/test_rollout_admission_memory.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence

from posttrain.rollout.admission.tickets import (
    AdmissionState,
    OpenTickets,
    ReissuedTask,
    Ticket,
    capacity,
    check_controller_args,
    check_refund_args,
    check_release_infra_args,
    engine_behind,
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
                        "rebased": 0, "completed": 0, "infra": 0, "reissued": 0, "abandoned": 0, "lost": 0,
                        "retaken": 0, "engine_behind": 0, "client_retry": 0}
        self._base_version = 0
        self._infra: dict[str, int] = {}
        self._tasks: dict[str, ReissuedTask] = {}  # ticket_id -> the task its episode runs
        self._reissue: deque[ReissuedTask] = deque()
        self._refunded: set[str] = set()  # entry ids refunded and not yet settled

    def _expire(self, now: float) -> None:
        dead = [t for t, exp in self._leases.items() if exp <= now]
        for t in dead:
            del self._leases[t]
        self._totals["expired"] += len(dead)

    def _try_once(self, served_version: int | None = None) -> Ticket | None:
        version = self.version_store.get()
        cap = capacity(version, self.max_staleness, self.batch_size)
        with self._lock:
            now = self.clock()
            self._expire(now)
            started = self._consumed + len(self._leases)
            if started >= cap:
                return None
            if engine_behind(version, served_version, self.max_staleness):
                self._totals["engine_behind"] += 1
                return None
            ticket = Ticket(uuid.uuid4().hex, version, started + 1, cap)
            self._leases[ticket.ticket_id] = now + self.lease_s
            self._totals["granted"] += 1
        self._open.add(ticket.ticket_id)
        return ticket

    def acquire(self, timeout_s: float, served_version: int | None = None) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds (``>= 0``) for a ticket; None if capacity stayed full.

        No ticket while the learner is more than tau versions ahead of ``served_version``
        (``AdmissionController.acquire``).

        Raises:
            ValueError: ``timeout_s < 0``.
        """
        return poll_until_granted(lambda: self._try_once(served_version), timeout_s, self.poll_interval_s)

    def consume(self, ticket: Ticket) -> None:
        """Count the ticket's rollout as consumed (call after ``queue.put``).

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
        """
        self._open.close(ticket, "consumed")
        with self._lock:
            if self._leases.pop(ticket.ticket_id, None) is None:
                self._totals["late"] += 1
            self._tasks.pop(ticket.ticket_id, None)
            self._consumed += 1
            self._totals["completed"] += 1

    def release(self, ticket: Ticket) -> None:
        """Give the slot of a failed episode back.

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
        """
        self._open.close(ticket, "released")
        with self._lock:
            self._tasks.pop(ticket.ticket_id, None)
            if self._leases.pop(ticket.ticket_id, None) is not None:
                self._totals["released"] += 1

    def release_infra(self, ticket: Ticket, cause: str, reissue: ReissuedTask | None, *,
                      client_retries: bool = False) -> None:
        """Give the slot back, count the infrastructure failure by ``cause``, queue ``reissue`` (``AdmissionController``).

        Raises:
            ValueError: the ticket is unknown or already consumed/released; ``client_retries`` with a ``reissue``.
        """
        check_release_infra_args(reissue, client_retries)
        self.release(ticket)
        with self._lock:
            self._totals["infra"] += 1
            self._infra[cause] = self._infra.get(cause, 0) + 1
            if client_retries:
                self._totals["client_retry"] += 1
            elif reissue is None:
                self._totals["abandoned"] += 1
            else:
                self._reissue.append(reissue)
                self._totals["reissued"] += 1

    def assign(self, ticket: Ticket, task: ReissuedTask) -> None:
        """Record the task ``ticket`` runs (kept until consumed or released; nothing here loses it in flight)."""
        with self._lock:
            self._tasks[ticket.ticket_id] = task

    def take_reissued(self) -> ReissuedTask | None:
        """The oldest task queued to run again, or None."""
        with self._lock:
            return self._reissue.popleft() if self._reissue else None

    def refund(self, count: int, entry_ids: Sequence[str] | None = None) -> int:
        """Give back the slots of ``count`` consumed rollouts the learner dropped (at most ``consumed``).

        Refunds beyond ``consumed`` (entries put without a ticket) are counted in ``unticketed_total``;
        with ``entry_ids``, an entry refunded before and not settled gives nothing back again.

        Returns:
            Slots given back.

        Raises:
            ValueError: ``count < 0``, or ``entry_ids`` not one per rollout.
        """
        check_refund_args(count, entry_ids)
        with self._lock:
            if entry_ids is not None:
                new = set(entry_ids) - self._refunded
                self._refunded |= new
                count = len(new)
            back = min(count, self._consumed)
            self._consumed -= back
            self._totals["refunded"] += back
            self._totals["unticketed"] += count - back
            return back

    def settle(self, trained: Sequence[str] = (), acked: Sequence[str] = ()) -> int:
        """Refunded entries that are trained take their place back; acknowledged ones are forgotten (``AdmissionController``)."""
        with self._lock:
            retaken = sum(1 for e in set(trained) if e in self._refunded)
            self._refunded -= set(trained) | set(acked)
            self._consumed += retaken
            self._totals["retaken"] += retaken
            return retaken

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
                infra_by_cause=dict(self._infra),
                **{f"{k}_total": v for k, v in self._totals.items()},
            )

