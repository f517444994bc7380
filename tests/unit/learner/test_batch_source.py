"""``learner.batch_source``: SAO's rollout buffer and its staleness checks, on the in-memory stream.

Run: ``python -m pytest -q tests/unit/learner/test_batch_source.py``.
"""

from __future__ import annotations

import pytest

from posttrain.learner.batch_source import DropRecorder, SingleRolloutSource, trainable
from posttrain.records import Rollout
from posttrain.rollout.admission import MemoryAdmissionController, StalenessStats
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryRolloutQueue, MemoryStream


def _rollout(k: int, policy_version: int) -> Rollout:
    mask = [False, False, True, True]
    return Rollout(rollout_id=f"r{k}", task_id=f"t{k}", env_name="scripted", token_ids=[5, 6, 7, 8],
                   behaviour_logprobs=[0.0, 0.0, -0.5, -0.5], action_mask=mask, reward=float(k % 2),
                   policy_version=policy_version, turn_policy_versions=[policy_version])


@pytest.mark.parametrize(("rule", "reason"), [("token", "no fresh token"), ("episode", "stale")])
def test_rollouts_left_in_the_buffer_are_checked_for_staleness_again_when_their_batch_is_released(rule, reason):
    """A dead learner read 12 rollouts (4 of version 0, 4 of version 0, 4 of version 1) and never
    acknowledged them. Its successor reclaims all 12 in one read, more than a batch (B = 4), and
    trains the first 4 at version 0. At version 2 (tau = 1) the next 4 in the buffer lag by 2 > tau:
    they are dropped as stale (refunded, kept for the ledger; acknowledged later, with the
    checkpoint that covers their ledger line) and the 4 of version 1 (lag 1) make the batch.
    Checked only on arrival, the version-0 rollouts were trained at lag 2. One turn each, so both
    staleness rules drop the same rollouts (with their own reason)."""
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
    drops = DropRecorder(admission, staleness)
    source = SingleRolloutSource(queue, drops, batch_rollouts=4, max_staleness=1, claim_idle_ms=0, block_s=0,
                                 staleness_rule=rule)

    first = source.next_batch(0)
    assert first is not None and [e.rollout.rollout_id for e in first] == ["r0", "r1", "r2", "r3"]
    second = source.next_batch(2)

    assert second is not None and [e.rollout.rollout_id for e in second] == ["r8", "r9", "r10", "r11"]
    assert (drops.total, drops.seen, staleness.dropped) == (0, 4, 4)  # total counts them once in a ledger line
    dropped = drops.take_for_ledger()
    assert [(e.rollout.rollout_id, reason) for e, reason in dropped] == [
        ("r4", reason), ("r5", reason), ("r6", reason), ("r7", reason)]
    assert drops.total == 4
    assert admission.state().consumed == 8  # 12 put, 4 refunded
    assert len(queue.pending()) == 12  # nothing acknowledged yet: the drops wait for their ledger line's checkpoint
    assert admission.refund(4, [e.entry_id for e, _ in dropped]) == 0  # delivered again later: refunded once only
    assert admission.state().consumed == 8


def _two_turns(versions: list[int]) -> Rollout:
    return Rollout(rollout_id="long", task_id="t", env_name="scripted", token_ids=[5, 6, 7, 8, 9],
                   behaviour_logprobs=[0.0, -0.5, 0.0, -0.5, -0.5], action_mask=[False, True, False, True, True],
                   reward=1.0, policy_version=min(versions), turn_policy_versions=versions, num_turns=2)


def test_the_token_rule_keeps_a_rollout_whose_newest_turn_is_fresh_and_the_episode_rule_drops_it():
    """Turns sampled at versions 1 and 6; learner at 6, tau = 2: the first turn lags 5 > 2, the second 0.
    The token rule keeps the rollout (its second turn trains); the episode rule drops it by its oldest turn.
    At learner version 9 the newest turn lags 3 > 2 too: no token is fresh, both rules drop it."""
    r = _two_turns([1, 6])
    assert trainable(r, 6, 2, "token") and not trainable(r, 6, 2, "episode")
    assert not trainable(r, 9, 2, "token") and not trainable(r, 9, 2, "episode")
    assert trainable(r, 8, 2, "token")
    with pytest.raises(ValueError, match="staleness_rule: expected 'token' or 'episode', got 'turn'"):
        trainable(r, 6, 2, "turn")
