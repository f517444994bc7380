"""Records that cross process boundaries: tasks, rollouts, preference pairs, SFT examples.

Every record is a ``msgspec.Struct``; on the wire (Redis Streams, files) it is msgpack with a
``schema_version`` field, never pickle. ``decode_rollout`` validates what it decodes, so a
learner never trains on a malformed rollout.

Run ``python -c "from posttrain.records import Rollout; help(Rollout)"`` for the field list.
"""

from __future__ import annotations

import math
import re
from typing import Literal

import msgspec
import numpy as np

ROLLOUT_SCHEMA_VERSION = 3
"""Version of the ``Rollout`` wire format. Bump it on any incompatible change.

The per-token arrays travel as little-endian bytes (int32 token ids, float32 logprobs, uint8
mask) inside the msgpack map, so encoding and validating a rollout needs no python object per
token; with numpy arrays in and out the queue runs near the raw Redis loop (see
docs/benchmarks.md, stream).

Version 3 added ``outcome`` and ``infra_cause``; version 2 entries (written before) still decode,
as ``outcome="completed"`` (``READABLE_SCHEMA_VERSIONS``)."""

READABLE_SCHEMA_VERSIONS = (2, 3)
"""Wire versions ``decode_rollout`` accepts; older ones decode as the current version with the
defaults of the fields they lack."""

FinishReason = Literal["stop", "length", "tool_error", "timeout"]
"""Why an episode ended: the model stopped, a token/turn limit was hit, a tool failed, or wall time ran out."""

Outcome = Literal["completed", "infra_error"]
"""Whose the episode's result is. ``completed``: the agent's (success or failure, the reward says
which). ``infra_error``: the infrastructure failed under it (the sandbox died, the grader could not
run, a tool was killed by something other than the episode's own limits); such a rollout is never
trained, whatever its reward (issue 32)."""

INFRA_CAUSE_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
"""What an ``infra_cause`` looks like (it names metrics: ``infra/<cause>``), e.g. ``tool_killed``."""


_INFRA_CAUSE_RE = re.compile(INFRA_CAUSE_PATTERN)


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

            The three per-token fields are python lists, or 1-D numpy arrays (``[T]`` int32,
            float32, bool): ``encode_rollout`` packs arrays without a per-token loop, and
            ``decode_rollout(payload, arrays=True)`` returns read-only views of the payload.
            Consumers that only take ``len()``, index, slice or build tensors accept both.
        reward: Scalar reward of the whole episode (SAO places it on the last action token).
        policy_version: The *oldest* policy version (count of weight publications) that sampled
            any token of this rollout; per-rollout staleness is measured from it.
        turn_policy_versions: Policy version used for each turn, in order: entry ``k`` sampled the
            ``k``-th maximal run of action tokens (``token_policy_versions``), so when it is not
            empty it has one entry per such run. Empty means every token came from
            ``policy_version``.
        num_turns: Number of model generations in the episode.
        finish_reason: ``stop``, ``length``, ``tool_error`` or ``timeout``.
        group_id: GRPO group id; ``None`` for SAO (one rollout per prompt).
        generator_id: Which generator process produced it.
        started_at: Unix time (seconds) when the episode started.
        finished_at: Unix time (seconds) when the episode finished.
        metrics: Extra per-rollout numbers (``correct``, ``tool_calls``...), all floats.
        outcome: ``completed`` (the agent's result) or ``infra_error`` (the infrastructure failed
            under the episode: never trained; ``Outcome``).
        infra_cause: Why, for ``infra_error`` (``tool_killed``, ``grader_killed``,
            ``grader_not_started``, ``sandbox_error``...; ``INFRA_CAUSE_PATTERN``); empty otherwise.
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
    outcome: Outcome = "completed"
    infra_cause: str = ""

    @property
    def num_action_tokens(self) -> int:
        """Number of tokens sampled by the policy (tokens)."""
        if isinstance(self.action_mask, np.ndarray):
            return int(np.count_nonzero(self.action_mask))
        return sum(self.action_mask)

    def validate(self) -> Rollout:
        """Check the invariants the learner relies on.

        Returns:
            ``self``, for chaining.

        Raises:
            RecordError: unequal lengths, a non-finite logprob or reward, no action token,
                a negative policy version, ``turn_policy_versions`` without one entry per run of
                action tokens, an ``infra_cause`` that does not match the ``outcome``, or an
                unknown schema version. The message names the field.
        """
        tokens, logprobs, mask = _arrays(self)
        _check_arrays(tokens, logprobs, mask)
        _check_scalars(self)
        _check_turns(mask, self.turn_policy_versions)
        return self

    def token_policy_versions(self) -> np.ndarray:
        """The policy version that sampled each token: ``[T]`` int64.

        Action token ``t`` in the ``k``-th maximal run of True in ``action_mask`` (the ``k``-th
        turn's generation) gets ``turn_policy_versions[k]``; every other token (prompt,
        observations), and every token of a rollout without ``turn_policy_versions``, gets
        ``policy_version``. Per-token staleness (SAO's ``staleness_rule: token``) is measured
        from these.

        Raises:
            RecordError: ``turn_policy_versions`` is not empty and its length differs from the
                number of action runs.
        """
        mask = _mask(self.action_mask)
        versions = np.full(mask.shape[0], self.policy_version, dtype=np.int64)
        if not self.turn_policy_versions:
            return versions
        starts = _check_turns(mask, self.turn_policy_versions)
        run = np.cumsum(starts) - 1  # index of the action run each position belongs to (after its start)
        turn = np.asarray(self.turn_policy_versions, dtype=np.int64)
        versions[mask] = turn[run[mask]]
        return versions

    def to_arrays(self) -> Rollout:
        """Validate once and return a copy whose per-token fields are numpy arrays of the wire dtypes.

        ``token_ids`` [T] int32, ``behaviour_logprobs`` [T] float32, ``action_mask`` [T] bool: what
        ``encode_rollout`` packs without a per-token loop. A generator that ends an episode with
        this instead of ``validate`` converts its python lists once (the checks need the arrays
        anyway) instead of once to validate and again to encode.

        Returns:
            A new ``Rollout`` (``self`` is unchanged).

        Raises:
            RecordError: as ``validate``, or a token id that does not fit int32.
        """
        tokens, logprobs, mask = _checked_arrays(self)
        return msgspec.structs.replace(
            self, token_ids=tokens.astype(np.int32, copy=False), behaviour_logprobs=logprobs, action_mask=mask
        )


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


