"""Behaviour of the in-memory rollout queue that is its own: exact ``maxlen`` trimming and id parsing.

Every guarantee of the ``RolloutQueue`` protocol (delivery, ack, restart, claim, dead letters,
no pickle, counters) is checked on this backend and on Redis by the contract suite,
``tests/contracts/test_rollout_queue_contract.py``.

Run: .venv/bin/python -m pytest -q tests/unit/rollout/test_rollout_memory_queue.py
"""

from __future__ import annotations

import pytest

from posttrain.records import Rollout
from posttrain.rollout.memory_queue import MemoryRolloutQueue, MemoryStream


def make_rollout(i: int, num_tokens: int = 4, policy_version: int = 0) -> Rollout:
    return Rollout(
        rollout_id=f"r{i}",
        task_id=f"t{i}",
        env_name="synthetic_arith",
        token_ids=list(range(num_tokens)),
        behaviour_logprobs=[0.0] + [-0.5] * (num_tokens - 1),
        action_mask=[False] + [True] * (num_tokens - 1),
        reward=1.0,
        policy_version=policy_version,
    )


def test_pending_entry_trimmed_before_ack_is_dead_lettered_on_restart():
    """maxlen 2: 1 delivered and unacked, then 2 more puts trim it; the restarted learner dead-letters it."""
    stream = MemoryStream(maxlen=2)
    q = MemoryRolloutQueue(stream)
    lost = q.put(make_rollout(0))
    q.get_batch(1, timeout_s=0.0)
    q.put(make_rollout(1))
    q.put(make_rollout(2))
    restarted = MemoryRolloutQueue(stream)
    got = restarted.get_batch(10, timeout_s=0.0)
    assert [e.rollout.rollout_id for e in got] == ["r1", "r2"]
    [dead] = restarted.dead_letters()
    assert dead.original_id == lost and "trimmed" in dead.reason


def test_maxlen_trims_the_oldest_entries():
    q = MemoryRolloutQueue(maxlen=5)
    for i in range(8):
        q.put(make_rollout(i))
    assert q.length() == 5
    assert [e.rollout.rollout_id for e in q.get_batch(10, timeout_s=0.0)] == ["r3", "r4", "r5", "r6", "r7"]


def test_bad_ids_and_maxlen_are_rejected_with_the_argument_name():
    """The memory queue parses ids itself (Redis answers a malformed id with a server error)."""
    q = MemoryRolloutQueue()
    with pytest.raises(ValueError, match="entry_id"):
        q.ack(["nonsense"])
    with pytest.raises(ValueError, match="maxlen"):
        MemoryStream(maxlen=0)
