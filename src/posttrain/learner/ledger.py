"""The learner's ledger: one JSON line per iteration saying what it trained on and what it dropped.

``<run>/learner_ledger.jsonl`` is an audit trail of a run. Each line is one learner iteration:

* ``iteration`` (1-based count of iterations done) and ``policy_version`` after it;
* ``entry_ids``: the stream entries it trained on (asynchronous runs; after a restart, iterations
  past the last checkpoint appear again with their re-delivered entries);
* ``rollouts``: one ``rollout_summary`` per rollout of the batch, in batch order;
* ``dropped``: one ``rollout_summary`` per rollout dropped while the batch was assembled, with its
  ``reason``: ``stale`` (SAO: its oldest policy version lagged the learner by more than tau), or
  for asynchronous GRPO's groups ``GroupAssembler.drop_reason`` (``stale group``, ``surplus
  member``, ``no group id``).

A summary keeps a rollout's lengths, reward, versions and times, not its tokens, so a line stays
a few kilobytes for a batch of 64. Users read it to see which tasks, lengths and staleness each
update saw; ``bench.async_vs_sync`` reads it to replay a run's episodes in the simulator (``bench.sim``).

Example: ``tests/unit/learner/test_ledger.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
        that sampled it), ``reward``, ``finish_reason``, ``started_at`` / ``finished_at`` (Unix
        seconds), ``prompt_tokens``, ``action_tokens`` and ``observation_tokens`` (per turn,
        ``turn_lengths``) and the environment's ``metrics`` (floats).
    """
    prompt, actions, observations = turn_lengths(rollout.action_mask)
    return {
        "rollout_id": rollout.rollout_id, "task_id": rollout.task_id, "group_id": rollout.group_id,
        "generator_id": rollout.generator_id, "policy_version": rollout.policy_version, "reward": rollout.reward,
        "finish_reason": rollout.finish_reason, "started_at": rollout.started_at, "finished_at": rollout.finished_at,
        "prompt_tokens": prompt, "action_tokens": actions, "observation_tokens": observations,
        "metrics": dict(rollout.metrics),
    }


def ledger_line(iteration: int, policy_version: int, rollouts: Iterable[Rollout],
                entry_ids: Sequence[str] | None = None, dropped: Iterable[tuple[Rollout, str]] = ()) -> str:
    """One ledger line (JSON, newline-terminated) for an iteration (module docstring).

    Args:
        iteration: Iterations done, this one included (>= 1).
        policy_version: The learner's policy version after the iteration.
        rollouts: The batch, in order.
        entry_ids: Stream entry ids of the batch (asynchronous runs); ``None`` leaves the key out.
        dropped: ``(rollout, reason)`` of each rollout dropped while the batch was assembled.
    """
    line: dict[str, Any] = {"iteration": iteration, "policy_version": policy_version}
    if entry_ids is not None:
        line["entry_ids"] = list(entry_ids)
    line["rollouts"] = [rollout_summary(r) for r in rollouts]
    line["dropped"] = [{**rollout_summary(r), "reason": reason} for r, reason in dropped]
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
    out = []
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            if not isinstance(line, dict) or "iteration" not in line:
                raise ValueError(f"{path}:{number}: expected an object with 'iteration'")
            out.append(line)
    return out
