"""Admission tickets: the shared maths (capacity), the ticket records and the controller Protocol.

With ``B = batch_size``, learner version ``v`` and ``tau = max_staleness``, a generator may start a
rollout only while ``consumed + in_flight < capacity(v) = (v + tau + 1) * B`` (the package
docstring explains why). The two controllers (``memory_controller``, ``redis_controller``) share
the argument checks, the polling loop and the open-ticket bookkeeping defined here.

Example: ``capacity(learner_version=2, max_staleness=1, batch_size=8) == 32``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from posttrain.rollout.infra import infra_share


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
class ReissuedTask:
    """A task to run again: its episode failed for the infrastructure, or was lost in flight (issue 32).

    Attributes:
        task_id: The ``Task.task_id``.
        attempts: Episodes of this task that failed for the infrastructure so far (a loss in flight
            does not count: it says nothing about the task).
        cause: Why it came back: an infrastructure cause (``tool_killed``...), or ``lost_in_flight``
            (its generator died, or restarted, with the episode running).
    """

    task_id: str
    attempts: int = 0
    cause: str = "lost_in_flight"

    def encode(self) -> str:
        """The JSON string stored in Redis (and moved as it is by the admission scripts)."""
        return json.dumps({"task_id": self.task_id, "attempts": self.attempts, "cause": self.cause})

    @classmethod
    def decode(cls, raw: bytes | str) -> ReissuedTask:
        """The inverse of ``encode``; a record assigned to a ticket and lost reads as ``lost_in_flight``.

        Raises:
            ValueError: not such a JSON object (the message quotes it).
        """
        try:
            data = json.loads(raw)
            return cls(str(data["task_id"]), int(data.get("attempts", 0)), str(data.get("cause", "lost_in_flight")))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"re-issued task record: not a task record: {raw!r:.200}") from exc


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
        completed_total: Tickets consumed (rollouts put on the stream), over the run.
        infra_total: Episodes that failed for the infrastructure (``release_infra``); their
            slots came back and their rollouts were never sent.
        infra_by_cause: ``infra_total`` split by cause (``tool_killed``, ``grader_killed``...).
        reissued_total: Tasks queued to be run again (infrastructure failures and losses in flight).
        abandoned_total: Tasks given up after ``generator.infra_retries`` re-issues (reported).
        lost_total: Episodes lost in flight: their generator died or restarted while they ran
            (their leases were returned at once, their tasks re-issued).
        retaken_total: Rollouts refunded when dropped and trained after all (a learner resumed
            from an older checkpoint): their places were taken back (``settle``).
        engine_behind_total: Grants refused because the asking generator's engine served weights
            more than tau versions behind the learner (``acquire(served_version=)``).
        client_retry_total: Infrastructure failures of external agents' episodes (the rollout
            gateway's ``infra_error`` closes): counted by cause in ``infra_total``, neither re-issued
            nor given up, since their client owns the retry (``release_infra(client_retries=True)``).

    The infrastructure counters are an ``posttrain.rollout.infra.InfraCounts`` (``infra_metrics``).
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
    completed_total: int = 0
    infra_total: int = 0
    infra_by_cause: dict[str, int] = field(default_factory=dict)
    reissued_total: int = 0
    abandoned_total: int = 0
    lost_total: int = 0
    retaken_total: int = 0
    engine_behind_total: int = 0
    client_retry_total: int = 0

    @property
    def started(self) -> int:
        """``consumed + in_flight``: what ``capacity`` bounds."""
        return self.consumed + self.in_flight

    @property
    def infra_share(self) -> float:
        """Share of finished episodes that failed for the infrastructure: ``infra / (infra + completed)`` (0 when none)."""
        return infra_share(self.infra_total, self.completed_total)

    def as_metrics(self) -> dict[str, float]:
        """Flat floats for MLflow: ``admission/<field>``, each cause as ``admission/infra_<cause>``."""
        fields = {k: float(v) for k, v in self.__dict__.items() if k != "infra_by_cause"}
        fields["started"] = float(self.started)
        fields.update({f"infra_{cause}": float(n) for cause, n in sorted(self.infra_by_cause.items())})
        return {f"admission/{k}": v for k, v in fields.items()}


@runtime_checkable
class AdmissionController(Protocol):
    """Admission tickets shared by all generators of a run."""

    def acquire(self, timeout_s: float, served_version: int | None = None) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds for a ticket; None if capacity stayed full.

        ``served_version``: the policy version the asking generator's engine serves now. While the
        learner is more than tau versions ahead of it no ticket is granted (counted in
        ``engine_behind_total``): the episode's first turn would be sampled with weights already
        too stale to train. At tau = 0 a generator woken by a new version used to start episodes
        on the previous weights before its reload, and the learner dropped them (issue 32).
        """
        ...

    def consume(self, ticket: Ticket) -> None:
        """The ticket's rollout is on the stream: it now counts as consumed."""
        ...

    def release(self, ticket: Ticket) -> None:
        """The episode failed and produced no rollout: give the slot back."""
        ...

    def release_infra(self, ticket: Ticket, cause: str, reissue: ReissuedTask | None, *,
                      client_retries: bool = False) -> None:
        """The episode failed for the infrastructure: give the slot back, count it by ``cause``, re-issue its task.

        ``reissue``: the task to queue again (``take_reissued``), or None when it is given up
        (counted in ``abandoned_total``). ``client_retries``: an external agent's episode (the
        rollout gateway), whose retry is its client's: with ``reissue`` None it is counted in
        ``client_retry_total`` instead of ``abandoned_total``. Raises ValueError for an unknown or
        closed ticket, or for ``client_retries`` with a ``reissue``.
        """
        ...

    def assign(self, ticket: Ticket, task: ReissuedTask) -> None:
        """Record the task ``ticket``'s episode runs, so a loss in flight can re-issue it (Redis: with the lease)."""
        ...

    def take_reissued(self) -> ReissuedTask | None:
        """The oldest task queued to run again, removed from the queue; None when there is none."""
        ...

    def refund(self, count: int, entry_ids: Sequence[str] | None = None) -> int:
        """The learner dropped ``count`` consumed rollouts (stale, dead-lettered): give their slots back.

        At most ``consumed`` slots come back; the rest (entries that came without a ticket) is
        counted in ``unticketed_total``. With ``entry_ids`` (one per rollout) a refund is made once
        per entry: an entry dropped again after a learner restart gives nothing back twice
        (``settle`` forgets it once acknowledged). Returns the slots given back. Raises ValueError
        for ``count < 0`` or ``entry_ids`` of another length.
        """
        ...

    def settle(self, trained: Sequence[str] = (), acked: Sequence[str] = ()) -> int:
        """Close the refund record of stream entries (see ``refund``'s ``entry_ids``).

        ``trained``: entries about to be trained; one refunded when dropped (by a learner that then
        died before its checkpoint) takes its place back (``retaken_total``). ``acked``: entries
        acknowledged, never delivered again: their record is forgotten. Returns the places taken back.
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


def check_release_infra_args(reissue: ReissuedTask | None, client_retries: bool) -> None:
    """Validate ``release_infra``'s arguments.

    Raises:
        ValueError: ``client_retries`` with a ``reissue``: the run re-issues the task, or its client does.
    """
    if client_retries and reissue is not None:
        raise ValueError(f"release_infra: client_retries=True with a task to re-issue ({reissue.task_id}): "
                         "a failed episode is retried by the run or by its client, not both")


def engine_behind(learner_version: int, served_version: int | None, max_staleness: int) -> bool:
    """Whether an engine serving ``served_version`` is more than tau versions behind the learner (None: unknown, no)."""
    return served_version is not None and learner_version - served_version > max_staleness


def check_refund_args(count: int, entry_ids: Sequence[str] | None) -> None:
    """Validate ``refund``'s arguments.

    Raises:
        ValueError: ``count < 0``, or ``entry_ids`` given with a length other than ``count``.
    """
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    if entry_ids is not None and len(entry_ids) != count:
        raise ValueError(f"entry_ids: expected one per refunded rollout ({count}), got {len(entry_ids)}")


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
