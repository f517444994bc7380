"""A tenant's cost report from MLflow: its runs' time accounts summed by technique and by month.

``posttrain cost report --tenant T [--since YYYY-MM-DD] [--json]`` (``posttrain.cli``) calls
``tenant_report``. It selects the runs tagged ``posttrain.tenant = T`` and ``posttrain.account = 1``
(every technique's run records its account at its end: ``posttrain.runners.accounting``) in every
experiment of the tracking server, started on or after ``since``, and adds up their ``cost/*`` and
``time/<role>/wall_s`` metrics. The selection is the server's (a filter on the tenant tag), so
another tenant's run is never read. Runs without an account (failed, or older than issue 35) are
not in it.

``CostReport`` is the record both sources fill (this one, and Kueue's Workloads in cluster mode:
``posttrain.cluster.workload_cost``); ``CostReport.to_json`` is the showback document, ``table``
the text a person reads. ``source`` says where the numbers came from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

TENANT_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""What a tenant name looks like (a Kubernetes namespace: a DNS label)."""

_TENANT = re.compile(TENANT_PATTERN)

SUMMED_METRICS = ("cost/requested_cpu_s", "cost/used_cpu_s", "cost/requested_gpu_s", "cost/trained_tokens")
"""The run metrics a report adds up (``posttrain.account.RunAccount.derived``)."""


class UnknownTenantError(LookupError):
    """No run with a time account carries the tenant (``--tenant``); the message lists the tenants that do."""


def check_store(tracking_uri: str) -> str:
    """``tracking_uri`` when a report can read it without creating anything.

    A report only reads: a local store (``sqlite:///PATH``, a plain path, ``file://``) must already exist,
    or MLflow would create an empty one there and the report would print zeros. Remote URIs
    (``http(s)://``, ``databricks``...) are the server's to refuse.

    Raises:
        ValueError: one line naming the URI, what is missing and how to point at the runs' store.
    """
    from urllib.parse import urlparse

    scheme = urlparse(tracking_uri).scheme
    hint = ("a report reads a store and never creates one; give the one the runs logged to: --tracking-uri "
            "sqlite:///ABSOLUTE/PATH/mlflow.db or $MLFLOW_TRACKING_URI (default sqlite:///runs/mlflow.db, "
            "relative to the current directory)")
    if scheme == "sqlite":
        path = tracking_uri[len("sqlite:///"):] if tracking_uri.startswith("sqlite:///") else ""
        if path in ("", ":memory:"):
            raise ValueError(f"--tracking-uri: {tracking_uri} names no sqlite file; {hint}")
        if not Path(path).is_file():
            raise ValueError(f"--tracking-uri: {tracking_uri}: no such sqlite file {path}; {hint}")
    elif scheme in ("", "file") or len(scheme) == 1:  # a path (a Windows drive letter parses as a scheme)
        path = urlparse(tracking_uri).path if scheme == "file" else tracking_uri
        if not Path(path).exists():
            raise ValueError(f"--tracking-uri: {tracking_uri}: no such file or folder; {hint}")
        if Path(path).is_file():
            raise ValueError(f"--tracking-uri: {tracking_uri} is a file, not a tracking URI; for a sqlite "
                             f"store write sqlite:///{Path(path).resolve()}")
    return tracking_uri


def check_tenant(tenant: str) -> str:
    """``tenant`` when it is a DNS label (a namespace name).

    Raises:
        ValueError: anything else (the message names ``--tenant`` and the pattern).
    """
    if not _TENANT.match(tenant or ""):
        raise ValueError(f"--tenant: {tenant!r} is not a tenant name (a namespace: lower-case letters, digits and "
                         f"'-', at most 63, {TENANT_PATTERN})")
    return tenant


def parse_since(value: str | None) -> date | None:
    """``YYYY-MM-DD`` as a date (None for None).

    Raises:
        ValueError: not a date in that form (the message names ``--since``).
    """
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since: {value!r} is not a date YYYY-MM-DD") from None


