"""Admission tickets: the shared maths (capacity), the ticket records and the controller Protocol.

With ``B = batch_size``, learner version ``v`` and ``tau = max_staleness``, a generator may start a
rollout only while ``consumed + in_flight < capacity(v) = (v + tau + 1) * B`` (the package
docstring explains why). The two controllers (``memory_controller``, ``redis_controller``) share
the argument checks, the polling loop and the open-ticket bookkeeping defined here.

Example: ``capacity(learner_version=2, max_staleness=1, batch_size=8) == 32``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


def capacity(learner_version: int, max_staleness: int, batch_size: int) -> int:
    """Rollouts that may have been started in total at ``learner_version``: ``(v + tau + 1) * B``.

    Args:
        learner_version: Learner's policy version v (``>= 0``).
        max_staleness: tau, in policy versions (``>= 0``).
        batch_size: B, rollouts per optimizer step (``>= 1``).

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    if learner_version < 0:
        raise ValueError(f"learner_version: must be >= 0, got {learner_version}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness: must be >= 0, got {max_staleness}")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    return (learner_version + max_staleness + 1) * batch_size

@dataclass(frozen=True)
class Ticket:
    """Permission to start one rollout.

    Attributes:
        ticket_id: Unique id (uuid4 hex).
        learner_version: Learner policy version when granted.
        started: ``consumed + in_flight`` after this grant (this ticket is number ``started``).
        capacity: ``(learner_version + max_staleness + 1) * batch_size`` at grant time.
    """

    ticket_id: str
    learner_version: int
    started: int
    capacity: int


@dataclass(frozen=True)
class AdmissionState:
    """Snapshot of the admission counters (all counts of rollouts).

    Attributes:
        learner_version: Current learner policy version.
        capacity: ``(learner_version + max_staleness + 1) * batch_size``.
        consumed: Rollouts put on the stream and not refunded.
        in_flight: Tickets granted, unexpired, not yet consumed or released.
        granted_total, released_total, expired_total, refunded_total, late_total: Running totals;
            ``late_total`` counts consumes whose lease had already expired.
        unticketed_total: Refunds beyond the consumed count (entries that reached the stream
            without a ticket, from a producer outside admission); nothing was given back for them.
        rebased_total: Rollouts counted as consumed by ``rebase`` after the counters were lost.
    """

    learner_version: int
    capacity: int
    consumed: int
    in_flight: int
    granted_total: int
    released_total: int
    expired_total: int
    refunded_total: int
    late_total: int
    unticketed_total: int = 0
    rebased_total: int = 0

    @property
    def started(self) -> int:
        """``consumed + in_flight``: what ``capacity`` bounds."""
        return self.consumed + self.in_flight

    def as_metrics(self) -> dict[str, float]:
        """Flat floats for MLflow: ``admission/<field>``."""
        fields = {k: float(v) for k, v in self.__dict__.items()}
        fields["started"] = float(self.started)
        return {f"admission/{k}": v for k, v in fields.items()}


@runtime_checkable
class AdmissionController(Protocol):
    """Admission tickets shared by all generators of a run."""

    def acquire(self, timeout_s: float) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds for a ticket; None if capacity stayed full."""
        ...

    def consume(self, ticket: Ticket) -> None:
        """The ticket's rollout is on the stream: it now counts as consumed."""
        ...

    def release(self, ticket: Ticket) -> None:
        """The episode failed and produced no rollout: give the slot back."""
        ...

    def refund(self, count: int) -> None:
        """The learner dropped ``count`` consumed rollouts (stale, dead-lettered): give their slots back.

        At most ``consumed`` slots come back; the rest (entries that came without a ticket) is
        counted in ``unticketed_total``. Raises ValueError for ``count < 0``.
        """
        ...

    def rebase(self, learner_version: int) -> int:
        """Re-base the counters on a learner resumed at ``learner_version`` (issue 23, item 17).

        The counters assume ``consumed`` holds every batch that made a version. When they were lost
        (a fresh Redis: the key of the policy version is gone or behind the learner's checkpoint),
        the versions the counters never saw, ``learner_version - max(key version, last re-base)``,
        are added as ``B`` consumed rollouts each, so capacity ``(v + tau + 1) * B`` again bounds
        the rollouts admitted after the loss instead of granting ``C * B`` surplus slots, which
        went stale (70% of consumed rollouts at C = 8). Idempotent for one ``learner_version``.

        Returns:
            Rollouts added to ``consumed`` (0 when nothing was lost).
        """
        ...

    def state(self) -> AdmissionState:
        """Current counters."""
        ...


def check_controller_args(batch_size: int, max_staleness: int, lease_s: float, poll_interval_s: float) -> None:
    """Validate the constructor arguments both controllers share.

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    capacity(0, max_staleness, batch_size)
    if lease_s <= 0:
        raise ValueError(f"lease_s: must be > 0 seconds, got {lease_s}")
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s: must be > 0 seconds, got {poll_interval_s}")


def poll_until_granted(
    try_once: Callable[[], Ticket | None], timeout_s: float, poll_interval_s: float
) -> Ticket | None:
    """Call ``try_once`` every ``poll_interval_s`` seconds until it grants a ticket or ``timeout_s`` passes.

    ``try_once`` runs at least once, so ``timeout_s=0`` is a single non-blocking attempt.

    Returns:
        The granted ticket, or None on timeout.

    Raises:
        ValueError: ``timeout_s < 0``.
    """
    if timeout_s < 0:
        raise ValueError(f"timeout_s: must be >= 0 seconds, got {timeout_s}")
    deadline = time.monotonic() + timeout_s
    while True:
        ticket = try_once()
        if ticket is not None:
            return ticket
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(poll_interval_s, remaining))


class OpenTickets:
    """Ids granted by one controller and not yet consumed/released (catches double use); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def add(self, ticket_id: str) -> None:
        """Record a newly granted ticket id."""
        with self._lock:
            self._ids.add(ticket_id)

    def close(self, ticket: Ticket, action: str) -> None:
        """Forget ``ticket``; ``action`` (``consumed``/``released``) names the operation in the error.

        Raises:
            ValueError: the ticket is unknown to this controller or already consumed or released.
        """
        with self._lock:
            if ticket.ticket_id not in self._ids:
                raise ValueError(
                    f"ticket: {ticket.ticket_id} cannot be {action}: unknown to this controller, "
                    "or already consumed or released"
                )
            self._ids.remove(ticket.ticket_id)
