"""Submit the SAO JobSet, re-attach to it after a retry, follow it to the end, explain failures.

Used by the ``train_sao`` KFP step on a cluster (it runs in the lightweight ``base`` image):

    name = launch_or_attach(api, core, namespace, build_sao_jobset(...))
    status = wait_for_jobset(api, core, namespace, name, poll_s=30, timeout_s=7 * 86400)

* ``launch_or_attach`` creates the JobSet; on 409 AlreadyExists it attaches to the existing one if
  it carries the same ``posttrain.io/run-id`` annotation (a retried step), and refuses otherwise.
  Before creating, it checks that what the pods will need exists (Secrets and their keys,
  ConfigMaps, the Kueue LocalQueue), so a missing Secret fails the step in seconds instead of
  leaving pods in ``CreateContainerConfigError``.
* ``watch_jobset`` polls the JobSet (bounded: every ``poll_s`` seconds until ``timeout_s``) and
  yields a ``JobSetStatus`` whenever the phase or a replicatedJob count changes; while Kueue holds
  the JobSet suspended it adds the Workload's admission message (e.g. waiting for quota).
* ``wait_for_jobset`` consumes it, returns on ``Completed`` and raises ``JobSetFailed`` on ``Failed``
  with the JobSet condition and the learner pod's termination reason, exit code and message.

Cleanup, so a terminated pipeline run never leaves the JobSet (and its GPUs) running:

* ``delete_on_termination`` (around launch and wait): SIGTERM, which a terminated KFP run sends to
  its step's pod, deletes the JobSet and exits with status 143 (128 + SIGTERM).
* ``owner_reference_from_env``: the launcher's own pod (``POD_NAME``/``POD_UID`` from the downward
  API) becomes an owner of the JobSet, so the garbage collector deletes the JobSet when the pod is
  deleted, even if the launcher died without handling a signal (SIGKILL, node loss). A retried
  step that re-attaches adds its own pod; the JobSet goes once every owner pod is gone.

Transient API errors (5xx, connection errors) are retried ``max_api_errors`` times in a row, then
raised; 401/403/404 are raised at once. Nothing here retries without bound.

What the JobSet is doing (status, Kueue's message, failed containers) is read in
``posttrain.cluster.jobset_status``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from posttrain.cluster.jobset import QUEUE_LABEL, RUN_ID_ANNOTATION
from posttrain.cluster.jobset_status import (
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_VERSION,
    TERMINAL_PHASES,
    JobSetStatus,
    PodFailure,
    jobset_status,
    kueue_admission_message,
    pod_failures,
)

log = logging.getLogger(__name__)

_URL_SAFE = re.compile(r"^[A-Za-z0-9._~-]+$")
POD_NAME_ENV = "POD_NAME"
"""The launcher pod's name (downward API ``metadata.name``), for the JobSet's ownerReference."""
POD_UID_ENV = "POD_UID"
"""The launcher pod's uid (downward API ``metadata.uid``), for the JobSet's ownerReference."""


class JobSetError(RuntimeError):
    """Base class of launcher errors; the message names the JobSet and namespace."""


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


class Terminated(SystemExit):
    """The launcher got a termination signal; its JobSet was deleted. Exits with status 128 + signal number.

    A ``SystemExit`` so that no ``except Exception`` on the way up swallows it.

    Attributes:
        signum: The signal received.
    """

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def owner_reference_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """An ownerReference to the launcher's own pod, from ``POD_NAME`` and ``POD_UID``; None (logged) when either is unset.

    The pod must be in the JobSet's namespace (a KFP step runs in the tenant's profile namespace,
    where it creates the JobSet). ``blockOwnerDeletion`` is left out: setting it needs update rights
    on the pod's finalizers, which the pipeline runner does not have.
    """
    env = os.environ if env is None else env
    name, uid = env.get(POD_NAME_ENV), env.get(POD_UID_ENV)
    if not name or not uid:
        log.info("%s/%s not set (no downward API): the JobSet gets no ownerReference and is deleted only on SIGTERM",
                 POD_NAME_ENV, POD_UID_ENV)
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


@contextlib.contextmanager
def delete_on_termination(
    api: CustomObjectsApi, namespace: str, name: str, signals: tuple[int, ...] = (signal.SIGTERM,),
) -> Iterator[None]:
    """Inside the block, a signal in ``signals`` deletes the JobSet ``name`` and raises ``Terminated``.

    Install it before creating the JobSet (its name is known up front), so a signal between the
    create and the watch still deletes it. Further signals during the deletion are ignored; the
    previous handlers are restored on leaving. Outside the main thread it installs nothing (logged).

    Raises:
        Terminated: a signal arrived; the JobSet was deleted (or did not exist yet).
    """

    def handler(signum: int, frame: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated(signum)

    if threading.current_thread() is not threading.main_thread():  # Python runs signal handlers there only
        log.warning("not the main thread: JobSet %s/%s is not deleted on a signal (its ownerReference still applies)",
                    namespace, name)
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    except Terminated as exc:
        log.warning("signal %d: deleting JobSet %s/%s before exiting", exc.signum, namespace, name)
        try:
            delete_jobset(api, namespace, name)
        except (ApiException, urllib3.exceptions.HTTPError) as delete_error:
            log.error("could not delete JobSet %s/%s: %s (its ownerReference, if set, still lets the "
                      "garbage collector delete it with this pod)", namespace, name, delete_error)
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


def _check_preflight(api: CustomObjectsApi, core: CoreV1Api, namespace: str, jobset: Mapping[str, Any]) -> None:
    """Check the LocalQueue, Secrets (and keys) and ConfigMaps the JobSet refers to.

    Raises:
        PreflightError: one of them is missing, unreadable, or the Redis password is not URL-safe.
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
        return PreflightError(f"cannot read {what} in namespace {namespace} (HTTP {exc.status} {exc.reason}); check the pipeline-runner Role")

    if queue:
        try:
            api.get_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", queue)
        except ApiException as exc:
            raise fail(f"Kueue LocalQueue {queue!r} (label {QUEUE_LABEL})", exc) from exc
    for name, keys in sorted(secrets.items()):
        try:
            secret = core.read_namespaced_secret(name, namespace)
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
            core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            raise fail(f"ConfigMap {name!r}", exc) from exc


