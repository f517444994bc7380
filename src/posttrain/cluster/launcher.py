"""Submit the SAO JobSet, re-attach to it after a retry, follow it to the end, explain failures.

Used by the ``train_sao`` KFP step on a cluster (``posttrain.kfp.train_cluster``):

    owner = run_owner(core, pod_name, pod_namespace, namespace)        # the run's Argo Workflow
    with cancel_on_termination(api, core, namespace, name, pod_name=..., pod_namespace=..., workflow=owner):
        name = launch_or_attach(api, core, namespace, build_sao_jobset(...), owner=owner)
        status = wait_for_jobset(api, core, namespace, name, poll_s=30, timeout_s=7 * 86400)

* ``launch_or_attach`` creates the JobSet. On 409 AlreadyExists it looks at the existing one:
  another run id -> refused (``JobSetConflict``); being deleted (``metadata.deletionTimestamp``) ->
  it waits, bounded by ``deletion_timeout_s``, until the object is gone, then creates a new one;
  ``Failed`` -> deleted and created fresh (the learner resumes from the run's checkpoints), or an
  error that says why it cannot be; otherwise it attaches (a retried step). Before creating, it
  checks that what the pods will need exists (Secrets and their keys, ConfigMaps, the Kueue
  LocalQueue), so a missing Secret fails the step in seconds instead of leaving pods in
  ``CreateContainerConfigError``.
* ``watch_jobset`` reads the JobSet, then follows it with a Kubernetes watch (at most ``poll_s``
  seconds per watch request, then it reads again), and yields a ``JobSetStatus`` at the first
  read and whenever the phase or a replicatedJob count changes; while Kueue holds the JobSet
  suspended it adds the Workload's admission message. Bounded by ``timeout_s``.
* ``wait_for_jobset`` consumes it, returns on ``Completed`` and raises ``JobSetFailed`` on ``Failed``
  with the JobSet condition and the learner pod's termination reason, exit code and message.

Cancel and eviction are told apart, so that a cancelled run frees its GPUs and a moved launcher does
not kill the training:

* Ownership: the JobSet's ownerReference is the KFP run's Argo Workflow (``run_owner`` reads it
  from the launcher pod's own ownerReferences), never the launcher pod. Deleting the run deletes
  the Workflow, and the garbage collector then deletes the JobSet; a launcher pod that is evicted,
  drained or lost with its node leaves it alone. An owner in another namespace is never set (the
  garbage collector treats it as absent and would delete the JobSet at once).
* SIGTERM (``cancel_on_termination``): the launcher reads the Workflow and its own pod
  (``termination_cause``). A terminated run (KFP sets the Workflow's
  ``spec.activeDeadlineSeconds`` to 0; Argo's ``spec.shutdown``), a Workflow being deleted or gone,
  or a signal with no sign of eviction -> the JobSet is deleted. The pod being deleted
  (``deletionTimestamp``: eviction, drain) or carrying a ``DisruptionTarget`` condition (node
  shutdown, preemption) while the run goes on -> the JobSet is left running and a retried step
  re-attaches. Either way the launcher exits with status 143 (128 + SIGTERM).

Every API request carries a timeout (``request_timeout``, default ``REQUEST_TIMEOUT_S``); an API
server that stops answering gives a one-line ``KubeUnavailable`` error after a bounded number of
attempts. Transient errors (5xx, 429, connection errors, timeouts) while watching are retried
``max_api_errors`` times in a row, then raised; 401/403/404 are raised at once.

What the JobSet is doing (status, Kueue's message, failed containers) is read in
``posttrain.cluster.jobset_status``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import watch as kube_watch
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from posttrain.cluster.jobset import (
    JOB_DELETION_SLACK_S,
    LEARNER_TERMINATION_GRACE_S,
    QUEUE_LABEL,
    RUN_ID_ANNOTATION,
)
from posttrain.cluster.jobset_status import (
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_VERSION,
    REQUEST_TIMEOUT_S,
    TERMINAL_PHASES,
    JobSetStatus,
    PodFailure,
    jobset_status,
    kube_timeout,
    kueue_admission_message,
    pod_failures,
)

log = logging.getLogger(__name__)

_URL_SAFE = re.compile(r"^[A-Za-z0-9._~-]+$")
POD_NAME_ENV = "POD_NAME"
"""The launcher pod's name (downward API ``metadata.name``; KFP also sets ``KFP_POD_NAME``)."""
KFP_POD_NAME_ENV = "KFP_POD_NAME"
"""The pod name KFP's compiler injects into every step (``argocompiler/common.go``)."""
POD_NAMESPACE_ENV = "POD_NAMESPACE"
"""The launcher pod's namespace (downward API ``metadata.namespace``)."""
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""The namespace of the pod's service account, mounted into every pod that mounts its token."""
WORKFLOW_GROUP, WORKFLOW_VERSION, WORKFLOW_PLURAL = "argoproj.io", "v1alpha1", "workflows"
"""Argo Workflows' API: a KFP run is one Workflow, the owner of every step pod."""
TERMINATION_REQUEST_TIMEOUT_S = 5.0
"""Seconds each API request may take inside the SIGTERM handler: the reads and the delete must fit in
the pod's grace period (Kubernetes' default: 30 s)."""
DELETION_WAIT_S = float(LEARNER_TERMINATION_GRACE_S + JOB_DELETION_SLACK_S)
"""Seconds ``launch_or_attach`` waits for a JobSet that is being deleted to go: its learner pods get
``LEARNER_TERMINATION_GRACE_S`` to checkpoint, then the foreground deletion removes Jobs and JobSet."""
_T = TypeVar("_T")


