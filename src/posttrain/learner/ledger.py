"""The learner's ledger: one JSON line per iteration saying what it trained on and what it dropped.

``<run>/learner_ledger.jsonl`` is an audit trail of a run. Each line is one learner iteration:

* ``iteration`` (1-based count of iterations done) and ``policy_version`` after it;
* ``learner_version``: the policy version the batch trained at (the one its update moved from)
  and ``max_staleness`` (tau), so per-token staleness can be checked from the ledger alone
  (``staleness_violations``);
* ``entry_ids``: the stream entries it trained on (asynchronous runs; after a restart, iterations
  past the last checkpoint appear again with their re-delivered entries);
* ``rollouts``: one ``rollout_summary`` per rollout of the batch, in batch order, with (SAO) its
  token accounting from the train step (``learner.token_metrics.ROW_TOKEN_KEYS``): action tokens
  that got policy gradient, that the staleness bound masked, that the DIS band masked, and the
  oldest and newest policy version among those that got gradient (null when none did);
* ``dropped``: one ``rollout_summary`` per rollout dropped while the batch was assembled, with its
  stream ``entry_id`` and its ``reason``: ``no fresh token`` (SAO, ``staleness_rule: token``: even
  its newest turn lagged the learner by more than tau), ``stale`` (SAO, ``staleness_rule:
  episode``: its oldest turn did), ``infra_error: <cause>`` (a rollout sent with that outcome), or
  for asynchronous GRPO's groups ``GroupAssembler.drop_reason`` (``stale group``, ``surplus
  member``, ``no group id``). A dropped entry is acknowledged only after the checkpoint that
  covers its line, so every acknowledged entry is in a line (``entry_ids`` or ``dropped``), and a
  learner killed before that checkpoint judges it again after the restart, as it retrains the
  batches (the later line for an iteration is the one that stands).

A summary keeps a rollout's lengths, reward, versions and times, not its tokens, so a line stays
a few kilobytes for a batch of 64. Users read it to see which tasks, lengths and staleness each
update saw; ``bench.async_vs_sync`` reads it to replay a run's episodes in the simulator (``bench.sim``).

Example: ``tests/unit/learner/test_ledger.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.data.jsonl_log import read_json_lines
from posttrain.records import Rollout

LEDGER_NAME = "learner_ledger.jsonl"
"""File name of the ledger inside a run directory."""


def turn_lengths(action_mask: Sequence[bool] | np.ndarray) -> tuple[int, list[int], list[int]]:
    """Prompt tokens, action tokens per turn and observation tokens after each turn of one rollout.

    Action turns are the maximal runs of True in ``action_mask``; the prompt is the run of False
    before the first; observation ``k`` is the run of False after action turn ``k`` (0 after the
    last turn, and after any turn the episode ended on).

    Args:
        action_mask: ``[T]`` bool, True where the policy sampled the token.

    Returns:
        ``(prompt_tokens, action_tokens, observation_tokens)`` in tokens; the two lists have one
        entry per turn (both empty for a rollout without action tokens).
    """
    mask = np.asarray(action_mask, dtype=bool)
    if mask.size == 0:
        return 0, [], []
    edges = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    starts = np.concatenate(([0], edges))
    lengths = np.diff(np.concatenate((starts, [mask.size])))
    kinds = mask[starts]
    prompt = int(lengths[0]) if not kinds[0] else 0
    body = zip(kinds[1:], lengths[1:], strict=True) if prompt else zip(kinds, lengths, strict=True)
    actions: list[int] = []
    observations: list[int] = []
    for is_action, n in body:
        if is_action:
            actions.append(int(n))
        else:
            observations.append(int(n))
    observations = (observations + [0] * len(actions))[: len(actions)]
    return prompt, actions, observations


def rollout_summary(rollout: Rollout) -> dict[str, Any]:
    """What the ledger keeps of one rollout: ids, lengths per turn, reward, versions, times and metrics.

    Returns:
        ``rollout_id``, ``task_id``, ``group_id``, ``generator_id``, ``policy_version`` (the oldest
        that sampled it), ``turn_policy_versions`` (one per turn), ``reward``, ``finish_reason``, ``started_at`` / ``finished_at`` (Unix
        seconds), ``prompt_tokens``, ``action_tokens`` and ``observation_tokens`` (per turn,
        ``turn_lengths``) and the environment's ``metrics`` (floats).
    """
    prompt, actions, observations = turn_lengths(rollout.action_mask)
    return {
        "rollout_id": rollout.rollout_id, "task_id": rollout.task_id, "group_id": rollout.group_id,
        "generator_id": rollout.generator_id, "policy_version": rollout.policy_version,
        "turn_policy_versions": list(rollout.turn_policy_versions), "reward": rollout.reward,
        "finish_reason": rollout.finish_reason, "started_at": rollout.started_at, "finished_at": rollout.finished_at,
        "prompt_tokens": prompt, "action_tokens": actions, "observation_tokens": observations,
        "metrics": dict(rollout.metrics),
    }


def ledger_line(iteration: int, policy_version: int, rollouts: Iterable[Rollout],
                entry_ids: Sequence[str] | None = None, dropped: Iterable[tuple[Rollout, str]] = (), *,
                learner_version: int | None = None, max_staleness: int | None = None,
                row_tokens: Sequence[Mapping[str, float | None]] | None = None,
                dropped_entry_ids: Sequence[str] | None = None) -> str:
    """One ledger line (JSON, newline-terminated) for an iteration (module docstring).

    Args:
        iteration: Iterations done, this one included (>= 1).
        policy_version: The learner's policy version after the iteration.
        rollouts: The batch, in order.
        entry_ids: Stream entry ids of the batch (asynchronous runs); ``None`` leaves the key out.
        dropped: ``(rollout, reason)`` of each rollout dropped while the batch was assembled.
        learner_version: The version the batch trained at; ``None`` leaves the key out.
        max_staleness: tau (policy versions); ``None`` leaves the key out.
        row_tokens: Per rollout of the batch, its token accounting (``TrainStepResult.row_tokens``),
            merged into its summary; ``None`` adds nothing.
        dropped_entry_ids: The stream entry id of each dropped rollout, in ``dropped``'s order,
            added to its summary as ``entry_id``; ``None`` adds nothing.

    Raises:
        ValueError: ``row_tokens`` and ``rollouts``, or ``dropped_entry_ids`` and ``dropped``, differ in length.
    """
    line: dict[str, Any] = {"iteration": iteration, "policy_version": policy_version}
    if learner_version is not None:
        line["learner_version"] = learner_version
    if max_staleness is not None:
        line["max_staleness"] = max_staleness
    if entry_ids is not None:
        line["entry_ids"] = list(entry_ids)
    line["rollouts"] = [rollout_summary(r) for r in rollouts]
    if row_tokens is not None:
        if len(row_tokens) != len(line["rollouts"]):
            raise ValueError(f"row_tokens: expected {len(line['rollouts'])} like rollouts, got {len(row_tokens)}")
        for summary, tokens in zip(line["rollouts"], row_tokens, strict=True):
            summary.update(tokens)
    line["dropped"] = [{**rollout_summary(r), "reason": reason} for r, reason in dropped]
    if dropped_entry_ids is not None:
        if len(dropped_entry_ids) != len(line["dropped"]):
            raise ValueError(f"dropped_entry_ids: expected {len(line['dropped'])} like dropped, "
                             f"got {len(dropped_entry_ids)}")
        for summary, entry_id in zip(line["dropped"], dropped_entry_ids, strict=True):
            summary["entry_id"] = entry_id
    return json.dumps(line) + "\n"


def append_ledger(path: Path, line: str) -> None:
    """Append one ``ledger_line`` to the ledger at ``path`` (its directory is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The ledger's lines, in order.

    Raises:
        FileNotFoundError: no ledger at ``path``.
        ValueError: a line that is not a JSON object with ``iteration`` (the message names the
            file and the 1-based line number).
    """
    return read_json_lines(path, "iteration")


def staleness_violations(lines: Iterable[Mapping[str, Any]]) -> list[str]:
    """Rollouts whose tokens got policy gradient more than tau versions after they were sampled.

    For every line with ``learner_version`` and ``max_staleness`` and every rollout of its batch
    that trained: the oldest version among its tokens that got policy gradient
    (``trained_version_min``) must be at least ``learner_version - max_staleness``. A rollout
    without token accounting (asynchronous GRPO) is held to its oldest version
    (``policy_version``), which bounds every token of it. Rollouts no token of which got gradient
    (a critic-only iteration) and lines written before these keys existed are skipped.

    Args:
        lines: ``read_ledger`` lines.

    Returns:
        One message per violation (iteration, rollout id, versions); empty when the bound held.
    """
    out: list[str] = []
    for line in lines:
        if "learner_version" not in line or "max_staleness" not in line:
            continue
        floor = int(line["learner_version"]) - int(line["max_staleness"])
        for r in line["rollouts"]:
            if "trained_tokens" in r:
                if not r["trained_tokens"]:
                    continue
                oldest = r["trained_version_min"]
            else:
                oldest = r["policy_version"]
            if oldest is None or oldest < floor:
                out.append(f"iteration {line['iteration']}: rollout {r['rollout_id']} trained a token of version "
                           f"{oldest} at learner version {line['learner_version']} (tau {line['max_staleness']})")
    return out
