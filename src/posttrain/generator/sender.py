"""Sending a generator's finished rollouts: XADD each one, then settle its admission ticket.

A rollout the stream took consumes its ticket; one it refused (an invalid record, a failed
XADD) releases it, so the capacity goes to another episode. Every ticket handed to
``RolloutSender`` ends consumed or released, even when the generator stops mid-send: the episode
slots call ``send_shielded``, whose send runs on its own task that a stop does not cancel, and
the generator awaits the sends still pending (``drain``) before it exits.

Used by ``generator.slots``; tested in ``tests/unit/generator/test_slots.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from posttrain.inference.metering import GeneratorStats
from posttrain.records import RecordError, Rollout
from posttrain.rollout.admission import AdmissionController, Ticket
from posttrain.rollout.queue import RolloutQueue

log = logging.getLogger("posttrain.generator")


class RolloutSender:
    """Puts rollouts on the stream and consumes or releases their tickets.

    Args:
        queue: The run's rollout stream; ``put`` runs on a worker thread.
        admission: The run's admission controller.
        stats: The generator's counters: ``rollouts``, ``action_tokens`` and ``total_tokens`` of
            sent rollouts, ``rejected`` (refused records), ``failed`` (failed sends).
        generator_id: Name of this generator, for log lines.
    """

    def __init__(self, queue: RolloutQueue, admission: AdmissionController, stats: GeneratorStats,
                 generator_id: str) -> None:
        self.queue = queue
        self.admission = admission
        self.stats = stats
        self.generator_id = generator_id
        self._pending: set[asyncio.Task[list[bool]]] = set()

    @property
    def pending(self) -> int:
        """Shielded sends not finished yet (count)."""
        return len(self._pending)

    async def send(self, pairs: Sequence[tuple[Ticket, Rollout]]) -> list[bool]:
        """XADD each rollout in order, then consume its ticket, or release it when the send failed.

        Args:
            pairs: Each rollout with the admission ticket it was run under.

        Returns:
            For each pair, whether its rollout reached the stream.
        """
        sent: list[bool] = []
        for ticket, rollout in pairs:
            sent.append(False)
            try:
                await asyncio.to_thread(self.queue.put, rollout)
            except RecordError as exc:
                self.stats.rejected += 1
                self.admission.release(ticket)
                log.warning("generator %s: rollout of %s rejected: %s", self.generator_id, rollout.task_id, exc)
                continue
            except (OSError, RuntimeError, ValueError) as exc:
                self.stats.failed += 1
                self.admission.release(ticket)
                log.error("generator %s: rollout of %s not sent: %s", self.generator_id, rollout.task_id, exc)
                continue
            self.admission.consume(ticket)
            sent[-1] = True
            self.stats.rollouts += 1
            self.stats.action_tokens += rollout.num_action_tokens
            self.stats.total_tokens += len(rollout.token_ids)
        return sent

    async def send_shielded(self, pairs: Sequence[tuple[Ticket, Rollout]]) -> list[bool]:
        """``send`` on its own task, which cancelling the caller does not interrupt.

        A ticket is never left neither consumed nor released: when the caller is cancelled (the
        generator is stopping), the send goes on and ``drain`` awaits it.

        Returns:
            For each pair, whether its rollout reached the stream.

        Raises:
            asyncio.CancelledError: the caller was cancelled (the send itself continues).
        """
        task = asyncio.create_task(self.send(pairs))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        """Wait for every shielded send still running; log (not raise) the errors they ended with."""
        for result in await asyncio.gather(*self._pending, return_exceptions=True):
            if isinstance(result, BaseException):
                log.error("generator %s: sending a rollout failed while stopping: %r", self.generator_id, result)
