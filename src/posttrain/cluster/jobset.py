"""Build the one JobSet that runs an SAO training group on a cluster: learner, generators, Redis.

SAO (Single-Rollout Asynchronous Optimization, arXiv 2607.07508) needs a learner, N generators
and a rollout stream (Redis Streams) alive at the same time. They go into one
``jobset.x-k8s.io/v1alpha2`` JobSet labelled ``kueue.x-k8s.io/queue-name``: Kueue turns it into one
Workload with one PodSet per replicatedJob and admits all of it or none of it (gang admission), so a
learner never holds GPUs while its generators wait for quota, or the reverse.

* ``redis`` (1 pod, first): Valkey with ``--requirepass`` read from a Secret, AOF on an emptyDir
  (survives container restarts, not pod deletion), ``noeviction`` so stream entries are never
  dropped for memory.
* ``learner`` (1 Indexed Job of ``learner.nodes`` pods, ``learner.resources`` each): every pod runs
  ``torchrun --nnodes=<nodes> --nproc_per_node=<resources.gpus, or 1 without GPUs>
  --node_rank=<its completion index> --master_addr=<learner pod 0> --master_port=29500 -m
  posttrain.cli learner --config <uri>`` (``learner_command``). Pod 0 is reached by the stable name
  ``<jobset>-learner-0-0.<jobset>`` that JobSet gives it through its headless Service
  (``network.enableDNSHostnames``; ``publishNotReadyAddresses`` so the name resolves before the pod
  is Ready); torchrun's static rendezvous retries until that name resolves and every node has
  joined, for at most ``RENDEZVOUS_TIMEOUT_S``. The Job has ``backoffLimit: 0`` and
  ``restartPolicy: Never`` so a crash of any learner pod fails the Job. What happens then depends
  on the JobSet install (``restart_job``):

  - a stock JobSet v0.12 (``restart_job=False``, the default): the failure policy has one rule,
    ``RestartJobSet``, so the whole group restarts: Redis comes back empty (emptyDir), and the
    resumed learner re-bases the admission counters and the generators' positions on its
    checkpoint (``RolloutQueue``/``admission.rebase``, issue 23 items 17-18); the rollouts in the
    stream that no checkpoint covered are sampled again;
  - a JobSet controller started with ``--feature-gates=RestartJob=true`` (``restart_job=True``,
    tenant ConfigMap ``POSTTRAIN_JOBSET_RESTART_JOB: "true"``): the JobSet recreates the learner
    Job alone (failure rule ``RestartJob``), so Redis keeps the stream, the pending entries, the
    admission counters and the generators' positions, and the new learner resumes from its
    checkpoint on ``checkpoints_uri`` (issue 20, "restart that keeps the stream"). The ``RestartJob``
    action is alpha and off by default in v0.12 (``pkg/features/features.go``); the JobSet webhook
    refuses a JobSet that uses it on a stock install (``posttrain.cluster.jobset_webhook``).

  Both are bounded by ``failurePolicy.maxRestarts``. The failed pod keeps its termination message
  (``FallbackToLogsOnError``: the log tail when the process wrote none) for the launcher to report.
* ``generator`` (N Jobs of 1 pod, ``generator.resources`` each): ``posttrain generator --config
  <uri> --generator-index $(POSTTRAIN_GENERATOR_INDEX)``, the index being the pod's JobSet job
  index (0..N-1, from the ``jobset.sigs.k8s.io/job-index`` label): generator ``g<index>``, seeded
  ``seed * 1000 + index``, with episode seeds disjoint from the other generators'
  (``posttrain.generator.seeds``). A generator Job that fails past its ``backoffLimit`` restarts
  the group on a stock install and only itself with ``restart_job``, counted against ``maxRestarts``.

Every pod carries ``sidecar.istio.io/inject: "false"`` unless ``istio_sidecar=True`` (Kubeflow
profile namespaces inject Istio sidecars, which keep finished batch pods Running), and, with a
``priority_class``, the label ``kueue.x-k8s.io/priority-class`` the JobSet itself carries for Kueue.

A failure of the ``redis`` Job itself (past its ``backoffLimit``) always restarts the whole group
(``RestartJobSet``); Redis then starts empty, and the resumed learner re-bases the admission
counters on its checkpoint (``RolloutQueue``/``admission.rebase``), so the surplus capacity does not
go stale (issue 23, item 17).

Every JobSet built here passes the v0.12 webhook's rules for the declared feature gates
(``posttrain.cluster.jobset_webhook.validate_create``); ``build_sao_jobset`` refuses to return one
that would not.

Restart timing (``restart_recovery_s``): a restart takes at most the slowest pod's grace period
(``LEARNER_TERMINATION_GRACE_S``), the deletion of the failed Jobs (``JOB_DELETION_SLACK_S``), Redis
becoming Ready again on a group restart (``REDIS_READY_BUDGET_S``) and the new pods starting
(``POD_START_BUDGET_S``). Kueue's ``waitForPodsReady.recoveryTimeout``
(``manifests/kueue-system/kueue-manager-config.yaml``) must exceed it, or Kueue evicts the whole
group in the middle of a restart it would have survived.

``successPolicy {operator: All, targetReplicatedJobs: [learner]}`` ends the run when the learner
completes; the JobSet controller then deletes the still-running generator and Redis Jobs.
``learner`` and ``generator`` start once ``redis`` is Ready (``dependsOn``).

Pod counts and resources come from the run config (``learner.nodes``, ``learner.resources``,
``generator.num_processes``, ``generator.resources``): ``sao_jobset_for_config`` reads them;
``build_sao_jobset`` takes them as arguments (defaults: the config's defaults).

The name is a pure function of the pipeline run id (``jobset_name``), so a retried KFP step builds
the same name and re-attaches instead of starting a second group.

Nothing here talks to a cluster; ``posttrain.cluster.launcher`` submits the dict.
Example: ``python -c "import json; from posttrain.cluster.jobset import *; from posttrain.config import
load_config; print(json.dumps(sao_jobset_for_config(load_config(None, ['learner.nodes=2']), 'run-1',
'team-a', SAOImages('l:1', 'g:1'), 'posttrain', 's3://b/c.yaml', 'redis-credentials'), indent=1))"``
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from posttrain.cluster.gateway import GATEWAY_TERMINATION_GRACE_S, TOKEN_ENV, gateway_container
from posttrain.cluster.jobset_webhook import JobSetRejected, validate_create
from posttrain.config import GeneratorConfig, LearnerConfig, RunConfig
from posttrain.config.resources import PodResources, quantity_bytes
from posttrain.config.sections import MAX_LEARNER_NODES

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
RUN_ID_ANNOTATION = "posttrain.io/run-id"
APP_NAME = "posttrain"
REDIS_PORT = 6379
REDIS_PASSWORD_KEY = "password"
"""Key of the Redis password inside ``redis_password_secret``."""
TENANT_CONFIG_MAP = "posttrain-tenant"
"""ConfigMap rendered per tenant (``posttrain.cluster.tenant``): S3 prefix, MLflow experiment, Redis key prefix."""
S3_CREDENTIALS_SECRET = "s3-credentials"
"""Secret with ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` for the tenant's S3 prefix."""
VALKEY_IMAGE = "docker.io/valkey/valkey:9.1.1"
"""Per-run rollout store image (Valkey 9.1, Redis-compatible, BSD)."""
MAX_NAME_LEN = 40
"""JobSet name budget (chars). The JobSet webhook requires every generated pod name
``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>`` to be a DNS-1035 label (<= 63);
with ``generator`` (9) and up to 1024 replicas that leaves 40."""
RENDEZVOUS_PORT = 29500
"""TCP port of torchrun's rendezvous store on learner pod 0 (``--master_port``)."""
RENDEZVOUS_TIMEOUT_S = 1800
"""Seconds torchrun's static rendezvous waits for learner pod 0's name to resolve and for every
learner pod to join (``--rdzv_conf=timeout``): long enough for pods on different nodes to pull a
CUDA image; after it the learner fails and the JobSet restarts the group."""
NODE_RANK_ENV = "POSTTRAIN_NODE_RANK"
"""Environment variable of a learner pod holding its Job completion index (torchrun's ``--node_rank``)."""
GENERATOR_INDEX_ENV = "POSTTRAIN_GENERATOR_INDEX"
"""Environment variable of a generator pod holding its JobSet job index (``--generator-index``)."""
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
"""Label JobSet puts on each pod: the index of its Job among the replicatedJob's replicas."""
ISTIO_INJECT = "sidecar.istio.io/inject"
"""Istio's per-pod switch (label, and the older annotation) for sidecar injection. Kubeflow profile
namespaces are labelled ``istio-injection=enabled`` in sidecar mode; a sidecar in a batch pod keeps
the pod Running after its container exits (so the Job never completes) and needs egress to istiod,
which the generators' NetworkPolicy does not allow. ``build_sao_jobset(istio_sidecar=False)``, the
default, sets it to ``"false"`` on every pod."""

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
@dataclass(frozen=True)
class SAOImages:
    """Container images of the three roles (pin them by digest in production).

    Attributes:
        learner: The ``trainer`` image (CUDA torch + posttrain), runs ``posttrain learner``.
        generator: The ``generator`` image (vLLM + posttrain), runs ``posttrain generator``.
        redis: Valkey image for the per-run rollout stream.
    """

    learner: str
    generator: str
    redis: str = VALKEY_IMAGE


REDIS_RESOURCES = PodResources(cpu="2", memory="8Gi")
"""The per-run Redis pod (not in the run config: it holds only the rollout stream)."""


def jobset_name(run_id: str) -> str:
    """Deterministic JobSet name for a pipeline run: ``sao-<slug>-<8 hex of sha256(run_id)>``.

    The same ``run_id`` always gives the same name (a retried KFP step re-attaches); different run
    ids that slug alike differ in the hash. The result is a DNS-1035 label of at most
    ``MAX_NAME_LEN`` (40) characters.

    Args:
        run_id: Any non-empty string, typically the KFP pipeline job id (a UUID).

    Raises:
        ValueError: ``run_id`` is empty.
    """
    if not run_id:
        raise ValueError("run_id: must be a non-empty string")
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    room = MAX_NAME_LEN - len("sao--") - len(digest)
    slug = slug[:room].strip("-")
    name = f"sao-{slug}-{digest}" if slug else f"sao-{digest}"
    assert _DNS1035.match(name) and len(name) <= MAX_NAME_LEN, name
    return name


def learner_host(name: str) -> str:
    """DNS name of learner pod 0 of JobSet ``name``: ``<name>-learner-0-0.<name>``.

    JobSet names each pod of an Indexed Job ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`` and, with
    ``network.enableDNSHostnames``, puts it under a headless Service named after the JobSet (the
    default ``network.subdomain``); the short name resolves inside the JobSet's namespace.
    """
    return f"{name}-learner-0-0.{name}"


def learner_command(name: str, config_uri: str, nodes: int, gpus_per_node: int) -> list[str]:
    """The command of every learner pod: ``torchrun`` starting one ``posttrain learner`` per GPU.

    ``--node_rank`` is ``$(POSTTRAIN_NODE_RANK)``, which the kubelet expands from the pod's
    environment (its Job completion index). The static rendezvous runs on learner pod 0
    (``learner_host``) at ``RENDEZVOUS_PORT``; torchrun sets ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE`` (= ``nodes * nproc_per_node``), ``MASTER_ADDR`` and ``MASTER_PORT`` for each process.

    Args:
        name: JobSet name.
        config_uri: Run config path or ``s3://`` URI (``--config``).
        nodes: Learner pods (``--nnodes``), >= 1.
        gpus_per_node: GPUs per learner pod; ``--nproc_per_node`` is this, or 1 for a CPU pod (0).

    Returns:
        The container's ``command`` list.
    """
    return [
        "torchrun",
        f"--nnodes={nodes}",
        f"--nproc_per_node={max(gpus_per_node, 1)}",
        f"--node_rank=$({NODE_RANK_ENV})",
        f"--master_addr={learner_host(name)}",
        f"--master_port={RENDEZVOUS_PORT}",
        f"--rdzv_conf=timeout={RENDEZVOUS_TIMEOUT_S}",
        "-m", "posttrain.cli", "learner", "--config", config_uri,
    ]


def _labels(component: str, name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/part-of": "posttrain",
        "app.kubernetes.io/managed-by": "posttrain",
    }


def _container_resources(res: PodResources) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": res.cpu, "memory": res.memory}
    limits: dict[str, Any] = {"memory": res.memory}
    if res.gpus:
        requests["nvidia.com/gpu"] = res.gpus
        limits["nvidia.com/gpu"] = res.gpus
    return {"requests": requests, "limits": limits}


LEARNER_TERMINATION_GRACE_S = 600
"""Seconds Kubernetes waits after SIGTERM before SIGKILL on a learner pod: the learner writes a
distributed checkpoint of its last trained iteration first (issue 23, item 20), which for a sharded
multi-billion-parameter model takes minutes, not the default 30 s."""
GENERATOR_TERMINATION_GRACE_S = 60
"""Seconds a generator pod gets after SIGTERM: it stops sampling, sends what it finished and gives
its admission tickets back (issue 23, item 20); the engine is not waited for."""
DEFAULT_TERMINATION_GRACE_S = 30
"""Kubernetes' grace period for a pod that sets none (the Redis pod)."""
JOB_DELETION_SLACK_S = 120
"""Seconds allowed, past the slowest pod's grace period, for the JobSet controller to delete the
failed Job(s) (foreground: the Job goes after its pods) and create the new ones."""
REDIS_READY_BUDGET_S = 120
"""Seconds allowed for a recreated Redis pod to be scheduled, pull Valkey and pass its readiness
probe: on a group restart the learner and generators wait for it (``dependsOn``)."""
POD_START_BUDGET_S = 900
"""Seconds allowed for recreated learner and generator pods to be scheduled, pull their CUDA images
(cached on a node that ran them before; a cold pull on a new node can take most of this) and start."""


def restart_recovery_s(jobset: dict[str, Any]) -> int:
    """Worst-case seconds from a pod failure until the restarted JobSet's pods are all Ready again.

    The slowest pod's ``terminationGracePeriodSeconds`` (the learner's checkpoint on SIGTERM) +
    ``JOB_DELETION_SLACK_S`` + ``REDIS_READY_BUDGET_S`` + ``POD_START_BUDGET_S``. Kueue's
    ``waitForPodsReady.recoveryTimeout`` must be at least this (``tests/manifests/test_kueue.py``
    checks the shipped value), else Kueue evicts the group while it restarts.

    Args:
        jobset: A JobSet from ``build_sao_jobset``.

    Returns:
        Seconds.
    """
    grace = max(
        int(r["template"]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", DEFAULT_TERMINATION_GRACE_S))
        for r in jobset["spec"]["replicatedJobs"]
    )
    return grace + JOB_DELETION_SLACK_S + REDIS_READY_BUDGET_S + POD_START_BUDGET_S


def _pod_spec(
    container: dict[str, Any],
    res: PodResources,
    restart_policy: str,
    volumes: list[dict[str, Any]],
    security: dict[str, Any],
    grace_s: int | None = None,
) -> dict[str, Any]:
    mounts = list(container.get("volumeMounts", []))
    if res.shm:
        volumes = volumes + [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm}}]
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if mounts:
        container = {**container, "volumeMounts": mounts}
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": security,
        "containers": [container],
    }
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    if volumes:
        spec["volumes"] = volumes
    if res.gpus:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return spec


def _replicated_job(
    role: str,
    name: str,
    replicas: int,
    pods: int,
    pod_spec: dict[str, Any],
    backoff_limit: int,
    depends_on: str | None,
    pod_labels: dict[str, str],
    pod_annotations: dict[str, str],
) -> dict[str, Any]:
    pod_meta: dict[str, Any] = {"labels": {**_labels(role, name), **pod_labels}}
    if pod_annotations:
        pod_meta["annotations"] = dict(pod_annotations)
    rjob: dict[str, Any] = {
        "name": role,
        "replicas": replicas,
        "template": {
            "metadata": {"labels": _labels(role, name)},
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "backoffLimit": backoff_limit,
                "template": {"metadata": pod_meta, "spec": pod_spec},
            },
        },
    }
    if depends_on:
        rjob["dependsOn"] = [{"name": depends_on, "status": "Ready"}]
    return rjob


def build_sao_jobset(
    run_id: str,
    tenant: str,
    images: SAOImages,
    num_generators: int,
    queue_name: str,
    config_uri: str,
    redis_password_secret: str,
    *,
    learner_nodes: int | None = None,
    learner_resources: PodResources | None = None,
    generator_resources: PodResources | None = None,
    redis_resources: PodResources = REDIS_RESOURCES,
    priority_class: str | None = None,
    istio_sidecar: bool = False,
    max_restarts: int = 2,
    restart_job: bool = False,
    tenant_config_map: str | None = TENANT_CONFIG_MAP,
    s3_credentials_secret: str | None = S3_CREDENTIALS_SECRET,
    ttl_seconds_after_finished: int = 86400,
    gateway_resources: PodResources | None = None,
    gateway_token_env: str = TOKEN_ENV,
) -> dict[str, Any]:
    """Build the SAO JobSet (learner x1, generator xN, redis x1, optionally gateway x1) as a plain dict.

    Args:
        run_id: Pipeline run id; the JobSet name is ``jobset_name(run_id)`` and the full id is kept in
            the ``posttrain.io/run-id`` annotation (``launch_or_attach`` checks it on re-attach).
        tenant: Tenant namespace the JobSet is created in.
        images: Images of the three roles.
        num_generators: Generator Jobs (one pod each), 1..1024.
        queue_name: Kueue LocalQueue in ``tenant`` (label ``kueue.x-k8s.io/queue-name``).
        config_uri: Run config (YAML) path or ``s3://`` URI passed as ``--config`` to both roles.
        redis_password_secret: Secret in ``tenant`` whose key ``password`` is the Redis password; it
            must be URL-safe (``[A-Za-z0-9._~-]``, e.g. hex) because it is spliced into ``REDIS_URL``.
        learner_nodes: Learner pods (``parallelism = completions``, 1..64), each running ``torchrun``
            with node rank = its completion index; None: the run config's default (``learner.nodes``).
        learner_resources: Per learner pod; ``gpus`` is torchrun's ``--nproc_per_node``. None: the
            run config's default (``learner.resources``).
        generator_resources: Per generator pod. None: the run config's default (``generator.resources``).
        redis_resources: Redis pod; Valkey's ``maxmemory`` is set to 80 % of its memory.
        priority_class: Kueue WorkloadPriorityClass name (``manifests/kueue/workload-priority-classes.yaml``)
            put as label ``kueue.x-k8s.io/priority-class`` on the JobSet (which Kueue reads) and its
            pods; None or "": no label (Kueue priority 0).
        istio_sidecar: False (default): every pod carries ``sidecar.istio.io/inject: "false"``
            (label and annotation), so a profile namespace with sidecar injection leaves the pods
            alone; True: no opt-out (a mesh-managed namespace; the tenant's NetworkPolicies must
            then allow istiod: ``posttrain tenant render --istio-sidecar``).
        max_restarts: ``failurePolicy.maxRestarts``: group restarts plus (with ``restart_job``)
            single-learner and single-generator restarts.
        restart_job: The JobSet controller runs with the ``RestartJob`` feature gate on (alpha, off
            by default in JobSet v0.12): a failed learner or generator Job is recreated alone
            (``RestartJob`` rules) and Redis keeps its stream. False (default, what a stock install
            accepts): any failed Job restarts the whole group (``RestartJobSet``).
        tenant_config_map: ConfigMap mounted as environment (``envFrom``) into learner and generators
            (S3 prefix, MLflow experiment and tracking URI, Redis key prefix), or None.
        s3_credentials_secret: Secret mounted as environment into learner and generators, or None.
        ttl_seconds_after_finished: Seconds a finished JobSet (and its pods) is kept for inspection.
        gateway_resources: With a value, a ``gateway`` replicated job (one pod of these resources on
            the generator image; ``posttrain.cluster.gateway``), restarted alone when it fails (``restart_job``); its
            Secret, Service and NetworkPolicy are created beside the JobSet
            (``posttrain.cluster.gateway.apply_gateway_objects``). None: no gateway. With a gateway,
            ``num_generators`` may be 0 (the gateway's traffic is the only episode source).
        gateway_token_env: Environment variable the gateway pod gets its token in (``gateway.token_env``).

    Returns:
        The JobSet object, ready for ``CustomObjectsApi.create_namespaced_custom_object``.

    Raises:
        ValueError: a field is out of range or not a valid Kubernetes name (the message names it).
        posttrain.cluster.jobset_webhook.JobSetRejected: (a ``ValueError``) the JobSet webhook of
            v0.12 with these feature gates would refuse the result (its reasons in the message).
    """
    name = jobset_name(run_id)
    learner_nodes = LearnerConfig().nodes if learner_nodes is None else learner_nodes
    learner_resources = learner_resources or LearnerConfig().resources
    generator_resources = generator_resources or GeneratorConfig().resources
    for field, value in (("tenant", tenant), ("queue_name", queue_name), ("redis_password_secret", redis_password_secret)):
        if not isinstance(value, str) or len(value) > 63 or not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", value):
            raise ValueError(f"{field}: {value!r} is not a DNS-1123 label (lowercase a-z0-9 '-', <= 63)")
    least = 0 if gateway_resources is not None else 1  # gateway-only runs have no generator pod
    if not least <= num_generators <= 1024:
        raise ValueError(f"num_generators: must be in [{least}, 1024] (JobSet's limit of replicas per replicatedJob "
                         f"with RestartJob rules), got {num_generators}")
    if not isinstance(learner_nodes, int) or not 1 <= learner_nodes <= MAX_LEARNER_NODES:
        raise ValueError(f"learner_nodes: must be an integer in [1, {MAX_LEARNER_NODES}], got {learner_nodes!r}")
    if not 0 <= max_restarts <= 100:
        raise ValueError(f"max_restarts: must be in [0, 100], got {max_restarts}")
    if not config_uri:
        raise ValueError("config_uri: must be a non-empty path or URI")
    if priority_class and (len(priority_class) > 253 or not _DNS1123_SUBDOMAIN.match(priority_class)):
        raise ValueError(f"priority_class: {priority_class!r} is not a WorkloadPriorityClass name "
                         "(DNS-1123 subdomain: lowercase a-z0-9 '-' '.', <= 253)")
    for field, image in (("images.learner", images.learner), ("images.generator", images.generator), ("images.redis", images.redis)):
        if not image or any(c.isspace() for c in image):
            raise ValueError(f"{field}: {image!r} is not an image reference")

    redis_host = f"{name}-redis-0-0.{name}"
    password_env = {
        "name": "REDIS_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": redis_password_secret, "key": REDIS_PASSWORD_KEY}},
    }
    common_env = [
        password_env,
        # $(REDIS_PASSWORD) is expanded by the kubelet from the variable defined just above.
        {"name": "REDIS_URL", "value": f"redis://:$(REDIS_PASSWORD)@{redis_host}:{REDIS_PORT}/0"},
        {"name": "POSTTRAIN_RUN_ID", "value": run_id},
        {"name": "POSTTRAIN_JOBSET", "value": name},
        {"name": "POSTTRAIN_TENANT", "value": tenant},
    ]
    env_from: list[dict[str, Any]] = []
    if tenant_config_map:
        env_from.append({"configMapRef": {"name": tenant_config_map}})
    if s3_credentials_secret:
        env_from.append({"secretRef": {"name": s3_credentials_secret}})

    def role_container(role: str, image: str, res: PodResources, extra_env: list[dict[str, Any]]) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": role,
            "image": image,
            "command": ["posttrain", role, "--config", config_uri],
            "env": common_env + [{"name": "POSTTRAIN_ROLE", "value": role}] + extra_env,
            "resources": _container_resources(res),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": {"allowPrivilegeEscalation": False},
        }
        if env_from:
            container["envFrom"] = env_from
        return container

    learner = role_container(
        "learner",
        images.learner,
        learner_resources,
        [
            {"name": "POSTTRAIN_LEARNER_NODES", "value": str(learner_nodes)},
            {"name": "POSTTRAIN_LEARNER_COORDINATOR", "value": learner_host(name)},
            # The Job controller writes each pod's completion index into this annotation.
            {"name": NODE_RANK_ENV, "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        ],
    )
    learner["command"] = learner_command(name, config_uri, learner_nodes, learner_resources.gpus)
    learner["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}]
    generator = role_container(
        "generator",
        images.generator,
        generator_resources,
        [
            # Each generator is its own one-pod Job, so its index is the Job's index in the replicatedJob.
            {"name": GENERATOR_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}}},
        ],
    )
    # $(POSTTRAIN_GENERATOR_INDEX) is expanded by the kubelet from the variable just defined.
    generator["command"] = [*generator["command"], "--generator-index", f"$({GENERATOR_INDEX_ENV})"]
    maxmemory = int(quantity_bytes(redis_resources.memory) * 0.8)
    redis = {
        "name": "redis",
        "image": images.redis,
        "command": ["valkey-server"],
        "args": [
            "--port", str(REDIS_PORT),
            "--requirepass", "$(REDIS_PASSWORD)",
            "--appendonly", "yes",
            "--save", "",
            "--dir", "/data",
            "--maxmemory", str(maxmemory),
            "--maxmemory-policy", "noeviction",
        ],
        "env": [password_env],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "readinessProbe": {"tcpSocket": {"port": REDIS_PORT}, "periodSeconds": 5},
        "resources": _container_resources(redis_resources),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    redis_volumes = [{"name": "data", "emptyDir": {"sizeLimit": redis_resources.memory}}]
    # The valkey image's user is uid 999; our images run as uid 10001 (images/*/Dockerfile).
    redis_security = {"runAsNonRoot": True, "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999}
    role_security = {"runAsNonRoot": True}

    pod_labels = {PRIORITY_LABEL: priority_class} if priority_class else {}
    pod_annotations: dict[str, str] = {}
    if not istio_sidecar:
        pod_labels[ISTIO_INJECT] = "false"
        pod_annotations[ISTIO_INJECT] = "false"
    pod_meta = (pod_labels, pod_annotations)
    replicated_jobs = [
        _replicated_job("redis", name, 1, 1,
                        _pod_spec(redis, redis_resources, "OnFailure", redis_volumes, redis_security), 3, None,
                        *pod_meta),
        _replicated_job("learner", name, 1, learner_nodes,
                        _pod_spec(learner, learner_resources, "Never", [], role_security, LEARNER_TERMINATION_GRACE_S), 0, "redis", *pod_meta),
        _replicated_job("generator", name, num_generators, 1,
                        _pod_spec(generator, generator_resources, "OnFailure", [], role_security,
                                  GENERATOR_TERMINATION_GRACE_S), 3, "redis",
                        *pod_meta),
    ][: 3 if num_generators else 2]
    restart_alone = ["learner", "generator"] if num_generators else ["learner"]
    if gateway_resources is not None:
        gateway = gateway_container(role_container("gateway", images.generator, gateway_resources, []), name,
                                    config_uri, gateway_token_env)
        replicated_jobs.append(_replicated_job(
            "gateway", name, 1, 1, _pod_spec(gateway, gateway_resources, "OnFailure", [], role_security,
                                             GATEWAY_TERMINATION_GRACE_S), 3, "redis", *pod_meta))
        restart_alone.append("gateway")
    if restart_job:
        failure_rules = [{"name": f"{role}RestartsAlone", "action": "RestartJob", "targetReplicatedJobs": [role]}
                         for role in restart_alone]
    else:
        failure_rules = [{"name": "anyFailureRestartsTheGroup", "action": "RestartJobSet"}]
    labels = {**_labels("sao", name), QUEUE_LABEL: queue_name}
    if priority_class:
        labels[PRIORITY_LABEL] = priority_class
    jobset = {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": tenant,
            "labels": labels,
            "annotations": {RUN_ID_ANNOTATION: run_id, "posttrain.io/config-uri": config_uri},
        },
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["learner"]},
            "failurePolicy": {
                "maxRestarts": max_restarts,
                "restartStrategy": "Recreate",
                "rules": failure_rules,
            },
            "ttlSecondsAfterFinished": ttl_seconds_after_finished,
            "replicatedJobs": replicated_jobs,
        },
    }
    errors = validate_create(jobset, {"RestartJob": restart_job})
    if errors:
        raise JobSetRejected(name, errors)
    return jobset


def sao_jobset_for_config(
    cfg: RunConfig,
    run_id: str,
    tenant: str,
    images: SAOImages,
    queue_name: str,
    config_uri: str,
    redis_password_secret: str,
    **options: Any,
) -> dict[str, Any]:
    """``build_sao_jobset`` with pod counts and resources from a run config.

    ``generator.num_processes`` generator pods of ``generator.resources`` (none with ``gateway.mode:
    only``); ``learner.nodes`` learner pods of ``learner.resources``, each running ``torchrun`` with
    ``learner.resources.gpus`` processes; with ``gateway.mode`` set, one gateway pod of ``gateway.resources``.

    Args:
        cfg: The run config (the one staged at ``config_uri``).
        run_id: Pipeline run id (see ``build_sao_jobset``).
        tenant: Tenant namespace.
        images: Images of the three roles.
        queue_name: Kueue LocalQueue in ``tenant``.
        config_uri: Run config path or ``s3://`` URI passed as ``--config`` to both roles.
        redis_password_secret: Secret holding the Redis password.
        **options: Further keyword arguments of ``build_sao_jobset`` (``priority_class``,
            ``istio_sidecar``, ``max_restarts``...).

    Returns:
        The JobSet object.

    Raises:
        ValueError: as ``build_sao_jobset``; also when ``options`` sets a size the config owns.
    """
    owned = {"num_generators", "learner_nodes", "learner_resources", "generator_resources", "gateway_resources",
             "gateway_token_env"} & options.keys()
    if owned:
        raise ValueError(f"{sorted(owned)}: set by the run config (learner.*, generator.*), not as arguments")
    gw = cfg.gateway
    return build_sao_jobset(
        run_id, tenant, images, 0 if gw.mode == "only" else cfg.generator.num_processes, queue_name, config_uri,
        redis_password_secret, learner_nodes=cfg.learner.nodes, learner_resources=cfg.learner.resources,
        generator_resources=cfg.generator.resources,
        gateway_resources=gw.resources if gw.mode != "disabled" else None, gateway_token_env=gw.token_env, **options,
    )
