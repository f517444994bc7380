"""Records that cross process boundaries: tasks, rollouts, preference pairs, SFT examples.

Every record is a ``msgspec.Struct``; on the wire (Redis Streams, files) it is msgpack with a
``schema_version`` field, never pickle. ``decode_rollout`` validates what it decodes, so a
learner never trains on a malformed rollout.

Run ``python -c "from posttrain.records import Rollout; help(Rollout)"`` for the field list.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec
import numpy as np

ROLLOUT_SCHEMA_VERSION = 2
"""Version of the ``Rollout`` wire format. Bump it on any incompatible change.

v2 packs the per-token arrays as little-endian bytes (int32 token ids, float32 logprobs, uint8
mask) inside the msgpack map, which makes encoding and validating a 32k-token rollout ~50x
cheaper than a msgpack list per token (see docs/benchmarks.md, stream)."""

FinishReason = Literal["stop", "length", "tool_error", "timeout"]
"""Why an episode ended: the model stopped, a token/turn limit was hit, a tool failed, or wall time ran out."""


class RecordError(ValueError):
    """A record failed to decode or violated an invariant; the message names the field."""


class Task(msgspec.Struct, kw_only=True, frozen=True):
    """One dataset item an environment runs on.

    Attributes:
        task_id: Stable id, unique within its dataset (for example ``gsm8k-train-00042``).
        env_name: Environment that runs it (``synthetic_arith``, ``gsm8k``, ``math_tool``, ``swe``...).
        prompt: The user-facing problem text.
        reference: What the verifier checks against (a final answer, or a test command id).
        data_source: Dataset name the task came from.
        metadata: Free-form string fields (category, difficulty, repository...).
    """

    task_id: str
    env_name: str
    prompt: str
    reference: str
    data_source: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class Rollout(msgspec.Struct, kw_only=True):
    """One run of one task by a generator: the record on the rollout stream.

    Position ``t`` of ``behaviour_logprobs`` and ``action_mask`` describes ``token_ids[t]``.
    The prompt and every tool observation are part of ``token_ids`` with ``action_mask`` False;
    their ``behaviour_logprobs`` are 0.0.

    Attributes:
        schema_version: Wire format version, ``ROLLOUT_SCHEMA_VERSION``.
        rollout_id: Unique id (uuid4 hex).
        task_id: The ``Task.task_id`` this rollout ran.
        env_name: Environment name.
        token_ids: ``[T]`` int. Prompt, actions and observations, in order (token in, token out).
        behaviour_logprobs: ``[T]`` float. Log-probability (nats) of each sampled token under the
            generator's policy at sampling temperature 1.0; 0.0 on observation tokens.
        action_mask: ``[T]`` bool. True where the token was sampled by the policy.
        reward: Scalar reward of the whole episode (SAO places it on the last action token).
        policy_version: The *oldest* policy version (count of weight publications) that sampled
            any token of this rollout; staleness is measured from it.
        turn_policy_versions: Policy version used for each turn, in order.
        num_turns: Number of model generations in the episode.
        finish_reason: ``stop``, ``length``, ``tool_error`` or ``timeout``.
        group_id: GRPO group id; ``None`` for SAO (one rollout per prompt).
        generator_id: Which generator process produced it.
        started_at: Unix time (seconds) when the episode started.
        finished_at: Unix time (seconds) when the episode finished.
        metrics: Extra per-rollout numbers (``correct``, ``tool_calls``...), all floats.
    """

    schema_version: int = ROLLOUT_SCHEMA_VERSION
    rollout_id: str
    task_id: str
    env_name: str
    token_ids: list[int]
    behaviour_logprobs: list[float]
    action_mask: list[bool]
    reward: float
    policy_version: int
    turn_policy_versions: list[int] = msgspec.field(default_factory=list)
    num_turns: int = 1
    finish_reason: FinishReason = "stop"
    group_id: str | None = None
    generator_id: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    metrics: dict[str, float] = msgspec.field(default_factory=dict)

    @property
    def num_action_tokens(self) -> int:
        """Number of tokens sampled by the policy (tokens)."""
        return sum(self.action_mask)

    def validate(self) -> Rollout:
        """Check the invariants the learner relies on.

        Returns:
            ``self``, for chaining.

        Raises:
            RecordError: unequal lengths, a non-finite logprob or reward, no action token,
                a negative policy version, or an unknown schema version. The message names
                the field.
        """
        _check_arrays(*_arrays(self))
        _check_scalars(self)
        return self


def _check_arrays(tokens: np.ndarray, logprobs: np.ndarray, mask: np.ndarray) -> None:
    """Vectorised per-token checks; the error names the first offending index."""
    n = len(tokens)
    if n == 0:
        raise RecordError("token_ids: empty")
    if len(logprobs) != n or len(mask) != n:
        raise RecordError(
            f"lengths differ: token_ids={n}, behaviour_logprobs={len(logprobs)}, action_mask={len(mask)}"
        )
    if (tokens < 0).any():
        t = int(np.argmax(tokens < 0))
        raise RecordError(f"token_ids[{t}]: negative token id {int(tokens[t])}")
    finite = np.isfinite(logprobs)
    if not finite.all():
        t = int(np.argmax(~finite))
        raise RecordError(f"behaviour_logprobs[{t}]: not finite ({logprobs[t]})")
    positive = mask & (logprobs > 1e-4)
    if positive.any():
        t = int(np.argmax(positive))
        raise RecordError(f"behaviour_logprobs[{t}]: a log-probability must be <= 0, got {logprobs[t]}")
    if not mask.any():
        raise RecordError("action_mask: no action token")


def _check_scalars(r: Rollout) -> None:
    if r.schema_version != ROLLOUT_SCHEMA_VERSION:
        raise RecordError(f"schema_version: got {r.schema_version}, this build reads {ROLLOUT_SCHEMA_VERSION}")
    if not math.isfinite(r.reward):
        raise RecordError(f"reward: not finite ({r.reward})")
    if r.policy_version < 0:
        raise RecordError(f"policy_version: must be >= 0, got {r.policy_version}")
    if r.turn_policy_versions and min(r.turn_policy_versions) != r.policy_version:
        raise RecordError(
            f"policy_version: {r.policy_version} is not the oldest of turn_policy_versions {r.turn_policy_versions}"
        )


class PreferencePair(msgspec.Struct, kw_only=True, frozen=True):
    """One DPO example: a prompt with a preferred and a dispreferred completion (text)."""

    pair_id: str
    prompt: str
    chosen: str
    rejected: str


class SFTExample(msgspec.Struct, kw_only=True, frozen=True):
    """One supervised example: chat ``messages`` (role/content dicts) or raw ``text`` for CPT."""

    example_id: str
    messages: list[dict[str, str]] = msgspec.field(default_factory=list)
    text: str = ""


class _RolloutWire(msgspec.Struct, kw_only=True):
    """The msgpack layout of a ``Rollout``: same fields, per-token arrays packed as bytes."""

    schema_version: int
    rollout_id: str
    task_id: str
    env_name: str
    token_ids: bytes
    behaviour_logprobs: bytes
    action_mask: bytes
    reward: float
    policy_version: int
    turn_policy_versions: list[int] = msgspec.field(default_factory=list)
    num_turns: int = 1
    finish_reason: FinishReason = "stop"
    group_id: str | None = None
    generator_id: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    metrics: dict[str, float] = msgspec.field(default_factory=dict)


class _VersionOnly(msgspec.Struct):
    schema_version: int = -1


_ARRAYS = ("token_ids", "behaviour_logprobs", "action_mask")
_SCALARS = tuple(f for f in Rollout.__struct_fields__ if f not in _ARRAYS)
_encoder = msgspec.msgpack.Encoder()
_wire_decoder = msgspec.msgpack.Decoder(_RolloutWire)
_version_decoder = msgspec.msgpack.Decoder(_VersionOnly)


def _arrays(rollout: Rollout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # np.fromiter over the lists is ~2x faster than np.array for long python lists.
    return (
        np.fromiter(rollout.token_ids, dtype=np.int64, count=len(rollout.token_ids)),
        np.fromiter(rollout.behaviour_logprobs, dtype=np.float64, count=len(rollout.behaviour_logprobs)),
        np.fromiter(rollout.action_mask, dtype=bool, count=len(rollout.action_mask)),
    )


def _pack(rollout: Rollout, tokens: np.ndarray, logprobs: np.ndarray, mask: np.ndarray) -> bytes:
    wire = _RolloutWire(
        token_ids=tokens.astype("<i4").tobytes(),
        behaviour_logprobs=logprobs.astype("<f4").tobytes(),
        action_mask=mask.astype(np.uint8).tobytes(),
        **{f: getattr(rollout, f) for f in _SCALARS},
    )
    return _encoder.encode(wire)


def pack_rollout_unvalidated(rollout: Rollout) -> bytes:
    """Pack a rollout into the wire format *without* checking it.

    Only for tests and tools that must produce a corrupt entry on purpose (a NaN logprob, unequal
    lengths); generators use ``encode_rollout``.
    """
    return _pack(rollout, *_arrays(rollout))


def encode_rollout(rollout: Rollout) -> bytes:
    """Serialise a rollout to msgpack bytes (the stream payload; arrays packed little-endian).

    Raises:
        RecordError: if the rollout violates an invariant (see ``Rollout.validate``), or a token
            id does not fit int32.
    """
    tokens, logprobs, mask = _arrays(rollout)
    _check_arrays(tokens, logprobs, mask)
    _check_scalars(rollout)
    if tokens.max() > np.iinfo(np.int32).max:
        raise RecordError(f"token_ids: id {int(tokens.max())} does not fit int32")
    return _pack(rollout, tokens, logprobs, mask)


def decode_rollout(payload: bytes) -> Rollout:
    """Decode and validate a msgpack rollout.

    Raises:
        RecordError: undecodable bytes, an unknown schema version, a wrong field type, a byte
            array of the wrong size, or a violated invariant.
    """
    try:
        wire = _wire_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        try:
            version = _version_decoder.decode(payload).schema_version
        except (msgspec.DecodeError, msgspec.ValidationError):
            version = ROLLOUT_SCHEMA_VERSION
        if version != ROLLOUT_SCHEMA_VERSION:
            raise RecordError(f"schema_version: got {version}, this build reads {ROLLOUT_SCHEMA_VERSION}") from exc
        raise RecordError(f"undecodable rollout: {exc}") from exc
    if len(wire.token_ids) % 4 or len(wire.behaviour_logprobs) % 4:
        raise RecordError("token_ids/behaviour_logprobs: byte length is not a multiple of 4")
    tokens = np.frombuffer(wire.token_ids, dtype="<i4")
    logprobs = np.frombuffer(wire.behaviour_logprobs, dtype="<f4")
    mask = np.frombuffer(wire.action_mask, dtype=np.uint8)
    if (mask > 1).any():
        raise RecordError("action_mask: bytes must be 0 or 1")
    mask_b = mask.astype(bool)
    _check_arrays(tokens, logprobs, mask_b)
    rollout = Rollout(
        token_ids=tokens.tolist(),
        behaviour_logprobs=logprobs.astype(np.float64).tolist(),
        action_mask=mask_b.tolist(),
        **{f: getattr(wire, f) for f in _SCALARS},
    )
    _check_scalars(rollout)
    return rollout
