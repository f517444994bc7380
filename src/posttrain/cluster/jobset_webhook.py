"""The JobSet admission webhook of the pinned JobSet release, applied offline to a JobSet dict.

A JobSet is checked twice on a real cluster: by the API server against the CRD (schema and CEL
rules: ``posttrain.cluster.validate`` and the real-API-server tests cover those), and by the JobSet
controller's webhook, which no test cluster here runs. This module re-implements the webhook's
rules for **JobSet v0.12.0** (``kubernetes-sigs/jobset`` tag ``v0.12.0``, commit ``f22e565``), so
that a JobSet a stock install would refuse is refused here, with the webhook's own reason:

* ``pkg/webhooks/jobset_webhook.go`` ``Default`` (the mutating webhook: success and startup policy,
  completion mode, restart policy, DNS hostnames, failure-policy rule names) -> ``default``;
* same file, ``ValidateCreate`` and ``validateFailurePolicy`` (feature-gated actions and restart
  strategy, ``dependsOn`` of the first replicatedJob, generated Job and pod names, rule names,
  targets and failure reasons, coordinator) -> ``validate_create``;
* same file, ``ValidateUpdate`` (``replicatedJobs`` and ``managedBy`` immutable, except the pod
  template fields Kueue mutates while the JobSet is suspended) and the CEL rules of
  ``config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml`` (``failurePolicy``, ``network``,
  ``successPolicy``, ``startupPolicy``, ``volumeClaimPolicies`` and each ``dependsOn`` immutable;
  ``startupPolicy: InOrder`` and ``dependsOn`` mutually exclusive) -> ``validate_update`` and
  ``validate_create``;
* ``pkg/features/features.go``: the feature gates and their defaults -> ``DEFAULT_FEATURE_GATES``.
  In v0.12 ``RestartJob`` (the ``RestartJob`` and ``RestartJobAndIgnoreMaxRestarts`` failure
  actions), ``InPlaceRestart`` and ``ElasticJobSet`` are alpha and off; a cluster admin turns one on
  with ``--feature-gates=RestartJob=true`` on the JobSet controller manager.

Not re-implemented: ``volumeClaimPolicies`` (posttrain writes none; the webhook reads existing PVCs
for them). Messages are the webhook's strings; each error is one line naming the field.

Example: ``validate_create(build_sao_jobset(...), {"RestartJob": False})`` -> ``[]`` for the
default SAO JobSet, and the webhook's ``"RestartJob and RestartJobAndIgnoreMaxRestarts failure
policy actions are not allowed when RestartJob feature gate is disabled"`` for one that asks for
``RestartJob`` on a stock install.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

JOBSET_RELEASE = "v0.12.0"
"""The JobSet release whose webhook this module follows (``kubernetes-sigs/jobset`` tag, commit f22e565)."""
WEBHOOK_NAME = "vjobset.kb.io"
"""Name of the validating webhook in the JobSet install (its message prefix on a real cluster)."""
DEFAULT_FEATURE_GATES: dict[str, bool] = {
    "InPlaceRestart": False,
    "TLSOptions": True,
    "RestartJob": False,
    "ElasticJobSet": False,
}
"""``pkg/features/features.go`` at v0.12.0: the gates and their defaults on a stock install."""
RESTART_JOB_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
"""Failure-policy actions that need the ``RestartJob`` gate."""
RESTART_JOB_GATE_MESSAGE = (
    "RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed when RestartJob "
    "feature gate is disabled"
)
"""The webhook's reason for refusing a gated action (``validateFailurePolicy``, jobset_webhook.go:440-443)."""
MAX_REPLICAS_WITH_RESTART_JOB = 1024
"""``maxReplicasPerReplicatedJob``: replicas allowed per replicatedJob with a ``RestartJob*`` rule."""
VALID_JOB_FAILURE_REASONS = (
    "BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded", "PodFailurePolicy",
)
"""``validOnJobFailureReasons``: the Job failure reasons a rule's ``onJobFailureReasons`` may name."""
IMMUTABLE_BY_CEL = ("failurePolicy", "network", "successPolicy", "startupPolicy", "volumeClaimPolicies")
"""``spec`` fields the CRD marks ``self == oldSelf`` (``Value is immutable``); each ``dependsOn`` too."""
MUTABLE_WHILE_SUSPENDED = ("labels", "annotations", "nodeSelector", "tolerations", "schedulingGates")
"""Pod template fields ``ValidateUpdate`` lets change while the JobSet is (or is being) suspended (Kueue)."""

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_MAX_INT32 = 2**31 - 1


