"""What every technique runner shares: preparation, the SFT warm start, the tracked run, metrics, summaries.

* ``prepare``: tokenizer and base model of a run (trained/built locally for a tiny model);
* ``warm_start``: SFT on the environment's reference episodes, rendered exactly as rollouts are;
* ``tracked_run``: the run directory and its MLflow run, yielding a ``TrackedRun`` (sink,
  registration, summary, the ranks) that the SFT, CPT, DPO and GRPO runners share;
* ``check_ranks``: a technique's batch must have a row for each learner rank;
* ``metrics_sink``: the one ``MetricsSink`` of a run (``metrics.jsonl`` and MLflow);
* ``RunSummary``: the table ``posttrain run`` prints and writes to ``summary.md``;
* the time account (issue 35): ``TrackedRun.clock`` is the learner process's clock
  (``posttrain.account.LEARNER_STATES``): ``preparing`` in ``tracked_run``, ``warm_start`` in
  ``start_model``, ``evaluating`` in ``evaluate_and_log``, ``checkpointing`` in ``step_callback``,
  ``registering`` in ``TrackedRun.register``; the runners mark ``training`` (and the RL loops their
  own states); ``TrackedRun.summary`` records it (``posttrain.runners.accounting``).

Under ``torchrun --nproc_per_node N -m posttrain.cli run CONFIG`` (SFT, CPT, DPO, synchronous
GRPO) every rank runs the runner: rank 0 prepares the tokenizer, base model and warm start first
and the others wait at a barrier, then find them on disk; every rank loads the same data, trains
its share of each batch, checkpoints and gathers the final model; only rank 0 opens the MLflow
run, writes metrics, prints, evaluates and registers (``TrackedRun.world``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from posttrain.account import LEARNER_STATES, StateClock, StateTimer
from posttrain.config import RunConfig
from posttrain.config.load import ConfigError
from posttrain.config.roles import uses_async_runtime
from posttrain.data.formats import LoadedRows, RowPolicy, load_rows
from posttrain.data.jsonl_log import read_json_lines
from posttrain.eval.heldout import evaluate_policy
from posttrain.learner.resume import ResumedPolicy
from posttrain.parallel.world import World
from posttrain.rollout.infra import causes_text, is_cause_metric
from posttrain.runners.console import RUN_LOG, engine_output_to_log, seconds_since_start
from posttrain.runtime import RunContext
from posttrain.tracking import MetricsSink

T = TypeVar("T")


def sft_reference_actions(env_name: str, task: Any) -> list[str]:
    """Assistant turns of an ideal episode for ``task`` (the SFT warm-start target).

    Raises:
        ValueError: for an environment without reference solutions.
    """
    from posttrain.envs.registry import reference_actions

    return reference_actions(env_name, task)


def build_sft_examples(ctx: RunContext, tokenizer: Any, tasks: list[Any]) -> list[Any]:
    """Render reference episodes through the agent loop's template logic into ``TokenExample``s.

    Observations come from actually stepping the environment with the reference actions, so
    multi-turn SFT data carries real tool output, tokenised exactly as rollouts are.
    """
    from posttrain.chat.format import render_sft_example
    from posttrain.learner.sft import TokenExample

    env = ctx.environment()

    async def one(task: Any) -> TokenExample:
        episode = env.start(task)
        try:
            turns: list[dict[str, str]] = list(episode.messages())
            for action in sft_reference_actions(ctx.config.data.env, task):
                turns.append({"role": "assistant", "content": action})
                result = await episode.step(action)
                if result.observation is not None and not result.done:
                    turns.append({"role": "tool", "content": result.observation})
        finally:
            episode.close()
        ids, mask = render_sft_example(tokenizer, turns)
        return TokenExample(list(ids), list(mask))

    async def all_examples() -> list[TokenExample]:
        return [await one(t) for t in tasks]

    return asyncio.run(all_examples())


def prepare(ctx: RunContext) -> None:
    """Create the tokenizer and the base model of the run (skipped when they exist)."""
    from posttrain.data.tokenizer import train_tokenizer
    from posttrain.models.hf import build_tiny_model, load_tokenizer

    cfg = ctx.config
    ctx.save_resolved_config()
    if cfg.model.path:
        if not ctx.base_model_dir.exists():
            shutil.copytree(cfg.model.path, ctx.base_model_dir)
        if not ctx.tokenizer_dir.exists():
            load_tokenizer(cfg.model.path).save_pretrained(str(ctx.tokenizer_dir))
        return
    if not (ctx.tokenizer_dir / "tokenizer.json").exists():
        env = ctx.environment()
        texts: list[str] = []
        for task in ctx.tasks("train")[:2000] + ctx.tasks("eval"):
            episode = env.start(task)
            texts.extend(m["content"] for m in episode.messages())
            episode.close()
            texts.extend(sft_reference_actions(cfg.data.env, task))
        train_tokenizer(texts, ctx.tokenizer_dir, vocab_size=cfg.model.tiny.vocab_size)
    if not (ctx.base_model_dir / "config.json").exists():
        tok = load_tokenizer(ctx.tokenizer_dir)
        t = cfg.model.tiny
        build_tiny_model(
            ctx.base_model_dir, vocab_size=len(tok), hidden_size=t.hidden_size, num_layers=t.num_layers,
            num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, intermediate_size=t.intermediate_size,
            max_position_embeddings=t.max_position_embeddings, seed=cfg.seed,
        )
        tok.save_pretrained(str(ctx.base_model_dir))


def warm_start(ctx: RunContext, sink: MetricsSink | None = None, progress: bool = False) -> Path:
    """SFT the base model on reference episodes; returns the warm-started model directory.

    ``progress`` shows tqdm's per-step bar (off by default: in a log file or a pipeline step's output
    it is a line per step); ``sink`` receives every step's ``warm_start/*`` metrics.
    """
    return sft_on_references(ctx, ctx.sft_model_dir, ctx.config.warm_start, metric_prefix="warm_start", sink=sink,
                             progress=progress)


def reference_tasks(ctx: RunContext, max_turns: int | None) -> list[Any]:
    """The train tasks whose reference episode has at most ``max_turns`` assistant turns (all when None).

    Raises:
        ValueError: no train task is left (the message names ``warm_start.max_reference_turns`` and the shortest).
    """
    tasks = ctx.tasks("train")
    if max_turns is None:
        return tasks
    kept = [t for t in tasks if len(sft_reference_actions(ctx.config.data.env, t)) <= max_turns]
    if not kept:
        shortest = min((len(sft_reference_actions(ctx.config.data.env, t)) for t in tasks), default=0)
        raise ValueError(f"warm_start.max_reference_turns: {max_turns} keeps no train task (the shortest reference "
                         f"episode has {shortest} turns)")
    return kept


def sft_on_references(ctx: RunContext, out: Path, section: Any, *, metric_prefix: str,
                      sink: MetricsSink | None = None, progress: bool = False) -> Path:
    """The base model trained by SFT on the environment's reference episodes for ``section.steps`` steps, in ``out``.

    The warm start (``warm_start``) and GKD's self-built teacher (``runners.gkd``) are both made
    this way. Skipped when ``out`` already holds a model; written into a temporary directory renamed
    into place, so a killed run never leaves a half-written model that a re-run would take as done.

    Args:
        ctx: The run (tokenizer and base model prepared).
        out: Directory to write (model and tokenizer).
        section: An ``SFTConfig`` (steps, batch size, sequence length, optimizer); 0 steps copies the base model.
        metric_prefix: ``sink`` gets each step's metrics as ``<metric_prefix>/<name>``.
        sink: Receives ``(metrics, step)``; None: not logged.
        progress: Show tqdm's per-step bar.
    """
    from posttrain.learner.sft import train_sft
    from posttrain.models.hf import load_policy, load_tokenizer

    if (out / "config.json").exists():
        return out
    tok = load_tokenizer(ctx.tokenizer_dir)
    model = load_policy(ctx.base_model_dir)
    if section.steps > 0:
        examples = build_sft_examples(ctx, tok, reference_tasks(ctx, getattr(section, "max_reference_turns", None)))

        def on_step(step: int, metrics: dict[str, float]) -> None:
            if sink is not None:
                sink({f"{metric_prefix}/{k}": v for k, v in metrics.items()}, step)

        train_sft(model, examples, section, pad_token_id=tok.pad_token_id, seed=ctx.config.seed,
                  on_step=on_step, progress=progress)
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)  # a directory without config.json: an earlier write that never finished
    tmp.rename(out)
    return out


def metrics_sink(ctx: RunContext, tracker: Any = None) -> MetricsSink:
    """A ``(metrics, step) -> None`` that appends to ``metrics.jsonl`` and logs to ``tracker``."""
    path = ctx.run_dir / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)

    def sink(metrics: dict[str, float], step: int) -> None:
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        if tracker is not None:
            tracker.log_metrics(metrics, step=step)

    return sink


def plot_reward_curve(
    metrics_path: Path, out_png: Path, heldout: dict[str, tuple[int, float]] | None = None
) -> Path:
    """Plot the training reward per policy version (raw and a moving average) into a PNG.

    Args:
        metrics_path: ``metrics.jsonl`` of the run (rows with ``reward/mean``).
        out_png: Where to write the PNG.
        heldout: Label → ``(policy_version, accuracy)`` markers, e.g. after SFT and after SAO.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in read_json_lines(metrics_path, "step") if "reward/mean" in row]
    steps, rewards = [row["step"] for row in rows], [row["reward/mean"] for row in rows]
    window = 5
    smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
              for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, marker=".", lw=0.8, alpha=0.4, label="training reward (batch mean)")
    ax.plot(steps, smooth, lw=2, label=f"moving average ({window} steps)")
    for (label, (x, y)), marker in zip((heldout or {}).items(), "os^D", strict=False):
        ax.scatter([x], [y], marker=marker, s=60, zorder=3, label=f"held-out accuracy {label}: {y:.2f}")
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward / accuracy")
    ax.set_title("SAO training")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