def _check_turns(mask: np.ndarray, turn_policy_versions: list[int]) -> np.ndarray:
    """``[T]`` bool, True where a maximal run of action tokens starts; checks it against the turns.

    Raises:
        RecordError: ``turn_policy_versions`` is not empty and has not one entry per action run.
    """
    starts = mask.copy()
    starts[1:] &= ~mask[:-1]
    runs = int(np.count_nonzero(starts))
    if turn_policy_versions and runs != len(turn_policy_versions):
        raise RecordError(
            f"turn_policy_versions: {len(turn_policy_versions)} entries, but action_mask has {runs} runs of "
            "action tokens (one per turn)"
        )
    return starts


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
    if r.outcome == "infra_error" and not _INFRA_CAUSE_RE.match(r.infra_cause):
        raise RecordError(f"infra_cause: an infra_error needs a cause matching {INFRA_CAUSE_PATTERN}, "
                          f"got {r.infra_cause!r}")
    if r.outcome == "completed" and r.infra_cause:
        raise RecordError(f"infra_cause: {r.infra_cause!r} given for a completed episode (outcome infra_error?)")


class PreferencePair(msgspec.Struct, kw_only=True, frozen=True):
    """One DPO example: a prompt with a preferred and a dispreferred completion (text)."""

    pair_id: str
    prompt: str
    chosen: str
    rejected: str


class SFTExample(msgspec.Struct, kw_only=True, frozen=True):
    """One supervised example: chat ``messages`` (role/content dicts) or raw ``text`` for CPT.

    ``provenance`` says where the example came from (``posttrain traces import`` writes the source
    file, line, trace id and reward); empty for hand-written data.
    """

    example_id: str
    messages: list[dict[str, str]] = msgspec.field(default_factory=list)
    text: str = ""
    provenance: dict[str, str] = msgspec.field(default_factory=dict)


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
    outcome: Outcome = "completed"
    infra_cause: str = ""


class _VersionOnly(msgspec.Struct):
    schema_version: int = -1


_ARRAYS = ("token_ids", "behaviour_logprobs", "action_mask")
_SCALARS = tuple(f for f in Rollout.__struct_fields__ if f not in _ARRAYS)
_encoder = msgspec.msgpack.Encoder()
_wire_decoder = msgspec.msgpack.Decoder(_RolloutWire)
_version_decoder = msgspec.msgpack.Decoder(_VersionOnly)


