"""The SAO JobSet builder: schema-valid, gang-admitted by Kueue, deterministic name, secrets by reference,
learner pods under torchrun, pod counts and resources from the run config.

Run: .venv/bin/python -m pytest -q tests/cluster/test_jobset.py
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from posttrain.cluster.jobset import (
    GENERATOR_TERMINATION_GRACE_S,
    ISTIO_INJECT,
    LEARNER_TERMINATION_GRACE_S,
    MAX_NAME_LEN,
    PRIORITY_LABEL,
    RENDEZVOUS_PORT,
    RENDEZVOUS_TIMEOUT_S,
    PodResources,
    SAOImages,
    build_sao_jobset,
    jobset_name,
    quantity_bytes,
    sao_jobset_for_config,
)
from posttrain.cluster.validate import (
    jobset_child_jobs,
    validate_builtin,
    validate_custom_resource,
    validate_object,
)
from posttrain.config import load_config

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
    # What a stock JobSet v0.12 accepts (the RestartJob action is behind an alpha gate, off by default).
    assert policy["rules"] == [{"name": "anyFailureRestartsTheGroup", "action": "RestartJobSet"}]
    gated = build(max_restarts=3, restart_job=True)["spec"]["failurePolicy"]
    assert gated["rules"] == [
        {"name": "learnerRestartsAlone", "action": "RestartJob", "targetReplicatedJobs": ["learner"]},
        {"name": "generatorRestartsAlone", "action": "RestartJob", "targetReplicatedJobs": ["generator"]},
    ]
    learner_job = rjobs(js)["learner"]["template"]["spec"]
    assert learner_job["backoffLimit"] == 0
    assert learner_job["template"]["spec"]["restartPolicy"] == "Never"
    assert container(js, "learner")["terminationMessagePolicy"] == "FallbackToLogsOnError"


def recreated_jobs(js: dict, failed: str) -> set[str]:
    """The replicatedJobs the JobSet controller (v0.12) recreates when a Job of ``failed`` fails.

    The first failurePolicy rule whose ``targetReplicatedJobs`` holds ``failed`` (or is empty)
    decides: ``RestartJob*`` recreates that Job only, ``RestartJobSet*`` every Job, ``FailJobSet``
    none; without a matching rule the controller restarts the whole JobSet.
    """
    everything = {r["name"] for r in js["spec"]["replicatedJobs"]}
    for rule in js["spec"]["failurePolicy"].get("rules", []):
        if not rule.get("targetReplicatedJobs") or failed in rule["targetReplicatedJobs"]:
            action = rule["action"]
            if action.startswith("RestartJobSet"):
                return everything
            return {failed} if action.startswith("RestartJob") else set()
    return everything


def test_a_learner_failure_restarts_the_group_on_stock_jobset_and_the_learner_alone_with_the_gate():
    """Issue 20: a learner restart that keeps Redis needs the RestartJob action, which JobSet v0.12 gates
    (alpha, off); a stock install restarts the group, and the learner re-bases on a fresh Redis."""
    stock = build()
    everything = {"redis", "learner", "generator"}
    assert recreated_jobs(stock, "learner") == everything
    assert recreated_jobs(stock, "generator") == everything
    gated = build(restart_job=True)
    assert recreated_jobs(gated, "learner") == {"learner"}
    assert recreated_jobs(gated, "generator") == {"generator"}
    assert recreated_jobs(gated, "redis") == everything  # the rebase path (issue 23, item 17)
    assert rjobs(stock)["redis"]["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"


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
    learner = container(js, "learner")["command"]
    assert learner[0] == "torchrun"
    assert learner[-5:] == ["-m", "posttrain.cli", "learner", "--config", uri]
    assert container(js, "generator")["command"] == [
        "posttrain", "generator", "--config", uri, "--generator-index", "$(POSTTRAIN_GENERATOR_INDEX)"]
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


def test_learner_and_generators_get_time_to_stop_cleanly_after_sigterm():
    """Issue 23, item 20: on SIGTERM the learner checkpoints and generators give tickets back; the
    Kubernetes default of 30 s before SIGKILL is too short for a sharded checkpoint."""
    pods = {name: r["template"]["spec"]["template"]["spec"] for name, r in rjobs(build()).items()}
    assert pods["learner"]["terminationGracePeriodSeconds"] == LEARNER_TERMINATION_GRACE_S == 600
    assert pods["generator"]["terminationGracePeriodSeconds"] == GENERATOR_TERMINATION_GRACE_S == 60
    assert "terminationGracePeriodSeconds" not in pods["redis"]


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
    with pytest.raises(ValidationError, match=r"memory\n.*not a Kubernetes quantity"):
        PodResources(cpu="8", memory="64 GB")
    with pytest.raises(ValidationError, match=r"gpus\n.*greater than or equal to 0"):
        PodResources(cpu="8", memory="64Gi", gpus=-1)
    with pytest.raises(ValidationError, match=r"shm \(2Gi\) must not exceed memory \(1Gi\)"):
        PodResources(cpu="8", memory="1Gi", shm="2Gi")


# --- learner pods under torchrun, sizes from the run config -------------------------------------

def config_2x4():
    """2 learner pods x 4 GPUs; 3 generators x 2 GPUs; everything else the config's defaults."""
    return load_config(None, [
        "learner.nodes=2", "learner.resources.gpus=4", "learner.resources.cpu=48", "learner.resources.memory=384Gi",
        "generator.num_processes=3", "generator.resources.gpus=2", "generator.resources.memory=96Gi",
    ])


