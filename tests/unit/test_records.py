import math

import msgspec
import pytest

from posttrain.records import (
    ROLLOUT_SCHEMA_VERSION,
    RecordError,
    Rollout,
    decode_rollout,
    encode_rollout,
    pack_rollout_unvalidated,
)


def _rollout(**kw):
    base = dict(
        rollout_id="r1", task_id="t1", env_name="synthetic_tool",
        token_ids=[5, 6, 7, 8, 9], behaviour_logprobs=[0.0, -0.5, 0.0, -1.25, -0.125],
        action_mask=[False, True, False, True, True], reward=1.0, policy_version=3,
        turn_policy_versions=[3, 4], num_turns=2, metrics={"correct": 1.0},
    )
    base.update(kw)
    return Rollout(**base)


def test_round_trip_keeps_every_field_exactly():
    """Logprobs are chosen to be exact in float32, so the round trip is bit-exact."""
    r = _rollout()
    back = decode_rollout(encode_rollout(r))
    assert back == r
    assert back.num_action_tokens == 3


def test_arrays_travel_packed_not_as_msgpack_lists():
    """5 tokens: 20 bytes of int32 ids, 20 of float32 logprobs, 5 of mask bytes."""
    payload = encode_rollout(_rollout())
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw["token_ids"], bytes) and len(raw["token_ids"]) == 20
    assert len(raw["behaviour_logprobs"]) == 20 and len(raw["action_mask"]) == 5
    assert raw["schema_version"] == ROLLOUT_SCHEMA_VERSION


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"behaviour_logprobs": [0.0, -0.5, 0.0, math.nan, -0.1]}, r"behaviour_logprobs\[3\]: not finite"),
        ({"behaviour_logprobs": [0.0, 0.5, 0.0, -1.0, -0.1]}, r"behaviour_logprobs\[1\]: a log-probability must be <= 0"),
        ({"action_mask": [False] * 5}, "action_mask: no action token"),
        ({"action_mask": [True, False]}, "lengths differ"),
        ({"token_ids": []}, "token_ids: empty"),
        ({"reward": math.inf}, "reward: not finite"),
        ({"policy_version": 4}, "policy_version: 4 is not the oldest"),
    ],
)
def test_invalid_rollouts_are_refused_on_encode_and_on_decode(changes, message):
    bad = _rollout(**changes)
    with pytest.raises(RecordError, match=message):
        encode_rollout(bad)
    with pytest.raises(RecordError, match=message):
        decode_rollout(pack_rollout_unvalidated(bad))


def test_garbage_and_other_schema_versions_are_record_errors():
    with pytest.raises(RecordError, match="undecodable rollout"):
        decode_rollout(b"\xc1 not msgpack")
    old = msgspec.msgpack.encode({"schema_version": 1, "rollout_id": "x"})
    with pytest.raises(RecordError, match="schema_version: got 1"):
        decode_rollout(old)


def test_truncated_array_bytes_are_detected():
    raw = msgspec.msgpack.decode(encode_rollout(_rollout()))
    raw["token_ids"] = raw["token_ids"][:-2]
    with pytest.raises(RecordError, match="multiple of 4"):
        decode_rollout(msgspec.msgpack.encode(raw))
