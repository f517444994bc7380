"""What the roles of the asynchronous runtime read from a run config, derived once for SAO, async GRPO or GKD.

SAO, asynchronous GRPO and GKD share one runtime: generator processes take admission tickets, run
episodes (one per ticket for SAO, a group of ``group_size`` for GRPO) and push rollouts to the
stream; the learner trains on them as they arrive. Generators and the learner must agree on a
few numbers (rollouts per learner batch, the staleness bound tau, the group size), and the
learner needs its budget (policy versions to publish, checkpoint cadence). They come from the
technique's own section: ``sao`` for ``technique: sao``, ``grpo`` for ``technique: grpo`` with
``grpo.async: true``, ``gkd`` for ``technique: gkd`` (its batch's on-policy rows are the rollouts
admission and the stream count; its fixed rows never pass through them).

``async_rl_settings(config)`` derives them, and every entry point calls it: ``posttrain run``,
``posttrain learner`` and ``posttrain generator``, so a role started by hand on a config reads
the same values as one started by the runner. No section is rewritten into another.

Example: ``python -c "from posttrain.config import load_config; from posttrain.config.roles import
async_rl_settings; print(async_rl_settings(load_config('configs/grpo_async_cpu.yaml')))"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from posttrain.config.common import OptimConfig
from posttrain.config.load import ConfigError
from posttrain.config.run import RunConfig


@dataclass(frozen=True)
class AsyncRLSettings:
    """The asynchronous runtime's shared numbers (see the module docstring).

    Attributes:
        technique: ``sao`` (one rollout per prompt, critic), ``grpo`` (groups, group baseline, DIS) or
            ``gkd`` (one rollout per prompt, scored by a teacher).
        steps: Policy versions the learner publishes before it stops (``sao.steps`` / ``grpo.steps``).
        batch_rollouts: Rollouts per learner batch; the admission capacity's B
            (``sao.batch_size`` / ``grpo.prompts_per_step * grpo.group_size`` / GKD's on-policy rows,
            ``round(gkd.lmbda * gkd.batch_size)``).
        max_staleness: tau, in policy versions (``sao.max_staleness`` / ``grpo.max_staleness``).
        staleness_rule: ``token`` (per-token staleness: stale tokens masked, a rollout dropped
            only when none of its action tokens is fresh, no generator cancellations) or
            ``episode`` (drop by the oldest turn, cancel in flight); ``sao.staleness_rule``;
            asynchronous GRPO keeps ``episode`` (a group is dropped whole when a member is stale), and
            so does GKD (a rollout is dropped whole).
        group_size: Rollouts per prompt a generator runs together (1 for SAO, G for GRPO).
        groups_per_batch: Prompts per learner batch (``batch_rollouts / group_size``).
        checkpoint_every: Policy versions between learner checkpoints.
        optim: The policy's optimizer section.
        policy_optimizer_steps: Optimizer steps the policy's LR schedule spans (policy versions
            times GRPO's mini-batches per batch).
        max_nonfinite_iterations: Learner iterations in a row with a skipped (non-finite) optimizer
            step that stop the run (``sao.max_nonfinite_iterations`` / ``grpo.max_nonfinite_iterations``).
        critic_warmup_iterations: The first learner iterations that train only the critic and publish no
            version by design (``sao.critic.warmup_steps`` with ``sao.advantage: gae``; 0 otherwise); the
            progress bound (``learner.max_iterations_without_progress``) does not count them.
    """

    technique: Literal["sao", "grpo", "gkd"]
    steps: int
    batch_rollouts: int
    max_staleness: int
    staleness_rule: Literal["token", "episode"]
    group_size: int
    groups_per_batch: int
    checkpoint_every: int
    optim: OptimConfig
    policy_optimizer_steps: int
    max_nonfinite_iterations: int
    critic_warmup_iterations: int = 0


def samples_on_policy(config: RunConfig) -> bool:
    """Whether the run's learner trains on rollouts generators sample: every asynchronous-runtime run but GKD at ``gkd.lmbda: 0``.

    GKD at lambda 0 (supervised KD) trains on fixed sequences only: no generator, inference engine,
    rollout stream or admission is started, and its learner reads no Redis.
    """
    return uses_async_runtime(config) and not (config.technique == "gkd" and config.gkd.on_policy_rows == 0)


def uses_async_runtime(config: RunConfig) -> bool:
    """True for ``technique: sao`` and ``gkd``, and for ``technique: grpo`` with ``grpo.async: true``."""
    return config.technique in ("sao", "gkd") or (config.technique == "grpo" and config.grpo.async_)


def async_rl_settings(config: RunConfig) -> AsyncRLSettings:
    """The runtime settings of ``config`` (module docstring).

    Raises:
        ConfigError: the technique does not run on the asynchronous runtime (names ``technique``
            and ``grpo.async``).
    """
    if config.technique == "sao":
        sao = config.sao
        return AsyncRLSettings(
            technique="sao", steps=sao.steps, batch_rollouts=sao.batch_size, max_staleness=sao.max_staleness,
            staleness_rule=sao.staleness_rule, group_size=1, groups_per_batch=sao.batch_size, checkpoint_every=sao.checkpoint_every,
            optim=sao.optim, policy_optimizer_steps=sao.steps, max_nonfinite_iterations=sao.max_nonfinite_iterations,
            critic_warmup_iterations=sao.critic.warmup_steps if sao.advantage == "gae" else 0,
        )
    if config.technique == "grpo" and config.grpo.async_:
        grpo = config.grpo
        return AsyncRLSettings(
            technique="grpo", steps=grpo.steps, batch_rollouts=grpo.batch_rollouts,
            max_staleness=grpo.max_staleness, staleness_rule="episode", group_size=grpo.group_size, groups_per_batch=grpo.prompts_per_step,
            checkpoint_every=grpo.checkpoint_every, optim=grpo.optim,
            policy_optimizer_steps=grpo.steps * grpo.mini_batches,
            max_nonfinite_iterations=grpo.max_nonfinite_iterations,
        )
    if config.technique == "gkd":
        gkd = config.gkd
        return AsyncRLSettings(
            technique="gkd", steps=gkd.steps, batch_rollouts=gkd.on_policy_rows, max_staleness=gkd.max_staleness,
            staleness_rule="episode", group_size=1, groups_per_batch=gkd.on_policy_rows,
            checkpoint_every=gkd.checkpoint_every, optim=gkd.optim, policy_optimizer_steps=gkd.steps,
            max_nonfinite_iterations=gkd.max_nonfinite_iterations,
        )
    raise ConfigError(
        f"technique: {config.technique!r} (grpo.async={config.grpo.async_}) does not run on the asynchronous "
        "runtime; expected technique sao or gkd, or grpo with grpo.async true"
    )
