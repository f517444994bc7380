"""The JobSet v0.12 webhook's rules, offline, on every JobSet posttrain renders.

No test cluster runs the JobSet webhook (the real API server of the cluster tier enforces the CRD's
schema and CEL rules only), so ``posttrain.cluster.jobset_webhook`` re-implements it from
kubernetes-sigs/jobset v0.12.0: ``pkg/webhooks/jobset_webhook.go`` (``Default``, ``ValidateCreate``,
``validateFailurePolicy``, ``ValidateUpdate``), ``pkg/features/features.go`` (gates) and the CRD's CEL
rules. Defect 1 of issue 31: the SAO failure policy used ``RestartJob``, which that webhook refuses
unless the alpha ``RestartJob`` gate is on, so a stock install rejected every SAO JobSet.

Run: .venv/bin/python -m pytest -q tests/cluster/test_jobset_webhook.py
"""

from __future__ import annotations

import copy

import pytest

from posttrain.cluster.jobset import PodResources, SAOImages, build_sao_jobset, sao_jobset_for_config
from posttrain.cluster.jobset_webhook import (
    DEFAULT_FEATURE_GATES,
    RESTART_JOB_GATE_MESSAGE,
    JobSetRejected,
    check_create,
    default,
    feature_gates,
    validate_create,
    validate_update,
)
from posttrain.config import load_config

IMAGES = SAOImages("registry.example.com/t:1", "registry.example.com/g:1")
WEBHOOK_REASON = ("RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed when "
                  "RestartJob feature gate is disabled")
"""Copied from jobset v0.12.0 pkg/webhooks/jobset_webhook.go:442, the message a stock install answers."""


def build(**overrides):
    kwargs = dict(run_id="3f1c2a9e-run", tenant="team-a", images=IMAGES, num_generators=4, queue_name="posttrain",
                  config_uri="s3://posttrain/tenants/team-a/sao.yaml", redis_password_secret="redis-credentials")
    kwargs.update(overrides)
    return build_sao_jobset(**kwargs)


RENDERINGS = {
    "default": {},
    "priority-and-mesh": {"priority_class": "posttrain-scheduled", "istio_sidecar": True},
    "2x4-learner": {"learner_nodes": 2, "learner_resources": PodResources(cpu="32", memory="256Gi", gpus=4, shm="32Gi")},
    "cpu-learner": {"learner_resources": PodResources(cpu="4", memory="16Gi"),
                    "generator_resources": PodResources(cpu="4", memory="16Gi")},
    "1024-generators-longest-name": {"run_id": "z" * 200, "num_generators": 1024},
    "64-learner-nodes": {"learner_nodes": 64},
    "no-restarts": {"max_restarts": 0},
}


def test_the_stock_webhook_refuses_the_old_restartjob_policy_with_its_own_reason():
    """The failure policy posttrain used to render (RestartJob rules) against a stock v0.12 install."""
    assert DEFAULT_FEATURE_GATES["RestartJob"] is False
    assert RESTART_JOB_GATE_MESSAGE == WEBHOOK_REASON
    old = build(restart_job=True)  # built for a cluster that declares the gate
    assert [r["action"] for r in old["spec"]["failurePolicy"]["rules"]] == ["RestartJob", "RestartJob"]
    assert validate_create(old) == [WEBHOOK_REASON]
    with pytest.raises(JobSetRejected, match="RestartJob feature gate is disabled") as info:
        check_create(old)
    assert info.value.errors == [WEBHOOK_REASON]
    assert validate_create(old, {"RestartJob": True}) == []


@pytest.mark.parametrize("rendering", RENDERINGS, ids=list(RENDERINGS))
def test_every_rendered_jobset_passes_the_stock_webhook(rendering):
    js = build(**RENDERINGS[rendering])
    assert validate_create(js) == []
    assert js["spec"]["failurePolicy"]["rules"] == [{"name": "anyFailureRestartsTheGroup", "action": "RestartJobSet"}]
    gated = build(**RENDERINGS[rendering], restart_job=True)
    assert validate_create(gated, {"RestartJob": True}) == []


def test_the_jobset_of_the_default_config_passes_the_stock_webhook():
    js = sao_jobset_for_config(load_config(None, []), "run-1", "team-a", IMAGES, "posttrain", "s3://b/c.yaml",
                               "redis-credentials")
    assert validate_create(js) == []


def test_generated_names_over_63_characters_get_the_webhooks_words():
    """``jobset_name`` keeps names to 40 characters so that '<name>-generator-1023-0-abcde' fits; a longer one does not."""
    js = build()
    with pytest.raises(ValueError, match="pod names generated for this JobSet will exceed 63 characters"):
        check_create({**js, "metadata": {**js["metadata"], "name": "x" * 50}})  # 50 + len("-generator-3-0-abcde") = 70


