"""Scheduled retraining: create or update a Kubeflow Pipelines recurring run (cron) through ``kfp.Client``.

``posttrain schedule`` makes sure exactly one recurring run named ``--name`` exists in the
experiment, running the compiled pipeline (default ``pipelines/compiled/post_training.yaml``) on
a 6-field cron (robfig/cron, seconds first: ``"0 0 2 * * *"`` is 02:00 every day). Its ``model``
parameter is ``models:/<registered model>@champion``, which the pipeline's ``prepare_dataset``
step resolves when each run starts: every scheduled run retrains from whatever is ``champion``
then, and promotes its result only if it beats it. A pipeline with a ``priority_class`` parameter
gets ``posttrain-scheduled`` (``SCHEDULED_PRIORITY``) unless ``--param priority_class=...`` says
otherwise, so interactive runs preempt scheduled ones in the team's ClusterQueue.

Create or update:

* none with that name: create it;
* one whose spec fingerprint (pipeline spec, parameters, cron, concurrency, service account,
  enabled; stored in its description as ``[posttrain-spec <sha256/16>]``) matches: leave it
  (``unchanged``);
* one that differs: delete it and create the new one (KFP has no update call for recurring runs);
  if the create fails, the old one is created again from its stored spec and the error is raised;
* more than one with that name: refuse (``ScheduleError`` listing their ids).

Runs in the recurring run always execute the spec sent here; a newly compiled pipeline is picked
up by running ``posttrain schedule`` again (KFP does not follow pipeline versions by itself).

Usage::

    posttrain schedule --host http://ml-pipeline.kubeflow:8888 --namespace team-a
        --name nightly-sao --cron "0 0 2 * * *" --registered-model team-a-policy
        --param technique=sao --param steps=200 [--pipeline FILE] [--experiment NAME] [--disable]

(one command line).

Authentication: ``$KF_PIPELINES_TOKEN`` as a bearer token if set; in a pod with the projected
service-account token (``/var/run/secrets/kubeflow/pipelines/token``) that token; else none.
Exit status: 0 done, 1 a failure explained in one ``error:`` line, 2 a usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from posttrain.cluster.tenant import SCHEDULED_PRIORITY

DEFAULT_PIPELINE = "pipelines/compiled/post_training.yaml"
DEFAULT_EXPERIMENT = "scheduled-retraining"
FINGERPRINT = re.compile(r"\[posttrain-spec ([0-9a-f]{16})\]")
SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
_LIST_PAGE_SIZE = 100
_LIST_MAX_PAGES = 100


class ScheduleError(RuntimeError):
    """The recurring run cannot be created or updated; the message names the field or object."""


@dataclass(frozen=True)
class ScheduleSpec:
    """The recurring run ``posttrain schedule`` should leave behind.

    Attributes:
        name: Recurring run display name (unique within its experiment).
        cron: 6-field cron expression (seconds, minutes, hours, day of month, month, day of week).
        pipeline_path: Compiled pipeline YAML.
        params: Pipeline parameters (validated against the pipeline's inputs).
        experiment: Experiment name (created if missing).
        namespace: Kubeflow profile namespace, or None for single-user KFP.
        service_account: Kubernetes service account of the runs, or None for the profile default.
        max_concurrency: Runs of this schedule allowed at once (>= 1); 1 keeps retrains from overlapping.
        enabled: Whether the schedule fires.
        description: Free text, followed by the spec fingerprint.
    """

    name: str
    cron: str
    pipeline_path: Path
    params: dict[str, Any] = field(default_factory=dict)
    experiment: str = DEFAULT_EXPERIMENT
    namespace: str | None = None
    service_account: str | None = None
    max_concurrency: int = 1
    enabled: bool = True
    description: str = "posttrain scheduled retraining from the current champion"


@dataclass(frozen=True)
class ScheduleResult:
    """What ``ensure_recurring_run`` did.

    Attributes:
        action: ``created``, ``updated`` or ``unchanged``.
        recurring_run_id: Id of the recurring run that now carries the spec.
        experiment_id: Its experiment.
        replaced_id: Id of the recurring run deleted by an update, else None.
        fingerprint: The spec fingerprint (16 hex characters of a sha256).
    """

    action: str
    recurring_run_id: str
    experiment_id: str
    replaced_id: str | None
    fingerprint: str


def check_cron(cron: str) -> str:
    """Check that ``cron`` has the 6 fields KFP's scheduler (robfig/cron) expects.

    Raises:
        ScheduleError: wrong field count or characters outside ``0-9 * / , - ? L W #`` and names.
    """
    fields = cron.split()
    if len(fields) != 6:
        raise ScheduleError(
            f"cron: {cron!r} has {len(fields)} fields; KFP wants 6 with seconds first, e.g. '0 0 2 * * *' (02:00 daily)"
        )
    for f in fields:
        if not re.fullmatch(r"[0-9A-Za-z*/,?#-]+", f):
            raise ScheduleError(f"cron: field {f!r} of {cron!r} is not a cron field")
    return " ".join(fields)


def pipeline_inputs(pipeline_path: Path) -> dict[str, dict[str, Any]]:
    """The root parameters of a compiled pipeline: ``{name: {"parameterType": ..., "defaultValue": ...}}``.

    Raises:
        ScheduleError: the file is missing or is not a compiled KFP pipeline.
    """
    if not pipeline_path.is_file():
        raise ScheduleError(f"pipeline: {pipeline_path} not found (compile with: python -m pipelines.compile)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = list(yaml.load_all(pipeline_path.read_text(encoding="utf-8"), Loader=loader))
    root = (docs[0] or {}).get("root") if docs else None
    if not isinstance(root, dict):
        raise ScheduleError(f"pipeline: {pipeline_path} is not a compiled KFP pipeline (no 'root')")
    return dict(root.get("inputDefinitions", {}).get("parameters", {}))


def _boolean(text: str) -> bool:
    return {"true": True, "false": False}[text.lower()]


_CASTS: dict[str, Callable[[str], Any]] = {
    "STRING": str,
    "NUMBER_INTEGER": int,
    "NUMBER_DOUBLE": float,
    "BOOLEAN": _boolean,
}


def parse_params(items: list[str], inputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Turn ``["steps=200", "technique=sao"]`` into typed pipeline parameters.

    Raises:
        ScheduleError: an item without ``=``, a name the pipeline does not have, or a value of the wrong type.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ScheduleError(f"--param {item!r}: expected name=value")
        if key not in inputs:
            raise ScheduleError(f"--param {key}: the pipeline has no such parameter (it has {sorted(inputs)})")
        kind = inputs[key].get("parameterType", "STRING")
        cast = _CASTS.get(kind)
        if cast is None:
            raise ScheduleError(f"--param {key}: parameter type {kind} cannot be set from the command line")
        try:
            out[key] = cast(raw)
        except (ValueError, KeyError) as exc:
            raise ScheduleError(f"--param {key}={raw!r}: not a valid {kind}") from exc
    return out


def fingerprint(spec: ScheduleSpec) -> str:
    """sha256 (16 hex characters) of everything that defines the schedule's behaviour."""
    content = {
        "pipeline": spec.pipeline_path.read_text(encoding="utf-8"),
        "params": spec.params,
        "cron": spec.cron,
        "max_concurrency": spec.max_concurrency,
        "service_account": spec.service_account or "",
        "enabled": spec.enabled,
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _find_by_name(client: Any, experiment_id: str, name: str) -> list[Any]:
    """Recurring runs of the experiment with display name ``name`` (pages bounded by ``_LIST_MAX_PAGES``)."""
    flt = json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})
    found: list[Any] = []
    token = ""
    for _ in range(_LIST_MAX_PAGES):
        page = client.list_recurring_runs(page_token=token, page_size=_LIST_PAGE_SIZE, experiment_id=experiment_id,
                                          filter=flt)
        found.extend(r for r in page.recurring_runs or [] if r.display_name == name)
        token = page.next_page_token or ""
        if not token:
            return found
    raise ScheduleError(f"experiment {experiment_id}: more than {_LIST_MAX_PAGES * _LIST_PAGE_SIZE} recurring runs")