def _tokens(values: list[int] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
            raise RecordError(f"token_ids: expected a 1-D integer array, got shape {values.shape} dtype {values.dtype}")
        return values
    # np.fromiter over a python list is ~2x faster than np.array for long lists.
    return np.fromiter(values, dtype=np.int64, count=len(values))


def _logprobs(values: list[float] | np.ndarray) -> np.ndarray:
    # Converted (and later checked) as float32, the wire type: a finite float64 that overflows
    # float32 is refused here instead of arriving as -inf.
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise RecordError(f"behaviour_logprobs: expected a 1-D array, got shape {values.shape}")
        return values.astype(np.float32, copy=False)
    # fromiter to float64, then one cast: ~2x faster than fromiter straight to float32.
    with np.errstate(over="ignore"):
        return np.fromiter(values, dtype=np.float64, count=len(values)).astype(np.float32)


def _mask(values: list[bool] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise RecordError(f"action_mask: expected a 1-D array, got shape {values.shape}")
        return values.astype(bool, copy=False)
    try:
        # bytes() of a list of python bools is one C loop, ~3x faster than np.fromiter(dtype=bool).
        raw = np.frombuffer(bytes(values), dtype=np.uint8)
    except (TypeError, ValueError):  # numpy bools or other truthy objects: the general path
        return np.fromiter(values, dtype=bool, count=len(values))
    return _mask_from_bytes(raw)


def _checked_arrays(rollout: Rollout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-token fields as arrays after every wire check (``validate``'s, plus ids that fit int32)."""
    tokens, logprobs, mask = _arrays(rollout)
    _check_arrays(tokens, logprobs, mask)
    _check_scalars(rollout)
    _check_turns(mask, rollout.turn_policy_versions)
    if tokens.dtype.itemsize > 4 and tokens.size and tokens.max() > np.iinfo(np.int32).max:
        raise RecordError(f"token_ids: id {int(tokens.max())} does not fit int32")
    return tokens, logprobs, mask


def _mask_from_bytes(raw: np.ndarray) -> np.ndarray:
    """View ``raw`` ([T] uint8, each 0 or 1) as [T] bool without a copy; other bytes are an error."""
    if raw.size and raw.max() > 1:
        t = int(np.argmax(raw > 1))
        raise RecordError(f"action_mask[{t}]: must be 0/1 (False/True), got {int(raw[t])}")
    return raw.view(np.bool_)


def _arrays(rollout: Rollout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``token_ids`` [T] int, ``behaviour_logprobs`` [T] float32, ``action_mask`` [T] bool of ``rollout``.

    Arrays held by the rollout are used as they are (no copy when already of the wire dtype).
    """
    return _tokens(rollout.token_ids), _logprobs(rollout.behaviour_logprobs), _mask(rollout.action_mask)


def _pack(rollout: Rollout, tokens: np.ndarray, logprobs: np.ndarray, mask: np.ndarray) -> bytes:
    wire = _RolloutWire(
        token_ids=tokens.astype("<i4", copy=False).tobytes(),
        behaviour_logprobs=logprobs.astype("<f4", copy=False).tobytes(),
        action_mask=mask.view(np.uint8).tobytes() if mask.dtype == np.bool_ else mask.astype(np.uint8).tobytes(),
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
    return _pack(rollout, *_checked_arrays(rollout))


def _readable() -> str:
    return " and ".join(str(v) for v in READABLE_SCHEMA_VERSIONS)


def decode_rollout(payload: bytes, *, arrays: bool = False) -> Rollout:
    """Decode and validate a msgpack rollout (any of ``READABLE_SCHEMA_VERSIONS``; returned as the current one).

    Args:
        payload: ``encode_rollout`` bytes.
        arrays: Return the per-token fields as read-only numpy views of ``payload`` instead of
            python lists (no copy: ``token_ids`` [T] int32, ``behaviour_logprobs`` [T] float32,
            ``action_mask`` [T] bool). About 1.3 ms cheaper per 32k-token rollout
            (docs/benchmarks.md, stream); for consumers that only take ``len()``, index, slice or
            call ``torch.as_tensor`` on the fields (the learner's batching). Validation is the same either way.

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
        if version not in READABLE_SCHEMA_VERSIONS:
            raise RecordError(f"schema_version: got {version}, this build reads {_readable()}") from exc
        raise RecordError(f"undecodable rollout: {exc}") from exc
    if wire.schema_version not in READABLE_SCHEMA_VERSIONS:  # checked before the arrays: their layout is versioned
        raise RecordError(f"schema_version: got {wire.schema_version}, this build reads {_readable()}")
    if wire.schema_version < 3 and (wire.outcome != "completed" or wire.infra_cause):
        raise RecordError(f"outcome: schema_version {wire.schema_version} has no outcome field")
    wire.schema_version = ROLLOUT_SCHEMA_VERSION  # an older entry reads as the current version with defaults
    if len(wire.token_ids) % 4 or len(wire.behaviour_logprobs) % 4:
        raise RecordError("token_ids/behaviour_logprobs: byte length is not a multiple of 4")
    tokens = np.frombuffer(wire.token_ids, dtype="<i4")
    logprobs = np.frombuffer(wire.behaviour_logprobs, dtype="<f4")
    mask = _mask_from_bytes(np.frombuffer(wire.action_mask, dtype=np.uint8))
    _check_arrays(tokens, logprobs, mask)
    scalars = {f: getattr(wire, f) for f in _SCALARS}
    if arrays:
        rollout = Rollout(token_ids=tokens, behaviour_logprobs=logprobs, action_mask=mask, **scalars)  # type: ignore[arg-type]
    else:
        rollout = Rollout(
            token_ids=tokens.tolist(), behaviour_logprobs=logprobs.tolist(), action_mask=mask.tolist(), **scalars
        )
    _check_scalars(rollout)
    _check_turns(mask, rollout.turn_policy_versions)
    return rollout
