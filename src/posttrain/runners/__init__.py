"""``posttrain run``: one registry from the config's ``technique`` to its runner.

``TECHNIQUES`` is a plain dict; ``run(config)`` looks the technique up and runs it end to end.
Every runner shares the same frame (``posttrain.runners.common``):

1. **prepare** the tokenizer and base model (``common.prepare``);
2. **data**: SFT/CPT/DPO read the technique's own file (``sft.data_path`` / ``dpo.data_path``,
   formats in ``docs/data.md``), validated row by row, with bad rows stopped on or quarantined
   (``data.on_bad_row``); GRPO, SAO and GKD run the environment's tasks (GKD also draws fixed
   sequences from ``gkd.data_path`` when ``gkd.lmbda < 1``);
3. **train**: SFT/CPT/DPO (``runners.sft``, ``runners.dpo``) and synchronous GRPO
   (``runners.grpo_sync``) in this process; SAO, GKD (``runners.gkd``, with its teacher) and
   asynchronous GRPO (``runners.sao``) with generator processes and the learner over the rollout stream; checkpoints go to
   ``<run>/checkpoints`` and a re-run resumes;
4. **final model**: ``<run>/final_model``, an HF safetensors directory with the tokenizer and
   ``resolved_config.yaml``;
5. **evaluate** held-out accuracy on ``data.env`` (``posttrain.eval.heldout``), log everything to
   MLflow and **register** the final model as a version of ``tracking.registered_model``.

SFT and CPT train from the base model; DPO, GRPO, SAO and GKD from the SFT warm start when
``warm_start.steps > 0`` (the base model otherwise), which is also their reference policy.

SFT, CPT, DPO and synchronous GRPO also run on N learner ranks, sharded with FSDP2:
``torchrun --nproc_per_node N -m posttrain.cli run CONFIG``. Every rank runs the same runner; rank 0
prepares, tracks, evaluates and registers (``runners.common``), every rank trains its share of
each batch. SAO, GKD and asynchronous GRPO shard their learner with ``posttrain learner`` under torchrun
(``learner.local_ranks``).

This package is the composition layer: the only one that imports both roles (learner and
generator). Run: ``posttrain run configs/sao_demo_cpu.yaml`` (or ``sft_cpu``, ``dpo_cpu``, ``grpo_cpu``,
``gkd_cpu``...).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from posttrain.config import ConfigError, RunConfig
from posttrain.config.roles import uses_async_runtime
from posttrain.config.sections import redis_url_problem
from posttrain.parallel.world import init_world, shutdown_world
from posttrain.runners.common import RunSummary, check_ranks
from posttrain.runners.dpo import run_dpo
from posttrain.runners.gkd import run_gkd
from posttrain.runners.grpo import run_grpo
from posttrain.runners.sao import run_sao
from posttrain.runners.sft import run_cpt, run_sft
from posttrain.runtime import check_input_files, check_model_dir, check_output_writable

TECHNIQUES: dict[str, Callable[[RunConfig], RunSummary]] = {
    "sao": run_sao,
    "sft": run_sft,
    "cpt": run_cpt,
    "dpo": run_dpo,
    "grpo": run_grpo,
    "gkd": run_gkd,
}
"""Technique name (``RunConfig.technique``) -> its runner."""


def preflight(config: RunConfig) -> None:
    """The checks of a run's inputs and outputs that come before any work, each one line; nothing is created.

    ``posttrain run`` calls it before it opens the run's log file (``posttrain.runners.console``), so a
    refused run leaves no run directory behind.

    Raises:
        ValueError: a technique without a runner.
        FileNotFoundError: a local ``model.path`` (or GKD's ``gkd.teacher.path``) that holds no model or
            tokenizer (``check_model_dir``).
        posttrain.config.ConfigError: a named input file is missing, not a file or empty (``check_input_files``),
            a ``gkd.teacher.path`` that is not a local directory,
            the run directory cannot be written (``check_output_writable``), or ``REDIS_URL`` is not a Redis URL
            (asynchronous techniques).
        posttrain.data.tasks.DatasetError: a bad row of an input file the technique reads, or no valid row
            (every row is read here, ``check_input_files``).
    """
    if config.technique not in TECHNIQUES:
        raise ValueError(f"technique: no runner for {config.technique!r}; known: {sorted(TECHNIQUES)}")
    # Inputs and outputs a run needs are checked before any work: one line each, not a traceback later.
    if config.model.path and "://" not in config.model.path:
        check_model_dir(config.model.path)
    teacher = config.gkd.teacher.path if config.technique == "gkd" else None
    if teacher:
        if ":/" in teacher:
            raise ConfigError(f"gkd.teacher.path: {teacher} is not a local directory; posttrain run reads one (s3:// and "
                              "models:/ teachers are fetched by the pipeline's steps, posttrain.kfp)")
        check_model_dir(teacher, "gkd.teacher.path")
    check_input_files(config)
    env_url = os.environ.get("REDIS_URL")
    if env_url and not config.queue.redis_url and uses_async_runtime(config) and redis_url_problem(env_url):
        raise ConfigError(f"REDIS_URL: {redis_url_problem(env_url)}")  # was a ValueError after the model was prepared
    check_output_writable(config)


def run(config: RunConfig) -> RunSummary:
    """Run ``config.technique`` end to end (see the module docstring) and return its summary.

    Under torchrun the process group is created here (``init_world``) and destroyed at the end; on
    ranks > 0 the summary has no rows.

    Raises:
        ValueError: a technique without a runner.
        posttrain.config.ConfigError: a batch smaller than the number of ranks, or SAO under torchrun.
        posttrain.runners.common.TechniqueConfigError: a required field of the technique's section is missing.
        posttrain.data.tasks.DatasetError: a bad data row under ``data.on_bad_row: stop``.
        posttrain.parallel.world.DeviceError: ``learner.device`` is ``cuda`` and there is none.
        FileNotFoundError: a local ``model.path`` that holds no model or tokenizer (``check_model_dir``).
        posttrain.config.ConfigError: the run directory cannot be written (``check_output_writable``), or
            ``REDIS_URL`` is not a Redis URL (asynchronous techniques).
    """
    preflight(config)
    world = init_world(config.learner)
    try:
        check_ranks(config, world)
        return TECHNIQUES[config.technique](config)
    finally:
        shutdown_world()
