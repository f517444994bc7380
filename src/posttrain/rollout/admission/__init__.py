"""Staleness control: admission tickets for generators (AReaL-style capacity) and staleness stats.

SAO (arXiv 2607.07508) drops rollouts whose oldest generating policy version lags the learner
by more than tau (``max_staleness``); dropping biases training towards short tasks, so the
generators are first kept from starting work that would be too stale (admission control, as in
AReaL's staleness manager, arXiv 2505.24298). With ``B = batch_size`` and learner version ``v``,
a generator may start a rollout only while

    started < capacity(v) = (v + tau + 1) * B,   started = consumed + in_flight,

where ``consumed`` counts rollouts put on the stream (minus ``refund``s of rollouts the learner
dropped) and ``in_flight`` the tickets granted and not yet consumed or released. The learner
consumes B rollouts per version, so a rollout admitted at version v is trained by version
v + tau at the latest (if consumed in order, and if its engine was at v when it started).

Lifecycle: ``ticket = ctl.acquire(timeout_s, served_version)`` (None on timeout, or while the
generator's engine lags the learner by more than tau) -> ``ctl.assign(ticket, task)`` -> run the
episode -> ``queue.put(rollout); ctl.consume(ticket)``, or ``ctl.release(ticket)`` if the episode
failed, or ``ctl.release_infra(ticket, cause, reissue)`` if it failed for the infrastructure (the
task queued to run again: ``ctl.take_reissued()``; issue 32). A generator that dies mid-episode
loses its tickets' episodes in flight: the learner (heartbeat lapsed) or the generator's next life
(same id, at start) returns them, counts them in ``lost_total`` and re-issues their tasks.
The learner calls ``ctl.refund(n)`` for rollouts it dropped (stale or dead-lettered) and for
every rollout of a batch that made no policy version (an SAO critic-only warm-up batch, a GRPO
batch whose groups all had equal rewards) so their slots come back: capacity is counted in
versions, and a batch consumed without one would otherwise shrink it for the rest of the run. A
batch that made a version refunds nothing, not even rows that trained nothing (uniform GRPO
groups): the version already adds B slots, and refunding those rows too would let admitted,
unread rollouts grow past ``(tau + 1) * B``. Each ticket is a lease
(``lease_s``): a generator that dies holding tickets does not shrink capacity forever; its
tickets expire.

Guarantees: in Redis, check-and-grant is one Lua script, so concurrent generators never exceed
capacity. Not guaranteed: a ticket whose lease expired before ``consume`` lets one extra
rollout start (counted in ``late_total``); per-rollout staleness still needs ``is_stale`` at
the learner because a generator engine may lag the version key.

Modules (the names below are importable from this package, where generators and the learner
import them):

* ``tickets``: ``capacity``, ``Ticket``, ``AdmissionState`` and the ``AdmissionController`` Protocol.
* ``memory_controller``: ``MemoryAdmissionController`` (one process, thread-safe).
* ``redis_controller``: ``RedisAdmissionController`` (Lua scripts, shared by generator processes).
* ``async_gate``: ``AsyncTicketGate``, which waits for tickets on an event loop without a thread.
* ``staleness``: ``is_stale``, ``StalenessStats`` and ``batch_staleness_metrics``.

Example: see ``tests/unit/rollout/test_rollout_admission_memory.py`` and
``tests/unit/rollout/test_admission_async_gate.py``.
"""

from posttrain.rollout.admission.async_gate import AsyncTicketGate
from posttrain.rollout.admission.memory_controller import MemoryAdmissionController
from posttrain.rollout.admission.redis_controller import RedisAdmissionController
from posttrain.rollout.admission.staleness import StalenessStats, batch_staleness_metrics, is_stale
from posttrain.rollout.admission.tickets import (
    AdmissionController,
    AdmissionState,
    ReissuedTask,
    Ticket,
    capacity,
)
from posttrain.rollout.infra import infra_metrics

__all__ = [
    "AdmissionController",
    "AdmissionState",
    "AsyncTicketGate",
    "MemoryAdmissionController",
    "RedisAdmissionController",
    "ReissuedTask",
    "StalenessStats",
    "Ticket",
    "batch_staleness_metrics",
    "capacity",
    "infra_metrics",
    "is_stale",
]