@dataclass
class CostLine:
    """One group's totals (a technique, a month, a pod set, or all).

    Attributes:
        runs: Runs (MLflow) or Workloads (cluster) in the group.
        requested_cpu_s: CPU-seconds requested (cores x wall, or x admitted time).
        used_cpu_s: CPU-seconds used (MLflow only: measured; 0 in cluster mode).
        requested_gpu_s: Accelerator-seconds requested.
        trained_tokens: Tokens trained (MLflow only).
        wall_s: Seconds: the learners' wall time (MLflow) or the admitted time (cluster).
        queued_s: Seconds Workloads waited from creation to admission (cluster only).
        failed_runs: Of ``runs``, those that failed (MLflow: ``posttrain.outcome = failed``; their account
            runs up to the error; cluster: 0, a Workload's outcome is not read).
        interrupted_runs: Of ``runs``, those stopped by a signal (``posttrain.outcome = interrupted``: Ctrl-C,
            SIGTERM), charged up to the stop like failed ones but not counted as failures.
    """

    runs: int = 0
    requested_cpu_s: float = 0.0
    used_cpu_s: float = 0.0
    requested_gpu_s: float = 0.0
    trained_tokens: float = 0.0
    wall_s: float = 0.0
    queued_s: float = 0.0
    failed_runs: int = 0
    interrupted_runs: int = 0

    def add(self, other: CostLine) -> None:
        """Add ``other``'s numbers to this line's."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class CostReport:
    """A tenant's totals, by technique and by month (and by pod set in cluster mode).

    Attributes:
        tenant: The tenant.
        source: ``mlflow`` (runs' time accounts) or ``kueue`` (Workloads' requests x admitted time).
        since: First day counted (``YYYY-MM-DD``), or empty for all.
        total: All runs together.
        by_technique: Technique -> totals.
        by_month: ``YYYY-MM`` -> totals.
        by_pod_set: Pod set (role) -> totals (cluster mode; empty from MLflow).
        run_ids: The runs (MLflow run ids, or ``namespace/workload``) counted.
    """

    tenant: str
    source: str
    since: str = ""
    total: CostLine = field(default_factory=CostLine)
    by_technique: dict[str, CostLine] = field(default_factory=dict)
    by_month: dict[str, CostLine] = field(default_factory=dict)
    by_pod_set: dict[str, CostLine] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)

    def add(self, run_id: str, technique: str, month: str, line: CostLine) -> None:
        """Count one run's ``line`` under its technique and month."""
        self.run_ids.append(run_id)
        self.total.add(line)
        self.by_technique.setdefault(technique, CostLine()).add(line)
        self.by_month.setdefault(month, CostLine()).add(line)

    def to_json(self) -> str:
        """The showback document: every field, the lines as objects of numbers."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def table(self) -> str:
        """Text tables: by technique, by month (and by pod set), then the total; the source first."""
        source = {"mlflow": "MLflow runs' time accounts (posttrain.tenant tag)",
                  "kueue": "Kueue Workloads: pod set requests x admitted time"}.get(self.source, self.source)
        out = [f"tenant {self.tenant}, since {self.since or 'the first run'}; source: {source}", ""]
        widths = (16, 5, 6, 11, 15, 12, 15, 14, 10, 10)
        names = ("runs", "failed", "interrupted", "requested CPU-s", "used CPU-s", "requested GPU-s", "trained tokens", "wall s",
                 "queued s")

        def head(title: str) -> list[str]:
            cells = [title.ljust(widths[0])] + [n.rjust(w) for n, w in zip(names, widths[1:], strict=True)]
            return ["| " + " | ".join(cells) + " |", "|" + "|".join("-" * (w + 2) for w in widths) + "|"]

        def row(name: str, c: CostLine) -> str:
            cells = [name.ljust(widths[0]), f"{c.runs:>5}", f"{c.failed_runs:>6}", f"{c.interrupted_runs:>11}"] + [
                f"{v:>{w}.0f}" for v, w in zip((c.requested_cpu_s, c.used_cpu_s, c.requested_gpu_s, c.trained_tokens,
                                                c.wall_s, c.queued_s), widths[4:], strict=True)]
            return "| " + " | ".join(cells) + " |"

        groups = [("technique", self.by_technique), ("month", self.by_month)]
        if self.by_pod_set:
            groups.append(("pod set", self.by_pod_set))
        for title, lines in groups:
            out += head(title) + [row(k, v) for k, v in sorted(lines.items())] + [""]
        out += head("total") + [row("all", self.total)]
        return "\n".join(out)


def _line(metrics: Mapping[str, float], outcome: str) -> CostLine:
    return CostLine(runs=1, failed_runs=int(outcome == "failed"), interrupted_runs=int(outcome == "interrupted"),
                    requested_cpu_s=float(metrics.get("cost/requested_cpu_s", 0.0)),
                    used_cpu_s=float(metrics.get("cost/used_cpu_s", 0.0)),
                    requested_gpu_s=float(metrics.get("cost/requested_gpu_s", 0.0)),
                    trained_tokens=float(metrics.get("cost/trained_tokens", 0.0)),
                    wall_s=float(metrics.get("time/learner/wall_s", 0.0)))


def report_from_runs(tenant: str, runs: Iterable[Any], since: date | None = None) -> CostReport:
    """A report of MLflow ``Run`` objects already selected for ``tenant``.

    A run whose ``posttrain.tenant`` tag is not ``tenant`` is refused, not counted (the selection
    is the caller's, this is the guard).

    Raises:
        ValueError: a run of another tenant (named by its id).
    """
    report = CostReport(tenant, "mlflow", since.isoformat() if since else "")
    for r in runs:
        tags = r.data.tags
        if tags.get("posttrain.tenant") != tenant:
            raise ValueError(f"run {r.info.run_id} belongs to tenant {tags.get('posttrain.tenant')!r}, not {tenant!r}")
        month = tags.get("posttrain.month") or datetime.fromtimestamp(r.info.start_time / 1000, UTC).strftime("%Y-%m")
        report.add(r.info.run_id, tags.get("posttrain.technique", "unknown"), month, _line(r.data.metrics, tags.get("posttrain.outcome", "finished")))
    return report


def tenant_report(tracking_uri: str, tenant: str, since: date | None = None, *, max_runs: int = 100_000) -> CostReport:
    """``tenant``'s runs with a time account on ``tracking_uri``, summed (module docstring).

    Args:
        tracking_uri: The MLflow tracking URI (``sqlite:///...`` or ``http://...``).
        tenant: The tenant (a DNS label).
        since: Count only runs started on or after this day (UTC); None: all.
        max_runs: Most runs read (pages of 1000); more raises rather than undercounting.

    Raises:
        ValueError: a bad tenant name, more than ``max_runs`` runs, or a local store that does not exist
            (``check_store``: nothing is created).
        UnknownTenantError: no run with an account carries ``tenant`` at all (whatever ``since``); the
            message lists the tenants that do.
        mlflow.exceptions.MlflowException: the server refused the search.
    """
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    check_tenant(tenant)
    check_store(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    query = f"tags.`posttrain.tenant` = '{tenant}' and tags.`posttrain.account` = '1'"
    if since is not None:
        start_ms = int(datetime(since.year, since.month, since.day, tzinfo=UTC).timestamp() * 1000)
        query += f" and attributes.start_time >= {start_ms}"
    runs: list[Any] = []
    token = None
    while experiments:
        page = client.search_runs(experiments, filter_string=query, max_results=1000, page_token=token)
        runs += list(page)
        if len(runs) > max_runs:
            raise ValueError(f"tenant {tenant}: more than {max_runs} runs; narrow the report with --since")
        token = page.token
        if not token:
            break
    if not runs:
        _check_known_tenant(client, experiments, tenant, tracking_uri)
    return report_from_runs(tenant, runs, since)


def _check_known_tenant(client: Any, experiments: list[str], tenant: str, tracking_uri: str) -> None:
    """Raise ``UnknownTenantError`` when no run with an account carries ``tenant``.

    One page of 1000 runs is read for the tenants that do (a list for the message, not a count).
    """
    known: list[str] = []
    if experiments:
        mine = client.search_runs(experiments, filter_string=f"tags.`posttrain.tenant` = '{tenant}' and "
                                                             "tags.`posttrain.account` = '1'", max_results=1)
        if list(mine):
            return  # the tenant has runs, only none since the day asked for
        page = client.search_runs(experiments, filter_string="tags.`posttrain.account` = '1'", max_results=1000)
        known = sorted({r.data.tags.get("posttrain.tenant", "") for r in page} - {""})
    raise UnknownTenantError(f"--tenant: no run on {tracking_uri} carries tenant {tenant!r}; tenants with runs: "
                             f"{', '.join(known) if known else 'none (no run recorded a time account)'}")