def _create(client: Any, spec: ScheduleSpec, experiment_id: str, digest: str) -> Any:
    return client.create_recurring_run(
        experiment_id=experiment_id,
        job_name=spec.name,
        description=f"{spec.description} [posttrain-spec {digest}]",
        cron_expression=spec.cron,
        max_concurrency=spec.max_concurrency,
        no_catchup=True,
        params=spec.params,
        pipeline_package_path=str(spec.pipeline_path),
        enabled=spec.enabled,
        enable_caching=False,
        service_account=spec.service_account,
    )


def _restore(client: Any, old: Any) -> Any:
    """Create a recurring run again from a deleted one's stored fields (same spec, trigger, parameters)."""
    import kfp_server_api

    body = kfp_server_api.V2beta1RecurringRun(
        experiment_id=old.experiment_id, display_name=old.display_name, description=old.description,
        pipeline_spec=old.pipeline_spec, pipeline_version_reference=old.pipeline_version_reference,
        runtime_config=old.runtime_config, trigger=old.trigger, max_concurrency=old.max_concurrency,
        mode=old.mode, no_catchup=old.no_catchup, service_account=old.service_account,
    )
    return client._recurring_run_api.recurring_run_service_create_recurring_run(recurring_run=body)


def ensure_recurring_run(client: Any, spec: ScheduleSpec) -> ScheduleResult:
    """Create or update the recurring run described by ``spec`` (see the module docstring).

    Args:
        client: A ``kfp.Client`` connected to the KFP API.
        spec: The desired schedule.

    Returns:
        What was done and the id of the recurring run carrying the spec.

    Raises:
        ScheduleError: a bad cron, several recurring runs with the name, or a failed update (after
            restoring the previous recurring run).
        kfp_server_api.ApiException: any other API error.
    """
    import kfp_server_api

    check_cron(spec.cron)
    if spec.max_concurrency < 1:
        raise ScheduleError(f"max_concurrency: must be >= 1, got {spec.max_concurrency}")
    digest = fingerprint(spec)
    experiment = client.create_experiment(name=spec.experiment, namespace=spec.namespace)
    exp_id = experiment.experiment_id
    existing = _find_by_name(client, exp_id, spec.name)
    if len(existing) > 1:
        ids = ", ".join(r.recurring_run_id for r in existing)
        raise ScheduleError(f"experiment {spec.experiment}: {len(existing)} recurring runs are named {spec.name!r} "
                            f"({ids}); delete all but one first")
    if not existing:
        made = _create(client, spec, exp_id, digest)
        return ScheduleResult("created", made.recurring_run_id, exp_id, None, digest)
    old = existing[0]
    match = FINGERPRINT.search(old.description or "")
    if match and match.group(1) == digest:
        return ScheduleResult("unchanged", old.recurring_run_id, exp_id, None, digest)
    client.delete_recurring_run(old.recurring_run_id)
    try:
        made = _create(client, spec, exp_id, digest)
    except kfp_server_api.ApiException as exc:
        restored = _restore(client, old)
        raise ScheduleError(
            f"creating the new recurring run {spec.name!r} failed (HTTP {exc.status} {exc.reason}); the previous one "
            f"was restored as {restored.recurring_run_id}"
        ) from exc
    return ScheduleResult("updated", made.recurring_run_id, exp_id, old.recurring_run_id, digest)