class JobSetRejected(ValueError):
    """The webhook (or a CEL rule of the CRD) would refuse the JobSet.

    Attributes:
        name: The JobSet's name.
        errors: One line per rule broken, each with the webhook's own message.
    """

    def __init__(self, name: str, errors: list[str]):
        self.name = name
        self.errors = errors
        super().__init__(
            f'admission webhook "{WEBHOOK_NAME}" (JobSet {JOBSET_RELEASE}) would deny JobSet {name!r}: '
            + "; ".join(errors)
        )


def feature_gates(overrides: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """The v0.12 gates with ``overrides`` applied.

    Raises:
        ValueError: ``overrides`` names a gate v0.12 does not have.
    """
    gates = dict(DEFAULT_FEATURE_GATES)
    for gate, value in (overrides or {}).items():
        if gate not in gates:
            raise ValueError(f"feature gate {gate!r}: JobSet {JOBSET_RELEASE} has only {sorted(gates)}")
        gates[gate] = bool(value)
    return gates


def _dns1035_errors(value: str) -> list[str]:
    """``validation.IsDNS1035Label`` messages (length first, then format)."""
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _DNS1035.match(value):
        errors.append("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                      "alphabetic character, and end with an alphanumeric character")
    return errors


def _dns1123_subdomain_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        errors.append("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                      "'.', and must start and end with an alphanumeric character")
    return errors


def default(jobset: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSet after the CRD's defaults and the mutating webhook (``Default``), as a new dict.

    CRD defaults: ``replicas: 1``, ``groupName: default``, ``failurePolicy.restartStrategy: Recreate``.
    Webhook: ``successPolicy {operator: All}``, ``startupPolicy {startupPolicyOrder: AnyOrder}``,
    ``completionMode: Indexed``, pod ``restartPolicy: OnFailure``, ``network.enableDNSHostnames`` and
    ``publishNotReadyAddresses`` true, rule names ``failurePolicyRule<i>``.
    """
    js = copy.deepcopy(dict(jobset))
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        rjob.setdefault("replicas", 1)
        rjob.setdefault("groupName", "default")
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    policy = spec.get("failurePolicy")
    if policy is not None:
        policy.setdefault("restartStrategy", "Recreate")
        for i, rule in enumerate(policy.get("rules") or []):
            if not rule.get("name"):
                rule["name"] = f"failurePolicyRule{i}"
    return js


def _failure_policy_errors(spec: Mapping[str, Any], names: set[str], gates: Mapping[str, bool]) -> list[str]:
    """``validateFailurePolicy`` (jobset_webhook.go:425-494)."""
    policy = spec.get("failurePolicy")
    if policy is None:
        return []
    rules = policy.get("rules") or []
    errors: list[str] = []
    if any(rule.get("action") in RESTART_JOB_ACTIONS for rule in rules):
        if not gates["RestartJob"]:
            return [RESTART_JOB_GATE_MESSAGE]  # the webhook returns early on this one
        if any(rjob.get("replicas", 1) > MAX_REPLICAS_WITH_RESTART_JOB for rjob in spec.get("replicatedJobs") or []):
            errors.append("JobSet cannot have a failure policy rule with RestartJob or RestartJobAndIgnoreMaxRestarts "
                          f"action and a replicated job with replicas > {MAX_REPLICAS_WITH_RESTART_JOB}")
    seen: dict[str, list[int]] = {}
    for index, rule in enumerate(rules):
        name = rule.get("name", "")
        if not 1 <= len(name) <= 128:
            errors.append(f"invalid failure policy rule name of length {len(name)}, the rule name must be at least 1 "
                          "characters long and at most 128 characters long")
        seen.setdefault(name, []).append(index)
        if not _RULE_NAME.match(name):
            errors.append(f"invalid failure policy rule name '{name}', a failure policy rule name must start with an "
                          "alphabetic character, optionally followed by a string of alphanumeric characters or "
                          "'_,:', and must end with an alphanumeric character or '_'")
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                errors.append(f"invalid replicatedJob name '{target}' in failure policy does not appear in "
                              ".spec.ReplicatedJobs")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in VALID_JOB_FAILURE_REASONS:
                errors.append(f"invalid job failure reason '{reason}' in failure policy is not a recognized job "
                              "failure reason")
    for name, indices in seen.items():
        if len(indices) > 1:
            errors.append(f"rule names are not unique, rules with indices {indices} all have the same name '{name}'")
    return errors


def validate_create(jobset: Mapping[str, Any], gates: Mapping[str, bool] | None = None) -> list[str]:
    """Every reason the v0.12 webhook (and the CRD's CEL rules) would refuse to create ``jobset``.

    The JobSet is defaulted first (``default``), as on a cluster, where the mutating webhook runs
    before the validating one.

    Args:
        jobset: The JobSet dict (``build_sao_jobset``'s output or any other).
        gates: Feature-gate overrides (``{"RestartJob": True}`` where the admin turned it on);
            None: a stock v0.12 install.

    Returns:
        One message per problem; empty when a stock (or ``gates``) install would accept it.

    Raises:
        ValueError: ``gates`` names an unknown gate.
    """
    gates = feature_gates(gates)
    js = default(jobset)
    name = str((js.get("metadata") or {}).get("name", ""))
    spec = js["spec"]
    rjobs = spec.get("replicatedJobs") or []
    errors: list[str] = []
    policy = spec.get("failurePolicy")
    if not gates["InPlaceRestart"] and policy is not None and policy.get("restartStrategy") == "InPlaceRestart":
        errors.append("InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate is disabled")
    if rjobs and rjobs[0].get("dependsOn") is not None:
        errors.append("DependsOn can't be set for the first ReplicatedJob")
    subdomain = (spec.get("network") or {}).get("subdomain") or ""
    if subdomain:
        for msg in _dns1123_subdomain_errors(subdomain):
            errors.append(f'spec.network.subdomain: Invalid value: "{subdomain}": {msg}')
        for msg in _dns1035_errors(subdomain):
            if "must be no more than 63 characters" in msg:
                msg = ".spec.network.subdomain is too long, must be less than 63 characters"
            errors.append(f'spec.network.subdomain: Invalid value: "{subdomain}": {msg}')
    managed_by = spec.get("managedBy")
    if managed_by is not None:
        if "/" not in managed_by or len(managed_by) > 63:
            errors.append(f'spec.managedBy: Invalid value: "{managed_by}": must be a domain-prefixed path of at most '
                          "63 characters (such as \"acme.io/foo\")")
    names: set[str] = set()
    for index, rjob in enumerate(rjobs):
        path = f"spec.replicatedJobs[{index}]"
        rname = rjob.get("name", "")
        names.add(rname)
        job_spec = rjob["template"]["spec"]
        replicas = int(rjob.get("replicas", 1))
        parallelism = int(job_spec.get("parallelism", 1))
        if parallelism * replicas > _MAX_INT32:
            errors.append(f"the product of replicas and parallelism must not exceed {_MAX_INT32} for replicatedJob "
                          f"'{rname}'")
        group = rjob.get("groupName", "default")
        for msg in _dns1035_errors(group):
            if "must be no more than 63 characters" in msg:
                msg = ".spec.replicatedJob[].groupName is too long, must be less than 63 characters"
            errors.append(f'{path}.groupName: Invalid value: "{group}": {msg}')
        longest_job = f"{name}-{rname}-{replicas - 1}"
        for msg in _dns1035_errors(longest_job):
            if "must be no more than 63 characters" in msg:
                msg = "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
            errors.append(f'{path}.name: Invalid value: "{longest_job}": {msg}')
        if job_spec.get("completionMode") == "Indexed" and job_spec.get("completions") is not None:
            longest_pod = f"{name}-{rname}-{replicas - 1}-{int(job_spec['completions']) - 1}-abcde"
            for msg in _dns1035_errors(longest_pod):
                if "must be no more than 63 characters" in msg:
                    msg = "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
                errors.append(f'{path}.name: Invalid value: "{longest_job}": {msg}')
        for dep in rjob.get("dependsOn") or []:
            if dep.get("name") not in names:
                errors.append(f"replicatedJob: {rname} cannot depend on replicatedJob: {dep.get('name')}")
        if gates["InPlaceRestart"] and policy is not None and policy.get("restartStrategy") == "InPlaceRestart":
            if job_spec.get("backoffLimit") != _MAX_INT32:
                errors.append(f"{path}.template.spec.backoffLimit: replicatedJob {rname}: must be set to {_MAX_INT32} "
                              "(MaxInt32) when in-place restart is enabled")
            if job_spec.get("podReplacementPolicy") != "Failed":
                errors.append(f"{path}.template.spec.podReplacementPolicy: replicatedJob {rname}: must be set to "
                              "Failed when in-place restart is enabled")
            if job_spec.get("completions") is None or job_spec.get("completions") != job_spec.get("parallelism"):
                errors.append(f"{path}.template.spec.completions: replicatedJob {rname}: completions and parallelism "
                              "must be set and equal to each other when in-place restart is enabled")
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            errors.append(f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs")
    errors += _failure_policy_errors(spec, names, gates)
    coordinator = spec.get("coordinator")
    if coordinator is not None:
        errors += _coordinator_errors(name, spec, coordinator)
    # CEL rule on .spec (the API server evaluates it; kept here so the offline check is complete).
    if (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder" and any("dependsOn" in r for r in rjobs):
        errors.append("spec: Invalid value: \"object\": StartupPolicy and DependsOn APIs are mutually exclusive")
    return errors


def _coordinator_errors(name: str, spec: Mapping[str, Any], coordinator: Mapping[str, Any]) -> list[str]:
    """``validateCoordinator`` and ``validateCoordinatorLabelValue``."""
    target = next((r for r in spec.get("replicatedJobs") or [] if r.get("name") == coordinator.get("replicatedJob")), None)
    if target is None:
        return [f"coordinator replicatedJob {coordinator.get('replicatedJob')} does not exist"]
    job_index, pod_index = int(coordinator.get("jobIndex", 0)), int(coordinator.get("podIndex", 0))
    if not 0 <= job_index < int(target.get("replicas", 1)):
        return [f"coordinator job index {job_index} is invalid for replicatedJob {target['name']}"]
    job_spec = target["template"]["spec"]
    if job_spec.get("completionMode") != "Indexed" or job_spec.get("completions") is None:
        return ["job for coordinator pod must be indexed completion mode, and completions number must be set"]
    if not 0 <= pod_index < int(job_spec["completions"]):
        return [f"coordinator pod index {pod_index} is invalid for replicatedJob {target['name']} job index {job_index}"]
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    value = f"{name}-{target['name']}-{job_index}-{pod_index}.{subdomain}"
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return [f'spec will lead to invalid label value "{value}" for coordinator label "jobset.sigs.k8s.io/coordinator" '
                "(long JobSet / ReplicatedJob / SubDomain name?)"]
    return []


def _masked_pod_template(rjob: Mapping[str, Any]) -> dict[str, Any]:
    """A replicatedJob with the pod template fields Kueue may change while suspended removed."""
    masked: dict[str, Any] = copy.deepcopy(dict(rjob))
    pod = masked["template"]["spec"]["template"]
    meta = pod.setdefault("metadata", {})
    meta.pop("labels", None)
    meta.pop("annotations", None)
    for key in ("nodeSelector", "tolerations", "schedulingGates"):
        pod.setdefault("spec", {}).pop(key, None)
    return masked


def validate_update(old: Mapping[str, Any], new: Mapping[str, Any], gates: Mapping[str, bool] | None = None) -> list[str]:
    """Every reason the v0.12 webhook (and the CRD's CEL rules) would refuse the update ``old`` -> ``new``.

    ``replicatedJobs`` and ``managedBy`` are immutable (``ValidateUpdate``), except pod template
    labels, annotations, nodeSelector, tolerations and schedulingGates while either side is
    suspended (what Kueue changes on admission); ``failurePolicy``, ``network``, ``successPolicy``,
    ``startupPolicy``, ``volumeClaimPolicies`` and each ``dependsOn`` are immutable by CEL rule.
    ``ElasticJobSet`` (off on stock) would let parallelism and completions change.

    Args:
        old: The stored JobSet.
        new: The JobSet as it would be after the update.
        gates: Feature-gate overrides; None: a stock install.

    Returns:
        One message per field that may not change; empty when the update is allowed.
    """
    gates = feature_gates(gates)
    old_spec, new_spec = default(old)["spec"], default(new)["spec"]
    errors = []
    for key in IMMUTABLE_BY_CEL:
        if old_spec.get(key) != new_spec.get(key):
            errors.append(f"spec.{key}: Invalid value: \"object\": Value is immutable")
    old_jobs = {r["name"]: r for r in old_spec.get("replicatedJobs") or []}
    for index, rjob in enumerate(new_spec.get("replicatedJobs") or []):
        before = old_jobs.get(rjob["name"])
        if before is not None and before.get("dependsOn") != rjob.get("dependsOn"):
            errors.append(f"spec.replicatedJobs[{index}].dependsOn: Invalid value: \"array\": Value is immutable")
    suspended = bool(old_spec.get("suspend")) or bool(new_spec.get("suspend"))

    def comparable(rjobs: list[dict[str, Any]], reference: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for rjob in rjobs:
            rjob = copy.deepcopy(rjob)
            if gates["ElasticJobSet"] and rjob["name"] in reference:
                for key in ("parallelism", "completions"):
                    rjob["template"]["spec"].pop(key, None)
            if suspended and rjob["name"] in reference:
                rjob = _masked_pod_template(rjob)
            out.append(rjob)
        return out

    new_jobs = new_spec.get("replicatedJobs") or []
    if comparable(new_jobs, old_jobs) != comparable(list(old_jobs.values()), old_jobs):
        errors.append("spec.replicatedJobs: Invalid value: \"array\": field is immutable")
    if old_spec.get("managedBy") != new_spec.get("managedBy"):
        errors.append("spec.managedBy: Invalid value: \"string\": field is immutable")
    return errors


def check_create(jobset: Mapping[str, Any], gates: Mapping[str, bool] | None = None) -> None:
    """Raise ``JobSetRejected`` when ``validate_create`` finds anything.

    Raises:
        JobSetRejected: the message carries every reason, the webhook's own words.
    """
    errors = validate_create(jobset, gates)
    if errors:
        raise JobSetRejected(str((jobset.get("metadata") or {}).get("name", "")), errors)
