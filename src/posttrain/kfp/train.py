"""The training steps: ``train_sao`` and ``train_technique`` (sft, dpo, grpo, gkd), from a prepared dataset.

Each writes a transformers checkpoint into the Model artifact directory, with
``posttrain_model.json`` beside it (``export_model``; it names the MLflow run that trained it),
copies it under the tenant's S3 prefix when ``$S3_PREFIX`` is set (``publish_checkpoint``: the
metadata's ``checkpoint_uri``, which the register step reads), and works in ``workspace(run_name)``: a
mounted volume when ``$POSTTRAIN_WORKSPACE`` exists (a retried step resumes from its checkpoints),
else a temporary directory. ``train_sao(mode="cluster")`` hands over to
``posttrain.kfp.train_cluster``, which runs the same training as one JobSet.

Runs in the ``trainer`` image. Try it on a Dataset artifact written by ``prepare_dataset``:
``python -c "from posttrain.kfp.train import train_sao;
print(train_sao('/tmp/ds', '/tmp/model', mode='local', queue='', run_id='try').metrics)"``.
"""

from __future__ import annotations

import re
from pathlib import Path

from posttrain.kfp.artifacts import (
    PipelineStepError,
    StepOutputs,
    account_outputs,
    expect_technique,
    export_model,
    load_prepared,
    markdown_table,
    workspace,
)
from posttrain.kfp.curves import reward_curve_page
from posttrain.kfp.locations import local_model, publish_checkpoint

SAO_MODES = ("local", "cluster")
"""``train_sao`` modes: processes inside the step, or one JobSet admitted by Kueue."""


def train_sao(
    dataset_dir: Path | str,
    model_out: Path | str,
    *,
    mode: str,
    queue: str,
    run_id: str,
    learner_image: str = "",
    generator_image: str = "",
    priority_class: str = "",
    poll_s: float = 30.0,
    timeout_s: float = 7 * 86400.0,
) -> StepOutputs:
    """SAO (Single-Rollout Asynchronous Optimization, arXiv 2607.07508) from a prepared dataset.

    ``mode="local"``: the SFT warm start, then ``generator.num_processes`` generator processes, the
    learner in this process and an embedded Redis (``posttrain.runners.sao.train_sao``); the final policy
    is copied into ``model_out``. ``mode="cluster"``: one JobSet (learner, generators, Redis)
    labelled with ``queue`` for Kueue, created or re-attached by run id and followed to the end
    (``posttrain.kfp.train_cluster.train_sao_cluster``).

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset``.
        model_out: Model artifact directory to fill.
        mode: ``local`` or ``cluster``.
        queue: Kueue LocalQueue of the JobSet (cluster mode).
        run_id: Pipeline run id (the JobSet name derives from it).
        learner_image: Learner image (cluster mode).
        generator_image: Generator image (cluster mode).
        priority_class: Kueue WorkloadPriorityClass of the JobSet (cluster mode); "": none.
        poll_s: Seconds between JobSet status reads (cluster mode).
        timeout_s: Seconds before giving up on the JobSet (cluster mode).

    Returns:
        Metrics (policy versions, rollouts trained and dropped, generator busy fraction), the model
        metadata, a Markdown summary and an HTML page with the reward curve (``kfp.curves``).

    Raises:
        PipelineStepError: unknown mode, or a prepared dataset of another technique.
        posttrain.cluster.launcher.JobSetError: the JobSet failed, timed out or conflicts (cluster mode).
    """
    if mode not in SAO_MODES:
        raise PipelineStepError(f"mode: {mode!r} is not one of {list(SAO_MODES)}")
    if mode == "cluster":
        from posttrain.kfp.train_cluster import train_sao_cluster

        return train_sao_cluster(dataset_dir, model_out, queue=queue, run_id=run_id, learner_image=learner_image,
                                 generator_image=generator_image, priority_class=priority_class,
                                 poll_s=poll_s, timeout_s=timeout_s)
    import time

    from posttrain.account import LEARNER_STATES, StateClock
    from posttrain.runners.accounting import build_account, record_account
    from posttrain.runners.common import metrics_sink, prepare, warm_start
    from posttrain.runners.sao import train_sao
    from posttrain.runtime import RunContext
    from posttrain.tracking import Tracker

    clock, cpu_started = StateClock(LEARNER_STATES, initial="preparing"), time.process_time()

    cfg, manifest = load_prepared(dataset_dir)
    expect_technique(manifest, "sao")
    with workspace(cfg.run_name) as work:
        cfg = local_model(load_prepared(dataset_dir, work)[0], work)
        ctx = RunContext(cfg)
        tracker = Tracker(cfg.tracking.tracking_uri, cfg.tracking.experiment, run_name=cfg.run_name,
                          tags={"posttrain.technique": "sao", "posttrain.pipeline_run": run_id})
        with tracker:
            tracker.log_params(cfg.model_dump(mode="json", by_alias=True))
            sink = metrics_sink(ctx, tracker)
            prepare(ctx)
            clock.switch("warm_start")
            start = warm_start(ctx, sink)
            clock.switch("other")
            summary = train_sao(ctx, start, sink, clock=clock)
            # The held-out evaluation is the pipeline's own step: no accuracy here.
            account = build_account(cfg, clock, cpu_started, summary.generator_stats,
                                    trained_tokens=summary.this_life("action_tokens_trained"),
                                    heldout_before=None, heldout_after=None, generators_in_process=False,
                                    this_life_only=True)
            record_account(account, ctx.run_dir, tracker, step=summary.policy_version)
            account_fields = account_outputs(ctx.run_dir)
        metrics = {"policy_version": float(summary.policy_version), **{k: float(v) for k, v in summary.counters.items()}}
        info = {"technique": "sao", "run_name": cfg.run_name, "mlflow_run_id": tracker.run_id,
                "policy_version": summary.policy_version}
        published = publish_checkpoint(summary.final_model_dir, cfg.run_name)
        if published:
            info["checkpoint_uri"] = published
        export_model(summary.final_model_dir, model_out, info)
    md = f"# SAO training: {cfg.run_name}\n\n" + markdown_table({**info, **metrics})
    page = reward_curve_page(tracker.tracking_uri, tracker.run_id, cfg.run_name)
    return StepOutputs(metrics=metrics, metadata=info, markdown=md, html=page, **account_fields)


