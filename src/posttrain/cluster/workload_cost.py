"""A tenant's cost report from Kueue's Workload objects: each pod set's requests x its admitted time.

``posttrain cost report --tenant T --cluster`` (``posttrain.cli``) calls ``workload_report`` with
the kube context's client. The tenant's Workloads are those in its namespace (a tenant is a
namespace: ``posttrain.cluster.tenant``). For each Workload:

* **admitted time**: from the ``Admitted`` condition's ``lastTransitionTime`` (status ``True``) to
  the ``Finished`` condition's ``lastTransitionTime`` (status ``True``), or to now while it runs. A
  Workload never admitted counts no admitted time (and its whole life so far as queued).
* **queued time**: from the Workload's ``creationTimestamp`` to its admission: what gang admission
  of the whole JobSet (one Workload, every pod set at once) makes a team wait.
* **requests**: per pod set, Kueue's ``status.admission.podSetAssignments[].resourceUsage``
  (the total of the pod set as admitted: cores, ``nvidia.com/gpu``) when present, else the pod
  template's container requests x the pod set's ``count``.

Requested CPU-seconds = cores x admitted seconds, summed over pod sets; the same for GPUs. The
technique is the Workload's ``posttrain.io/technique`` label (``unlabelled`` without); the month is
the admission's (UTC). Kueue reports no usage and no trained tokens, so those stay 0: ``source`` is
``kueue``, and the table says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from kubernetes.client import CustomObjectsApi

from posttrain.cluster.jobset_status import KUEUE_GROUP, KUEUE_VERSION, kube_timeout
from posttrain.config.resources import quantity_value
from posttrain.tracking.cost import CostLine, CostReport, check_tenant

TECHNIQUE_LABEL = "posttrain.io/technique"
"""Label on a Workload naming the run's technique (grouped as ``unlabelled`` without it)."""

GPU_RESOURCE = "nvidia.com/gpu"
"""The accelerator resource name counted as GPU-seconds."""

REQUEST_TIMEOUT_S = 30.0
"""Longest wait (seconds) for one list of Workloads."""


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def pod_set_requests(workload: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """Pod set name -> (cores, GPUs) of the whole pod set (module docstring: Kueue's usage, else template x count).

    Raises:
        ValueError: a quantity that is not a Kubernetes quantity (the message names the Workload and pod set).
    """
    name = (workload.get("metadata") or {}).get("name", "?")
    usage = {a.get("name"): a.get("resourceUsage") or {}
             for a in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []}
    out: dict[str, tuple[float, float]] = {}
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        ps = pod_set.get("name", "main")
        try:
            if usage.get(ps):
                res = usage[ps]
                out[ps] = (quantity_value(str(res.get("cpu", "0"))), quantity_value(str(res.get(GPU_RESOURCE, "0"))))
                continue
            count = int(pod_set.get("count", 1))
            cores = gpus = 0.0
            for c in ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []:
                requests = (c.get("resources") or {}).get("requests") or {}
                cores += quantity_value(str(requests.get("cpu", "0")))
                gpus += quantity_value(str(requests.get(GPU_RESOURCE, "0")))
            out[ps] = (cores * count, gpus * count)
        except ValueError as exc:
            raise ValueError(f"Workload {name}, pod set {ps}: {exc}") from None
    return out


def workload_lines(workload: Mapping[str, Any], now: datetime) -> tuple[dict[str, CostLine], datetime | None]:
    """Each pod set's line of one Workload (module docstring), and when it was admitted (None: never)."""
    meta = workload.get("metadata") or {}
    created = _time(meta.get("creationTimestamp")) or now
    admitted_cond, finished_cond = _condition(workload, "Admitted"), _condition(workload, "Finished")
    admitted = _time(admitted_cond.get("lastTransitionTime")) if admitted_cond else None
    finished = _time(finished_cond.get("lastTransitionTime")) if finished_cond else None
    run_s = max(((finished or now) - admitted).total_seconds(), 0.0) if admitted else 0.0
    queued_s = max(((admitted or finished or now) - created).total_seconds(), 0.0)
    lines = {}
    for ps, (cores, gpus) in pod_set_requests(workload).items():
        lines[ps] = CostLine(runs=1, requested_cpu_s=cores * run_s, requested_gpu_s=gpus * run_s, wall_s=run_s,
                             queued_s=queued_s)
    return lines, admitted


def workload_report(api: CustomObjectsApi, tenant: str, since: date | None = None, *,
                    now: datetime | None = None) -> CostReport:
    """``tenant``'s Workloads (in its namespace) as a cost report (module docstring).

    Args:
        api: A client for the cluster (``kubernetes.client.CustomObjectsApi``).
        tenant: The tenant: its namespace.
        since: Count only Workloads admitted (or, never admitted, created) on or after this day (UTC).
        now: The end of Workloads still running (default: now, UTC).

    Raises:
        ValueError: a bad tenant name, or a bad quantity in a Workload.
        kubernetes.client.exceptions.ApiException: the API server refused the list (RBAC, no CRD).
    """
    check_tenant(tenant)
    now = now or datetime.now(UTC)
    items = api.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, tenant, "workloads",
                                              _request_timeout=kube_timeout(REQUEST_TIMEOUT_S)).get("items") or []
    report = CostReport(tenant, "kueue", since.isoformat() if since else "")
    for w in items:
        meta = w.get("metadata") or {}
        if meta.get("namespace", tenant) != tenant:  # a list is namespaced; this is the guard
            continue
        lines, admitted = workload_lines(w, now)
        when = admitted or _time(meta.get("creationTimestamp")) or now
        if since is not None and when.date() < since:
            continue
        total = CostLine()
        for ps, line in lines.items():
            total.add(line)
            report.by_pod_set.setdefault(ps, CostLine()).add(line)
        # One Workload is one run: its pod sets share one admitted time (gang admission), counted once.
        total.runs, total.wall_s, total.queued_s = 1, max((x.wall_s for x in lines.values()), default=0.0), \
            max((x.queued_s for x in lines.values()), default=0.0)
        technique = (meta.get("labels") or {}).get(TECHNIQUE_LABEL, "unlabelled")
        report.add(f"{tenant}/{meta.get('name', '?')}", technique, when.strftime("%Y-%m"), total)
    return report