def connect(host: str | None, namespace: str | None) -> Any:
    """A ``kfp.Client`` for ``host`` (``$KF_PIPELINES_ENDPOINT`` when None); see the module docstring for auth.

    Raises:
        ScheduleError: no host given and ``$KF_PIPELINES_ENDPOINT`` unset.
    """
    import kfp
    from kfp.client import ServiceAccountTokenVolumeCredentials

    host = host or os.environ.get("KF_PIPELINES_ENDPOINT")
    if not host:
        raise ScheduleError("--host: not given and KF_PIPELINES_ENDPOINT is not set")
    token = os.environ.get("KF_PIPELINES_TOKEN")
    token_path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", SA_TOKEN_PATH)
    credentials = ServiceAccountTokenVolumeCredentials(token_path) if not token and Path(token_path).is_file() else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP v2.0.0-beta.2 and later"
        return kfp.Client(host=host, namespace=namespace or "kubeflow", existing_token=token, credentials=credentials)


def _registered_model_from_config(config: str | None) -> str | None:
    if not config or not Path(config).is_file():
        return None
    from posttrain.config import load_config

    return load_config(config).tracking.registered_model


def build_parser() -> argparse.ArgumentParser:
    """The ``posttrain schedule`` argument parser."""
    p = argparse.ArgumentParser(prog="posttrain schedule",
                                description="Create or update a KFP recurring run that retrains from the current champion.")
    p.add_argument("--host", default=None, help="KFP API URL (default: $KF_PIPELINES_ENDPOINT)")
    p.add_argument("--namespace", default=None, help="Kubeflow profile namespace (multi-user KFP)")
    p.add_argument("--name", required=True, help="recurring run name, unique in the experiment")
    p.add_argument("--cron", required=True, help="6-field cron, seconds first: '0 0 2 * * *' = 02:00 daily")
    p.add_argument("--pipeline", default=DEFAULT_PIPELINE, help=f"compiled pipeline YAML (default {DEFAULT_PIPELINE})")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help=f"experiment name (default {DEFAULT_EXPERIMENT})")
    p.add_argument("--registered-model", default=None,
                   help="retrain from models:/<this>@champion (default: tracking.registered_model of --param config=FILE)")
    p.add_argument("--model", default=None, help="explicit model parameter instead of the champion (e.g. a fixed base model)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="pipeline parameter (repeatable)")
    p.add_argument("--service-account", default=None, help="service account of the runs")
    p.add_argument("--max-concurrency", type=int, default=1, help="runs allowed at once (default 1)")
    p.add_argument("--disable", action="store_true", help="create or keep the recurring run disabled")
    return p


def schedule_cli(argv: list[str] | None = None) -> int:
    """``posttrain schedule``: create or update the recurring run; print what was done.

    Returns:
        0 on success, 1 on a failure (one ``error:`` line on stderr), 2 on a usage error.
    """
    items = list(sys.argv[1:] if argv is None else argv)
    if items[:1] == ["--"]:  # ``posttrain schedule -- --host ...`` (the separator argparse may pass through)
        items = items[1:]
    try:
        args = build_parser().parse_args(items)
    except SystemExit as exc:  # argparse printed usage or help; turn its exit into a return code
        return int(exc.code or 0)
    import kfp_server_api
    import urllib3

    try:
        pipeline = Path(args.pipeline)
        inputs = pipeline_inputs(pipeline)
        params = parse_params(args.param, inputs)
        if "model" in params and args.model is None:
            raise ScheduleError("--param model=...: use --model (or --registered-model for the champion)")
        if args.model is not None:
            params["model"] = args.model
        else:
            name = args.registered_model or _registered_model_from_config(params.get("config"))
            if not name:
                raise ScheduleError("--registered-model: needed to retrain from the champion (or give --model, "
                                    "or --param config=<local config file> with tracking.registered_model)")
            params["model"] = f"models:/{name}@champion"
        if "model" not in inputs:
            raise ScheduleError(f"pipeline {pipeline}: has no 'model' parameter to retrain from the champion")
        if "priority_class" in inputs:
            params.setdefault("priority_class", SCHEDULED_PRIORITY)
        spec = ScheduleSpec(name=args.name, cron=check_cron(args.cron), pipeline_path=pipeline, params=params,
                            experiment=args.experiment, namespace=args.namespace,
                            service_account=args.service_account, max_concurrency=args.max_concurrency,
                            enabled=not args.disable)
        result = ensure_recurring_run(connect(args.host, args.namespace), spec)
    except urllib3.exceptions.HTTPError as exc:  # unreachable host: urllib3 gave up after its bounded retries
        print(f"error: --host {args.host}: KFP API unreachable ({type(exc).__name__}: "
              f"{' '.join(str(getattr(exc, 'reason', exc)).split())})", file=sys.stderr)
        return 1
    except (ScheduleError, kfp_server_api.ApiException, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    replaced = f" (replaced {result.replaced_id})" if result.replaced_id else ""
    print(f"{result.action} recurring run {result.recurring_run_id}{replaced} {spec.name!r} in experiment "
          f"{spec.experiment} ({result.experiment_id}): cron '{spec.cron}', model {params['model']}, "
          f"priority {params.get('priority_class', '(pipeline has none)')}, "
          f"{'enabled' if spec.enabled else 'disabled'}, spec {result.fingerprint}")
    return 0


if __name__ == "__main__":
    raise SystemExit(schedule_cli())
