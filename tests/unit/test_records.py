import math

import msgspec
import numpy as np
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
        ({"outcome": "infra_error"}, "infra_cause: an infra_error needs a cause"),
        ({"outcome": "infra_error", "infra_cause": "Tool Killed"}, "infra_cause: an infra_error needs a cause"),
        ({"infra_cause": "tool_killed"}, "infra_cause: 'tool_killed' given for a completed episode"),
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


def test_rollouts_holding_numpy_arrays_encode_to_the_same_bytes_as_lists():
    """The generator may hand over int32/float32/bool arrays: same 5-token payload as the lists."""
    r = _rollout()
    arr = _rollout(
        token_ids=np.array(r.token_ids, dtype=np.int32),
        behaviour_logprobs=np.array(r.behaviour_logprobs, dtype=np.float32),
        action_mask=np.array(r.action_mask, dtype=bool),
    )
    assert encode_rollout(arr) == encode_rollout(r)
    assert arr.num_action_tokens == 3


def test_decode_with_arrays_returns_read_only_views_equal_to_the_lists():
    """ids [5..9] int32, logprobs float32 (exact), mask bool with 3 True; writing to them fails."""
    payload = encode_rollout(_rollout())
    lists = decode_rollout(payload)
    back = decode_rollout(payload, arrays=True)
    assert back.token_ids.dtype == np.int32 and back.token_ids.tolist() == lists.token_ids
    assert back.behaviour_logprobs.dtype == np.float32 and back.behaviour_logprobs.tolist() == lists.behaviour_logprobs
    assert back.action_mask.dtype == np.bool_ and back.action_mask.tolist() == lists.action_mask
    assert back.num_action_tokens == 3 and isinstance(back.num_action_tokens, int)
    assert back.reward == lists.reward and back.turn_policy_versions == [3, 4]
    with pytest.raises(ValueError, match="read-only"):
        back.token_ids[0] = 1


@pytest.mark.parametrize("arrays", [False, True])
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"behaviour_logprobs": [0.0, -0.5, 0.0, math.nan, -0.1]}, r"behaviour_logprobs\[3\]: not finite"),
        ({"behaviour_logprobs": [0.0, 0.5, 0.0, -1.0, -0.1]}, r"behaviour_logprobs\[1\]: a log-probability must be <= 0"),
        ({"action_mask": [False] * 5}, "action_mask: no action token"),
        ({"token_ids": [5, 6, -1, 8, 9]}, r"token_ids\[2\]: negative token id -1"),
    ],
)
def test_decode_with_arrays_validates_like_the_list_path(changes, message, arrays):
    with pytest.raises(RecordError, match=message):
        decode_rollout(pack_rollout_unvalidated(_rollout(**changes)), arrays=arrays)


def test_mask_bytes_other_than_0_and_1_are_refused():
    """Mask byte 2 at index 1 of the payload -> "action_mask[1]" (lists in: the same check on encode)."""
    raw = msgspec.msgpack.decode(encode_rollout(_rollout()))
    raw["action_mask"] = b"\x00\x02\x00\x01\x01"
    with pytest.raises(RecordError, match=r"action_mask\[1\]: must be 0/1"):
        decode_rollout(msgspec.msgpack.encode(raw))
    with pytest.raises(RecordError, match=r"action_mask\[1\]: must be 0/1"):
        encode_rollout(_rollout(action_mask=[0, 2, 0, 1, 1]))


def test_a_logprob_that_overflows_float32_is_refused_on_encode():
    """-1e39 is finite as float64 but -inf as float32 (the wire type), so encode refuses index 3."""
    with pytest.raises(RecordError, match=r"behaviour_logprobs\[3\]: not finite"):
        encode_rollout(_rollout(behaviour_logprobs=[0.0, -0.5, 0.0, -1e39, -0.125]))


def test_two_dimensional_arrays_are_refused_naming_the_field():
    with pytest.raises(RecordError, match="token_ids: expected a 1-D integer array"):
        encode_rollout(_rollout(token_ids=np.array([[5, 6, 7, 8, 9]])))
    with pytest.raises(RecordError, match="behaviour_logprobs: expected a 1-D array"):
        encode_rollout(_rollout(behaviour_logprobs=np.zeros((5, 1))))


