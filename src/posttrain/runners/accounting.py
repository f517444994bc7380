"""A run's time account at its end: built from the learner's clock and the generators' stats, recorded everywhere.

Issue 35 (``posttrain.account`` defines the clocks and records). Every technique's runner calls
``record_account`` once, after its final evaluation and registration:

* the **learner** account is the runner process's ``StateClock`` (``account.LEARNER_STATES``),
  started when the run began (a cluster pod's: ``posttrain learner``'s rank 0; a resumed learner's
  sums its lives through the checkpoint); requested CPU-seconds = its wall x ``learner.resources.cpu``
  x ``learner.nodes`` (and accelerator-seconds x ``learner.resources.gpus`` x ``learner.nodes``);
  used = the process's CPU time (with ``local_ranks > 1`` every rank's);
* the **generator** accounts come from each generator's final ``GeneratorStats.snapshot()``
  (``account/engine/*``, ``account/slots/*``), which asynchronous runs' generators publish on the
  run's Redis (``posttrain.rollout.telemetry``, JSON) and synchronous GRPO returns from its own engine;
  summed over generators. Requested = each generator's serving wall x ``generator.resources.cpu``
  (synchronous GRPO's engine runs in the learner's process and pod, so it requests nothing of its own);
  used = the engine's busy seconds;
* the run's labels: tenant (``POSTTRAIN_TENANT``, set in a tenant's namespace by its ConfigMap;
  ``default`` elsewhere), technique, month.

``record_account`` checks that every role's shares add up to its wall time (within 2%), logs the
metrics (``time/<role>/<share>_s`` and ``_share``, ``cost/*``), tags the MLflow run
(``posttrain.tenant``, ``posttrain.month``, ``posttrain.account``) and logs ``account.json``,
``account.md`` (a Markdown table) and ``account.png`` (one stacked bar per role) as artifacts; it
returns the summary's rows. ``account_markdown`` and ``plot_account`` are what the KFP train steps
show in the UI (``posttrain.kfp.train``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.account import RoleAccount, RunAccount, StateClock, month_of, run_tenant
from posttrain.config import RunConfig
from posttrain.config.resources import quantity_value
from posttrain.inference.metering import ACCOUNT_LIVES, ENGINE_ACCOUNT, SLOTS_ACCOUNT
from posttrain.learner.liveness import LearnerStopped

log = logging.getLogger("posttrain.runners")

ACCOUNT_FILES = ("account.json", "account.md", "account.png")
"""What ``record_account`` writes into the run directory (and logs to MLflow)."""

RERUN_DIR = "rerun"
"""Where a re-run that trained nothing (it resumed at the final version) writes its summary and account files,
under the run directory: the run's own ``summary.md`` and ``account.*`` (the life that trained) stay as they were."""

RERUN_ROW = ("this process", "resumed at the final version and trained nothing: its account counts only its own "
                             "seconds (0 trained tokens); the run's summary.md and account files are kept")
"""The summary row of such a re-run."""


def files_dir(run_dir: Path, trained_nothing: bool) -> Path:
    """Where this process's ``summary.md`` and account files go (``run_dir``, or ``RERUN_DIR`` under it).

    ``run_dir/rerun`` for a re-run that trained nothing while the run directory already holds a ``summary.md``.
    """
    return run_dir / RERUN_DIR if trained_nothing and (run_dir / "summary.md").exists() else run_dir


def generator_accounts(stats: Sequence[Mapping[str, float]], *, cores: float, gpus: float) -> list[RoleAccount]:
    """The generators' engine and slot accounts, each summed over generators ([] without any).

    Args:
        stats: Each generator's final ``GeneratorStats.snapshot()``.
        cores: Requested CPU cores of one generator (0 when it runs in the learner's process).
        gpus: Requested accelerators of one generator.
    """
    engines, slots = [], []
    for s in stats:
        engine = RoleAccount.from_flat("generator", s, ENGINE_ACCOUNT, "engine_busy")
        if engine is not None:
            engine.requested_cpu_s, engine.requested_gpu_s = engine.wall_s * cores, engine.wall_s * gpus
            engine.processes = int(s.get(ACCOUNT_LIVES, 1))  # a restarted generator's lives, summed
            engines.append(engine)
        slot = RoleAccount.from_flat("generator_slots", s, SLOTS_ACCOUNT, "none")
        if slot is not None:
            slot.requested_cpu_s = slot.requested_gpu_s = 0.0
            slots.append(slot)
    return [a for a in (RoleAccount.summed("generator", engines), RoleAccount.summed("generator_slots", slots))
            if a is not None]


REQUESTED_LOCAL = "local"
"""``RunAccount.requested_by`` of a run outside a cluster: requested = what the machine gave the run."""

REQUESTED_CLUSTER = "cluster pod requests"
"""``RunAccount.requested_by`` in a pod: requested = the roles' ``resources`` (their pods' requests)."""


