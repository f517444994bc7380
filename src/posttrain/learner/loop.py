"""The asynchronous learner (SAO, GKD, and GRPO with ``grpo.async``): train on rollouts as they arrive.

Run one with ``posttrain learner CONFIG`` (``REDIS_URL`` must point at the run's Redis); it
resumes from the newest checkpoint in ``<run>/checkpoints`` if there is one. Each iteration:

1. **take a batch** (``batch_source``): SAO buffers single rollouts, async GRPO complete groups;
   a rollout older than ``max_staleness`` policy versions is dropped, counted, acknowledged and
   its admission place given back;
2. **train** (``steps``): SAO's critic, skip-observation GAE and DIS update (after the critic-only
   warm-up), GRPO's group-relative step with the DIS mask, or GKD's distillation step (the teacher
   scores the rollouts and the iteration's fixed sequences);
3. **refund** the admission places of a batch that made no policy version (all of its rows);
4. **record** the iteration in ``<run>/learner_ledger.jsonl`` (``posttrain.learner.ledger``);
5. after a policy update, **publish** the next version (weight store, version key, announcement);
6. **log** the metrics (``posttrain.learner.metrics``);
7. every ``checkpoint_every`` versions and at the end, **checkpoint, then acknowledge** the
   entries the checkpoint covers (``checkpointer``);
8. **stop** after ``max_nonfinite_iterations`` iterations in a row that skipped an optimizer step
   for a non-finite gradient norm (a skipped policy step makes no version; its batch is refunded);
   after ``learner.max_iterations_without_progress`` iterations in a row that trained no token (every
   group uniform, every rollout dropped as stale, every token masked: ``learner.progress``), on
   SIGTERM or SIGINT (Ctrl-C), or with no live generator for ``learner.no_generator_timeout_s`` while waiting
   (``learner.liveness``: dead generators' tickets are returned meanwhile), checkpoint, then stop.

The loop takes its transport as an argument (``setup.LearnerTransport``), so a test runs it on
the in-memory queue, admission and a temporary weight store.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from posttrain.account import StateClock
from posttrain.config import RunConfig
from posttrain.learner.liveness import INTERRUPTED
from posttrain.learner.setup import Learner, LearnerTransport, build_learner
from posttrain.learner.types import LearnerSummary
from posttrain.parallel.world import World
from posttrain.tracking import MetricsSink


def run_learner(
    config: RunConfig,
    transport: LearnerTransport | None,
    *,
    start_model_dir: Path,
    sink: MetricsSink | None = None,
    progress: bool = True,
    max_iterations: int | None = None,
    world: World | None = None,
    clock: StateClock | None = None,
) -> LearnerSummary:
    """Train until the run's last policy version is published (module docstring).

    Args:
        config: Run config (``technique: sao`` or ``gkd``, or ``grpo`` with ``grpo.async: true``).
        transport: Queue, admission, version key, weight store, announcements, telemetry
            (``setup.redis_transport`` for a real run); rank 0's only, None on other ranks.
        start_model_dir: Policy to start from when there is no checkpoint (the SFT warm start).
        sink: Receives ``(metrics, policy_version)`` after each iteration (MLflow, JSONL).
        progress: Show a progress bar.
        max_iterations: Stop after this many iterations in this process (a learner that dies
            mid-run, in tests); None runs to completion.
        world: The learner's ranks (``posttrain.parallel.world.init_world``; one process when
            None). Under ``torchrun`` every rank runs this loop: rank 0 reads the stream and
            broadcasts each batch, every rank trains its share of the rows, rank 0 publishes,
            logs and acknowledges; checkpoints are written by all.
        clock: The learner process's time account (``posttrain.account.LEARNER_STATES``): taking a
            batch is ``waiting_for_batch``; training, refunding, recording ``training``; publishing a
            version ``publishing``; checkpoints ``checkpointing``; logging and the rest ``other``.
            Each checkpoint saves the clock's account (``LearnerState.account``); a learner resumed
            from one adds it to ``clock`` first (``StateClock.carry``), so a restarted learner's
            lives are summed (the seconds after the last checkpoint of a life that crashed are not
            counted: nothing recorded them). None: not kept.

    Returns:
        ``LearnerSummary``: final version, iterations, final model directory, counters.

    Raises:
        posttrain.rollout.queue.QueueConnectionError: Redis unreachable after bounded retries.
        posttrain.learner.optim.NonFiniteGradientError: ``max_nonfinite_iterations`` iterations
            in a row skipped an optimizer step for a non-finite gradient norm.
        posttrain.learner.liveness.LearnerStopped: SIGTERM, SIGINT (Ctrl-C), no progress for
            ``learner.max_iterations_without_progress`` iterations, or no live generator for
            ``learner.no_generator_timeout_s``; raised after the final checkpoint (one line).
    """
    learner = build_learner(config, transport, start_model_dir=start_model_dir, world=world)
    bar = tqdm(total=learner.settings.steps, initial=learner.state.policy_version, desc=learner.settings.technique,
               disable=not progress or not learner.world.is_main, leave=False)
    if clock is not None:
        if learner.state.account:  # resumed: the earlier lives' account, as of their last checkpoint
            clock.carry(learner.state.account)
        learner.checkpointer.account = clock.record
    previous = _stop_on_signals(learner)
    switch = clock.switch if clock is not None else _no_switch
    stop, waiting = None, False
    while not learner.finished(max_iterations):
        if (stop := learner.stop_reason(waiting)) is not None:
            break
        switch("waiting_for_batch")
        entries = learner.source.next_batch(learner.state.policy_version)
        waiting = entries is None
        if entries is None:
            learner.observe_drops()
            continue
        switch("training")
        result = learner.train(entries)
        learner.refund_untrained(entries, result)
        learner.record(entries, result)
        learner.observe_progress(entries, result)
        if result.policy_updated:
            switch("publishing")
            learner.publish_next_version()
            bar.update(1)
        switch("other")
        if sink is not None and learner.world.is_main:
            sink(learner.metrics(entries, result), learner.state.policy_version)
        switch("checkpointing")
        learner.checkpointer.maybe_save(result.policy_updated)
        switch("other")
        learner.stop_on_nonfinite(result)
    bar.close()
    switch("checkpointing")
    learner.checkpointer.flush()
    switch("other")
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if stop is not None:
        raise learner.stopped(stop)
    return learner.finish()


def _no_switch(state: str) -> str:
    """The state switch of a loop that keeps no time account."""
    return state


def _stop_on_signals(learner: Learner) -> dict[int, signal.Handlers | Callable[..., object] | int | None]:
    """Make SIGTERM and SIGINT ask the loop to stop at the next iteration boundary (then checkpoint, then exit).

    Kubernetes sends SIGTERM and waits ``terminationGracePeriodSeconds``; a terminal's Ctrl-C sends
    SIGINT to every process of the run. Either way the learner finishes the step in progress (or
    its ``block_s`` wait), writes a checkpoint covering what it trained, and ends with
    ``LearnerStopped`` (exit status 143 for SIGTERM, 130 for SIGINT). A second Ctrl-C while it does
    so raises ``KeyboardInterrupt`` at once (what is trained since the last checkpoint is trained
    again after a resume). Only in the main thread (signal handlers can be installed nowhere else).

    Returns:
        The previous handlers by signal, for the caller to put back; empty outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_sigterm(signum: int, frame: object) -> None:
        learner.stop_requested = "SIGTERM received; stopped after a final checkpoint"

    def on_sigint(signum: int, frame: object) -> None:
        if learner.stop_requested is not None and learner.stop_requested.startswith(INTERRUPTED):
            raise KeyboardInterrupt
        learner.stop_requested = f"{INTERRUPTED}; stopped after a final checkpoint"

    return {signal.SIGTERM: signal.signal(signal.SIGTERM, on_sigterm),
            signal.SIGINT: signal.signal(signal.SIGINT, on_sigint)}