def launch_or_attach(
    api: CustomObjectsApi,
    core: CoreV1Api,
    namespace: str,
    jobset: Mapping[str, Any],
    *,
    preflight: bool = True,
    owner: Mapping[str, Any] | None = None,
) -> str:
    """Create the JobSet, or attach to the one a previous attempt of the same run created.

    Args:
        api: Custom objects client.
        core: Core client (preflight reads Secrets, ConfigMaps).
        namespace: Tenant namespace; must equal ``jobset.metadata.namespace`` when that is set.
        jobset: The object from ``build_sao_jobset``.
        preflight: Check what the pods refer to before creating.
        owner: An ownerReference (``owner_reference_from_env``) set on the created JobSet, or added
            to the ownerReferences of the JobSet attached to; None: none.

    Returns:
        The JobSet name.

    Raises:
        ValueError: namespace mismatch or no name.
        PreflightError: a referenced Secret/key, ConfigMap or LocalQueue is missing or unreadable.
        JobSetConflict: the name is taken by a JobSet of another run id.
        kubernetes.client.exceptions.ApiException: any other API error on create.
    """
    meta = jobset.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError("jobset.metadata.name: missing")
    if meta.get("namespace", namespace) != namespace:
        raise ValueError(f"jobset.metadata.namespace {meta['namespace']!r} differs from namespace {namespace!r}")
    body = {**jobset, "metadata": {**meta, "namespace": namespace}}
    if owner is not None:
        body["metadata"]["ownerReferences"] = [*(meta.get("ownerReferences") or []), dict(owner)]
    run_id = (meta.get("annotations") or {}).get(RUN_ID_ANNOTATION)
    if preflight:
        _check_preflight(api, core, namespace, body)
    try:
        api.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    else:
        log.info("created JobSet %s/%s (run id %s)", namespace, name, run_id)
        return name
    existing = api.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name)
    theirs = (existing.get("metadata", {}).get("annotations") or {}).get(RUN_ID_ANNOTATION)
    if theirs != run_id:
        raise JobSetConflict(
            f"JobSet {namespace}/{name} already exists for run id {theirs!r}, not {run_id!r}; refusing to attach"
        )
    owners = existing.get("metadata", {}).get("ownerReferences") or []
    if owner is not None and all(o.get("uid") != owner["uid"] for o in owners):
        # A merge patch replaces the whole list: send the old owners too (the pod of a failed attempt
        # may still exist; the JobSet is collected once every owner is gone).
        api.patch_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name,
                                           {"metadata": {"ownerReferences": [*owners, dict(owner)]}})
    log.info("attached to existing JobSet %s/%s (run id %s)", namespace, name, run_id)
    return name