def test_other_schema_version_with_valid_layout_is_named():
    """A v4 entry with the v3 layout is refused by version, not decoded."""
    raw = msgspec.msgpack.decode(encode_rollout(_rollout()))
    raw["schema_version"] = 4
    with pytest.raises(RecordError, match="schema_version: got 4, this build reads 2 and 3"):
        decode_rollout(msgspec.msgpack.encode(raw), arrays=True)


def test_a_version_2_entry_still_decodes_as_a_completed_episode_of_the_current_version():
    """An entry written before ``outcome`` existed (v2: no ``outcome``/``infra_cause`` keys) stays
    decodable, so a stream left by an older generator is not dead-lettered on upgrade; it reads
    as ``completed``. A v2 entry that claims an outcome is refused (v2 had none)."""
    raw = msgspec.msgpack.decode(encode_rollout(_rollout()))
    del raw["outcome"], raw["infra_cause"]
    raw["schema_version"] = 2
    back = decode_rollout(msgspec.msgpack.encode(raw))
    assert back == _rollout() and back.schema_version == ROLLOUT_SCHEMA_VERSION == 3
    assert back.outcome == "completed" and encode_rollout(back)  # re-encodes as v3
    raw["outcome"], raw["infra_cause"] = "infra_error", "tool_killed"
    with pytest.raises(RecordError, match="outcome: schema_version 2 has no outcome field"):
        decode_rollout(msgspec.msgpack.encode(raw))


def test_an_infra_error_outcome_and_its_cause_survive_the_wire():
    r = _rollout(outcome="infra_error", infra_cause="grader_killed", reward=0.0)
    back = decode_rollout(encode_rollout(r), arrays=True)
    assert (back.outcome, back.infra_cause) == ("infra_error", "grader_killed")


def test_to_arrays_converts_once_to_the_wire_dtypes_and_validates():
    """``to_arrays`` (what generators end an episode with) gives int32 / float32 / bool arrays that
    encode to the list rollout's bytes, and refuses what ``validate`` and ``encode`` refuse."""
    r = _rollout()
    arr = r.to_arrays()
    assert isinstance(r.token_ids, list)  # the original is unchanged
    assert (arr.token_ids.dtype, arr.behaviour_logprobs.dtype, arr.action_mask.dtype) == (
        np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.bool_))
    assert arr.token_ids.tolist() == r.token_ids and arr.action_mask.tolist() == r.action_mask
    assert encode_rollout(arr) == encode_rollout(r)
    with pytest.raises(RecordError, match=r"behaviour_logprobs\[3\]: not finite"):
        _rollout(behaviour_logprobs=[0.0, -0.5, 0.0, math.nan, -0.1]).to_arrays()
    with pytest.raises(RecordError, match="does not fit int32"):
        _rollout(token_ids=[5, 6, 2**31, 8, 9]).to_arrays()


def test_each_action_token_carries_the_version_of_the_turn_that_sampled_it():
    """Mask F T F T T: turn 0 is token 1 (version 3), turn 1 is tokens 3-4 (version 4); the prompt
    and the observation get the rollout's oldest version, 3."""
    r = _rollout()
    assert r.token_policy_versions().tolist() == [3, 3, 3, 4, 4]
    arrays = decode_rollout(encode_rollout(r), arrays=True)
    assert arrays.token_policy_versions().tolist() == [3, 3, 3, 4, 4]


def test_a_rollout_without_turn_versions_gives_every_token_its_policy_version():
    r = _rollout(turn_policy_versions=[], num_turns=1, policy_version=6)
    assert r.token_policy_versions().tolist() == [6] * 5


def test_turn_versions_that_do_not_match_the_action_runs_are_refused_naming_the_field():
    r = _rollout(turn_policy_versions=[3, 4, 5], num_turns=3)
    with pytest.raises(RecordError, match="turn_policy_versions: 3 entries, but action_mask has 2 runs"):
        r.validate()
    with pytest.raises(RecordError, match="turn_policy_versions"):
        encode_rollout(r)
    with pytest.raises(RecordError, match="turn_policy_versions"):
        decode_rollout(pack_rollout_unvalidated(r))
