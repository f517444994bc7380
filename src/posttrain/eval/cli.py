"""Command-line front ends of evaluation and the model registry, mounted by ``posttrain.cli``.

* ``eval_cli(argv)``: ``posttrain eval --benchmark NAME --model DIR [--limit N] [--k K]
  [--engine auto|vllm|hf] [--backend local|kubernetes] [--out DIR] [--baseline REPORT.json]
  [--judge-url URL --judge-model NAME]``; writes ``report.json``, ``report.md``, ``report.html``
  (and ``comparison.png`` with a baseline) to ``--out``.
* ``models_cli(argv)``: ``posttrain models [--tracking-uri URI] list | show NAME [--version V |
  --alias A] | promote NAME --version V --metric M [--margin X] [--lower-is-better] [--force] |
  register SOURCE --name NAME --run R --technique T --dataset-hash H --config-hash H
  --base-model B [--score BENCH.METRIC=VALUE ...]``.

Both return a process exit code: 0 success, 1 a failure explained in one ``error:`` line on
stderr, 2 a usage error (argparse's message).

Run: ``python -m posttrain.eval.cli eval --help`` or ``python -m posttrain.eval.cli models list``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import msgspec


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage/help; turn its exit into a return code
        return int(exc.code or 0)


def _error(message: object) -> int:
    text = " ".join(str(message).split())
    print(f"error: {text}", file=sys.stderr)
    return 1


def eval_parser() -> argparse.ArgumentParser:
    """The ``posttrain eval`` argument parser."""
    from posttrain.eval.benchmarks import BENCHMARKS

    p = argparse.ArgumentParser(prog="posttrain eval", description="Evaluate a model on a registered benchmark.")
    p.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS), help="benchmark name")
    p.add_argument("--model", required=True, help="model directory or s3:// URI (transformers checkpoint)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N tasks")
    p.add_argument("--k", type=int, default=1, help="samples per task (avg@k, pass@k)")
    p.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto", help="generator engine")
    p.add_argument("--backend", choices=["local", "kubernetes"], default="local", help="SWE test runner")
    p.add_argument("--out", default="eval_out", help="output directory for the reports")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 0.6 for k>1, else 0)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per response (default: the benchmark's)")
    p.add_argument("--baseline", default=None, help="report.json of the base model, for the comparison table and plot")
    p.add_argument("--judge-url", default=None, help="OpenAI-compatible /v1 URL of a judge model for 'needs judge' answers")
    p.add_argument("--judge-model", default=None, help="model name for the judge endpoint")
    p.add_argument("--namespace", default="default", help="Kubernetes namespace for --backend kubernetes")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--infra-retries", type=int, default=2,
                   help="runs again of a sample whose episode or grading failed for the infrastructure (same seed)")
    p.add_argument("--max-infra-share", type=float, default=0.1,
                   help="most samples left out for the infrastructure (share) with which an accuracy is reported")
    return p


def eval_cli(argv: list[str] | None = None,
             output_to_log: Callable[[Path], AbstractContextManager[Path]] | None = None) -> int:
    """``posttrain eval``: evaluate, write JSON/Markdown/HTML reports, print the headline score.

    Args:
        argv: The arguments after ``eval``.
        output_to_log: Given ``--out``, a context manager that sends library and engine output (vLLM's
            start-up report and progress bars) to a log file while the evaluation runs and yields the
            file's path; ``posttrain eval`` passes ``posttrain.cli.eval_output_to_log``. None: everything
            on the console.

    Returns:
        0 on success, 1 on a failure (one ``error:`` line), 2 on a usage error. Arguments, the baseline and
        a local ``--model`` directory are checked before ``--out`` is created: a refusal writes nothing.
    """
    args = _parse(eval_parser(), list(sys.argv[1:] if argv is None else argv))
    if isinstance(args, int):
        return args
    if args.limit is not None and args.limit < 1:
        return _error(f"--limit must be >= 1, got {args.limit}")
    if args.k < 1:
        return _error(f"--k must be >= 1, got {args.k}")
    if args.infra_retries < 0 or not 0.0 <= args.max_infra_share <= 1.0:
        return _error(f"--infra-retries must be >= 0 and --max-infra-share in [0, 1], got {args.infra_retries} and "
                      f"{args.max_infra_share}")
    if bool(args.judge_url) != bool(args.judge_model):
        return _error("--judge-url and --judge-model must be given together")
    from posttrain.storage import is_s3_uri

    if not is_s3_uri(args.model):  # before --out is created (its logs/ too): a refused model leaves nothing behind
        from posttrain.runtime import check_model_dir

        try:
            check_model_dir(args.model, field="--model")
        except FileNotFoundError as exc:
            return _error(exc)
    from posttrain.envs.math.verifier_pool import VerifierError
    from posttrain.eval.grading import JudgeClient
    from posttrain.eval.report import read_report
    from posttrain.eval.report_render import write_reports
    from posttrain.eval.runner import EvalError, evaluate
    from posttrain.eval.swe.instances import SweGradingError

    baseline = None
    if args.baseline:
        try:
            baseline = read_report(Path(args.baseline))
        except (OSError, ValueError) as exc:
            return _error(f"--baseline {args.baseline}: cannot read an eval report ({exc})")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        return _error(f"--out {args.out}: exists and is not a directory")
    quiet = output_to_log(Path(args.out)) if output_to_log is not None else contextlib.nullcontext(None)
    try:
        judge = JudgeClient(args.judge_url, args.judge_model) if args.judge_url else None
        with quiet:
            report = evaluate(
                args.model,
                args.benchmark,
                engine_kind=args.engine,
                limit=args.limit,
                samples_per_task=args.k,
                out_dir=Path(args.out),
                temperature=args.temperature,
                max_new_tokens=args.max_new_tokens,
                judge=judge,
                swe_backend=args.backend,
                namespace=args.namespace,
                seed=args.seed,
                infra_retries=args.infra_retries,
                max_infra_error_share=args.max_infra_share,
            )
        paths = write_reports([report], Path(args.out), baseline=[baseline] if baseline else None)
    except (EvalError, SweGradingError, VerifierError, ValueError, OSError) as exc:
        return _error(exc)
    s = report.scores
    files = ", ".join(str(p) for p in paths.values())
    if report.accuracy_refused:  # too many samples failed for the infrastructure: no accuracy, one line
        print(f"error: {report.accuracy_refused}; reports: {files}", file=sys.stderr)
        return 1
    left_out = sum(report.infra_errors.values())
    infra = (f", {left_out} samples left out (infrastructure failed: "
             f"{', '.join(f'{c} {n}' for c, n in report.infra_errors.items())})" if left_out else "")
    if s is None:
        print(f"{report.benchmark}: no task fully graded ({report.num_needs_judge} samples need a judge{infra}); "
              f"reports: {files}")
    else:
        print(
            f"{report.benchmark}: avg@{s.samples_per_task} = {s.avg_at_k:.4f} "
            f"[{s.ci_low:.4f}, {s.ci_high:.4f}] over {s.num_tasks} tasks, "
            f"{report.num_needs_judge} samples need a judge{infra}; reports: {files}"
        )
    return 0


def models_parser() -> argparse.ArgumentParser:
    """The ``posttrain models`` argument parser."""
    p = argparse.ArgumentParser(prog="posttrain models", description="List, show, register and promote checkpoints.")
    p.add_argument("--tracking-uri", default=None, help="MLflow URI (default: $MLFLOW_TRACKING_URI or sqlite:///runs/mlflow.db)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="registered models with their aliases")
    show = sub.add_parser("show", help="versions of a model with lineage tags and scores")
    show.add_argument("name")
    which = show.add_mutually_exclusive_group()
    which.add_argument("--version", type=int, default=None)
    which.add_argument("--alias", default=None)
    promote = sub.add_parser("promote", help="move 'champion' to a version if it beats the champion")
    promote.add_argument("name")
    promote.add_argument("--version", type=int, required=True)
    promote.add_argument("--metric", required=True, help="BENCH.METRIC, e.g. gsm8k.avg@1")
    promote.add_argument("--margin", type=float, default=0.0, help="least improvement required")
    promote.add_argument("--lower-is-better", action="store_true")
    promote.add_argument("--force", action="store_true", help="promote without comparing")
    reg = sub.add_parser("register", help="register a checkpoint (path or s3:// URI) as 'challenger'")
    reg.add_argument("source")
    reg.add_argument("--name", required=True, help="registered model")
    reg.add_argument("--run", required=True)
    reg.add_argument("--technique", required=True, choices=["sft", "cpt", "dpo", "grpo", "sao"])
    reg.add_argument("--dataset-hash", required=True)
    reg.add_argument("--config-hash", required=True)
    reg.add_argument("--base-model", required=True)
    reg.add_argument("--mlflow-run-id", default="")
    reg.add_argument("--score", action="append", default=[], help="BENCH.METRIC=VALUE (repeatable)")
    return p


def models_cli(argv: list[str] | None = None) -> int:
    """``posttrain models``: list, show, promote or register registry entries.

    Returns:
        0 on success (also when a promotion is declined), 1 on a failure, 2 on a usage error.
    """
    args = _parse(models_parser(), list(sys.argv[1:] if argv is None else argv))
    if isinstance(args, int):
        return args
    from mlflow.exceptions import MlflowException

    from posttrain.tracking import (
        Lineage,
        TrackingError,
        list_models,
        promote_if_better,
        register_checkpoint,
        show_model,
    )

    try:
        if args.command == "list":
            models = list_models(args.tracking_uri)
            if not models:
                print("no registered models")
            for m in models:
                aliases = ", ".join(f"{a}=v{v}" for a, v in sorted(m.aliases.items())) or "-"
                print(f"{m.name}\tlatest v{m.latest_version}\t{aliases}")
        elif args.command == "show":
            versions = show_model(args.name, version=args.version, alias=args.alias, tracking_uri=args.tracking_uri)
            print(msgspec.json.format(msgspec.json.encode(versions), indent=2).decode())
        elif args.command == "promote":
            decision = promote_if_better(
                args.name,
                args.version,
                metric=args.metric,
                margin=args.margin,
                higher_is_better=not args.lower_is_better,
                tracking_uri=args.tracking_uri,
                force=args.force,
            )
            print(("promoted: " if decision.promoted else "not promoted: ") + decision.reason)
        else:
            scores = {}
            for item in args.score:
                key, sep, value = item.partition("=")
                if not sep:
                    return _error(f"--score {item!r}: expected BENCH.METRIC=VALUE")
                try:
                    scores[key] = float(value)
                except ValueError:
                    return _error(f"--score {item!r}: {value!r} is not a number")
            lineage = Lineage(
                run=args.run,
                technique=args.technique,
                dataset_hash=args.dataset_hash,
                config_hash=args.config_hash,
                base_model=args.base_model,
                mlflow_run_id=args.mlflow_run_id,
            )
            mv = register_checkpoint(
                args.source, registered_model=args.name, lineage=lineage, eval_scores=scores, tracking_uri=args.tracking_uri
            )
            print(f"registered {mv.name} version {mv.version} ({', '.join(mv.aliases)}) from {mv.checkpoint} "
                  f"as {mv.source} (run {mv.run_id})")
    except (TrackingError, MlflowException, ValueError) as exc:
        return _error(exc)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m posttrain.eval.cli eval|models ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "eval":
        return eval_cli(args[1:])
    if args and args[0] == "models":
        return models_cli(args[1:])
    print("usage: python -m posttrain.eval.cli {eval,models} ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
