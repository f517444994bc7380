"""Open gateway episodes: their token records, segment by segment, and the book that keeps them.

An episode is everything an agent's client sends under one episode id, from its first request to
its reward call. It is kept as one or more *segments*; each segment is one contiguous token record
(what the policy saw and sampled, token in, token out) that becomes one ``Rollout`` at close and
holds one admission ticket until then. An episode has more than one segment only when the client
edited its history under the ``split`` rule (``posttrain.generator.gateway.history``).

Per segment, position ``t`` of ``logprobs`` and ``mask`` describes ``token_ids[t]``: the prompt,
tool results and other observations are ``mask`` False with logprob 0.0; every sampled token,
the end-of-turn token included, is ``mask`` True with the engine's behaviour logprob. Each
maximal run of sampled tokens has the policy version that sampled it in ``turn_versions``; a
turn sampled right after the previous one with no observation between (a raw completion that
continues) joins its run, which then carries the older of the two versions.

``EpisodeBook`` maps episode ids to open episodes and remembers how each finished episode ended
(closed with its rollouts, abandoned after ``idle_timeout_s``, or open longer than ``max_age_s``),
so a late request gets a precise 404 and a repeated reward call gets the first one's answer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from posttrain.generator.gateway.history import Canonical
from posttrain.records import FinishReason, Rollout
from posttrain.rollout.admission import Ticket

Api = Literal["chat", "completion"]
"""Which API an episode speaks; fixed by its first request."""

HistoryRule = Literal["split", "refuse"]
"""What an edited history does (``posttrain.generator.gateway.history``)."""


@dataclass
class Segment:
    """One contiguous token record of an episode (module docstring); one rollout at close.

    Attributes:
        ticket: The admission ticket this segment's rollout runs under.
        started_at: Unix time (s) of its first request.
        token_ids: ``[T]`` int. Everything the policy conditioned on and sampled, in order.
        logprobs: ``[T]`` float. Behaviour logprob (nats) of each sampled token; 0.0 on observations.
        mask: ``[T]`` bool. True on sampled tokens.
        turn_versions: Policy version of each maximal run of sampled tokens.
        actions: Decoded text of each turn's action, end-of-turn token left out (the verifier replays these).
        finish: ``length`` when the last turn hit its token budget, else ``stop``.
        tool_calls: Tool calls parsed from its actions.
        transcript: Chat API: the canonical messages the next request must start with.
        calls: Chat API: tool call id -> tool name, of the last turn's calls.
        text: Completions API: the prompt text and every completion text returned so far.
    """

    ticket: Ticket
    started_at: float = field(default_factory=time.time)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    turn_versions: list[int] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    finish: Literal["stop", "length"] = "stop"
    tool_calls: int = 0
    transcript: list[Canonical] = field(default_factory=list)
    calls: dict[str, str] = field(default_factory=dict)
    text: str = ""

    @property
    def turns(self) -> int:
        """Model generations in this segment."""
        return len(self.actions)

    def add_observation(self, token_ids: Sequence[int]) -> None:
        """Append observation tokens (``mask`` False, logprob 0.0)."""
        self.token_ids += token_ids
        self.logprobs += [0.0] * len(token_ids)
        self.mask += [False] * len(token_ids)

    def add_action(self, token_ids: Sequence[int], logprobs: Sequence[float], policy_version: int, text: str,
                   finish: Literal["stop", "length"]) -> None:
        """Append one turn's sampled tokens with their behaviour logprobs and policy version.

        Raises:
            ValueError: no token, or ``token_ids`` and ``logprobs`` of different lengths.
        """
        if not token_ids or len(token_ids) != len(logprobs):
            raise ValueError(f"a turn needs tokens and one logprob each, got {len(token_ids)} and {len(logprobs)}")
        if self.mask and self.mask[-1]:  # no observation since the last turn: the same run of action tokens
            self.turn_versions[-1] = min(self.turn_versions[-1], policy_version)
        else:
            self.turn_versions.append(policy_version)
        self.token_ids += token_ids
        self.logprobs += [float(lp) for lp in logprobs]
        self.mask += [True] * len(token_ids)
        self.actions.append(text)
        self.finish = finish

    def rollout(self, *, task_id: str, env_name: str, generator_id: str, reward: float,
                metrics: dict[str, float], finish_reason: FinishReason | None = None) -> Rollout:
        """This segment as a validated ``Rollout`` (per-token fields as numpy arrays of the wire dtypes).

        ``policy_version`` is the oldest turn's; ``metrics`` gets ``num_turns`` and ``tool_calls`` (the
        gateway's counts) unless the caller set them.

        Raises:
            posttrain.records.RecordError: the record breaks an invariant (no sampled token...).
        """
        metrics = {"num_turns": float(self.turns), "tool_calls": float(self.tool_calls), **metrics}
        return Rollout(
            rollout_id=uuid.uuid4().hex, task_id=task_id, env_name=env_name, token_ids=list(self.token_ids),
            behaviour_logprobs=list(self.logprobs), action_mask=list(self.mask), reward=float(reward),
            policy_version=min(self.turn_versions) if self.turn_versions else 0,
            turn_policy_versions=list(self.turn_versions), num_turns=self.turns,
            finish_reason=finish_reason or self.finish, group_id=None, generator_id=generator_id,
            started_at=self.started_at, finished_at=time.time(), metrics=metrics,
        ).to_arrays()


@dataclass
class Episode:
    """One open episode (module docstring).

    Attributes:
        episode_id: The client's id (path segment or ``X-Episode-Id``).
        api: ``chat`` or ``completion``.
        rule: What an edited history does for this episode.
        task_id: The task the client named when opening it (``X-Task-Id``), or None.
        segments: Its segments, oldest first; the last one is the current one.
        opened: Monotonic time (s) it was opened.
        last_active: Monotonic time (s) of its last request.
        lock: Held by the request being served; one request at a time per episode.
    """

    episode_id: str
    api: Api
    rule: HistoryRule
    task_id: str | None = None
    segments: list[Segment] = field(default_factory=list)
    opened: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def current(self) -> Segment:
        """The segment the next turn extends.

        Raises:
            IndexError: the episode has no segment yet (its first turn is being served).
        """
        return self.segments[-1]

    def touch(self) -> None:
        """Mark a request now (resets the idle clock)."""
        self.last_active = time.monotonic()


class EpisodeBook:
    """Open episodes by id, and how the last ``remember`` finished ones ended (module docstring).

    Not thread-safe: used on the gateway's event loop.

    Args:
        idle_timeout_s: An episode with no request for this long is due for abandoning (seconds, > 0).
        max_age_s: An episode open this long is due for abandoning whatever its activity (seconds, > 0).
        remember: Finished episodes whose outcome is kept (count, >= 1).

    Raises:
        ValueError: an argument out of range (the message names it).
    """

    def __init__(self, idle_timeout_s: float, max_age_s: float, remember: int = 100_000) -> None:
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s: must be > 0 seconds, got {idle_timeout_s}")
        if not max_age_s > 0:
            raise ValueError(f"max_age_s: must be > 0 seconds, got {max_age_s}")
        if remember < 1:
            raise ValueError(f"remember: must be >= 1, got {remember}")
        self.idle_timeout_s = idle_timeout_s
        self.max_age_s = max_age_s
        self.remember = remember
        self._open: dict[str, Episode] = {}
        self._finished: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, episode_id: str) -> Episode | None:
        """The open episode ``episode_id``, or None."""
        return self._open.get(episode_id)

    def outcome(self, episode_id: str) -> dict[str, Any] | None:
        """How a finished episode ended (``{"status": "closed" | "abandoned" | "infra_error", ...}``), or None."""
        return self._finished.get(episode_id)

    def add(self, episode: Episode) -> None:
        """Register a new episode.

        Raises:
            ValueError: the id is open or finished already.
        """
        if episode.episode_id in self._open or episode.episode_id in self._finished:
            raise ValueError(f"episode {episode.episode_id!r} exists already")
        self._open[episode.episode_id] = episode

    def discard(self, episode: Episode) -> None:
        """Forget an episode that never served a turn (its first request failed); its id may be used again."""
        if self._open.get(episode.episode_id) is episode:
            del self._open[episode.episode_id]

    def finish(self, episode: Episode, outcome: dict[str, Any]) -> None:
        """Move ``episode`` from open to finished with ``outcome`` (the oldest outcomes are forgotten)."""
        self._open.pop(episode.episode_id, None)
        self._finished[episode.episode_id] = outcome
        while len(self._finished) > self.remember:
            self._finished.popitem(last=False)

    def due(self, now: float | None = None) -> list[tuple[Episode, str]]:
        """Open episodes to abandon now, each with why (``idle`` or ``too_old``); episodes mid-request are skipped.

        Args:
            now: Monotonic time (s); default ``time.monotonic()``.
        """
        now = time.monotonic() if now is None else now
        out = []
        for episode in list(self._open.values()):
            if episode.lock.locked() or not episode.segments:
                continue
            if now - episode.last_active >= self.idle_timeout_s:
                out.append((episode, "idle"))
            elif now - episode.opened >= self.max_age_s:
                out.append((episode, "too_old"))
        return out

    def open_episodes(self) -> list[Episode]:
        """Every open episode."""
        return list(self._open.values())