def _cluster_api() -> CustomObjectsApi:
    """A ``CustomObjectsApi`` of the in-cluster config (in a pod) or the kubeconfig's current context.

    Raises:
        kubernetes.config.ConfigException: neither is usable.
    """
    import os

    from kubernetes import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # read now, not at import time
    return client.CustomObjectsApi(client.ApiClient(configuration=client.Configuration.get_default_copy()))


def cost_cli(argv: list[str]) -> int:
    """``posttrain cost report --tenant T [--since YYYY-MM-DD] [--json] [--cluster] [--tracking-uri URI]``.

    Prints the tenant's totals by technique and by month (``posttrain.tracking.cost``), from MLflow
    (default: ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///runs/mlflow.db``) or,
    with ``--cluster``, from the Kueue Workloads in the tenant's namespace (this module); the output
    names the source. Returns the exit status: 2 with one line on a bad argument (a local tracking store
    that does not exist included: a report never creates one); 1 with one line when no run carries the
    tenant (the line lists the tenants that do) or the tracking server refused the search.
    """
    import argparse
    import os
    import sys
    from pathlib import Path

    from mlflow.exceptions import MlflowException

    from posttrain.tracking.cost import UnknownTenantError, parse_since, tenant_report

    parser = argparse.ArgumentParser(prog="posttrain cost report",
                                     description="a tenant's CPU/GPU-seconds by technique and by month")
    parser.add_argument("--tenant", required=True, help="the team (its namespace; the runs' posttrain.tenant tag)")
    parser.add_argument("--since", default=None, help="first day counted, YYYY-MM-DD (UTC)")
    parser.add_argument("--json", action="store_true", help="print the JSON document (showback/finance)")
    parser.add_argument("--cluster", action="store_true",
                        help="use the Kueue Workloads' requests x admitted time (kube context) instead of MLflow")
    parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, "
                                                             "else sqlite:///runs/mlflow.db)")
    args = parser.parse_args(argv)
    try:
        since = parse_since(args.since)
        # Not tracking.client.default_tracking_uri: that one makes ./runs, and a report creates nothing.
        uri = (args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
               or f"sqlite:///{Path('runs').resolve() / 'mlflow.db'}")
        report = (workload_report(_cluster_api(), args.tenant, since) if args.cluster
                  else tenant_report(uri, args.tenant, since))
    except UnknownTenantError as exc:
        print(f"posttrain cost report: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"posttrain cost report: {exc}", file=sys.stderr)
        return 2
    except MlflowException as exc:
        first = str(exc.message if hasattr(exc, "message") else exc).strip().splitlines()[0]
        print(f"posttrain cost report: the tracking store {uri} refused the search: {first}", file=sys.stderr)
        return 1
    print(report.to_json() if args.json else report.table())
    return 0
