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

ROLLOUT_SCHEMA_VERSION = 1
"""Version of the ``Rollout`` wire format. Bump it on any incompatible change."""

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
        if self.schema_version != ROLLOUT_SCHEMA_VERSION:
            raise RecordError(
                f"schema_version: got {self.schema_version}, this build reads {ROLLOUT_SCHEMA_VERSION}"
            )
        n = len(self.token_ids)
        if n == 0:
            raise RecordError("token_ids: empty")
        if len(self.behaviour_logprobs) != n or len(self.action_mask) != n:
            raise RecordError(
                f"lengths differ: token_ids={n}, behaviour_logprobs={len(self.behaviour_logprobs)}, "
                f"action_mask={len(self.action_mask)}"
            )
        for t, (lp, act) in enumerate(zip(self.behaviour_logprobs, self.action_mask, strict=True)):
            if not math.isfinite(lp):
                raise RecordError(f"behaviour_logprobs[{t}]: not finite ({lp})")
            if act and lp > 1e-4:
                raise RecordError(f"behaviour_logprobs[{t}]: a log-probability must be <= 0, got {lp}")
        if not any(self.action_mask):
            raise RecordError("action_mask: no action token")
        if not math.isfinite(self.reward):
            raise RecordError(f"reward: not finite ({self.reward})")
        if self.policy_version < 0:
            raise RecordError(f"policy_version: must be >= 0, got {self.policy_version}")
        if self.turn_policy_versions and min(self.turn_policy_versions) != self.policy_version:
            raise RecordError(
                f"policy_version: {self.policy_version} is not the oldest of turn_policy_versions "
                f"{self.turn_policy_versions}"
            )
        return self


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


_encoder = msgspec.msgpack.Encoder()
_rollout_decoder = msgspec.msgpack.Decoder(Rollout)


def encode_rollout(rollout: Rollout) -> bytes:
    """Serialise a rollout to msgpack bytes (the stream payload).

    Raises:
        RecordError: if the rollout violates an invariant (see ``Rollout.validate``).
    """
    rollout.validate()
    return _encoder.encode(rollout)


def decode_rollout(payload: bytes) -> Rollout:
    """Decode and validate a msgpack rollout.

    Raises:
        RecordError: undecodable bytes, a wrong field type, or a violated invariant.
    """
    try:
        rollout = _rollout_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RecordError(f"undecodable rollout: {exc}") from exc
    return rollout.validate()
