"""What a JobSet is doing: its phase and counts, Kueue's admission message, its failed containers.

Read-only views the launcher reports through:

* ``jobset_status(obj)`` summarises a JobSet object into a ``JobSetStatus`` (``Queued`` while
  Kueue holds it suspended, ``Starting``, ``Running``, ``Restarting``, ``Completed``, ``Failed``);
* ``kueue_admission_message`` says why a suspended JobSet is still queued (its Workload's
  condition, e.g. waiting for quota);
* ``pod_failures`` lists the failed containers of its pods, learner first, with their termination
  reason, exit code and message (the log tail when the message is empty).

Example: ``jobset_status(api.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns,
JOBSET_PLURAL, name)).summary()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
TERMINAL_PHASES = ("Completed", "Failed")
REQUEST_TIMEOUT_S = 30.0
"""Seconds one Kubernetes API request may take (the ``_request_timeout`` of every call: connect,
TLS handshake and each read), so a half-open connection cannot block the launcher forever."""


def kube_timeout(seconds: float) -> tuple[float, float]:
    """The ``_request_timeout`` argument for ``seconds``: the pair ``(connect, read)``.

    Always a pair: the ``kubernetes`` client (30.1, ``client/rest.py``) turns only an ``int`` or a
    2-tuple into a urllib3 timeout and silently ignores a ``float``, which left a request to a
    server that accepts the connection and never answers blocked forever in the TLS handshake.

    Raises:
        ValueError: ``seconds`` is not positive.
    """
    if not seconds > 0:
        raise ValueError(f"request timeout: must be > 0 seconds, got {seconds!r}")
    return (float(seconds), float(seconds))
_MESSAGE_TAIL_CHARS = 2000


@dataclass(frozen=True)
class PodFailure:
    """One failed container of one pod of the JobSet.

    Attributes:
        pod: Pod name.
        role: replicatedJob name (``learner``, ``generator``, ``redis``).
        container: Container name.
        exit_code: Process exit code (137 = SIGKILL, typically OOMKilled).
        reason: Kubelet reason (``Error``, ``OOMKilled``, ``Evicted``...).
        message: Termination message (the log tail with ``FallbackToLogsOnError``), or the log tail
            read from ``pods/log`` when the message is empty; at most 2000 characters (the end).
        finished_at: RFC 3339 time the container ended ("" when unknown).
    """

    pod: str
    role: str
    container: str
    exit_code: int | None
    reason: str
    message: str
    finished_at: str = ""

    def describe(self) -> str:
        """One line (plus the message) for humans."""
        head = f"{self.role} pod {self.pod} container {self.container} exited {self.exit_code} ({self.reason})"
        return f"{head}: {self.message}" if self.message else head


@dataclass(frozen=True)
class ReplicatedJobCounts:
    """Child Job counts of one replicatedJob, from ``status.replicatedJobsStatus``."""

    ready: int = 0
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    suspended: int = 0


@dataclass(frozen=True)
class JobSetStatus:
    """What the launcher reports about a JobSet at one poll.

    Attributes:
        name: JobSet name.
        phase: ``Queued`` (suspended, waiting for Kueue admission), ``Starting``, ``Running`` (every
            replicatedJob has all its Jobs ready or done), ``Restarting``, ``Completed`` or ``Failed``.
        restarts: ``status.restarts`` (group restarts so far).
        replicated_jobs: Counts per replicatedJob name.
        reason: Reason of the condition behind the phase (``ReachedMaxRestarts``, ``AllJobsCompleted``...).
        message: Condition message, or Kueue's admission message while ``Queued``.
    """

    name: str
    phase: str
    restarts: int = 0
    replicated_jobs: dict[str, ReplicatedJobCounts] = field(default_factory=dict)
    reason: str = ""
    message: str = ""

    def key(self) -> tuple[Any, ...]:
        """What counts as a transition: phase, restarts or any count changed (not the message)."""
        return (self.phase, self.restarts, tuple(sorted(self.replicated_jobs.items())))

    def summary(self) -> str:
        """One line, e.g. ``sao-x Running restarts=0 learner 1/1 ready, generator 4/4 ready``."""
        counts = ", ".join(
            f"{n} {c.ready}r/{c.active}a/{c.succeeded}s/{c.failed}f" for n, c in sorted(self.replicated_jobs.items())
        )
        text = f"{self.name} {self.phase} restarts={self.restarts}"
        text += f" [{counts}]" if counts else ""
        return text + (f": {self.message}" if self.message else "")


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def jobset_status(obj: Mapping[str, Any]) -> JobSetStatus:
    """Summarise a JobSet object (as returned by the API) into a ``JobSetStatus``.

    Args:
        obj: The JobSet dict with its ``spec`` and ``status``.
    """
    name = obj["metadata"]["name"]
    status = obj.get("status") or {}
    conds = _conditions(obj)
    counts = {
        r["name"]: ReplicatedJobCounts(
            ready=r.get("ready", 0), active=r.get("active", 0), succeeded=r.get("succeeded", 0),
            failed=r.get("failed", 0), suspended=r.get("suspended", 0),
        )
        for r in status.get("replicatedJobsStatus") or []
    }
    restarts = int(status.get("restarts", 0))

    def true(kind: str) -> bool:
        return conds.get(kind, {}).get("status") == "True"

    if true("Completed") or status.get("terminalState") == "Completed":
        phase, cond = "Completed", conds.get("Completed", {})
    elif true("Failed") or status.get("terminalState") == "Failed":
        phase, cond = "Failed", conds.get("Failed", {})
    elif obj.get("spec", {}).get("suspend") or true("Suspended"):
        phase, cond = "Queued", conds.get("Suspended", {})
    elif true("RestartingJobSet"):
        phase, cond = "Restarting", conds.get("RestartingJobSet", {})
    else:
        replicas = {r["name"]: r.get("replicas", 1) for r in obj.get("spec", {}).get("replicatedJobs", [])}
        running = bool(replicas) and all(
            counts.get(n, ReplicatedJobCounts()).ready + counts.get(n, ReplicatedJobCounts()).succeeded >= want
            for n, want in replicas.items()
        )
        phase, cond = ("Running" if running else "Starting"), {}
    return JobSetStatus(name=name, phase=phase, restarts=restarts, replicated_jobs=counts,
                        reason=cond.get("reason", ""), message=cond.get("message", ""))


def kueue_admission_message(api: CustomObjectsApi, namespace: str, uid: str, *,
                            request_timeout: float = REQUEST_TIMEOUT_S) -> str:
    """Kueue's admission message for the Workload of the JobSet with ``uid`` (why it is still queued).

    An API error reading the Workload (or no answer within ``request_timeout`` seconds) gives a
    message that says so; it is not raised.
    """
    try:
        workloads = api.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", label_selector=f"{KUEUE_JOB_UID_LABEL}={uid}",
            _request_timeout=kube_timeout(request_timeout),
        )
    except ApiException as exc:
        return f"Kueue workload not readable (HTTP {exc.status} {exc.reason})"
    except urllib3.exceptions.HTTPError as exc:
        return f"Kueue workload not readable (no answer: {type(exc).__name__})"
    items = workloads.get("items") or []
    if not items:
        return "no Kueue Workload yet (is Kueue installed and the JobSet integration enabled?)"
    conds = _conditions(items[0])
    for kind in ("QuotaReserved", "Admitted", "Evicted"):
        cond = conds.get(kind)
        if cond and cond.get("message"):
            return f"Kueue {kind}={cond.get('status')} ({cond.get('reason', '')}): {cond['message']}"
    return "Kueue Workload has no admission condition yet"


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MESSAGE_TAIL_CHARS else "..." + text[-_MESSAGE_TAIL_CHARS:]


def pod_failures(core: CoreV1Api, namespace: str, name: str, *, read_logs: bool = True,
                 request_timeout: float = REQUEST_TIMEOUT_S) -> list[PodFailure]:
    """Failed containers of the JobSet's pods, learner first, then newest first.

    A container counts as failed when its current or last termination has a non-zero exit code; an
    evicted pod (``status.reason``) counts too. When a failed learner container left no termination
    message, the last 50 log lines are read from ``pods/log`` instead.

    Args:
        core: Core client.
        namespace: JobSet namespace.
        name: JobSet name (pods carry label ``jobset.sigs.k8s.io/jobset-name``).
        read_logs: Fall back to ``pods/log`` for empty learner messages.
        request_timeout: Seconds per API request.

    Raises:
        kubernetes.client.exceptions.ApiException: listing pods failed.
        urllib3.exceptions.HTTPError: the API server did not answer the listing.
    """
    pods = core.list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}",
                                    _request_timeout=kube_timeout(request_timeout)).items
    failures: list[PodFailure] = []
    for pod in pods:
        role = (pod.metadata.labels or {}).get(REPLICATED_JOB_LABEL, "?")
        found = False
        for cs in (pod.status.container_statuses if pod.status else None) or []:
            for state in (cs.state, cs.last_state):
                term = state.terminated if state else None
                if term is None or not term.exit_code:
                    continue
                found = True
                finished = term.finished_at.isoformat() if term.finished_at else ""
                failures.append(PodFailure(pod.metadata.name, role, cs.name, term.exit_code,
                                           term.reason or "", _tail(term.message or ""), finished))
        if not found and pod.status and pod.status.reason:
            failures.append(PodFailure(pod.metadata.name, role, "", None, pod.status.reason, _tail(pod.status.message or "")))
    failures.sort(key=lambda f: f.finished_at, reverse=True)
    failures.sort(key=lambda f: f.role != "learner")
    if read_logs:
        for i, f in enumerate(failures):
            if f.role == "learner" and not f.message and f.container:
                try:
                    text = core.read_namespaced_pod_log(f.pod, namespace, container=f.container, tail_lines=50,
                                                        previous=False, _request_timeout=kube_timeout(request_timeout))
                except ApiException as exc:
                    text = f"(log not readable: HTTP {exc.status} {exc.reason})"
                except urllib3.exceptions.HTTPError as exc:
                    text = f"(log not readable: no answer: {type(exc).__name__})"
                failures[i] = PodFailure(f.pod, f.role, f.container, f.exit_code, f.reason, _tail(text), f.finished_at)
    return failures
