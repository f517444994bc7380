"""The learner's train step, chosen once per run: SAO's critic + DIS step, asynchronous GRPO's group step, or GKD's.

A ``TrainStep`` takes the batch's stream entries and the iteration number and returns a
``TrainStepResult`` (``posttrain.learner.types``) that says whether the policy moved, how many
rollouts and action tokens counted as trained, and the step's metrics. The maths lives in
``sao_step.sao_train_step`` (arXiv 2607.07508: critic, skip-observation GAE, DIS) and
``grpo_step.grpo_train_step`` (arXiv 2402.03300 with the DIS mask) and ``gkd_step.gkd_train_step``
(arXiv 2306.13649: a frozen teacher's distributions on the student's samples and fixed sequences);
this module only collates the rollouts into a padded batch and calls the right one.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn

from posttrain.advantages import RunningMeanBaseline
from posttrain.config.sections import SAOConfig
from posttrain.config.techniques import GKDTechniqueConfig, GRPOTechniqueConfig
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.gkd_step import FixedSequences, gkd_train_step, mixed_batch
from posttrain.learner.grpo_step import grpo_train_step
from posttrain.learner.sao_step import sao_train_step
from posttrain.learner.types import Trainable, TrainStepResult
from posttrain.parallel.world import World
from posttrain.rollout.queue import QueueEntry


class TrainStep(Protocol):
    """One learner iteration on a batch of stream entries."""

    def __call__(self, entries: list[QueueEntry], iteration: int, world: World, learner_version: int) -> TrainStepResult:
        """Train on ``entries`` (iteration counts learner iterations done before this one).

        Every rank passes the same entries; each trains its share of the rows (``learner.rank_rows``).
        ``learner_version`` is the learner's policy version (per-token staleness is measured from it).
        """
        ...


class SAOStep:
    """SAO: critic values, skip-observation GAE, K critic updates, then the DIS policy update.

    Args:
        policy: The policy with its optimizer and schedule.
        critic: The critic (``sao.advantage == "gae"``), else None.
        config: The ``sao`` section.
        baseline: The running-mean baseline (``sao.advantage == "running_mean"``), else None.
        pad_token_id: Padding id of the tokenizer.
    """

    def __init__(self, policy: Trainable, critic: Trainable | None, config: SAOConfig,
                 baseline: RunningMeanBaseline | None, pad_token_id: int) -> None:
        self.policy, self.critic, self.config, self.baseline, self.pad = policy, critic, config, baseline, pad_token_id

    def __call__(self, entries: list[QueueEntry], iteration: int, world: World, learner_version: int) -> TrainStepResult:
        """``sao_train_step`` on the collated batch; a critic-only warm-up iteration makes no version.

        Action tokens more than ``sao.max_staleness`` versions behind ``learner_version`` get no
        policy gradient (``sao_step.stale_tokens``).
        """
        batch = collate_rollouts([e.rollout for e in entries], self.pad)
        return sao_train_step(policy=self.policy, critic=self.critic, batch=batch, config=self.config,
                              iteration=iteration, baseline=self.baseline, world=world,
                              learner_version=learner_version)


class GRPOStep:
    """Asynchronous GRPO ("GRPO + DIS"): group-relative advantages, DIS mask against the behaviour logprobs.

    Args:
        policy: The policy with its optimizer and schedule.
        config: The ``grpo`` section.
        reference: Frozen reference policy when ``grpo.loss.kl_coef > 0``, else None.
        temperature: The generators' sampling temperature (the learner's logprobs use it too).
        pad_token_id: Padding id of the tokenizer.
    """

    def __init__(self, policy: Trainable, config: GRPOTechniqueConfig, reference: nn.Module | None,
                 temperature: float, pad_token_id: int) -> None:
        self.policy, self.config, self.reference, self.temperature, self.pad = (
            policy, config, reference, temperature, pad_token_id)

    def __call__(self, entries: list[QueueEntry], iteration: int, world: World, learner_version: int) -> TrainStepResult:
        """``grpo_train_step`` on the collated groups; groups whose rewards are all equal train nothing.

        ``learner_version`` is not read: asynchronous GRPO drops a group with any stale member
        before it gets here (``staleness_rule: episode``).
        """
        batch = collate_rollouts([e.rollout for e in entries], self.pad)
        return grpo_train_step(policy=self.policy, batch=batch, group_ids=[str(e.rollout.group_id) for e in entries],
                               config=self.config, reference=self.reference, temperature=self.temperature,
                               world=world)


class GKDStep:
    """GKD: the batch's on-policy rollouts plus the iteration's fixed sequences, scored by the teacher.

    Args:
        policy: The student with its optimizer and schedule.
        teacher: The frozen teacher, placed like the student.
        config: The ``gkd`` section.
        fixed: The fixed sequences, drawn ``gkd.fixed_rows`` per iteration (none when ``gkd.lmbda`` is 1).
        pad_token_id: Padding id of the tokenizer.
    """

    def __init__(self, policy: Trainable, teacher: nn.Module, config: GKDTechniqueConfig, fixed: FixedSequences,
                 pad_token_id: int) -> None:
        self.policy, self.teacher, self.config, self.fixed, self.pad = policy, teacher, config, fixed, pad_token_id

    def __call__(self, entries: list[QueueEntry], iteration: int, world: World, learner_version: int) -> TrainStepResult:
        """``gkd_train_step`` on the rollouts of ``entries`` and the fixed sequences of ``iteration``.

        ``learner_version`` stamps the fixed rows; stale rollouts were dropped before (``staleness_rule: episode``).
        """
        rollouts = [e.rollout for e in entries]
        batch = mixed_batch(rollouts, self.fixed.take(iteration), self.pad, learner_version)
        return gkd_train_step(policy=self.policy, teacher=self.teacher, batch=batch, on_policy_rows=len(rollouts),
                              config=self.config, world=world)
