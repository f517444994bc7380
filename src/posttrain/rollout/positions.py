"""Generator positions kept beyond Redis: the learner's checkpoint records them, a resumed learner writes them back.

Each generator reserves its episode counters in blocks from the run's Redis (``HINCRBY`` on
``StreamKeys.generator_positions``, field = generator index; ``posttrain.generator.seeds``), so a
restarted generator never replays the (task, sampling seed) pairs of its earlier lives. When Redis
loses its data (a JobSet group restart recreates it on an empty emptyDir) the hash is gone, and the
generators numbered their episodes from 0 again: every pair the model had trained on came back.

So (issue 23, item 18):

* the learner reads the hash at every checkpoint (``read_positions``) and saves it in the
  checkpoint's state (``LearnerState.generator_positions``);
* a resumed learner writes the checkpoint's positions back (``restore_positions``: each field
  raised to at least the saved value, never lowered) before it sets the policy-version key;
* a generator reserves its first block only once that key exists (``learner_started``), so it can
  never reserve from an emptied hash while a checkpoint with positions exists.

What is guaranteed: no (task, seed) pair of a rollout trained into the checkpoint is sampled again.
Every such rollout came from an episode whose counter was reserved (``HINCRBY``) before the episode
ran, hence before the learner consumed it and before the read at checkpoint time. What is not:
counters reserved *after* the checkpoint are numbered again from the checkpoint's position. Their
rollouts were lost with the stream or trained by optimizer steps the resume discarded, so the
resumed model holds none of them, and sampling such a pair again trains it once in the run's
surviving history. Skipping ahead by a guessed margin would buy nothing a test could check.

Example: ``read_positions(client, keys) == {"0": 128, "1": 64}``;
``restore_positions(client, keys, {"0": 128, "1": 64})`` on an empty server returns both fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.queue import QueueError

# KEYS[1] positions hash; ARGV = field, value, field, value... Raises each field to at least its
# value (HSET only where the hash holds less or nothing); returns the fields it raised.
_RESTORE_LUA = """
local raised = {}
for i = 1, #ARGV, 2 do
  local have = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if have == nil then return redis.error_reply('field ' .. ARGV[i] .. ' is not an integer') end
  if have < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    table.insert(raised, ARGV[i])
  end
end
return raised
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_positions(client: Any, keys: StreamKeys) -> dict[str, int]:
    """The run's generator positions: generator index (decimal string) -> episode counters reserved so far.

    Empty when no generator has reserved yet, or when Redis lost its data.

    Raises:
        QueueError: a field or value is not a non-negative integer (the message names key and field).
        redis.ConnectionError: the server stayed unreachable (after the client's own retries).
    """
    out: dict[str, int] = {}
    for raw_field, raw_value in client.hgetall(keys.generator_positions).items():
        name, value = _text(raw_field), _text(raw_value)
        if not (name.isdigit() and value.isdigit()):
            raise QueueError(f"{keys.generator_positions}: field {name!r} holds {value!r}; generator positions are "
                             f"non-negative integers keyed by generator index")
        out[name] = int(value)
    return out


def check_positions(positions: Mapping[str, int], where: str) -> None:
    """Refuse positions that are not ``{decimal index: non-negative int}``.

    Raises:
        ValueError: one line naming ``where``, the field and its value.
    """
    for name, value in positions.items():
        if not (isinstance(name, str) and name.isdigit() and isinstance(value, int) and value >= 0):
            raise ValueError(f"{where}: generator position {name!r}: {value!r}; expected a non-negative integer "
                             f"keyed by generator index")


def restore_positions(client: Any, keys: StreamKeys, positions: Mapping[str, int]) -> list[str]:
    """Raise each generator's position in Redis to at least ``positions[index]`` (one script); never lower one.

    On a Redis that kept its data every saved position is at most the live one and nothing changes;
    on a fresh Redis every field comes back.

    Args:
        client: A redis-py client.
        keys: Key names of the run.
        positions: Generator index (decimal string) -> episode counters reserved (from a checkpoint).

    Returns:
        The indexes whose position was raised, sorted.

    Raises:
        ValueError: ``positions`` is malformed (``check_positions``).
        QueueError: the hash holds a non-integer where a position is restored.
        redis.ConnectionError: the server stayed unreachable.
    """
    check_positions(positions, "restore_positions")
    if not positions:
        return []
    args: list[str | int] = []
    for name, value in sorted(positions.items()):
        args += [name, value]
    try:
        raised = client.eval(_RESTORE_LUA, 1, keys.generator_positions, *args)
    except redis.ResponseError as exc:
        raise QueueError(f"{keys.generator_positions}: {exc}") from exc
    return sorted(_text(r) for r in raised)


def learner_started(client: Any, keys: StreamKeys) -> bool:
    """True once the run's policy-version key exists: the learner has set it, after restoring positions.

    Raises:
        redis.ConnectionError: the server stayed unreachable.
    """
    return bool(client.exists(keys.policy_version))