def build_from(cfg, **options):
    return sao_jobset_for_config(cfg, RUN_ID, "team-a", IMAGES, "posttrain",
                                 "s3://posttrain/tenants/team-a/configs/sao.yaml", "redis-credentials", **options)


def test_learner_pods_run_torchrun_with_nodes_and_gpus_from_the_config():
    js = build_from(config_2x4())
    name = js["metadata"]["name"]
    assert container(js, "learner")["command"] == [
        "torchrun", "--nnodes=2", "--nproc_per_node=4", "--node_rank=$(POSTTRAIN_NODE_RANK)",
        f"--master_addr={name}-learner-0-0.{name}", f"--master_port={RENDEZVOUS_PORT}",
        f"--rdzv_conf=timeout={RENDEZVOUS_TIMEOUT_S}",
        "-m", "posttrain.cli", "learner", "--config", "s3://posttrain/tenants/team-a/configs/sao.yaml",
    ]
    # one Indexed Job of 2 pods: Kueue sees one PodSet of count 2, a failed pod fails the Job
    learner = rjobs(js)["learner"]
    assert learner["replicas"] == 1
    job = learner["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (2, 2, "Indexed")


def test_node_rank_is_the_pods_completion_index_expanded_by_the_kubelet():
    """The kubelet expands $(VAR) in a command only from variables the container defines."""
    env = {e["name"]: e for e in container(build_from(config_2x4()), "learner")["env"]}
    assert env["POSTTRAIN_NODE_RANK"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}


def _kubelet_command(container: dict, pod_labels: dict[str, str]) -> list[str]:
    """The command as the kubelet runs it: env from literal values and label fieldRefs, then $(VAR) expanded."""
    env: dict[str, str] = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            match = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            if match:
                env[e["name"]] = pod_labels[match.group(1)]
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a)
            for a in container["command"]]


def test_n_rendered_generators_get_n_distinct_ids_and_seeds():
    """JobSet labels the pods of generator Job i with jobset.sigs.k8s.io/job-index=i; the kubelet
    expands it into --generator-index i, from which the generator takes its name, seed and episode seeds."""
    from posttrain.cli import build_parser
    from posttrain.generator.seeds import episode_seed, generator_identity

    cfg = load_config(None, ["generator.num_processes=4", "seed=7"])
    js = build_from(cfg)
    rjob = rjobs(js)["generator"]
    assert rjob["replicas"] == 4 and rjob["template"]["spec"]["completions"] == 1
    pod_template = rjob["template"]["spec"]["template"]
    identities = []
    for i in range(rjob["replicas"]):
        labels = {**pod_template["metadata"]["labels"], "jobset.sigs.k8s.io/job-index": str(i)}
        command = _kubelet_command(pod_template["spec"]["containers"][0], labels)
        assert command[:2] == ["posttrain", "generator"] and "$(" not in " ".join(command)
        args = build_parser().parse_args(command[1:])
        identities.append(generator_identity(cfg.seed, args.generator_index, args.generator_id, args.seed))
    assert identities == [(0, "g0", 7000), (1, "g1", 7001), (2, "g2", 7002), (3, "g3", 7003)]
    first_seeds = {episode_seed(cfg.seed, index, c) for index, _, _ in identities for c in range(50)}
    assert len(first_seeds) == 4 * 50


def test_master_addr_is_the_dns_name_jobset_gives_learner_pod_0():
    """JobSet names child Job i of replicatedJob r '<jobset>-<r>-<i>'; an Indexed Job's pod k gets the
    hostname '<job>-<k>'; with enableDNSHostnames and no subdomain the headless Service is '<jobset>'."""
    js = build_from(config_2x4())
    name = js["metadata"]["name"]
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    assert js["spec"]["network"]["publishNotReadyAddresses"] is True  # resolvable before Ready
    assert "subdomain" not in js["spec"]["network"]
    learner_job = next(j for j in jobset_child_jobs(js) if j["metadata"]["name"].endswith("-learner-0"))
    command = container(js, "learner")["command"]
    assert f"--master_addr={learner_job['metadata']['name']}-0.{name}" in command
    assert {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT} in container(js, "learner")["ports"]