def test_other_feature_gated_fields_are_refused_on_a_stock_install():
    js = build()
    in_place = copy.deepcopy(js)
    in_place["spec"]["failurePolicy"]["restartStrategy"] = "InPlaceRestart"
    assert validate_create(in_place) == [
        "InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate is disabled"]
    ignore_max = copy.deepcopy(js)
    ignore_max["spec"]["failurePolicy"]["rules"] = [{"name": "r", "action": "RestartJobAndIgnoreMaxRestarts"}]
    assert validate_create(ignore_max) == [WEBHOOK_REASON]
    too_many = copy.deepcopy(build(restart_job=True))
    too_many["spec"]["replicatedJobs"][2]["replicas"] = 1025
    assert any("replicas > 1024" in e for e in validate_create(too_many, {"RestartJob": True}))
    with pytest.raises(ValueError, match="JobSet v0.12.0 has only"):
        feature_gates({"NoSuchGate": True})


def test_mutually_exclusive_and_misplaced_fields_are_refused():
    js = build()
    in_order = copy.deepcopy(js)
    in_order["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}  # dependsOn is set: CEL refuses
    assert validate_create(in_order) == [
        'spec: Invalid value: "object": StartupPolicy and DependsOn APIs are mutually exclusive']
    first_depends = copy.deepcopy(js)
    first_depends["spec"]["replicatedJobs"][0]["dependsOn"] = [{"name": "learner", "status": "Ready"}]
    errors = validate_create(first_depends)
    assert "DependsOn can't be set for the first ReplicatedJob" in errors
    assert "replicatedJob: redis cannot depend on replicatedJob: learner" in errors
    bad_rules = copy.deepcopy(js)
    bad_rules["spec"]["failurePolicy"]["rules"] = [
        {"name": "same", "action": "FailJobSet", "targetReplicatedJobs": ["nope"]},
        {"name": "same", "action": "FailJobSet", "onJobFailureReasons": ["OOMKilled"]},
    ]
    errors = validate_create(bad_rules)
    assert "invalid replicatedJob name 'nope' in failure policy does not appear in .spec.ReplicatedJobs" in errors
    assert "invalid job failure reason 'OOMKilled' in failure policy is not a recognized job failure reason" in errors
    assert "rule names are not unique, rules with indices [0, 1] all have the same name 'same'" in errors


def test_immutable_fields_refuse_an_update_and_the_launchers_owner_patch_passes():
    """On re-attach the launcher patches only ``metadata.ownerReferences``; the spec is never updated."""
    js = build()
    with_owner = copy.deepcopy(js)
    with_owner["metadata"]["ownerReferences"] = [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                                  "name": "run-x", "uid": "u-1"}]
    assert validate_update(js, with_owner) == []
    for field, change in (("failurePolicy", {"maxRestarts": 9}), ("successPolicy", {"operator": "Any"}),
                          ("network", {"enableDNSHostnames": False})):
        changed = copy.deepcopy(js)
        changed["spec"][field] = {**changed["spec"][field], **change}
        assert validate_update(js, changed) == [f'spec.{field}: Invalid value: "object": Value is immutable']
    bigger = copy.deepcopy(js)
    bigger["spec"]["replicatedJobs"][1]["template"]["spec"]["parallelism"] = 2
    assert validate_update(js, bigger) == ['spec.replicatedJobs: Invalid value: "array": field is immutable']
    assert validate_update(js, bigger, {"ElasticJobSet": True}) == []


def test_kueue_may_change_pod_scheduling_fields_only_while_the_jobset_is_suspended():
    js = build()
    js["spec"]["suspend"] = True
    admitted = copy.deepcopy(js)
    pod = admitted["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]
    pod["spec"]["nodeSelector"] = {"cloud.example.com/gpu": "h100"}
    pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] = "learner"
    assert validate_update(js, admitted) == []
    running = copy.deepcopy(js)
    running["spec"]["suspend"] = False
    running_admitted = copy.deepcopy(admitted)
    running_admitted["spec"]["suspend"] = False
    assert validate_update(running, running_admitted) == ['spec.replicatedJobs: Invalid value: "array": field is immutable']


def test_defaulting_matches_the_mutating_webhook():
    js = default({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"},
                  "spec": {"failurePolicy": {"rules": [{"action": "FailJobSet"}]},
                           "replicatedJobs": [{"name": "w", "template": {"spec": {"template": {"spec": {}}}}}]}})
    spec = js["spec"]
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["failurePolicy"]["rules"][0]["name"] == "failurePolicyRule0"
    rjob = spec["replicatedJobs"][0]
    assert (rjob["replicas"], rjob["groupName"]) == (1, "default")
    assert rjob["template"]["spec"]["completionMode"] == "Indexed"
    assert rjob["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
