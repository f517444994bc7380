"""The ``posttrain`` command.

    posttrain run CONFIG [key=value ...]          the whole flow of a run (prepare, warm start, train, eval, register;
                                                  sft, cpt, dpo and sync grpo under torchrun --nproc_per_node N
                                                  train on N sharded ranks)
    posttrain generator CONFIG [key=value ...]    one generator process (needs REDIS_URL)
    posttrain learner CONFIG [key=value ...]      the learner (needs REDIS_URL; resumes from checkpoints;
                                                  under torchrun --nproc_per_node N, N sharded ranks)
    posttrain gateway CONFIG [key=value ...]      the rollout gateway: an OpenAI-compatible server whose episodes
                                                  train with SAO (needs REDIS_URL and the run's token; docs/gateway.md)
    posttrain traces import FILE --out OUT        recorded conversations with rewards -> SFT rows with provenance
    posttrain validate-config CONFIG [key=value ...]
    posttrain eval --benchmark NAME --model DIR ...
    posttrain models list|show|promote ...
    posttrain tenant render NAME --gpu-quota N ...

A bad config prints one line naming the field and the allowed values, and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posttrain.config import ConfigError, RunConfig, load_config
from posttrain.data.tasks import DatasetError
from posttrain.records import RecordError


def _config(args: argparse.Namespace) -> RunConfig:
    """Load the run config from a path or ``s3://`` URI; ``REDIS_KEY_PREFIX`` (a tenant's) applies first."""
    source = args.config_opt or args.config
    if not source:
        raise ConfigError("config: give a YAML path (positional) or --config PATH_OR_S3_URI")
    overrides = list(args.overrides)
    if args.config_opt and args.config:  # with --config the first override lands in the positional slot
        if "=" not in args.config:
            raise ConfigError(f"config: two configs given ({args.config} and --config {args.config_opt}); give one")
        overrides.insert(0, args.config)
    if os.environ.get("REDIS_KEY_PREFIX"):
        overrides.insert(0, f"queue.key_prefix={os.environ['REDIS_KEY_PREFIX']}")
    if source.startswith("s3://"):
        import tempfile
        from pathlib import Path

        from posttrain.storage import storage_for

        local = Path(tempfile.mkdtemp(prefix="posttrain-config-")) / "config.yaml"
        local.write_bytes(storage_for(source).read_bytes(source))
        source = str(local)
    return load_config(source, overrides)


def _cmd_validate(args: argparse.Namespace) -> int:
    from posttrain.runtime import check_input_files

    cfg = _config(args)
    # The input-file half of posttrain run's preflight (runners.preflight): a missing file or a bad row is the
    # same one line here as there. The model and output checks stay with run: they need the run's machine.
    check_input_files(cfg)
    print(f"{args.config_opt or args.config}: ok (technique={cfg.technique}, run_name={cfg.run_name}, "
          f"env={cfg.data.env})")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.runners import preflight, run
    from posttrain.runners.console import route_logs

    cfg = _config(args)
    preflight(cfg)  # bad inputs are one line each, before the log file (and so the run directory) is made
    log_path = route_logs(Path(cfg.output_dir) / cfg.run_name, verbose=args.verbose)
    _EXIT_LOG[:] = [log_path]
    if os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 speaks for the run
        print(f"posttrain run: {cfg.technique}, seed {cfg.seed}; library and engine messages go to {log_path}",
              flush=True)
    summary = run(cfg)
    if summary.rows:  # ranks > 0 of a torchrun run report nothing; rank 0 prints the table
        print(summary.table())
    return 0


def _redis_url_from_env() -> str:
    url = os.environ.get("REDIS_URL")
    if not url:
        raise ConfigError("REDIS_URL: not set; a single role needs the run's Redis (posttrain run starts one)")
    from posttrain.config.sections import redis_url_problem

    problem = redis_url_problem(url)
    if problem:
        raise ConfigError(f"REDIS_URL: {problem}")
    return url