def requested_by() -> str:
    """``REQUESTED_CLUSTER`` inside a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` is set), else ``REQUESTED_LOCAL``."""
    return REQUESTED_CLUSTER if os.environ.get("KUBERNETES_SERVICE_HOST") else REQUESTED_LOCAL


def local_resources(config: RunConfig) -> tuple[float, float]:
    """``(cores, gpus)`` a local run was given.

    The CPU cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count``) and the CUDA devices
    the learner may use (0 with ``learner.device: cpu`` or where torch sees no CUDA device).
    """
    import torch

    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    gpus = float(torch.cuda.device_count()) if config.learner.device != "cpu" and torch.cuda.is_available() else 0.0
    return cores, gpus


def build_account(config: RunConfig, clock: StateClock, cpu_started: float, generator_stats: Sequence[Mapping[str, float]],
                  *, trained_tokens: float, heldout_before: float | None, heldout_after: float | None,
                  generators_in_process: bool, requested: str | None = None,
                  this_life_only: bool = False) -> RunAccount:
    """The run's account now (module docstring).

    What "requested" means depends on ``requested`` (default ``requested_by()``): with ``cluster pod requests``,
    each role's wall x its ``resources`` (cores, GPUs; a generator in the learner's process requests nothing);
    with ``local``, the learner's wall x the cores and GPUs the machine gave the run (``local_resources``) and
    nothing for the generators, which share those cores (so the run is charged once for the machine it had,
    never for cluster pod sizes it did not have).

    Args:
        config: The run config (resources, technique).
        clock: The learner process's clock.
        cpu_started: ``time.process_time()`` when ``clock`` started.
        generator_stats: The generators' final snapshots (may be empty).
        trained_tokens: Tokens trained (action tokens; supervised: target tokens).
        heldout_before: Held-out accuracy of the start model, or None.
        heldout_after: Held-out accuracy after training, or None.
        generators_in_process: The engine ran in the learner's process (synchronous GRPO): it requests nothing.
        requested: ``local`` or ``cluster pod requests``; None: ``requested_by()``.
        this_life_only: Leave out the earlier lives ``clock`` carried (``StateClock.carry``): for a process that
            logs into an MLflow run of its own (``posttrain run``: each life is a new run, so the report, which
            sums runs, counts every life once). False: every life (a learner pod that resumes its predecessor's
            MLflow run). ``trained_tokens`` must then be this life's too (``LearnerSummary.this_life``).
    """
    requested = requested or requested_by()
    learner_res, gen_res = config.learner.resources, config.generator.resources
    if requested == REQUESTED_LOCAL:
        learner_cores, learner_gpus = local_resources(config)
        cores, gpus = 0.0, 0.0
    else:
        pods = config.learner.nodes  # a cluster learner of N pods requests N x resources (rank 0's clock times them all)
        learner_cores, learner_gpus = quantity_value(learner_res.cpu) * pods, float(learner_res.gpus) * pods
        cores, gpus = (0.0, 0.0) if generators_in_process else (quantity_value(gen_res.cpu), float(gen_res.gpus))
    if this_life_only:
        shares = {k: max(0.0, v - clock.carried.get(k, 0.0)) for k, v in clock.shares().items()}
        wall = sum(shares.values())
        learner = RoleAccount("learner", wall, shares, requested_cpu_s=wall * learner_cores,
                              used_cpu_s=time.process_time() - cpu_started)
    else:
        learner = RoleAccount.from_clock("learner", clock, cores=learner_cores,
                                         used_cpu_s=time.process_time() - cpu_started + clock.carried_cpu_s)
        learner.processes = clock.lives  # a resumed learner's lives, summed (``StateClock.carry``)
    learner.requested_gpu_s = learner.wall_s * learner_gpus
    variant = ("async" if config.grpo.async_ else "sync") if config.technique == "grpo" else ""
    return RunAccount(run_tenant(), config.technique, month_of(), [learner, *generator_accounts(
        generator_stats, cores=cores, gpus=gpus)], trained_tokens=trained_tokens, heldout_before=heldout_before,
        heldout_after=heldout_after, variant=variant, requested_by=requested)


def outcome_of(error: BaseException) -> str:
    """A stopped run's outcome: ``interrupted`` when a signal stopped it, else ``failed``.

    A signal: Ctrl-C's ``KeyboardInterrupt``, or a ``LearnerStopped`` with exit status 130 (SIGINT) or 143 (SIGTERM).
    """
    if isinstance(error, KeyboardInterrupt) or getattr(error, "exit_code", None) in (130, 143):
        return "interrupted"
    return "failed"