def train_technique(dataset_dir: Path | str, model_out: Path | str, technique: str, *, run_id: str = "") -> StepOutputs:
    """SFT, DPO, GRPO or GKD from a prepared dataset through ``posttrain.runners.run``.

    GRPO with ``grpo.async`` and GKD run the asynchronous runtime inside the step (generator processes,
    learner, embedded Redis); GKD's ``s3://`` teacher is downloaded into the workspace first.

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset``.
        model_out: Model artifact directory to fill with the final checkpoint.
        technique: ``sft``, ``dpo``, ``grpo`` or ``gkd`` (must match the prepared dataset).
        run_id: Pipeline run id (an MLflow tag).

    Returns:
        The technique's summary rows that are numbers, as metrics; a Markdown summary.

    Raises:
        PipelineStepError: a technique mismatch, or no final checkpoint after training.
    """
    from posttrain.runners import run
    from posttrain.runners.common import MLFLOW_RUN_ROW
    from posttrain.runtime import RunContext

    if technique not in ("sft", "dpo", "grpo", "gkd"):
        raise PipelineStepError(f"technique: {technique!r} is not sft, dpo, grpo or gkd")
    cfg, manifest = load_prepared(dataset_dir)
    expect_technique(manifest, technique)
    with workspace(cfg.run_name) as work:
        cfg = local_model(load_prepared(dataset_dir, work)[0], work)
        # The pipeline's register_model step registers the model; training must not do it twice.
        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"register_final": False})})
        summary = run(cfg)
        final = RunContext(cfg).final_model_dir
        if not (final / "config.json").is_file():
            raise PipelineStepError(f"{technique}: training finished without a checkpoint in {final}")
        metrics: dict[str, float] = {}
        for key, value in summary.rows:
            try:
                metrics[re.sub(r"[^A-Za-z0-9_]+", "_", key).strip("_")] = float(value)
            except (TypeError, ValueError):
                continue  # text rows (paths, names) belong in the report, not in Metrics
        info = {"technique": technique, "run_name": cfg.run_name, "pipeline_run": run_id,
                "mlflow_run_id": dict(summary.rows).get(MLFLOW_RUN_ROW, "")}
        published = publish_checkpoint(final, cfg.run_name)
        if published:
            info["checkpoint_uri"] = published
        export_model(final, model_out, info)
        account_fields = account_outputs(RunContext(cfg).run_dir)
    md = f"# {technique.upper()} training: {cfg.run_name}\n\n" + summary.table() + "\n"
    return StepOutputs(metrics=metrics, metadata=info, markdown=md, **account_fields)
