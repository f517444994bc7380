"""``learner.batch_source``: SAO's rollout buffer and its staleness checks, on the in-memory stream.

Run: ``python -m pytest -q tests/unit/learner/test_batch_source.py``.
"""

from __future__ import annotations

from posttrain.learner.batch_source import DropRecorder, SingleRolloutSource
from posttrain.records import Rollout
from posttrain.rollout.admission import MemoryAdmissionController, StalenessStats
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryRolloutQueue, MemoryStream


def _rollout(k: int, policy_version: int) -> Rollout:
    mask = [False, False, True, True]
    return Rollout(rollout_id=f"r{k}", task_id=f"t{k}", env_name="scripted", token_ids=[5, 6, 7, 8],
                   behaviour_logprobs=[0.0, 0.0, -0.5, -0.5], action_mask=mask, reward=float(k % 2),
                   policy_version=policy_version, turn_policy_versions=[policy_version])


def test_rollouts_left_in_the_buffer_are_checked_for_staleness_again_when_their_batch_is_released():
    """A dead learner read 12 rollouts (4 of version 0, 4 of version 0, 4 of version 1) and never
    acknowledged them. Its successor reclaims all 12 in one read, more than a batch (B = 4), and
    trains the first 4 at version 0. At version 2 (tau = 1) the next 4 in the buffer lag by 2 > tau:
    they are dropped as stale (acknowledged, refunded, kept for the ledger) and the 4 of version 1
    (lag 1) make the batch. Checked only on arrival, the version-0 rollouts were trained at lag 2."""
    stream = MemoryStream()
    generator = MemoryRolloutQueue(stream, consumer="generator")
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    for k, version in enumerate([0] * 8 + [1] * 4):
        ticket = admission.acquire(0)
        assert ticket is not None
        generator.put(_rollout(k, version))
        admission.consume(ticket)
    assert len(MemoryRolloutQueue(stream, consumer="learner-dead").get_batch(12, timeout_s=0)) == 12
    queue = MemoryRolloutQueue(stream, consumer="learner-0")
    staleness = StalenessStats(1)
    drops = DropRecorder(queue, admission, staleness)
    source = SingleRolloutSource(queue, drops, batch_rollouts=4, max_staleness=1, claim_idle_ms=0, block_s=0)

    first = source.next_batch(0)
    assert first is not None and [e.rollout.rollout_id for e in first] == ["r0", "r1", "r2", "r3"]
    second = source.next_batch(2)

    assert second is not None and [e.rollout.rollout_id for e in second] == ["r8", "r9", "r10", "r11"]
    assert drops.total == 4 and staleness.dropped == 4
    assert [(r.rollout_id, reason) for r, reason in drops.take_for_ledger()] == [
        ("r4", "stale"), ("r5", "stale"), ("r6", "stale"), ("r7", "stale")]
    assert admission.state().consumed == 8  # 12 put, 4 refunded
    assert sorted(queue.pending()) == sorted(e.entry_id for e in first + second)  # the drops are acknowledged
