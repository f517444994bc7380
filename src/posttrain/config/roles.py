"""What each role reads from the run config, derived once (placeholder moved from learner.grpo)."""

from __future__ import annotations

from posttrain.config import RunConfig


def async_runtime_config(config: RunConfig) -> RunConfig:
    """The run config the asynchronous runtime (generator processes, SAO learner loop) reads for ``grpo.async``.

    The runtime takes its batch shape and budgets from the ``sao`` section; this copies them from
    ``grpo``: ``sao.steps``, ``sao.batch_size = prompts_per_step * group_size``,
    ``sao.micro_batch_size``, ``sao.max_staleness``, ``sao.optim``, ``sao.checkpoint_every``, and
    ``sao.advantage = batch_norm`` (no critic is built; GRPO's advantages are group-relative).

    Raises:
        ValueError: ``config.technique`` is not ``grpo`` or ``grpo.async`` is false.
    """
    if config.technique != "grpo" or not config.grpo.async_:
        raise ValueError(f"technique/grpo.async: expected grpo with async true, got {config.technique}")
    grpo = config.grpo
    data = config.model_dump(mode="json", by_alias=True)
    data["sao"].update(
        steps=grpo.steps,
        batch_size=grpo.batch_rollouts,
        micro_batch_size=min(grpo.micro_batch_size, grpo.batch_rollouts),
        max_staleness=grpo.max_staleness,
        optim=grpo.optim.model_dump(mode="json"),
        checkpoint_every=grpo.checkpoint_every,
        advantage="batch_norm",
    )
    return type(config).model_validate(data)