def test_torchrun_accepts_the_learner_command(monkeypatch):
    """torchrun's own parser reads the command as static rendezvous on pod 0 for 2 nodes x 4 processes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from torch.distributed.run import config_from_args, parse_args

    js = build_from(config_2x4())
    name = js["metadata"]["name"]
    command = [a.replace("$(POSTTRAIN_NODE_RANK)", "1") for a in container(js, "learner")["command"]]
    launch, _, args = config_from_args(parse_args(command[1:]))
    assert (launch.min_nodes, launch.max_nodes, launch.nproc_per_node) == (2, 2, 4)
    assert launch.rdzv_backend == "static"
    assert launch.rdzv_endpoint == f"{name}-learner-0-0.{name}:{RENDEZVOUS_PORT}"
    assert launch.rdzv_configs == {"rank": 1, "timeout": str(RENDEZVOUS_TIMEOUT_S)}
    assert args == ["-u", "-m", "posttrain.cli", "learner", "--config", "s3://posttrain/tenants/team-a/configs/sao.yaml"]


def test_the_module_torchrun_starts_parses_the_learner_arguments():
    out = subprocess.run([sys.executable, "-m", "posttrain.cli", "learner", "--help"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout and "--start-model" in out.stdout


def test_pod_resources_come_from_the_config():
    js = build_from(config_2x4())
    assert container(js, "learner")["resources"] == {
        "requests": {"cpu": "48", "memory": "384Gi", "nvidia.com/gpu": 4},
        "limits": {"memory": "384Gi", "nvidia.com/gpu": 4},
    }
    assert container(js, "generator")["resources"] == {
        "requests": {"cpu": "8", "memory": "96Gi", "nvidia.com/gpu": 2},
        "limits": {"memory": "96Gi", "nvidia.com/gpu": 2},
    }
    assert rjobs(js)["generator"]["replicas"] == 3
    learner_volumes = rjobs(js)["learner"]["template"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in learner_volumes  # default shm


def test_the_2x4_jobset_passes_the_jobset_crd_and_its_jobs_kubernetes_validate_strict():
    js = build_from(config_2x4(), priority_class="posttrain-scheduled")
    assert validate_custom_resource(js) == []
    assert validate_object(js) == []
    for job in jobset_child_jobs(js):
        assert validate_builtin(job) == []


def test_default_sizes_are_the_configs_defaults():
    """One learner pod of 6 GPUs (32 cores, 256Gi, 32Gi shm); generators of 1 GPU (8 cores, 64Gi, 16Gi shm)."""
    js = build()
    assert container(js, "learner")["command"][1:3] == ["--nnodes=1", "--nproc_per_node=6"]
    assert container(js, "learner")["resources"]["requests"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 6}
    assert container(js, "generator")["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 1}
    assert build_from(load_config(None))["spec"] == build(num_generators=2)["spec"]


def test_a_cpu_learner_pod_runs_one_process_and_asks_for_no_gpu():
    cfg = load_config(None, ["learner.nodes=3", "learner.resources={cpu: 4, memory: 16Gi, gpus: 0, shm: null}"])
    js = build_from(cfg)
    assert container(js, "learner")["command"][1:3] == ["--nnodes=3", "--nproc_per_node=1"]
    assert container(js, "learner")["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"},
                                                     "limits": {"memory": "16Gi"}}
    spec = rjobs(js)["learner"]["template"]["spec"]["template"]["spec"]
    assert "tolerations" not in spec and "volumes" not in spec
    for job in jobset_child_jobs(js):
        assert validate_builtin(job) == []


def test_sizes_the_config_owns_are_not_taken_as_arguments():
    with pytest.raises(ValueError, match=r"learner_nodes.*run config"):
        build_from(config_2x4(), learner_nodes=4)


def test_too_many_learner_nodes_names_the_field():
    with pytest.raises(ValueError, match=r"learner_nodes: must be an integer in \[1, 64\], got 65"):
        build(learner_nodes=65)


def pod_meta(js, role):
    return rjobs(js)[role]["template"]["spec"]["template"]["metadata"]


def test_every_pod_opts_out_of_istio_sidecar_injection_by_default():
    """Profile namespaces inject sidecars; a sidecar keeps a finished batch pod Running and needs istiod egress."""
    js = build()
    for role in ("redis", "learner", "generator"):
        meta = pod_meta(js, role)
        assert meta["labels"][ISTIO_INJECT] == "false" and meta["annotations"][ISTIO_INJECT] == "false", role
    assert validate_object(js) == []
    for job in jobset_child_jobs(js):
        assert validate_builtin(job) == []


def test_istio_sidecar_true_leaves_injection_to_the_namespace():
    js = build(istio_sidecar=True)
    for role in ("redis", "learner", "generator"):
        meta = pod_meta(js, role)
        assert ISTIO_INJECT not in meta["labels"] and "annotations" not in meta, role


def test_priority_class_labels_the_jobset_and_every_pod():
    js = build(priority_class="posttrain-scheduled")
    assert js["metadata"]["labels"][PRIORITY_LABEL] == "posttrain-scheduled"
    for role in ("redis", "learner", "generator"):
        assert pod_meta(js, role)["labels"][PRIORITY_LABEL] == "posttrain-scheduled", role
    unlabelled = build(priority_class="")
    assert PRIORITY_LABEL not in unlabelled["metadata"]["labels"]
    assert all(PRIORITY_LABEL not in pod_meta(unlabelled, r)["labels"] for r in ("redis", "learner", "generator"))
    with pytest.raises(ValueError, match=r"priority_class: 'Posttrain_High' is not a WorkloadPriorityClass name"):
        build(priority_class="Posttrain_High")
