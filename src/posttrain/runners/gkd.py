"""GKD runner (``technique: gkd``): on-policy distillation of a teacher into the student over the asynchronous runtime.

GKD (Agarwal et al., "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes", ICLR 2024, arXiv 2306.13649). Steps of ``posttrain run configs/gkd_cpu.yaml``:

1. **prepare** the tokenizer and base model (``runners.common``);
2. **student and teacher**: the student is the SFT warm start (``warm_start.steps``); the teacher is
   ``gkd.teacher.path``, or, when unset, built here as the base model trained by SFT on the same
   reference episodes for ``gkd.teacher.build_steps`` steps (``<run>/teacher_model``), so a config
   runs on a fresh machine;
3. **evaluate** both on the held-out tasks (``eval_teacher/*``, ``eval_start/*`` in MLflow): the gap
   the distillation should close;
4. **distil** on the asynchronous runtime (``runners.sao.train_sao``, as SAO and asynchronous GRPO):
   generator processes sample the student on the environment's tasks through the inference
   engine and stream the rollouts; admission bounds their staleness (``gkd.max_staleness``); the
   learner mixes them with fixed sequences (``gkd.lmbda``), scores every sequence with the frozen
   teacher and trains the student on the divergence (``learner.gkd_step``), publishing a policy
   version per step. ``learner.local_ranks`` > 1 shards student and teacher over FSDP2 ranks;
5. **evaluate** the distilled student, log the share of the gap it closed
   (``gkd/heldout_gap_closed`` = (after - before) / (teacher - before)), register it.

With ``gkd.lmbda: 0`` (supervised KD: every sequence fixed, the paper's off-policy end) step 4 runs
the learner alone (``distil_fixed_sequences``): no Redis, generator process, inference engine or
weight publication, and the learner never waits for a rollout.

Under ``torchrun`` it is refused like SAO (it starts its own learner ranks). Run:
``posttrain run configs/gkd_cpu.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.account import StateClock
from posttrain.config import RunConfig
from posttrain.eval.heldout import heldout_tasks
from posttrain.learner.liveness import LearnerStopped
from posttrain.learner.loop import run_learner
from posttrain.learner.types import LearnerSummary
from posttrain.parallel.world import init_world
from posttrain.runners.common import (
    RunSummary,
    TrackedRun,
    evaluate_and_log,
    reward_curve,
    sft_on_references,
    start_model,
    tracked_run,
)
from posttrain.runners.console import plural
from posttrain.runners.sao import progress_sink, resume_from, run_learner_ranks, train_sao
from posttrain.runtime import RunContext, check_model_dir
from posttrain.tracking import HELDOUT_METRIC, MetricsSink


def teacher_model(run: TrackedRun) -> Path:
    """GKD's teacher: ``gkd.teacher.path`` checked, or built once in ``<run>/teacher_model`` (module docstring).

    Raises:
        FileNotFoundError: ``gkd.teacher.path`` holds no model or tokenizer (one line).
    """
    config = run.config
    teacher = config.gkd.teacher
    if teacher.path:
        check_model_dir(run.ctx.teacher_model_dir, "gkd.teacher.path")
        return run.ctx.teacher_model_dir
    section = config.warm_start.model_copy(update={"steps": teacher.build_steps})
    return sft_on_references(run.ctx, run.ctx.teacher_model_dir, section, metric_prefix="teacher_build", sink=run.sink)


def gap_closed(before: float, after: float, teacher: float) -> float | None:
    """Share of the held-out gap from student to teacher that distillation closed: ``(after - before) / (teacher - before)``.

    None when the teacher is not better than the student before (there is no gap to close).
    """
    gap = teacher - before
    return (after - before) / gap if gap > 0 else None


def distil_fixed_sequences(ctx: RunContext, student: Path, sink: MetricsSink | None,
                           clock: StateClock | None = None) -> LearnerSummary:
    """GKD at ``gkd.lmbda: 0``: the learner alone distils on fixed sequences (module docstring).

    The same learner as every GKD run (``learner.gkd_step``: teacher scores, checkpoints, resume, ledger,
    metrics) with no transport: no Redis, no generator, no weight store; on ``learner.local_ranks``
    ranks under torchrun when more than one.

    ``clock``: the learner process's time account (``run_learner``), or None.

    Returns:
        The learner's summary (``counters["generators"]`` 0).

    Raises:
        posttrain.learner.liveness.LearnerStopped: SIGTERM, Ctrl-C or no progress, after a final checkpoint;
            the message says how to resume.
    """
    config = ctx.config
    try:
        if config.learner.local_ranks > 1:
            summary = run_learner_ranks(ctx, None, ctx.save_resolved_config(), student, clock=clock)
        else:
            summary = run_learner(config, None, start_model_dir=student, sink=sink, world=init_world(config.learner),
                                  progress=False, clock=clock)
    except LearnerStopped as exc:
        raise LearnerStopped(f"{exc}; run the same command again to resume{resume_from(ctx)}", exc.exit_code,
                             summary=exc.summary) from None
    summary.counters["generators"] = 0.0
    return summary


def run_gkd(config: RunConfig) -> RunSummary:
    """Distil ``gkd``'s teacher into the warm-started student (module docstring) and return the run's summary."""
    gkd = config.gkd
    with tracked_run(config) as run:
        print(f"[2/5] student: SFT warm start ({config.warm_start.steps} steps); teacher: "
              f"{gkd.teacher.path or f'built by {gkd.teacher.build_steps} SFT steps'}", flush=True)
        student = start_model(run)
        with run.timer("warm_start"):  # the teacher's SFT, when the run builds it
            teacher = teacher_model(run)
        print(f"[3/5] held-out eval of teacher and student ({plural(len(heldout_tasks(run.ctx)), 'task')} x "
              f"{plural(config.eval.samples_per_task, 'sample')})", flush=True)
        teacher_scores = evaluate_and_log(run, teacher, "teacher")
        before = evaluate_and_log(run, student, "start")
        print(f"      accuracy: teacher {teacher_scores['accuracy']:.3f}, student {before['accuracy']:.3f}", flush=True)
        sources = (f"{config.generator.num_processes} generators, tau {gkd.max_staleness}" if gkd.on_policy_rows
                   else "no generator (lambda 0: supervised KD on the fixed sequences)")
        print(f"[4/5] gkd: {gkd.steps} policy versions of {gkd.on_policy_rows} on-policy + {gkd.fixed_rows} fixed "
              f"sequences ({gkd.loss.divergence}{f', beta {gkd.loss.beta}' if gkd.loss.divergence == 'generalized_jsd' else ''}), "
              f"{sources}{f', learner on {config.learner.local_ranks} ranks' if config.learner.local_ranks > 1 else ''}",
              flush=True)
        sink = progress_sink(run.sink, gkd.steps, gkd.checkpoint_every,
                             value=("reward/mean", "training reward") if gkd.on_policy_rows
                             else ("loss/gkd", "distillation loss"))
        summary = (train_sao(RunContext(config), student, sink, clock=run.clock) if gkd.on_policy_rows
                   else distil_fixed_sequences(RunContext(config), student, sink, clock=run.clock))
        run.generator_stats = summary.generator_stats
        run.trained_tokens = summary.this_life("action_tokens_trained")  # not the earlier lives' (a re-run)
        run.trained_nothing = not summary.trained_this_life
        print("[5/5] held-out eval, registration", flush=True)
        after = evaluate_and_log(run, summary.final_model_dir, "gkd")
        closed = gap_closed(before["accuracy"], after["accuracy"], teacher_scores["accuracy"])
        final = {"data/quarantined_rows": float(run.ctx.quarantined_rows())}
        if closed is not None:
            final["gkd/heldout_gap_closed"] = closed
        run.sink(final, summary.policy_version)
        data = [Path(gkd.data_path)] if gkd.fixed_rows and gkd.data_path else []
        version = run.register(summary.final_model_dir, data, {
            HELDOUT_METRIC: after["accuracy"],
            f"{config.data.env}.accuracy": after["accuracy"],
            "gkd.teacher_accuracy": teacher_scores["accuracy"],
            "gkd.start_accuracy": before["accuracy"],
        })
        rewards = reward_curve(run.ctx.run_dir / "metrics.jsonl")
        k = max(1, len(rewards) // 4)
        early = sum(rewards[:k]) / k if rewards else 0.0
        late = sum(rewards[-k:]) / k if rewards else 0.0
        c = summary.counters
        return run.summary([
            ("environment", config.data.env),
            ("teacher", str(teacher)),
            ("divergence", gkd.loss.divergence + (f" (beta {gkd.loss.beta})"
                                                  if gkd.loss.divergence == "generalized_jsd" else "")),
            ("on-policy share (lambda)", f"{gkd.on_policy_rows}/{gkd.batch_size} sequences per batch"),
            ("held-out accuracy of the teacher", f"{teacher_scores['accuracy']:.3f}"),
            ("held-out accuracy of the student before -> after", f"{before['accuracy']:.3f} -> {after['accuracy']:.3f}"),
            ("held-out gap closed", f"{closed:.2f}" if closed is not None else "- (the teacher is not better)"),
            ("policy versions", str(summary.policy_version)),
            ("on-policy rollouts trained", f"{c.get('rollouts_trained', 0.0):.0f}"),
            ("stale rollouts dropped", f"{c.get('stale_dropped', 0.0):.0f}"),
            ("stale episodes cancelled by generators", f"{c.get('generator_stale_aborted', 0.0):.0f}"),
            ("optimizer steps skipped (non-finite gradient)", f"{c.get('skipped_nonfinite', 0.0):.0f}"),
            ("on-policy train reward, first -> last quarter", f"{early:.3f} -> {late:.3f}"),
            ("generator busy fraction", f"{c.get('generator_busy_fraction', 0.0):.2f}"),
            ("registered model version", version),
        ])