def record_failed_account(config: RunConfig, clock: StateClock, cpu_started: float, run_dir: Path, tracker: Any,
                          error: BaseException, **known: Any) -> None:
    """Record the account of a run that raised ``error`` (``outcome``: ``outcome_of(error)``), up to now; never raises.

    A failed run spent its resources all the same, so the tenant's report must count it. What the run
    knew (``known``: ``generator_stats``, ``trained_tokens``, ``heldout_before``, ``generators_in_process``,
    and ``build_account``'s ``requested`` and ``this_life_only``) goes in; the rest is empty. A stopped
    learner's error (``LearnerStopped`` with its ``summary``: Ctrl-C, SIGTERM, no progress) says what it
    trained, as the successful path's summary does: its trained tokens (this life's with ``this_life_only``)
    and, when ``known`` has none, its generators' accounts. A failure to record is logged in one line: the
    run's own error is the one to show.
    """
    from mlflow.exceptions import MlflowException

    trained_tokens = float(known.get("trained_tokens", 0.0))
    generator_stats = known.get("generator_stats") or []
    stopped = error.summary if isinstance(error, LearnerStopped) else None
    if stopped is not None:  # the learner's counters died with it; its error carries them
        key = "action_tokens_trained"
        trained_tokens = stopped.this_life(key) if known.get("this_life_only") else float(stopped.counters.get(key, 0.0))
        generator_stats = generator_stats or stopped.generator_stats
    try:
        account = build_account(config, clock, cpu_started, generator_stats, trained_tokens=trained_tokens,
                                heldout_before=known.get("heldout_before"), heldout_after=None,
                                generators_in_process=bool(known.get("generators_in_process", False)),
                                requested=known.get("requested"), this_life_only=bool(known.get("this_life_only")))
        account.outcome = outcome_of(error)  # a Ctrl-C is not a failure, but its seconds were spent all the same
        record_account(account, run_dir, tracker)
    except (OSError, ValueError, MlflowException) as exc:  # files, a share that does not add up, the tracking server
        log.warning("the failed run's time account was not recorded (%s: %s); the run failed with %s: %s",
                    type(exc).__name__, exc, type(error).__name__, error)


def account_markdown(account: RunAccount) -> str:
    """A Markdown table of the account: one row per role and share (seconds, share of the role's wall), then costs."""
    lines = [f"### Time account: {account.technique}{f' ({account.variant})' if account.variant else ''}, "
             f"tenant {account.tenant}, {account.month}; requested: {account.requested_by}", "",
             "| role | share | seconds | share of wall |", "|---|---|---:|---:|"]
    for r in account.roles:
        unit = " (slot-s)" if r.role == "generator_slots" else ""
        fractions = r.fractions()
        for name, seconds in r.shares.items():
            lines.append(f"| {r.role}{unit} | {name} | {seconds:.1f} | {fractions[name]:.1%} |")
        lines.append(f"| {r.role}{unit} | **wall** | {r.wall_s:.1f} | 100% |")
    lines += ["", "| cost | value |", "|---|---:|"]
    lines += [f"| {k} | {v:.6g} |" for k, v in account.derived().items()]
    return "\n".join(lines) + "\n"


def plot_account(account: RunAccount, out_png: Path) -> Path:
    """One stacked horizontal bar per role (shares as fractions of its wall time), saved to ``out_png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(account.roles)))
    names = sorted({k for r in account.roles for k in r.shares})
    colours = plt.get_cmap("tab20")(range(len(names)))
    labels = [f"{r.role}\n{r.wall_s:.0f} {'slot-s' if r.role == 'generator_slots' else 's'}" for r in account.roles]
    left = [0.0] * len(account.roles)
    for name, colour in zip(names, colours, strict=True):
        widths = [r.fractions().get(name, 0.0) for r in account.roles]
        ax.barh(labels, widths, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the role's wall time")
    ax.set_title(f"time account: {account.technique}{f' ({account.variant})' if account.variant else ''}")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(account.roles) < 3 else -0.2))
    fig.tight_layout()
    fig.savefig(out_png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out_png


def record_account(account: RunAccount, run_dir: Path, tracker: Any, step: int = 0) -> list[tuple[str, str]]:
    """Check, write and log the account (module docstring); return the summary's rows.

    Args:
        account: The run's account.
        run_dir: Where ``account.json``, ``account.md`` and ``account.png`` go.
        tracker: The run's ``posttrain.tracking.Tracker``, or None (files only).
        step: The metrics' step (the final policy version).

    Raises:
        ValueError: a role's shares do not add up to its wall time within 2% (``RoleAccount.check``).
    """
    for role in account.roles:
        role.check()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "account.json").write_text(account.to_json() + "\n", encoding="utf-8")
    (run_dir / "account.md").write_text(account_markdown(account), encoding="utf-8")
    plot_account(account, run_dir / "account.png")
    if tracker is not None:
        tracker.log_metrics(account.metrics(), step=step)
        tracker.set_tags(account.tags())
        for name in ACCOUNT_FILES:
            tracker.log_artifact(run_dir / name)
    return account.lines()
