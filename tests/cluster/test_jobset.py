"""The SAO JobSet builder: schema-valid, gang-admitted by Kueue, deterministic name, secrets by reference.

Run: .venv/bin/python -m pytest -q tests/cluster/test_jobset.py
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from posttrain.cluster.jobset import (
    MAX_NAME_LEN,
    PodResources,
    SAOImages,
    build_sao_jobset,
    jobset_name,
    quantity_bytes,
)
from posttrain.cluster.validate import (
    jobset_child_jobs,
    validate_builtin,
    validate_custom_resource,
    validate_object,
)

RUN_ID = "3f1c2a9e-1234-4bcd-9def-0123456789ab"
IMAGES = SAOImages(
    learner="registry.example.com/posttrain/trainer@sha256:" + "a" * 64,
    generator="registry.example.com/posttrain/generator@sha256:" + "b" * 64,
)


def build(**overrides):
    kwargs = dict(
        run_id=RUN_ID, tenant="team-a", images=IMAGES, num_generators=4, queue_name="posttrain",
        config_uri="s3://posttrain/tenants/team-a/configs/sao.yaml", redis_password_secret="redis-credentials",
    )
    kwargs.update(overrides)
    return build_sao_jobset(**kwargs)


def rjobs(js):
    return {r["name"]: r for r in js["spec"]["replicatedJobs"]}


def container(js, role):
    return rjobs(js)[role]["template"]["spec"]["template"]["spec"]["containers"][0]


def test_jobset_passes_the_jobset_crd_schema_strictly():
    assert validate_custom_resource(build(priority_class="posttrain-scheduled")) == []


def test_jobset_child_jobs_pass_kubernetes_validate_strict():
    js = build(learner_nodes=2)
    jobs = jobset_child_jobs(js)
    assert [j["metadata"]["name"] for j in jobs] == [f"{js['metadata']['name']}-{r}-0" for r in ("redis", "learner", "generator")]
    for job in jobs:
        assert validate_builtin(job) == []


def test_validator_catches_a_typo_inside_the_embedded_pod_template():
    js = build()
    bad = copy.deepcopy(js)
    rjobs(bad)["learner"]["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = {}
    errors = validate_object(bad)
    assert any("'limit' was unexpected" in e and "replicatedJobs.1" in e for e in errors), errors


def test_queue_label_is_on_the_jobset_so_kueue_admits_the_whole_group():
    js = build(priority_class="posttrain-interactive")
    labels = js["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "posttrain"
    assert labels["kueue.x-k8s.io/priority-class"] == "posttrain-interactive"
    # one JobSet, three replicatedJobs: Kueue makes one Workload with one PodSet each
    assert {n: r["replicas"] for n, r in rjobs(js).items()} == {"redis": 1, "learner": 1, "generator": 4}


def test_success_follows_the_learner_and_failures_restart_a_bounded_number_of_times():
    js = build(max_restarts=3)
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["learner"]}
    policy = js["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 3
    assert policy["rules"] == [{"name": "generatorRestartsAlone", "action": "RestartJob", "targetReplicatedJobs": ["generator"]}]
    learner_job = rjobs(js)["learner"]["template"]["spec"]
    assert learner_job["backoffLimit"] == 0
    assert learner_job["template"]["spec"]["restartPolicy"] == "Never"
    assert container(js, "learner")["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_learner_and_generators_start_after_redis_is_ready():
    js = build()
    assert [r["name"] for r in js["spec"]["replicatedJobs"]][0] == "redis"
    assert rjobs(js)["learner"]["dependsOn"] == [{"name": "redis", "status": "Ready"}]
    assert rjobs(js)["generator"]["dependsOn"] == [{"name": "redis", "status": "Ready"}]


def test_every_pod_template_carries_name_and_component_labels():
    js = build()
    for role, rjob in rjobs(js).items():
        for meta in (rjob["template"]["metadata"], rjob["template"]["spec"]["template"]["metadata"]):
            assert meta["labels"]["app.kubernetes.io/name"] == "posttrain"
            assert meta["labels"]["app.kubernetes.io/component"] == role
    assert js["metadata"]["labels"]["app.kubernetes.io/component"] == "sao"


def test_commands_run_the_roles_with_the_config_uri():
    js = build()
    uri = "s3://posttrain/tenants/team-a/configs/sao.yaml"
    assert container(js, "learner")["command"] == ["posttrain", "learner", "--config", uri]
    assert container(js, "generator")["command"] == ["posttrain", "generator", "--config", uri]
    assert container(js, "learner")["image"] == IMAGES.learner
    assert container(js, "generator")["image"] == IMAGES.generator


def test_redis_password_comes_from_the_secret_and_is_never_inline():
    """REDIS_URL splices $(REDIS_PASSWORD), which the kubelet expands from the secretKeyRef before it."""
    js = build()
    name = js["metadata"]["name"]
    for role in ("learner", "generator", "redis"):
        env = container(js, role)["env"]
        assert env[0] == {"name": "REDIS_PASSWORD",
                          "valueFrom": {"secretKeyRef": {"name": "redis-credentials", "key": "password"}}}
    for role in ("learner", "generator"):
        env = {e["name"]: e for e in container(js, role)["env"]}
        assert env["REDIS_URL"]["value"] == f"redis://:$(REDIS_PASSWORD)@{name}-redis-0-0.{name}:6379/0"
    redis_args = container(js, "redis")["args"]
    assert redis_args[redis_args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert redis_args[redis_args.index("--maxmemory-policy") + 1] == "noeviction"
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    text = json.dumps(js)
    assert "password=" not in text.lower()


def test_redis_maxmemory_is_80_percent_of_its_memory():
    """8Gi = 8 * 2**30 = 8589934592 bytes; 80 % = 6871947673.6 -> 6871947673."""
    args = container(build(redis_resources=PodResources(cpu="2", memory="8Gi")), "redis")["args"]
    assert args[args.index("--maxmemory") + 1] == "6871947673"
    assert quantity_bytes("500m") == 0 and quantity_bytes("1k") == 1000 and quantity_bytes("2Ki") == 2048


def test_gpus_are_requested_and_limited_and_tolerated():
    js = build(generator_resources=PodResources(cpu="8", memory="64Gi", gpus=2, shm="8Gi"))
    res = container(js, "generator")["resources"]
    assert res["requests"]["nvidia.com/gpu"] == 2 and res["limits"]["nvidia.com/gpu"] == 2
    spec = rjobs(js)["generator"]["template"]["spec"]["template"]["spec"]
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in spec["volumes"]
    redis_spec = rjobs(js)["redis"]["template"]["spec"]["template"]["spec"]
    assert "tolerations" not in redis_spec
    assert "nvidia.com/gpu" not in container(js, "redis")["resources"]["requests"]


def test_pods_get_no_kubernetes_api_token():
    for rjob in rjobs(build()).values():
        assert rjob["template"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    "run_id",
    [RUN_ID, "a", "UPPER_case.Run:ID/with spaces", "----", "9" * 300, "run-" + "x" * 100],
)
def test_jobset_name_is_a_short_dns1035_label(run_id):
    name = jobset_name(run_id)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= MAX_NAME_LEN
    assert jobset_name(run_id) == name  # a retried step computes the same name


def test_different_run_ids_with_the_same_slug_get_different_names():
    assert jobset_name("run/1") != jobset_name("run-1")
    assert jobset_name("x" * 100 + "a") != jobset_name("x" * 100 + "b")


def test_longest_generated_pod_name_fits_in_63_characters():
    """1024 generators: '<40-char name>-generator-1023-0-abcde' = 40 + 1 + 9 + 1 + 4 + 1 + 1 + 6 = 63."""
    js = build(run_id="z" * 200, num_generators=1024)
    assert len(js["metadata"]["name"]) == 40
    assert validate_custom_resource(js) == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_generators": 0}, "num_generators"),
        ({"num_generators": 1025}, "num_generators"),
        ({"tenant": "Team_A"}, "tenant"),
        ({"queue_name": ""}, "queue_name"),
        ({"redis_password_secret": "redis credentials"}, "redis_password_secret"),
        ({"config_uri": ""}, "config_uri"),
        ({"run_id": ""}, "run_id"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"learner_nodes": 0}, "learner_nodes"),
        ({"images": SAOImages("", "g:1")}, "images.learner"),
    ],
)
def test_bad_inputs_raise_errors_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        build(**overrides)


def test_bad_resource_quantity_names_the_field():
    with pytest.raises(ValueError, match=r"PodResources\.memory"):
        PodResources(cpu="8", memory="64 GB")
    with pytest.raises(ValueError, match=r"PodResources\.gpus"):
        PodResources(cpu="8", memory="64Gi", gpus=-1)
