r"""The token-in/token-out agent loop: run one episode of one task and return a ``Rollout``.

How an episode is tokenised (the invariant the SAO learner relies on):

1. The environment's initial messages are rendered with the tokenizer's chat template ONCE, with
   ``add_generation_prompt=True``. These prompt tokens are observations (``action_mask`` False,
   ``behaviour_logprobs`` 0.0).
2. Each turn sends *all tokens so far* to the engine (``GenerationRequest.prompt_token_ids``) with
   ``max_new_tokens = min(limits.max_new_tokens, max_episode_tokens - len(tokens))`` and the chat
   template's end-of-turn token (``<|im_end|>`` for ChatML) as the stop token. The sampled tokens,
   including the stop token, are appended with ``action_mask`` True and the engine's behaviour
   logprobs.
3. Only the new action tokens (without the stop token) are decoded to text and passed to
   ``Episode.step``. An observation (tool output) is rendered as a turn of role ``tool`` using
   the template's own delimiters (for ChatML: ``\n<|im_start|>tool\n{obs}<|im_end|>\n
   <|im_start|>assistant\n``; the leading ``\n`` is the one the template writes after the
   assistant's ``<|im_end|>``), encoded once and appended with ``action_mask`` False and logprob
   0.0. The observation text itself is encoded with ``split_special_tokens=True``, so tool output
   that contains ``<|im_end|>`` cannot forge a turn boundary.
4. Text is never decoded and re-encoded between turns: the token list only grows, so the learner
   scores exactly the tokens the generator sampled (research/sao_algorithm.md §6 item 5).

Limits and finish reasons (``EpisodeLimits``):

* ``stop``: the environment ended the episode (final answer) — reward from the environment.
* ``tool_error``: the environment ended it because of repeated malformed tool calls.
* ``length``: a turn was cut by ``max_new_tokens`` / the episode token budget (the engine returned
  ``length``, or a turn did not end with the end-of-turn token), the next observation would not leave room for one more action token, or
  ``max_turns`` generations happened without the environment finishing. Reward 0.0 (the reward
  of an unfinished episode).
* ``timeout``: the wall-time budget ``timeout_s`` ran out while generating or while the
  environment stepped (the pending call is cancelled). Reward 0.0.

For ``length`` and ``timeout`` the rollout's metrics are those of the environment's last
``StepResult`` (environments report their full metric set on every step), plus ``num_turns``.

Infrastructure failures (issue 32): when the environment raises ``InfraError`` (the sandbox died,
the grader could not run, a tool was killed from outside) the episode ends at once and
``run_episode`` raises ``EpisodeInfraError`` with the cause and the partial rollout, marked
``outcome="infra_error"`` (``None`` when no action token was sampled yet). The result is not the
agent's: callers never train it (the generator re-issues the task).

Policy versions: each turn records ``GenerationResult.policy_version``; the rollout's
``policy_version`` is the oldest of them (a rollout whose weights changed between turns is as
stale as its oldest token).

``render_sft_example`` renders an SFT conversation through the same segment logic, so warm-start
data and RL rollouts of the same assistant tokens are token-for-token identical.

Run the tests: ``python -m pytest -q tests/unit/episodes/test_runner.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.chat.format import ChatFormat
from posttrain.envs.base import Environment, InfraError, StepResult
from posttrain.inference.base import GenerationRequest, GenerationResult, InferenceEngine
from posttrain.records import FinishReason, Rollout, Task


class EpisodeError(RuntimeError):
    """An episode could not produce a valid rollout (no action token, or an environment/engine bug).

    Attributes:
        finish_reason: Why it stopped, when that is one of the rollout finish reasons.
    """

    def __init__(self, message: str, finish_reason: FinishReason | None = None) -> None:
        super().__init__(message)
        self.finish_reason = finish_reason


class EpisodeInfraError(EpisodeError):
    """The infrastructure failed under the episode (``posttrain.envs.base.InfraError``): not the agent's result.

    Attributes:
        cause: The ``InfraError``'s cause (``tool_killed``, ``grader_killed``, ``sandbox_error``...).
        rollout: The episode up to the failure, ``outcome="infra_error"`` and reward 0.0 (never
            to be trained; its ``finish_reason`` is ``stop`` and means nothing), or ``None`` when
            it failed before its first action token.
    """

    def __init__(self, message: str, cause: str, rollout: Rollout | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.rollout = rollout


@dataclass(frozen=True)
class EpisodeLimits:
    """Budgets of one episode.

    Attributes:
        max_turns: Most model generations (turns) per episode, >= 1.
        max_new_tokens: Most sampled tokens per turn (tokens), >= 1.
        max_episode_tokens: Most tokens in the whole rollout: prompt, actions and observations
            (tokens), >= 2.
        timeout_s: Wall-time budget of the episode (seconds), > 0.
    """

    max_turns: int = 4
    max_new_tokens: int = 48
    max_episode_tokens: int = 512
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        """Validate the bounds.

        Raises:
            ValueError: a limit out of range; the message names the field.
        """
        if self.max_turns < 1:
            raise ValueError(f"max_turns: must be >= 1, got {self.max_turns}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.max_episode_tokens < 2:
            raise ValueError(f"max_episode_tokens: must be >= 2, got {self.max_episode_tokens}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")


def _check_result(result: GenerationResult, max_new_tokens: int) -> None:
    """Raise ``EpisodeError`` on an engine result that would corrupt the rollout."""
    if not result.token_ids:
        raise EpisodeError("engine returned no tokens for a turn")
    if len(result.token_ids) != len(result.logprobs):
        raise EpisodeError(
            f"engine result: {len(result.token_ids)} token_ids but {len(result.logprobs)} logprobs"
        )
    if len(result.token_ids) > max_new_tokens:
        raise EpisodeError(f"engine result: {len(result.token_ids)} tokens exceed max_new_tokens={max_new_tokens}")


async def run_episode(
    engine: InferenceEngine,
    tokenizer: Any,
    env: Environment,
    task: Task,
    limits: EpisodeLimits,
    *,
    generator_id: str = "",
    seed: int | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    group_id: str | None = None,
    chat: ChatFormat | None = None,
    arrays: bool = False,
    on_turn: Callable[[int], None] | None = None,
) -> Rollout:
    """Run one episode of ``task`` token-in/token-out and return its validated ``Rollout``.

    See the module docstring for the tokenisation, limits and finish reasons.

    Args:
        engine: Samples action tokens with behaviour logprobs.
        tokenizer: The policy's tokenizer (chat template, decode for ``Episode.step``).
        env: The environment that runs ``task``.
        task: The task.
        limits: Turn, token and wall-time budgets.
        generator_id: Stored in ``Rollout.generator_id``.
        seed: Per-episode sampling seed; turn ``k`` (0-based) uses ``seed + k``. ``None`` lets the
            engine choose. Recorded as ``metrics["sampling_seed"]``.
        temperature: Sampling temperature (SAO training uses 1.0).
        top_p: Nucleus mass (SAO training uses 1.0).
        group_id: GRPO group id; ``None`` for SAO.
        chat: A prebuilt ``ChatFormat`` for ``tokenizer`` (``ChatFormat.for_tokenizer`` when ``None``).
        arrays: Return the per-token fields as numpy arrays (``Rollout.to_arrays``: int32,
            float32, bool), converted once while validating; generators that put the rollout on
            the stream use this, so encoding needs no second per-token pass. Python lists otherwise.
        on_turn: Called with each turn's policy version as soon as the engine returns it, so the
            generator can cancel an episode that is already too stale to train
            (``generator.inflight``).

    Returns:
        The rollout: ``token_ids`` [T] int, ``behaviour_logprobs`` [T] float (nats, 0.0 on
        observations), ``action_mask`` [T] bool, reward, finish reason, per-turn and oldest
        policy versions, and the environment's metrics plus ``num_turns`` (and ``sampling_seed``).

    Raises:
        EpisodeInfraError: the environment raised ``InfraError`` (module docstring).
        EpisodeError: the prompt leaves no room for an action within ``max_episode_tokens``, the
            time ran out before the first action token, the engine returned a malformed result,
            or the environment returned neither ``done`` nor an observation.
        posttrain.records.RecordError: the assembled rollout violates an invariant.
    """
    chat = chat or ChatFormat.for_tokenizer(tokenizer)
    started_at = time.time()
    deadline = time.monotonic() + limits.timeout_s
    try:
        episode = env.start(task)
    except InfraError as exc:
        raise EpisodeInfraError(f"task {task.task_id}: {exc}", exc.cause) from exc
    infra: InfraError | None = None
    try:
        token_ids = chat.prompt_ids(episode.messages())
        if len(token_ids) >= limits.max_episode_tokens:
            raise EpisodeError(
                f"task {task.task_id}: prompt is {len(token_ids)} tokens, max_episode_tokens="
                f"{limits.max_episode_tokens} leaves no room for an action",
                "length",
            )
        logprobs = [0.0] * len(token_ids)
        action_mask = [False] * len(token_ids)
        versions: list[int] = []
        reward = 0.0
        finish: FinishReason = "length"
        metrics: dict[str, float] = {}

        for turn in range(limits.max_turns):
            budget = min(limits.max_new_tokens, limits.max_episode_tokens - len(token_ids))
            request = GenerationRequest(
                prompt_token_ids=list(token_ids),
                max_new_tokens=budget,
                stop_token_ids=[chat.stop_token_id],
                temperature=temperature,
                top_p=top_p,
                seed=None if seed is None else seed + turn,
            )
            try:
                result = await asyncio.wait_for(engine.generate(request), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                finish = "timeout"
                break
            _check_result(result, budget)
            token_ids += result.token_ids
            logprobs += [float(lp) for lp in result.logprobs]
            action_mask += [True] * len(result.token_ids)
            versions.append(int(result.policy_version))
            if on_turn is not None:
                on_turn(versions[-1])
            if result.finish_reason == "length" or result.token_ids[-1] != chat.stop_token_id:
                finish = "length"
                break
            text = tokenizer.decode(result.token_ids[:-1], skip_special_tokens=False)
            try:
                step: StepResult = await asyncio.wait_for(
                    episode.step(text), max(deadline - time.monotonic(), 0.0)
                )
            except TimeoutError:
                finish = "timeout"
                break
            except InfraError as exc:  # not the agent's: no reward, no observation
                infra, finish = exc, "stop"
                break
            metrics = dict(step.metrics)
            if step.done:
                reward, finish = float(step.reward), step.finish_reason
                break
            if step.observation is None:
                raise EpisodeError(f"environment {env.name}: step returned neither done nor an observation")
            if turn == limits.max_turns - 1:
                finish = "length"
                break
            observation = chat.turn_ids("tool", step.observation)
            if len(token_ids) + len(observation) >= limits.max_episode_tokens:
                finish = "length"
                break
            token_ids += observation
            logprobs += [0.0] * len(observation)
            action_mask += [False] * len(observation)
    finally:
        episode.close()

    if not versions:
        raise EpisodeError(f"task {task.task_id}: {finish} before the first action token", finish)
    metrics["num_turns"] = float(len(versions))
    outcome: dict[str, Any] = {}
    if infra is not None:
        outcome = {"outcome": "infra_error", "infra_cause": infra.cause}
    if seed is not None:  # exact: generator seeds stay below 2**53 (generator.seeds)
        metrics["sampling_seed"] = float(seed)
    rollout = Rollout(
        rollout_id=uuid.uuid4().hex,
        task_id=task.task_id,
        env_name=env.name,
        token_ids=token_ids,
        behaviour_logprobs=logprobs,
        action_mask=action_mask,
        reward=reward,
        policy_version=min(versions),
        turn_policy_versions=versions,
        num_turns=len(versions),
        finish_reason=finish,
        group_id=group_id,
        generator_id=generator_id,
        started_at=started_at,
        finished_at=time.time(),
        metrics=metrics,
        **outcome,
    )
    rollout = rollout.to_arrays() if arrays else rollout.validate()
    if infra is not None:
        raise EpisodeInfraError(f"task {task.task_id}: {infra}", infra.cause, rollout) from infra
    return rollout