class JobSetError(RuntimeError):
    """Base class of launcher errors; the message names the JobSet and namespace."""


class KubeUnavailable(JobSetError):
    """The Kubernetes API did not answer (timeouts, refused or reset connections) within the bounds."""


class PreflightError(JobSetError):
    """Something the JobSet's pods need is missing or unreadable (checked before creating it)."""


class JobSetConflict(JobSetError):
    """A JobSet of that name exists but belongs to a different run id."""


class JobSetGone(JobSetError):
    """The JobSet disappeared while being watched (deleted by someone else, or TTL)."""


class JobSetTimeout(JobSetError, TimeoutError):
    """The JobSet did not finish within ``timeout_s``.

    Attributes:
        last_status: The last status seen, or None if the JobSet was never read.
    """

    def __init__(self, message: str, last_status: JobSetStatus | None):
        super().__init__(message)
        self.last_status = last_status


@dataclasses.dataclass(frozen=True)
class TerminationCause:
    """Why the launcher got its signal, as far as the API tells.

    Attributes:
        cancel: True: the run was cancelled (or nothing says otherwise): delete the JobSet. False:
            the launcher pod is being moved (eviction, drain, node shutdown) while the run goes on:
            leave the JobSet for the retried step to re-attach to.
        reason: One line for the log.
    """

    cancel: bool
    reason: str


class Terminated(SystemExit):
    """The launcher got a termination signal. Exits with status 128 + signal number.

    A ``SystemExit`` so that no ``except Exception`` on the way up swallows it.

    Attributes:
        signum: The signal received.
        cause: What ``termination_cause`` decided (None until the handler has run).
        jobset_deleted: Whether the JobSet was deleted.
    """

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum
        self.cause: TerminationCause | None = None
        self.jobset_deleted = False


@dataclasses.dataclass(frozen=True)
class Owner:
    """An object that owns the JobSet (the run's Argo Workflow), and where it lives.

    Attributes:
        api_version: e.g. ``argoproj.io/v1alpha1``.
        kind: e.g. ``Workflow``.
        name: Its name.
        uid: Its uid (the garbage collector matches on it).
        namespace: Its namespace; an ownerReference can only point into the dependent's own namespace.
    """

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str

    def reference(self) -> dict[str, Any]:
        """The ``metadata.ownerReferences`` entry.

        ``blockOwnerDeletion`` and ``controller`` stay unset: the first needs update rights on the
        owner's finalizers, the second would make Kueue and JobSet treat the JobSet as another
        controller's child.
        """
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}


def _describe_unreachable(exc: Exception) -> str:
    """One line for an urllib3 error (``MaxRetryError`` wraps the real reason)."""
    reason = getattr(exc, "reason", None) or exc
    text = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
    if isinstance(reason, urllib3.exceptions.TimeoutError) or "timed out" in text.lower():
        return f"no answer in time ({type(reason).__name__})"
    return text[:200]