def _transient(exc: Exception) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (0, 429) or exc.status >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError)


def watch_jobset(
    api: CustomObjectsApi,
    namespace: str,
    name: str,
    *,
    poll_s: float = 30.0,
    timeout_s: float = 7 * 86400.0,
    max_api_errors: int = 5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[JobSetStatus]:
    """Poll a JobSet and yield its status at the first poll and on every transition.

    The generator ends after yielding a ``Completed`` or ``Failed`` status.

    Args:
        api: Custom objects client.
        namespace: JobSet namespace.
        name: JobSet name.
        poll_s: Seconds between polls (> 0).
        timeout_s: Seconds (from the first poll) after which ``JobSetTimeout`` is raised (> 0).
        max_api_errors: Consecutive transient API errors tolerated before raising.
        clock: Monotonic clock in seconds (tests pass a fake one).
        sleep: Sleep function in seconds (tests pass a fake one).

    Raises:
        ValueError: ``poll_s`` or ``timeout_s`` not positive.
        JobSetGone: the JobSet does not exist (404).
        JobSetTimeout: not finished by the deadline.
        JobSetError: more than ``max_api_errors`` transient errors in a row (chained to the last).
        kubernetes.client.exceptions.ApiException: a non-transient API error (401, 403...).
    """
    if poll_s <= 0 or timeout_s <= 0:
        raise ValueError(f"poll_s and timeout_s must be > 0, got poll_s={poll_s} timeout_s={timeout_s}")
    deadline = clock() + timeout_s
    last: JobSetStatus | None = None
    errors = 0
    while True:
        try:
            obj = api.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name)
            errors = 0
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                raise JobSetGone(f"JobSet {namespace}/{name} does not exist (never created, or deleted while being watched)") from exc
            if not _transient(exc):
                raise
            errors += 1
            log.warning("reading JobSet %s/%s failed (%d/%d in a row): %s", namespace, name, errors, max_api_errors, exc)
            if errors > max_api_errors:
                raise JobSetError(
                    f"JobSet {namespace}/{name}: {errors} API errors in a row while watching; giving up"
                ) from exc
        else:
            status = jobset_status(obj)
            if status.phase == "Queued":
                status = dataclasses.replace(status, message=kueue_admission_message(api, namespace, obj["metadata"].get("uid", "")))
            if last is None or status.key() != last.key():
                yield status
            last = status
            if status.phase in TERMINAL_PHASES:
                return
        now = clock()
        if now >= deadline:
            where = f"; last status: {last.summary()}" if last else "; it was never read"
            raise JobSetTimeout(f"JobSet {namespace}/{name} did not finish within {timeout_s:g} s{where}", last)
        sleep(min(poll_s, deadline - now))


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
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobSetStatus:
    """Follow a JobSet until it completes; report each transition through ``on_status``.

    Args:
        api: Custom objects client.
        core: Core client (reads the failed pods).
        namespace: JobSet namespace.
        name: JobSet name.
        poll_s: Seconds between polls.
        timeout_s: Seconds after which ``JobSetTimeout`` is raised.
        on_status: Called with every new status; default logs ``status.summary()`` at INFO.
        max_api_errors: Consecutive transient API errors tolerated.
        clock: Monotonic clock in seconds.
        sleep: Sleep function in seconds.

    Returns:
        The ``Completed`` status.

    Raises:
        JobSetFailed: the JobSet failed; carries the learner's termination reason and message.
        JobSetTimeout, JobSetGone, JobSetError: see ``watch_jobset``.
    """
    report = on_status or (lambda s: log.info("%s", s.summary()))
    for status in watch_jobset(api, namespace, name, poll_s=poll_s, timeout_s=timeout_s,
                               max_api_errors=max_api_errors, clock=clock, sleep=sleep):
        report(status)
        if status.phase == "Completed":
            return status
        if status.phase == "Failed":
            raise JobSetFailed(name, namespace, status.reason or "Failed", status.message, pod_failures(core, namespace, name))
    raise JobSetError(f"JobSet {namespace}/{name}: watch ended without a terminal status")


def delete_jobset(api: CustomObjectsApi, namespace: str, name: str) -> bool:
    """Delete a JobSet and (foreground propagation) its Jobs and pods, e.g. from an exit handler.

    Returns:
        True if it was deleted, False if it did not exist.

    Raises:
        kubernetes.client.exceptions.ApiException: any error other than 404.
    """
    try:
        api.delete_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, propagation_policy="Foreground"
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    log.info("deleted JobSet %s/%s", namespace, name)
    return True