def _check_redis_first(url: str, window_s: float) -> None:
    """PING the role's Redis (retrying over ``window_s``) before any slow work; one line naming the URL if it fails."""
    from posttrain.rollout.redis_streams import check_reachable, connect

    client = connect(url, reconnect_window_s=window_s)
    try:
        check_reachable(client, url, window_s)
    finally:
        client.close()


@contextlib.contextmanager
def _redis_named(url: str, window_s: float) -> Iterator[None]:
    """Turn a Redis that stopped answering into one ``RedisUnreachableError`` line naming the (redacted) URL."""
    import redis

    from posttrain.rollout.queue import QueueConnectionError, RedisUnreachableError
    from posttrain.rollout.redis_streams import unreachable_message

    try:
        yield
    except RedisUnreachableError:
        raise
    except (QueueConnectionError, redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnreachableError(unreachable_message(url, window_s, exc)) from None


def _cmd_generator(args: argparse.Namespace) -> int:
    from posttrain.cluster.role_inputs import generator_ready
    from posttrain.generator.seeds import generator_identity
    from posttrain.generator.worker import run_generator

    redis_url = _redis_url_from_env()  # a missing or malformed REDIS_URL is one line before any work
    cfg = _config(args)
    _check_redis_first(redis_url, cfg.queue.reconnect_window_s)  # unreachable: one line before any wait for inputs
    cfg = generator_ready(cfg)  # cluster pods: s3:// inputs downloaded, tokenizer from the weight store
    from posttrain.runners.console import RUN_LOG
    from posttrain.runtime import RunContext

    _EXIT_LOG[:] = [RunContext(cfg).run_dir / RUN_LOG]
    try:
        index, generator_id, seed = generator_identity(cfg.seed, args.generator_index, args.generator_id, args.seed)
    except ValueError as exc:
        raise ConfigError(f"--generator-index: {exc}") from None
    with _redis_named(redis_url, cfg.queue.reconnect_window_s):
        summary = run_generator(cfg, generator_id, redis_url, seed=seed, index=index)
    print(f"generator {summary.generator_id}: {summary.stats['rollouts']:.0f} rollouts, "
          f"busy fraction {summary.stats['busy_fraction']:.2f}")
    return 0


def _cmd_gateway(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.cluster.role_inputs import generator_ready
    from posttrain.generator.gateway.serve import GatewayBindError, gateway_token, listen_socket, run_gateway

    redis_url = _redis_url_from_env()
    cfg = _config(args)
    token = gateway_token(cfg)  # a missing token, a taken port, an unreachable Redis: one line before any wait
    try:
        sock = listen_socket(args.host or cfg.gateway.host, cfg.gateway.port if args.port is None else args.port)
    except GatewayBindError as exc:
        print(f"posttrain: {exc}", file=sys.stderr)
        return 1
    try:
        _check_redis_first(redis_url, cfg.queue.reconnect_window_s)
        cfg = generator_ready(cfg)  # cluster pods: s3:// inputs downloaded, tokenizer from the weight store
        with _redis_named(redis_url, cfg.queue.reconnect_window_s):
            summary = run_gateway(cfg, args.gateway_id, redis_url, token,
                                  seed=cfg.seed * 1000 + 999 if args.seed is None else args.seed, sock=sock,
                                  url_file=Path(args.url_file) if args.url_file else None)
    finally:
        sock.close()
    s = summary.stats
    print(f"gateway {summary.gateway_id}: {s['episodes_closed']:.0f} episodes closed, {s['rollouts']:.0f} rollouts, "
          f"{s['abandoned']:.0f} abandoned, {s['splits']:.0f} splits")
    return 0


def _learner_inputs(cfg: Any, start_model: str | None, world: Any) -> tuple[Any, Any, Any]:
    """Localized config, run context and start model, prepared once per node before any rank reads them.

    Rank 0 prepares first (downloads, tokenizer, warm start, mirror); then the first rank of each
    other node (a node with its own disk finds the mirrored start model, or warm-starts alike from
    the same seed); then the remaining ranks, which find everything in place.
    """
    from pathlib import Path

    from posttrain.cluster.role_inputs import learner_start_model, localize_inputs
    from posttrain.runtime import RunContext

    def prepare() -> tuple[Any, Any, Any]:
        localized = localize_inputs(cfg)  # cluster pods: s3:// task files and model downloaded
        ctx = RunContext(localized)
        return localized, ctx, Path(start_model) if start_model else learner_start_model(ctx)

    out = prepare() if world.is_main else None
    world.barrier()
    if out is None and world.local_rank == 0:
        out = prepare()
    world.barrier()
    return out if out is not None else prepare()


def _cmd_learner(args: argparse.Namespace) -> int:
    from posttrain.account import LEARNER_STATES, StateClock
    from posttrain.config.roles import samples_on_policy
    from posttrain.learner.loop import run_learner
    from posttrain.learner.setup import redis_transport
    from posttrain.parallel.world import init_world, shutdown_world
    from posttrain.runners.common import metrics_sink
    from posttrain.services.embedded_redis import EMBEDDED_REDIS_ENV

    clock, cpu_started = StateClock(LEARNER_STATES, initial="preparing"), time.process_time()
    cfg = _config(args)
    world = init_world(cfg.learner)  # torchrun: one process per rank, FSDP2 over them
    stream = samples_on_policy(cfg)  # GKD at gkd.lmbda 0 trains on fixed sequences only: no Redis at all
    try:
        # Rank 0's REDIS_URL, missing, malformed or unreachable: one line before the model is prepared.
        redis_url = _redis_url_from_env() if world.is_main and stream else ""
        if world.is_main and stream:
            _check_redis_first(redis_url, cfg.queue.reconnect_window_s)
        cfg, ctx, start = _learner_inputs(cfg, args.start_model, world)
        # Cluster pods get MLFLOW_TRACKING_URI from the tenant ConfigMap: metrics go to MLflow, into
        # the same run after a restart. Without a tracking URI they go to <run dir>/metrics.jsonl only.
        tracker = None
        if world.is_main and (cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
            from posttrain.tracking import Tracker

            tracker = Tracker.for_learner(cfg)
        with _redis_named(redis_url, cfg.queue.reconnect_window_s):
            transport = (redis_transport(cfg, redis_url, starts_empty=os.environ.get(EMBEDDED_REDIS_ENV) == "1")
                         if world.is_main and stream else None)
        clock.switch("other")
        with (tracker if tracker is not None else contextlib.nullcontext(),
              _redis_named(redis_url, cfg.queue.reconnect_window_s)):
            try:
                summary = run_learner(
                    cfg, transport, start_model_dir=start, sink=metrics_sink(ctx, tracker) if world.is_main else None,
                    max_iterations=args.max_iterations, world=world, clock=clock,
                )
            except BaseException as exc:
                if world.is_main:
                    _learner_account(cfg, ctx, clock, cpu_started, tracker, redis_url if stream else "", None, exc)
                raise
            if world.is_main:
                _learner_account(cfg, ctx, clock, cpu_started, tracker, redis_url if stream else "", summary, None)
    finally:
        shutdown_world()
    if world.is_main:
        print(f"learner: policy version {summary.policy_version}, {summary.counters['rollouts_trained']:.0f} "
              f"rollouts trained on {world.size} rank(s)")
    return 0


def _learner_account(cfg: Any, ctx: Any, clock: Any, cpu_started: float, tracker: Any, redis_url: str,
                     summary: Any, error: BaseException | None) -> None:
    """Rank 0 of ``posttrain learner``: record the learner's time account (issue 35), or hand it to a local parent.

    Under a local run's torchrun (``LEARNER_ACCOUNT_FILE_ENV`` set) the clock's account goes to that
    JSON file and the parent folds it into the run's account; a stopped learner's (``LearnerStopped``:
    Ctrl-C, SIGTERM, no progress) adds ``stopped`` (its message and exit status), since torchrun exits 1
    whatever its ranks' status. Otherwise (a cluster pod) the role's
    account is recorded like a local run's (``runners.accounting.record_account``: MLflow metrics,
    tags, ``account.json``/``.md``/``.png``), with the generators' accounts from their latest
    snapshots in the run's telemetry hash (they are still serving: each as of its last snapshot).
    ``error``: the learner raised it; the account up to now is recorded as ``failed``. Nothing here
    raises: the learner's own error is the one to show, and a finished learner that failed to record
    its account says so in one line on stderr (the training itself is done).
    """
    from posttrain.account import LEARNER_ACCOUNT_FILE_ENV
    from posttrain.runners.accounting import (
        REQUESTED_CLUSTER,
        build_account,
        record_account,
        record_failed_account,
    )

    handoff = os.environ.get(LEARNER_ACCOUNT_FILE_ENV, "")
    if handoff:
        record = {**clock.record(), "carried": dict(clock.carried), "carried_cpu_s": clock.carried_cpu_s}
        if isinstance(error, _stopped_error()):  # checkpointed first: the parent charges what its checkpoint holds
            record["stopped"] = {"message": str(error), "exit_code": int(getattr(error, "exit_code", 1))}
        with contextlib.suppress(OSError):  # the parent then counts the ranks' time as "other"
            Path(handoff).write_text(json.dumps(record), encoding="utf-8")
        return
    stats = _final_generator_stats(cfg, ctx, redis_url)
    if error is not None:
        record_failed_account(cfg, clock, cpu_started, ctx.run_dir, tracker, error, generator_stats=stats,
                              requested=REQUESTED_CLUSTER)
        return
    from mlflow.exceptions import MlflowException

    account = build_account(cfg, clock, cpu_started, stats,
                            trained_tokens=summary.counters.get("action_tokens_trained", 0.0),
                            heldout_before=None, heldout_after=None, generators_in_process=False,
                            requested=REQUESTED_CLUSTER)  # a JobSet's learner pod: its lives share one MLflow run
    try:
        rows = record_account(account, ctx.run_dir, tracker, step=summary.policy_version)
    except (OSError, ValueError, MlflowException) as exc:
        # The training is done and checkpointed: a pod that failed now would only be restarted to
        # record it again. One line says what is missing.
        print(f"posttrain: the learner's time account was not recorded ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return
    for label, value in rows:
        print(f"{label}: {value}")


def _final_generator_stats(cfg: Any, ctx: Any, redis_url: str) -> list[dict[str, float]]:
    """The generators' latest snapshots with a time account ([] without Redis or when it is unreachable)."""
    import redis

    from posttrain.rollout.redis_streams import connect
    from posttrain.rollout.telemetry import read_generator_stats

    if not redis_url:
        return []
    try:
        stats = read_generator_stats(connect(redis_url, reconnect_window_s=cfg.queue.reconnect_window_s), ctx.keys)
    except (redis.ConnectionError, redis.TimeoutError, ValueError) as exc:
        print(f"posttrain: the generators' time accounts were not read ({type(exc).__name__}: {exc})", file=sys.stderr)
        return []
    from posttrain.runners.gateway import (
        GATEWAY_ID,  # the gateway's engine serves agents: not a generator's account
    )

    return [s for name, s in sorted(stats.items()) if "account/engine/wall_s" in s and name != GATEWAY_ID]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``posttrain`` command."""
    parser = argparse.ArgumentParser(prog="posttrain", description="LLM post-training: SFT, DPO, GRPO, SAO, GKD.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", nargs="?", help="YAML run config")
        p.add_argument("--config", dest="config_opt", default=None, help="YAML run config path or s3:// URI")
        p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. sao.steps=10")

    p = sub.add_parser("run", help="run the whole flow of a config")
    with_config(p)
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("validate-config", help="check a config and exit")
    with_config(p)
    p.set_defaults(func=_cmd_validate)
    p = sub.add_parser("generator", help="run one generator process (REDIS_URL)")
    with_config(p)
    p.add_argument("--generator-index", type=int, default=None,
                   help="this generator's index in the run, 0..1023 (a cluster pod's JobSet job index); it names "
                        "the generator g<INDEX>, seeds it with seed*1000+INDEX and keeps its episode seeds apart "
                        "from every other generator's (default: N of --generator-id gN, else 0)")
    p.add_argument("--generator-id", default=None, help="name in rollouts and stats (default: g<INDEX>)")
    p.add_argument("--seed", type=int, default=None,
                   help="engine and task-order seed (default: the config's seed * 1000 + INDEX)")
    p.set_defaults(func=_cmd_generator)
    p = sub.add_parser("learner", help="run the learner process (REDIS_URL); resumes from the latest checkpoint")
    with_config(p)
    p.add_argument("--start-model", default=None,
                   help="policy to start from (default: <run>/sft_model, prepared and warm-started when absent)")
    p.add_argument("--max-iterations", type=int, default=None, help="stop after N iterations (testing)")
    p.set_defaults(func=_cmd_learner)
    p = sub.add_parser("gateway", help="run the rollout gateway (REDIS_URL and the run's token; docs/gateway.md)")
    with_config(p)
    p.add_argument("--gateway-id", default="gw0", help="name in rollouts, stats and the heartbeat (default gw0)")
    p.add_argument("--host", default=None, help="listen address (default: gateway.host)")
    p.add_argument("--port", type=int, default=None, help="TCP port, 0 for a free one (default: gateway.port)")
    p.add_argument("--url-file", default=None, help="write http://HOST:PORT here once listening")
    p.add_argument("--seed", type=int, default=None, help="engine seed (default: the config's seed * 1000 + 999)")
    p.set_defaults(func=_cmd_gateway)
    for name, text in (
        ("eval", "evaluate a model on a benchmark"),
        ("models", "list, show and promote registered models"),
        ("tenant", "render a team's Kueue, RBAC and storage objects"),
        ("schedule", "create or update a recurring retraining run"),
        ("traces", "import recorded conversations with rewards as SFT rows"),
        ("cost", "a tenant's cost report: CPU/GPU-seconds by technique and month (MLflow or Kueue)"),
    ):
        sub.add_parser(name, help=text, add_help=False)  # listed in --help; main() dispatches them
    return parser


DELEGATED = {
    "eval": ("posttrain.eval.cli", "eval_cli", None),
    "models": ("posttrain.eval.cli", "models_cli", None),
    "tenant": ("posttrain.cluster.tenant", "tenant_cli", "render"),
    "schedule": ("posttrain.cluster.schedule", "schedule_cli", None),
    "traces": ("posttrain.data.traces", "traces_cli", "import"),
    "cost": ("posttrain.cluster.workload_cost", "cost_cli", "report"),
}
"""Sub-commands with their own argument parsers: ``posttrain NAME [VERB] ARGS`` calls ``func(ARGS)``;
where a verb is given (``posttrain tenant render ...``) it is required."""


def _learner_errors() -> tuple[type[Exception], ...]:
    """Errors of the learner's placement, resume and training that deserve one line (imported only when one is raised)."""
    from posttrain.learner.checkpoint import CheckpointError
    from posttrain.learner.optim import NonFiniteGradientError
    from posttrain.parallel.world import DeviceError

    return (DeviceError, CheckpointError, NonFiniteGradientError)


def _stopped_error() -> type[BaseException]:
    """The learner's early stop after a final checkpoint (SIGTERM, no progress, no live generator)."""
    from posttrain.learner.liveness import LearnerStopped

    return LearnerStopped


def _outage_errors() -> tuple[type[BaseException], ...]:
    """Errors of an unreachable Redis or weight store that deserve one line (the message names the URL or operation)."""
    import redis

    from posttrain.rollout.queue import QueueConnectionError
    from posttrain.weight_sync.timed import WeightStoreTimeout

    return (QueueConnectionError, redis.ConnectionError, redis.TimeoutError, WeightStoreTimeout, PermissionError)


def _refused_error() -> type[BaseException]:
    """An evaluation that refused to report an accuracy (too many samples failed for the infrastructure)."""
    from posttrain.eval.infra import AccuracyRefused

    return AccuracyRefused


class Terminated(Exception):
    """SIGTERM arrived where nothing stops gracefully (``run_with_one_line_errors(..., sigterm=True)``); status 143."""


def one_line_error(exc: BaseException) -> tuple[str, int] | None:
    """The one line and the exit status for an error of the project that deserves one, else None (a bug: traceback).

    * ``ConfigError`` (``config error: ...``), ``FileNotFoundError`` (``file not found: ...``), a bad dataset row
      or record (file:line:field), the learner's placement, checkpoint and non-finite-gradient errors: status 2;
    * ``LearnerStopped`` (SIGTERM, Ctrl-C, no progress, no live generator; the learner checkpointed first): its
      own status (143 for SIGTERM, 130 for Ctrl-C, else 1); ``Terminated``: 143;
    * an unreachable Redis or weight store (the message names the URL or operation): status 1;
    * an evaluation that refused its accuracy (``AccuracyRefused``: too many samples failed for the
      infrastructure): status 1.

    Args:
        exc: The error.

    Returns:
        ``(line, status)``: the line without the program's name in front; None for any other error.
    """
    if isinstance(exc, ConfigError):
        return f"config error: {exc}", 2
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc}", 2
    if isinstance(exc, DatasetError | RecordError):
        # A bad dataset row names file:line:field; a bad record names the field.
        return str(exc), 2
    if isinstance(exc, Terminated):
        return str(exc), 143
    if isinstance(exc, _learner_errors()):
        # learner.device: cuda where there is none; a checkpoint of another model shape or missing shards;
        # too many non-finite gradient norms in a row.
        return str(exc), 2
    if isinstance(exc, _stopped_error()):
        # SIGTERM (143), Ctrl-C (130), no progress or no live generator (1): the learner checkpointed first.
        return str(exc), int(getattr(exc, "exit_code", 1))
    if isinstance(exc, _outage_errors()):
        # Redis gone past queue.reconnect_window_s; a weight store that hangs or cannot be read.
        return str(exc), 1
    if isinstance(exc, _refused_error()):
        # More than eval.max_infra_error_share of an evaluation's samples failed for the infrastructure.
        return str(exc), 1
    return None


def run_with_one_line_errors(
    prog: str, fn: Callable[[], int], *, sigterm: bool = False, interrupted_hint: str = ""
) -> int:
    """Call ``fn`` and return its exit status; an error ``one_line_error`` knows ends it with ``prog: line`` instead.

    The line goes to stderr; any other error propagates with its traceback (a bug). The ``posttrain`` command
    and every benchmark entry point (``bench/*.py``) end through this.

    Args:
        prog: The program's name, in front of the line (``posttrain``, ``bench.async_vs_sync``).
        fn: The command; returns its exit status.
        sigterm: Also end on SIGTERM with one line and status 143 (``Terminated``), where nothing installed its
            own handler (the learner's checkpoints first, then ends with ``LearnerStopped``, and puts this one
            back). Only in the main thread.
        interrupted_hint: What the line after a Ctrl-C adds (how to resume). A Ctrl-C inside the learner's loop
            checkpoints first and ends with ``LearnerStopped`` (status 130); anywhere else ``KeyboardInterrupt``
            ends ``fn`` with ``prog: interrupted (Ctrl-C)<hint>`` and status 130.
    """
    previous = None
    if sigterm and threading.current_thread() is threading.main_thread():
        def terminated(signum: int, frame: object) -> None:
            raise Terminated("SIGTERM received; stopped")

        previous = signal.signal(signal.SIGTERM, terminated)
    try:
        return int(fn())
    except Exception as exc:
        known = one_line_error(exc)
        if known is None:
            raise
        line, status = known
        print(f"{prog}: {line}", file=sys.stderr, flush=True)
        return status
    except KeyboardInterrupt:
        # Ctrl-C outside the learner's loop: during preparation, the warm start or an evaluation. Their results
        # are written whole or not at all.
        print(f"{prog}: interrupted (Ctrl-C){interrupted_hint}", file=sys.stderr, flush=True)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def eval_output_to_log(out_dir: Any) -> Iterator[Any]:
    """``posttrain eval``'s library and engine output to ``<out>/logs/run.log`` while it evaluates (``eval_cli``).

    As ``posttrain run`` does (``posttrain.runners.console``): the console keeps the report's line, errors
    and posttrain's warnings; vLLM's start-up report and progress bars go to the file, named first.
    """
    from pathlib import Path

    from posttrain.runners.console import engine_output_to_log, route_logs

    path = route_logs(Path(out_dir))
    print(f"posttrain eval: library and engine messages go to {path}", flush=True)
    with engine_output_to_log(path):
        yield path


RESUME_HINT = {"run": "; run the same command again to resume", "learner": "; run it again to resume"}
"""What ``posttrain COMMAND`` adds to its one line after a Ctrl-C."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``posttrain`` console script; returns the exit status.

    Called as the console script (``argv`` None: the process exits next) by ``run`` or ``generator``, it
    ends with ``_quick_exit``.
    """
    try:
        return _main(argv)
    finally:
        if argv is None and _EXIT_LOG:
            _quick_exit(_EXIT_LOG[0])


_EXIT_LOG: list[Any] = []
"""The log file of a ``run`` or ``generator`` process (set by the command), where its exit's own output goes."""


def _quick_exit(log_path: Any) -> None:
    """Make the interpreter's exit fast: freeze the garbage collector's heap, send what the exit prints to the log.

    Torch, transformers and MLflow leave millions of objects, and the collection passes over them while the
    interpreter tears its modules down took 4-8 s on a loaded 2-core machine after every run, every generator
    and every Ctrl-C (0.4 s with the heap frozen, ``gc.freeze``). Exit handlers, stream flushes and module
    teardown still run. Native extensions then report the objects they still see at their teardown (triton's
    nanobind lists hundreds of "leaked" types), so file descriptors 1 and 2 point at the log file first: the
    console keeps the run's last line. A run refused before any work has no log directory: nothing is created
    for it, and its exit's lines stay on the console.
    """
    from pathlib import Path

    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    if not Path(log_path).parent.is_dir():
        return  # a run refused before any work made no run directory, and its exit must not make one
    try:
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
    except OSError:
        pass  # no log to write to (a read-only run directory): the exit's lines stay on the console


def _main(argv: list[str] | None) -> int:
    """``main`` (the command's work)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        # Hand the rest over untouched (argparse's REMAINDER refuses a leading --option).
        import importlib

        module, func, verb = DELEGATED[argv[0]]
        rest = argv[1:]
        if verb is not None:
            if rest and rest[0] in ("-h", "--help"):
                print(f"usage: posttrain {argv[0]} {verb} ... (posttrain {argv[0]} {verb} -h: its options)")
                return 0
            if not rest or rest[0] != verb:
                got = repr(rest[0]) if rest else "nothing"
                print(f"posttrain {argv[0]}: expected the sub-command {verb!r}, got {got} "
                      f"(usage: posttrain {argv[0]} {verb} -h)", file=sys.stderr)
                return 2
            rest = rest[1:]
        if argv[0] == "eval":
            from posttrain.eval.cli import eval_cli

            return eval_cli(rest, output_to_log=eval_output_to_log)
        return int(getattr(importlib.import_module(module), func)(rest))
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if not args.verbose:
        # Load reports and weight-loading progress bars of transformers drown the run's own output.
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # vLLM's per-engine INFO lines (about 80 per engine start) bury the run's steps; its
        # warnings stay. Read when vllm is imported, so it must be set before.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_with_one_line_errors("posttrain", lambda: args.func(args),
                                    interrupted_hint=RESUME_HINT.get(args.command, ""))


if __name__ == "__main__":
    raise SystemExit(main())