def _api(what: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Run one API call; an unreachable API server becomes a one-line ``KubeUnavailable``.

    Raises:
        KubeUnavailable: connection refused, reset or timed out (after the client's own retries).
        kubernetes.client.exceptions.ApiException: the server answered with an error.
    """
    try:
        return call(*args, **kwargs)
    except urllib3.exceptions.HTTPError as exc:
        raise KubeUnavailable(f"Kubernetes API did not answer while {what}: {_describe_unreachable(exc)}") from exc


def launcher_pod_from_env(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """The launcher pod's ``(name, namespace)``; None for what is not known (outside a pod).

    The name is ``POD_NAME`` (or KFP's ``KFP_POD_NAME``), the namespace ``POD_NAMESPACE`` (or the
    service account's namespace file).
    """
    env = os.environ if env is None else env
    name = env.get(POD_NAME_ENV) or env.get(KFP_POD_NAME_ENV) or None
    namespace = env.get(POD_NAMESPACE_ENV) or None
    if namespace is None and env is os.environ and Path(SA_NAMESPACE_FILE).is_file():
        namespace = Path(SA_NAMESPACE_FILE).read_text(encoding="utf-8").strip() or None
    return name, namespace


def run_owner(
    core: CoreV1Api,
    pod_name: str | None,
    pod_namespace: str | None,
    jobset_namespace: str,
    *,
    request_timeout: float = REQUEST_TIMEOUT_S,
) -> Owner | None:
    """The Argo Workflow that owns the launcher's pod (the KFP run), to become the JobSet's owner.

    Returns None, with a logged reason, when the pod is not known (outside a pod), cannot be read,
    has no Workflow owner (not started by KFP/Argo), or lives in another namespace than the JobSet
    (``$POSTTRAIN_NAMESPACE`` moved it): an ownerReference to an object in another namespace is
    treated as a missing owner by the garbage collector, which would delete the JobSet at once.
    Without an owner the JobSet is deleted only by the SIGTERM handler (and its TTL after it ends).

    Args:
        core: Core client.
        pod_name: The launcher pod's name.
        pod_namespace: The launcher pod's namespace.
        jobset_namespace: Where the JobSet is created.
        request_timeout: Seconds for the pod read.

    Raises:
        KubeUnavailable: the API server did not answer.
    """
    if not pod_name or not pod_namespace:
        log.info("launcher pod unknown (%s/%s unset): the JobSet gets no owner and is deleted only on SIGTERM",
                 POD_NAME_ENV, POD_NAMESPACE_ENV)
        return None
    if pod_namespace != jobset_namespace:
        log.warning("the launcher pod is in namespace %s but the JobSet goes to %s: an owner reference cannot cross "
                    "namespaces, so the JobSet gets no owner (deleted only on SIGTERM, or by its TTL)",
                    pod_namespace, jobset_namespace)
        return None
    try:
        pod = _api(f"reading pod {pod_namespace}/{pod_name}", core.read_namespaced_pod, pod_name, pod_namespace,
                   _request_timeout=kube_timeout(request_timeout))
    except ApiException as exc:
        log.warning("cannot read the launcher pod %s/%s (HTTP %s %s): the JobSet gets no owner",
                    pod_namespace, pod_name, exc.status, exc.reason)
        return None
    for ref in pod.metadata.owner_references or []:
        if ref.kind == "Workflow" and ref.api_version.startswith(f"{WORKFLOW_GROUP}/"):
            return Owner(ref.api_version, ref.kind, ref.name, ref.uid, pod_namespace)
    log.info("pod %s/%s has no Argo Workflow owner (not a KFP step): the JobSet gets no owner", pod_namespace, pod_name)
    return None


def termination_cause(
    api: CustomObjectsApi,
    core: CoreV1Api,
    *,
    pod_name: str | None,
    pod_namespace: str | None,
    workflow: Owner | None,
    request_timeout: float = TERMINATION_REQUEST_TIMEOUT_S,
) -> TerminationCause:
    """Tell a cancelled run from a moved launcher pod, after a SIGTERM.

    In this order:

    1. the run's Workflow (``workflow``) is gone, being deleted, replaced, terminated from KFP
       (``spec.activeDeadlineSeconds: 0``, what KFP's terminate sets) or stopped
       (``spec.shutdown``) -> cancel;
    2. without a Workflow owner nothing else would ever delete the JobSet -> cancel;
    3. the launcher pod is being deleted (``deletionTimestamp``: an eviction or a drain), is
       already gone, or carries a ``DisruptionTarget=True`` condition (node shutdown, preemption,
       taint eviction) -> keep: the run goes on, a retried step re-attaches;
    4. otherwise (a signal with no sign of eviction: a person's Ctrl-C, a step timeout) -> cancel.

    Read errors are logged and skip that check; nothing here raises.
    """
    if workflow is not None:
        try:
            wf = api.get_namespaced_custom_object(WORKFLOW_GROUP, WORKFLOW_VERSION, workflow.namespace, WORKFLOW_PLURAL,
                                                  workflow.name, _request_timeout=kube_timeout(request_timeout))
        except ApiException as exc:
            if exc.status == 404:
                return TerminationCause(True, f"the run's Workflow {workflow.name} is gone (run deleted)")
            log.warning("cannot read Workflow %s/%s (HTTP %s %s)", workflow.namespace, workflow.name, exc.status, exc.reason)
        except urllib3.exceptions.HTTPError as exc:
            log.warning("cannot read Workflow %s/%s: %s", workflow.namespace, workflow.name, _describe_unreachable(exc))
        else:
            meta, spec = wf.get("metadata") or {}, wf.get("spec") or {}
            if meta.get("uid") not in (None, workflow.uid):
                return TerminationCause(True, f"the run's Workflow {workflow.name} was replaced (uid changed)")
            if meta.get("deletionTimestamp"):
                return TerminationCause(True, f"the run's Workflow {workflow.name} is being deleted (run deleted)")
            if spec.get("activeDeadlineSeconds") == 0:
                return TerminationCause(True, f"the run was terminated (Workflow {workflow.name} activeDeadlineSeconds: 0)")
            if spec.get("shutdown"):
                return TerminationCause(True, f"the run was stopped (Workflow {workflow.name} shutdown: {spec['shutdown']})")
    if workflow is None:
        return TerminationCause(True, "the JobSet has no owner that would delete it later")
    if pod_name and pod_namespace:
        try:
            pod = core.read_namespaced_pod(pod_name, pod_namespace, _request_timeout=kube_timeout(request_timeout))
        except ApiException as exc:
            if exc.status == 404:
                return TerminationCause(False, f"launcher pod {pod_name} is already deleted (eviction, drain or node loss)")
            log.warning("cannot read the launcher pod %s/%s (HTTP %s %s)", pod_namespace, pod_name, exc.status, exc.reason)
        except urllib3.exceptions.HTTPError as exc:
            log.warning("cannot read the launcher pod %s/%s: %s", pod_namespace, pod_name, _describe_unreachable(exc))
        else:
            if pod.metadata.deletion_timestamp is not None:
                return TerminationCause(False, f"launcher pod {pod_name} is being deleted (eviction or drain) while the "
                                               "run goes on")
            for cond in (pod.status.conditions if pod.status else None) or []:
                if cond.type == "DisruptionTarget" and cond.status == "True":
                    return TerminationCause(False, f"launcher pod {pod_name} is disrupted ({cond.reason}) while the run "
                                                   "goes on")
    return TerminationCause(True, "a termination signal without a sign of eviction (pod not being deleted, no "
                                  "DisruptionTarget condition)")


@contextlib.contextmanager
def cancel_on_termination(
    api: CustomObjectsApi,
    core: CoreV1Api,
    namespace: str,
    name: str,
    *,
    pod_name: str | None = None,
    pod_namespace: str | None = None,
    workflow: Owner | None = None,
    signals: tuple[int, ...] = (signal.SIGTERM,),
    request_timeout: float = TERMINATION_REQUEST_TIMEOUT_S,
) -> Iterator[None]:
    """Inside the block, a signal in ``signals`` decides (``termination_cause``) and raises ``Terminated``.

    A cancelled run deletes the JobSet ``name``; an evicted or drained launcher leaves it running
    for the retried step to re-attach to. Install it before creating the JobSet (its name is known
    up front), so a signal between the create and the watch is handled too. Further signals during
    the handling are ignored; the previous handlers are restored on leaving. Outside the main
    thread it installs nothing (logged).

    Raises:
        Terminated: a signal arrived (``cause`` and ``jobset_deleted`` say what was done).
    """

    def handler(signum: int, frame: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated(signum)

    if threading.current_thread() is not threading.main_thread():  # Python runs signal handlers there only
        log.warning("not the main thread: JobSet %s/%s is not handled on a signal (its owner, if any, still collects it)",
                    namespace, name)
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    except Terminated as exc:
        cause = termination_cause(api, core, pod_name=pod_name, pod_namespace=pod_namespace, workflow=workflow,
                                  request_timeout=request_timeout)
        exc.cause = cause
        if cause.cancel:
            log.warning("signal %d: %s; deleting JobSet %s/%s", exc.signum, cause.reason, namespace, name)
            try:
                exc.jobset_deleted = delete_jobset(api, namespace, name, request_timeout=request_timeout)
            except (ApiException, JobSetError) as delete_error:
                log.error("could not delete JobSet %s/%s: %s (its owner, if set, still lets the garbage collector "
                          "delete it with the run)", namespace, name, str(delete_error).splitlines()[0])
        else:
            log.warning("signal %d: %s; JobSet %s/%s keeps running and a retried step re-attaches to it",
                        exc.signum, cause.reason, namespace, name)
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class JobSetFailed(JobSetError):
    """The JobSet reached ``Failed``.

    Attributes:
        name: JobSet name.
        namespace: Its namespace.
        reason: Reason of the JobSet ``Failed`` condition (``ReachedMaxRestarts``, ``FailedJobs``...).
        condition_message: Message of that condition.
        learner_failure: The most recent failed learner container, if any pod is left to read.
        failures: Every failed container found, learner first, newest first.
    """

    def __init__(
        self,
        name: str,
        namespace: str,
        reason: str,
        condition_message: str,
        failures: list[PodFailure],
    ):
        self.name = name
        self.namespace = namespace
        self.reason = reason
        self.condition_message = condition_message
        self.failures = failures
        self.learner_failure = next((f for f in failures if f.role == "learner"), None)
        text = f"JobSet {namespace}/{name} failed: {reason}: {condition_message}"
        if self.learner_failure is not None:
            text += f"\nlearner failure: {self.learner_failure.describe()}"
        elif failures:
            text += f"\nno failed learner pod found; first failure: {failures[0].describe()}"
        else:
            text += "\nno failed pod found (pods may have been deleted)"
        super().__init__(text)


def _check_preflight(api: CustomObjectsApi, core: CoreV1Api, namespace: str, jobset: Mapping[str, Any],
                     request_timeout: float, ensured_secrets: Collection[str] = ()) -> None:
    """Check the LocalQueue, Secrets (and keys) and ConfigMaps the JobSet refers to.

    Secrets in ``ensured_secrets`` the caller has just created itself (the rollout gateway's token,
    ``posttrain.cluster.gateway``) are not read: the launcher's Role may create them, not read them.

    Raises:
        PreflightError: one of them is missing, unreadable, or the Redis password is not URL-safe.
        KubeUnavailable: the API server did not answer.
    """
    queue = (jobset["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    secrets: dict[str, set[str]] = {}
    config_maps: set[str] = set()
    url_safe_keys: set[tuple[str, str]] = set()
    for rjob in jobset["spec"]["replicatedJobs"]:
        for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    secrets.setdefault(ref["name"], set()).add(ref["key"])
                    if env["name"] == "REDIS_PASSWORD":
                        url_safe_keys.add((ref["name"], ref["key"]))
            for src in container.get("envFrom", []):
                if "secretRef" in src:
                    secrets.setdefault(src["secretRef"]["name"], set())
                if "configMapRef" in src:
                    config_maps.add(src["configMapRef"]["name"])

    def fail(what: str, exc: ApiException) -> PreflightError:
        if exc.status == 404:
            return PreflightError(f"{what} not found in namespace {namespace}; the JobSet's pods would never start")
        return PreflightError(f"cannot read {what} in namespace {namespace} (HTTP {exc.status} {exc.reason}); check the "
                              "pipeline-runner Role")

    if queue:
        try:
            _api(f"reading LocalQueue {namespace}/{queue}", api.get_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                 namespace, "localqueues", queue, _request_timeout=kube_timeout(request_timeout))
        except ApiException as exc:
            raise fail(f"Kueue LocalQueue {queue!r} (label {QUEUE_LABEL})", exc) from exc
    for name, keys in sorted(secrets.items()):
        if name in ensured_secrets:
            continue
        try:
            secret = _api(f"reading Secret {namespace}/{name}", core.read_namespaced_secret, name, namespace,
                          _request_timeout=kube_timeout(request_timeout))
        except ApiException as exc:
            raise fail(f"Secret {name!r}", exc) from exc
        data = secret.data or {}
        for key in sorted(keys):
            if key not in data:
                raise PreflightError(f"Secret {namespace}/{name} has no key {key!r} (keys: {sorted(data)})")
            if (name, key) in url_safe_keys and not _URL_SAFE.match(base64.b64decode(data[key]).decode("utf-8", "replace")):
                raise PreflightError(
                    f"Secret {namespace}/{name} key {key!r}: the Redis password must be URL-safe "
                    "([A-Za-z0-9._~-], e.g. `openssl rand -hex 32`) because it is spliced into REDIS_URL"
                )
    for name in sorted(config_maps):
        try:
            _api(f"reading ConfigMap {namespace}/{name}", core.read_namespaced_config_map, name, namespace,
                 _request_timeout=kube_timeout(request_timeout))
        except ApiException as exc:
            raise fail(f"ConfigMap {name!r}", exc) from exc


def _get_jobset(api: CustomObjectsApi, namespace: str, name: str, request_timeout: float) -> dict[str, Any] | None:
    """The JobSet, or None when it does not exist."""
    try:
        return _api(f"reading JobSet {namespace}/{name}", api.get_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION,
                    namespace, JOBSET_PLURAL, name, _request_timeout=kube_timeout(request_timeout))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _watch_stream(api: CustomObjectsApi, namespace: str, name: str, resource_version: str, window_s: float,
                  request_timeout: float) -> Iterator[dict[str, Any]]:
    """Watch events of the one JobSet ``name`` after ``resource_version``, for at most ``window_s`` seconds.

    The server ends the watch after ``timeout_seconds``; the client's read timeout is that plus
    ``request_timeout``, so a server that stops answering ends it too.
    """
    window = max(1, math.ceil(window_s))
    return kube_watch.Watch().stream(
        api.list_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL,
        field_selector=f"metadata.name={name}", resource_version=resource_version, timeout_seconds=window,
        _request_timeout=(request_timeout, window + request_timeout),
    )


def wait_until_deleted(
    api: CustomObjectsApi,
    namespace: str,
    name: str,
    uid: str,
    *,
    timeout_s: float = DELETION_WAIT_S,
    request_timeout: float = REQUEST_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait (watching it) until the JobSet ``name`` with ``uid`` no longer exists.

    Args:
        api: Custom objects client.
        namespace: JobSet namespace.
        name: JobSet name.
        uid: The uid of the object being deleted (an object of the same name with another uid counts as gone).
        timeout_s: Seconds to wait at most.
        request_timeout: Seconds per API request.
        clock: Monotonic clock in seconds.

    Raises:
        JobSetError: it still exists after ``timeout_s`` (the message names its finalizers).
        KubeUnavailable: the API server did not answer.
    """
    deadline = clock() + timeout_s
    while True:
        obj = _get_jobset(api, namespace, name, request_timeout)
        if obj is None or obj["metadata"].get("uid") != uid:
            return
        remaining = deadline - clock()
        if remaining <= 0:
            meta = obj["metadata"]
            raise JobSetError(
                f"JobSet {namespace}/{name} is still being deleted after {timeout_s:g} s (deletionTimestamp "
                f"{meta.get('deletionTimestamp')}, finalizers {meta.get('finalizers') or []}); not creating a new one"
            )
        try:
            for event in _api(f"watching JobSet {namespace}/{name}", _watch_stream, api, namespace, name,
                              obj["metadata"]["resourceVersion"], remaining, request_timeout):
                if event["type"] == "DELETED":
                    return
        except ApiException as exc:
            if exc.status != 410:  # 410 Gone: the watch expired; read again
                raise
        except urllib3.exceptions.HTTPError as exc:
            raise KubeUnavailable(f"Kubernetes API did not answer while watching JobSet {namespace}/{name}: "
                                  f"{_describe_unreachable(exc)}") from exc


def delete_jobset(api: CustomObjectsApi, namespace: str, name: str, *, request_timeout: float = REQUEST_TIMEOUT_S) -> bool:
    """Delete a JobSet and (foreground propagation) its Jobs and pods.

    Returns:
        True if it was deleted, False if it did not exist.

    Raises:
        kubernetes.client.exceptions.ApiException: any error other than 404.
        KubeUnavailable: the API server did not answer.
    """
    try:
        _api(f"deleting JobSet {namespace}/{name}", api.delete_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION,
             namespace, JOBSET_PLURAL, name, propagation_policy="Foreground", _request_timeout=kube_timeout(request_timeout))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    log.info("deleted JobSet %s/%s", namespace, name)
    return True


def launch_or_attach(
    api: CustomObjectsApi,
    core: CoreV1Api,
    namespace: str,
    jobset: Mapping[str, Any],
    *,
    preflight: bool = True,
    owner: Owner | None = None,
    replace_failed: bool = True,
    deletion_timeout_s: float = DELETION_WAIT_S,
    request_timeout: float = REQUEST_TIMEOUT_S,
    ensured_secrets: Collection[str] = (),
) -> str:
    """Create the JobSet, or attach to the one a previous attempt of the same run created.

    An existing JobSet of the same name and run id is attached to, unless it is being deleted (wait
    until it is gone, at most ``deletion_timeout_s``, then create) or it ``Failed`` (with
    ``replace_failed``: delete it, wait, create a fresh one; the new learner resumes from the run's
    checkpoints).

    Args:
        api: Custom objects client.
        core: Core client (preflight reads Secrets, ConfigMaps).
        namespace: Tenant namespace; must equal ``jobset.metadata.namespace`` when that is set.
        jobset: The object from ``build_sao_jobset``.
        preflight: Check what the pods refer to before creating.
        owner: The run's Workflow (``run_owner``), set as the JobSet's ownerReference on create and
            added on attach; None: none. Must be in ``namespace``.
        replace_failed: Replace a ``Failed`` JobSet of the same run by a fresh one (False: attach,
            and the wait reports the old failure).
        deletion_timeout_s: Seconds to wait for a JobSet that is being deleted.
        request_timeout: Seconds per API request.
        ensured_secrets: Secrets the caller created just before (the gateway's token); the preflight
            does not read them.

    Returns:
        The JobSet name.

    Raises:
        ValueError: namespace mismatch, no name, or an owner in another namespace.
        PreflightError: a referenced Secret/key, ConfigMap or LocalQueue is missing or unreadable.
        JobSetConflict: the name is taken by a JobSet of another run id.
        JobSetError: a JobSet being deleted did not go in time, or a failed one cannot be replaced
            (the message says why).
        KubeUnavailable: the API server did not answer.
        kubernetes.client.exceptions.ApiException: any other API error on create.
    """
    meta = jobset.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError("jobset.metadata.name: missing")
    if meta.get("namespace", namespace) != namespace:
        raise ValueError(f"jobset.metadata.namespace {meta['namespace']!r} differs from namespace {namespace!r}")
    if owner is not None and owner.namespace != namespace:
        raise ValueError(f"owner {owner.kind} {owner.namespace}/{owner.name} is not in the JobSet's namespace {namespace}: "
                         "ownership never crosses namespaces (the garbage collector would delete the JobSet at once)")
    body = {**jobset, "metadata": {**meta, "namespace": namespace}}
    if owner is not None:
        body["metadata"]["ownerReferences"] = [*(meta.get("ownerReferences") or []), owner.reference()]
    run_id = (meta.get("annotations") or {}).get(RUN_ID_ANNOTATION)
    if preflight:
        _check_preflight(api, core, namespace, body, request_timeout, ensured_secrets)
    for _attempt in range(3):  # create; at most twice more after a deletion we waited out
        try:
            _api(f"creating JobSet {namespace}/{name}", api.create_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION,
                 namespace, JOBSET_PLURAL, body, _request_timeout=kube_timeout(request_timeout))
        except ApiException as exc:
            if exc.status != 409:
                raise
        else:
            log.info("created JobSet %s/%s (run id %s)", namespace, name, run_id)
            return name
        existing = _get_jobset(api, namespace, name, request_timeout)
        if existing is None:
            continue  # deleted between our create and read: create again
        emeta = existing.get("metadata") or {}
        theirs = (emeta.get("annotations") or {}).get(RUN_ID_ANNOTATION)
        if theirs != run_id:
            raise JobSetConflict(
                f"JobSet {namespace}/{name} already exists for run id {theirs!r}, not {run_id!r}; refusing to attach"
            )
        if emeta.get("deletionTimestamp"):
            log.info("JobSet %s/%s is being deleted (since %s); waiting up to %g s for it to go before creating it again",
                     namespace, name, emeta["deletionTimestamp"], deletion_timeout_s)
            wait_until_deleted(api, namespace, name, emeta["uid"], timeout_s=deletion_timeout_s,
                               request_timeout=request_timeout)
            continue
        status = jobset_status(existing)
        if status.phase == "Failed" and replace_failed:
            log.warning("JobSet %s/%s of this run failed earlier (%s: %s); deleting it and starting a fresh one "
                        "(the learner resumes from the run's checkpoints)", namespace, name, status.reason, status.message)
            try:
                delete_jobset(api, namespace, name, request_timeout=request_timeout)
            except ApiException as exc:
                raise JobSetError(
                    f"JobSet {namespace}/{name} failed earlier ({status.reason}) and cannot be replaced: deleting it "
                    f"was refused (HTTP {exc.status} {exc.reason}); delete it by hand or start a new run"
                ) from exc
            wait_until_deleted(api, namespace, name, emeta["uid"], timeout_s=deletion_timeout_s,
                               request_timeout=request_timeout)
            continue
        owners = emeta.get("ownerReferences") or []
        if owner is not None and all(o.get("uid") != owner.uid for o in owners):
            # A merge patch replaces the whole list: send the old owners too.
            _api(f"patching JobSet {namespace}/{name}", api.patch_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION,
                 namespace, JOBSET_PLURAL, name, {"metadata": {"ownerReferences": [*owners, owner.reference()]}},
                 _request_timeout=kube_timeout(request_timeout))
        log.info("attached to existing JobSet %s/%s (run id %s, %s)", namespace, name, run_id, status.phase)
        return name
    raise JobSetError(f"JobSet {namespace}/{name} kept reappearing while being replaced; giving up after 3 attempts")


def _transient(exc: Exception) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (0, 429) or exc.status >= 500
    return isinstance(exc, (urllib3.exceptions.HTTPError, KubeUnavailable))


def watch_jobset(
    api: CustomObjectsApi,
    namespace: str,
    name: str,
    *,
    poll_s: float = 30.0,
    timeout_s: float = 7 * 86400.0,
    max_api_errors: int = 5,
    request_timeout: float = REQUEST_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[JobSetStatus]:
    """Follow a JobSet with a Kubernetes watch; yield its status at the first read and on every transition.

    Each round reads the JobSet, then watches it from that read's ``resourceVersion`` for at most
    ``poll_s`` seconds (an expired watch, 410, just starts the next round). The generator ends
    after yielding a ``Completed`` or ``Failed`` status.

    Args:
        api: Custom objects client.
        namespace: JobSet namespace.
        name: JobSet name.
        poll_s: Longest a single watch request stays open, seconds (> 0); the JobSet is read again
            after it, and at most every ``poll_s`` seconds after an API error.
        timeout_s: Seconds (from the first read) after which ``JobSetTimeout`` is raised (> 0).
        max_api_errors: Consecutive transient API errors tolerated before raising.
        request_timeout: Seconds per API request (the watch's read timeout is ``poll_s`` more).
        clock: Monotonic clock in seconds.
        sleep: Sleep function in seconds (the back-off after an API error).

    Raises:
        ValueError: ``poll_s`` or ``timeout_s`` not positive.
        JobSetGone: the JobSet does not exist (404) or was deleted while being watched.
        JobSetTimeout: not finished by the deadline.
        JobSetError: more than ``max_api_errors`` transient errors in a row (``KubeUnavailable``
            when the API server stopped answering), one line, chained to the last error.
        kubernetes.client.exceptions.ApiException: a non-transient API error (401, 403...).
    """
    if poll_s <= 0 or timeout_s <= 0:
        raise ValueError(f"poll_s and timeout_s must be > 0, got poll_s={poll_s} timeout_s={timeout_s}")
    deadline = clock() + timeout_s
    last: JobSetStatus | None = None
    errors = 0

    def observe(obj: Mapping[str, Any]) -> JobSetStatus:
        status = jobset_status(obj)
        if status.phase == "Queued":
            message = kueue_admission_message(api, namespace, obj["metadata"].get("uid", ""), request_timeout=request_timeout)
            status = dataclasses.replace(status, message=message)
        return status

    gone = f"JobSet {namespace}/{name} does not exist (never created, or deleted while being watched)"
    while True:
        try:
            obj = _get_jobset(api, namespace, name, request_timeout)
            if obj is None:
                raise JobSetGone(gone)
            status = observe(obj)
            errors = 0
            if last is None or status.key() != last.key():
                yield status
            last = status
            if status.phase in TERMINAL_PHASES:
                return
            remaining = deadline - clock()
            if remaining > 0:
                for event in _watch_stream(api, namespace, name, obj["metadata"]["resourceVersion"],
                                           min(poll_s, remaining), request_timeout):
                    if event["type"] == "DELETED":
                        raise JobSetGone(gone)
                    if event["type"] not in ("ADDED", "MODIFIED"):
                        continue
                    status = observe(event["raw_object"])
                    if status.key() != last.key():
                        yield status
                    last = status
                    if status.phase in TERMINAL_PHASES:
                        return
        except (ApiException, urllib3.exceptions.HTTPError, KubeUnavailable) as exc:
            if isinstance(exc, ApiException) and exc.status == 410:
                continue  # the watch's resourceVersion expired: read again
            if not _transient(exc):
                raise
            errors += 1
            reason = str(exc).splitlines()[0] if isinstance(exc, KubeUnavailable) else (
                _describe_unreachable(exc) if isinstance(exc, urllib3.exceptions.HTTPError) else f"HTTP {exc.status} {exc.reason}")
            log.warning("following JobSet %s/%s failed (%d/%d in a row): %s", namespace, name, errors, max_api_errors, reason)
            if errors > max_api_errors:
                kind = KubeUnavailable if not isinstance(exc, ApiException) else JobSetError
                raise kind(f"JobSet {namespace}/{name}: {errors} API errors in a row while watching, last: {reason}; "
                           "giving up") from exc
            now = clock()
            if now < deadline:
                sleep(min(poll_s, 2.0 ** (errors - 1), deadline - now))
        now = clock()
        if now >= deadline:
            where = f"; last status: {last.summary()}" if last else "; it was never read"
            raise JobSetTimeout(f"JobSet {namespace}/{name} did not finish within {timeout_s:g} s{where}", last)


def wait_for_jobset(
    api: CustomObjectsApi,
    core: CoreV1Api,
    namespace: str,
    name: str,
    *,
    poll_s: float = 30.0,
    timeout_s: float = 7 * 86400.0,
    on_status: Callable[[JobSetStatus], None] | None = None,
    max_api_errors: int = 5,
    request_timeout: float = REQUEST_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobSetStatus:
    """Follow a JobSet until it completes; report each transition through ``on_status``.

    Args:
        api: Custom objects client.
        core: Core client (reads the failed pods).
        namespace: JobSet namespace.
        name: JobSet name.
        poll_s: Longest single watch request, seconds (see ``watch_jobset``).
        timeout_s: Seconds after which ``JobSetTimeout`` is raised.
        on_status: Called with every new status; default logs ``status.summary()`` at INFO.
        max_api_errors: Consecutive transient API errors tolerated.
        request_timeout: Seconds per API request.
        clock: Monotonic clock in seconds.
        sleep: Sleep function in seconds.

    Returns:
        The ``Completed`` status.

    Raises:
        JobSetFailed: the JobSet failed; carries the learner's termination reason and message.
        JobSetTimeout, JobSetGone, JobSetError, KubeUnavailable: see ``watch_jobset``.
    """
    report = on_status or (lambda s: log.info("%s", s.summary()))
    for status in watch_jobset(api, namespace, name, poll_s=poll_s, timeout_s=timeout_s, max_api_errors=max_api_errors,
                               request_timeout=request_timeout, clock=clock, sleep=sleep):
        report(status)
        if status.phase == "Completed":
            return status
        if status.phase == "Failed":
            failures = _api(f"listing the pods of JobSet {namespace}/{name}", pod_failures, core, namespace, name,
                            request_timeout=request_timeout)
            raise JobSetFailed(name, namespace, status.reason or "Failed", status.message, failures)
    raise JobSetError(f"JobSet {namespace}/{name}: watch ended without a terminal status")