@dataclass
class RunSummary:
    """What ``posttrain run`` prints at the end."""

    run_dir: Path
    rows: list[tuple[str, str]] = field(default_factory=list)

    def table(self) -> str:
        """A Markdown table of the summary rows."""
        width = max(len(k) for k, _ in self.rows) if self.rows else 10
        lines = [f"| {'metric'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
        lines += [f"| {k.ljust(width)} | {v} |" for k, v in self.rows]
        return "\n".join(lines)


log = logging.getLogger("posttrain.runners")

MLFLOW_RUN_ROW = "mlflow run id"
"""Summary row naming the MLflow run of a technique run (the register step links the model to it)."""



class TechniqueConfigError(ConfigError):
    """A technique's config section misses something the run needs; the message names the field.

    A ``ConfigError`` (a ``ValueError``), so the command line reports it in one line with exit 2.
    """


def check_ranks(config: RunConfig, world: World) -> None:
    """Refuse, before anything is prepared, a batch with fewer rows than there are learner ranks.

    Every rank trains at least one row of each batch (``posttrain.parallel.shares``). SAO, GKD and
    asynchronous GRPO start their own learner ranks (``learner.local_ranks``), so ``posttrain run``
    of them is refused under torchrun.

    Raises:
        ConfigError: the message names the field (``sft.batch_size``, ``dpo.batch_size``,
            ``grpo.prompts_per_step x grpo.group_size``) or, for the asynchronous runtime, ``technique``.
    """
    if not world.distributed:
        return
    technique = config.technique
    if uses_async_runtime(config):
        raise ConfigError(f"technique: {technique}{' (grpo.async)' if technique == 'grpo' else ''} starts its own "
                          f"learner ranks: run `posttrain run CONFIG learner.local_ranks={world.size}` without torchrun "
                          f"(or `torchrun ... -m posttrain.cli learner CONFIG` beside running generators); "
                          f"`posttrain run` under torchrun trains sft, cpt, dpo and synchronous grpo")
    if technique in ("sft", "cpt"):
        field_name, rows = "sft.batch_size", config.sft.batch_size
    elif technique == "dpo":
        field_name, rows = "dpo.batch_size", config.dpo.batch_size
    else:
        field_name, rows = "grpo.prompts_per_step x grpo.group_size", config.grpo.prompts_per_step * config.grpo.group_size
    if rows < world.size:
        raise ConfigError(f"{field_name}: a batch of {rows} cannot feed {world.size} learner ranks "
                          f"(each trains at least one row); use at least {world.size} (or fewer ranks)")


def _no_sink(metrics: dict[str, float], step: int) -> None:
    """The metrics sink of ranks > 0: rank 0 writes the run's metrics."""


@dataclass
class TrackedRun:
    """What every runner shares: paths, the MLflow run, the metrics sink, the start time, the ranks.

    ``started`` is ``time.monotonic()`` when training could begin (after preparation); the summary's wall
    time counts from the process start (``console.seconds_since_start``).

    On ranks > 0 ``tracker`` is None and ``sink`` drops the metrics (rank 0 has them too: every
    metric is reduced over ranks).

    The time account (module docstring): ``clock`` and ``cpu_started`` (``time.process_time()`` when
    it started); the runner fills ``trained_tokens``, ``generator_stats`` (the generators' final
    ``GeneratorStats.snapshot()``) and ``generators_in_process``; ``evaluate_and_log`` fills
    ``heldout_before`` (label ``start``) and ``heldout_after`` (the other labels but ``teacher``).
    """

    config: RunConfig
    ctx: RunContext
    tracker: Any
    sink: MetricsSink
    started: float
    world: World = field(default_factory=World)
    clock: StateClock = field(default_factory=lambda: StateClock(LEARNER_STATES))
    cpu_started: float = field(default_factory=time.process_time)
    trained_tokens: float = 0.0
    generator_stats: list[dict[str, float]] = field(default_factory=list)
    generators_in_process: bool = False
    heldout_before: float | None = None
    heldout_after: float | None = None
    trained_nothing: bool = False

    @property
    def timer(self) -> StateTimer:
        """``with run.timer("training"): ...`` on the learner's clock."""
        return StateTimer(self.clock)

    def main_first(self, fn: Callable[[], T]) -> T:
        """``fn()`` on rank 0, then on the other ranks once it returned (they find on disk what it wrote)."""
        if self.world.is_main:
            out = fn()
            self.world.barrier()
            return out
        self.world.barrier()
        return fn()

    def register(self, model_dir: Path, data_paths: list[Path], scores: dict[str, float]) -> str:
        """Register ``model_dir`` in ``tracking.registered_model`` and promote it; return the summary's text for it.

        ``Tracker.register_model``: once per checkpoint (a re-run of a finished run registers nothing
        and says so), ``champion`` for the model's first version or one that beats the champion on
        ``heldout.accuracy`` (``scores`` must hold it). ``"not registered"`` when
        ``tracking.register_final`` is false.
        """
        if not self.config.tracking.register_final:
            return "not registered"
        cfg = self.config
        teacher = ((cfg.gkd.teacher.path or f"built by the run ({cfg.gkd.teacher.build_steps} SFT steps)")
                   if cfg.technique == "gkd" else "")
        with self.timer("registering"):
            return self.tracker.register_model(model_dir, technique=cfg.technique, scores=scores,
                                               data_paths=data_paths, teacher=teacher).describe()

    def summary(self, rows: list[tuple[str, str]]) -> RunSummary:
        """A ``RunSummary`` with the common rows and the time account appended; also written to ``<run>/summary.md``.

        The time account is recorded here (``posttrain.runners.accounting.record_account``: metrics,
        tags, ``account.json``/``.md``/``.png``). On ranks > 0 an empty summary (nothing written,
        nothing printed).

        Raises:
            ValueError: a role's time shares do not add up to its wall time within 2%.
        """
        from posttrain.runners.accounting import RERUN_ROW, build_account, files_dir, record_account

        result = RunSummary(self.ctx.run_dir)
        if not self.world.is_main:
            return result
        account = build_account(self.config, self.clock, self.cpu_started, self.generator_stats,
                                trained_tokens=self.trained_tokens,
                                heldout_before=None if self.trained_nothing else self.heldout_before,  # no gain
                                heldout_after=self.heldout_after, generators_in_process=self.generators_in_process,
                                this_life_only=True)  # each posttrain run is an MLflow run of its own
        out_dir = files_dir(self.ctx.run_dir, self.trained_nothing)  # a re-run keeps the run's own summary
        account_rows = record_account(account, out_dir, self.tracker)
        rerun = [RERUN_ROW] if out_dir != self.ctx.run_dir else []
        result.rows = [("technique", self.config.technique), *rerun, *rows, *account_rows,
                       ("final model", str(self.ctx.final_model_dir)),
                       (MLFLOW_RUN_ROW, self.tracker.run_id if self.tracker is not None else ""),
                       ("wall time (s, from the process start)", f"{seconds_since_start():.0f}")]
        (out_dir / "summary.md").write_text(result.table() + "\n", encoding="utf-8")
        return result


@contextmanager
def tracked_run(config: RunConfig) -> Iterator[TrackedRun]:
    """Open the run directory and its MLflow run (FAILED on an exception), log the resolved config.

    On an exception in the body the run's time account up to it is recorded first (``outcome: failed``:
    ``posttrain.runners.accounting.record_failed_account``), then the exception goes on.

    With several ranks (``init_world``) rank 0 does all of that and prepares the tokenizer and
    base model while the others wait; they get a ``TrackedRun`` without tracker or sink.

    Raises:
        posttrain.parallel.world.DeviceError: ``learner.device`` is ``cuda`` and there is none.
    """
    from posttrain.parallel.world import init_world
    from posttrain.tracking import Tracker

    clock, cpu_started = StateClock(LEARNER_STATES, initial="preparing"), time.process_time()
    world = init_world(config.learner)
    ctx = RunContext(config)
    if not world.is_main:
        world.barrier()  # rank 0 prepares
        clock.switch("other")
        yield TrackedRun(config, ctx, None, _no_sink, time.monotonic(), world, clock, cpu_started)
        return
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    tracker = Tracker.for_run(config, ctx.run_dir)
    with tracker:
        tracker.log_params_from_config(config)
        print(f"[1/4] prepare: tokenizer + base model in {ctx.run_dir}", flush=True)
        prepare(ctx)
        world.barrier()
        clock.switch("other")
        run = TrackedRun(config, ctx, tracker, metrics_sink(ctx, tracker), time.monotonic(), world, clock, cpu_started)
        try:
            yield run
        except (Exception, KeyboardInterrupt) as exc:  # a failed run is charged too (outcome: failed), then re-raised
            from posttrain.runners.accounting import record_failed_account

            record_failed_account(config, clock, cpu_started, ctx.run_dir, tracker, exc,
                                  generator_stats=run.generator_stats, trained_tokens=run.trained_tokens,
                                  heldout_before=run.heldout_before, generators_in_process=run.generators_in_process,
                                  this_life_only=True)
            raise


def step_callback(
    run: TrackedRun, resumed: ResumedPolicy, tokenizer: Any, every: int, total: int, tracked: str
) -> tuple[Callable[[int, dict[str, float]], None], list[float]]:
    """The ``on_step(step, metrics)`` of the supervised trainers, and the list of one metric it keeps.

    Each optimizer step's metrics go to the run's sink; every ``every`` steps and at step ``total`` a
    learner checkpoint is written (``policy_version`` = step) by every rank (its shards).
    ``tracked`` names the metric whose values the returned list collects, in step order (e.g.
    ``loss/sft``) for the run's summary.
    """
    from posttrain.learner.checkpoint import LearnerState, save_checkpoint

    values: list[float] = []

    def on_step(step: int, metrics: dict[str, float]) -> None:
        values.append(metrics[tracked])
        run.trained_tokens += metrics.get("sft/tokens", 0.0)
        run.sink(metrics, step)
        if step % every == 0 or step >= total:
            with run.timer("checkpointing"):
                save_checkpoint(run.ctx.checkpoints_dir, state=LearnerState(iteration=step, policy_version=step),
                                parts=resumed.parts, resolved_config_yaml=run.ctx.resolved_config_yaml(),
                                world=run.world)

    return on_step, values


def data_file(value: str | None, field: str) -> Path:
    """The technique's training file named by config field ``field``.

    Raises:
        TechniqueConfigError: the field is unset or names no file.
    """
    if not value:
        raise TechniqueConfigError(f"{field}: required (a JSONL file; formats in docs/data.md)")
    path = Path(value)
    if not path.is_file():
        raise TechniqueConfigError(f"{field}: {path} is not a file")
    return path


def load_training_rows(run: TrackedRun, path: Path, fmt: Literal["sft", "cpt", "dpo"], limit: int | None) -> tuple[LoadedRows[Any], RowPolicy]:
    """Validate the training file under ``data.on_bad_row``; return its rows and the policy for later bad rows.

    With several ranks call it through ``run.main_first``: rank 0 starts the quarantine file afresh
    and fills it; the other ranks find each bad row there already (quarantine writes are idempotent).
    """
    quarantine = run.ctx.run_dir / f"quarantine-{run.config.technique}.jsonl"
    if run.world.is_main:
        quarantine.unlink(missing_ok=True)
    loaded = load_rows(path, fmt, on_bad_row=run.config.data.on_bad_row, quarantine_path=quarantine, limit=limit)
    return loaded, RowPolicy(path, run.config.data.on_bad_row, quarantine)


def evaluate_and_log(run: TrackedRun, model_dir: Path, label: str) -> dict[str, float]:
    """Held-out accuracy of ``model_dir`` (``posttrain.eval.heldout``), logged to MLflow as ``eval_<label>/*``.

    The inference engine's own output (vLLM's start-up report and progress bars) goes to the run log,
    ``<run>/logs/run.log``, as in the SAO flow.
    """
    with run.timer("evaluating"), engine_output_to_log(run.ctx.run_dir / RUN_LOG):
        scores = evaluate_policy(run.ctx, model_dir)
    run.tracker.log_metrics({f"eval_{label}/{k}": v for k, v in scores.items()}, step=0)
    if label == "start":
        run.heldout_before = scores["accuracy"]
    elif label != "teacher":
        run.heldout_after = scores["accuracy"]
    return scores


def start_model(run: TrackedRun) -> Path:
    """The SFT warm start when ``warm_start.steps > 0``, else the base model.

    With several ranks rank 0 warm-starts (one process, unsharded) while the others wait.
    """
    if run.config.warm_start.steps > 0:
        if run.world.is_main:
            print(f"      SFT warm start ({run.config.warm_start.steps} steps)", flush=True)
        with run.timer("warm_start"):
            return run.main_first(lambda: warm_start(run.ctx, run.sink))
    return run.ctx.base_model_dir


def reward_curve(metrics_path: Path) -> list[float]:
    """``reward/mean`` of every learner step in ``metrics.jsonl`` (in order); [] when there is no file.

    Raises:
        ValueError: a line that is not a JSON object with ``step`` (``read_json_lines``).
    """
    if not metrics_path.exists():
        return []
    return [float(row["reward/mean"]) for row in read_json_lines(metrics_path, "step") if "reward/mean" in row]


def infra_row(counters: dict[str, float]) -> str:
    """The summary's infrastructure-failure entry from the ``infra/*`` counters (``posttrain.rollout.infra.infra_metrics``).

    ``0``, or ``3 (grader_killed 1, tool_killed 2); 3 re-issued, 0 given up``, and ``, 1 left to its client
    (gateway)`` when external agents closed episodes with ``infra_error``. SAO, asynchronous and synchronous
    GRPO and GKD print it.
    """
    total = counters.get("infra/errors", 0.0)
    if not total:
        return "0"
    causes = causes_text({k[len("infra/"):]: v for k, v in counters.items() if is_cause_metric(k)})
    client = counters.get("infra/left_to_client", 0.0)
    return (f"{total:.0f} ({causes}); {counters.get('infra/reissued', 0.0):.0f} re-issued, "
            f"{counters.get('infra/abandoned', 0.0):.0f} given up"
            + (f", {client:.0f} left to its client (gateway)" if client else ""))
