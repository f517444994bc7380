"""Kubernetes settings of pipeline tasks: one helper per concern, applied in ``pipelines/``.

* ``use_kueue_queue(task, queue, priority_class)``: the pod labels ``kueue.x-k8s.io/queue-name``
  and ``kueue.x-k8s.io/priority-class``, so Kueue's pod integration admits the task's pod against
  the tenant's quota at that priority (the SAO JobSet carries the same
  label itself; see ``posttrain.cluster.jobset``).
* ``request_gpus(task, gpus, ...)``: GPUs (``nvidia.com/gpu`` request = limit), CPU and memory, the
  GPU taint toleration and a memory-backed ``/dev/shm`` for data loaders and NCCL.
* ``mount_workspace(task, ...)``: scratch space for a training step at ``/workspace`` (a generic
  ephemeral volume, or an existing claim when a retried step must resume from its checkpoints);
  ``posttrain.kfp.artifacts.workspace`` uses it when the directory exists.
* ``use_tenant_config(task)``: the tenant's ConfigMap (S3 prefix and endpoint, MLflow URI and
  experiment, Redis key prefix) and S3 credentials as environment variables.
* ``use_pod_identity(task)``: the pod's own name and namespace as ``POD_NAME``/``POD_NAMESPACE``
  (downward API), so the SAO launcher reads its pod, finds the run's Argo Workflow among the pod's
  owners and makes that Workflow the owner of the JobSet it creates.

All of them only change the compiled ``platforms.kubernetes`` section (or the container's
resources); ``kfp.local`` ignores them, which is why ``tests/pipelines`` asserts on the compiled
YAML. Pod labels and resource quantities are fixed at compile time: KFP cannot take them from a
pipeline parameter.

Run: ``python -m pipelines.compile`` applies them to every pipeline.
"""

from __future__ import annotations

import re

from kfp import kubernetes
from kfp.dsl import PipelineTask

from posttrain.cluster.jobset import PRIORITY_LABEL, QUEUE_LABEL, S3_CREDENTIALS_SECRET, TENANT_CONFIG_MAP
from posttrain.cluster.tenant import (
    INTERACTIVE_PRIORITY,
    ISTIO_SIDECAR_KEY,
    JOBSET_RESTART_JOB_KEY,
    LOCAL_QUEUE,
)
from posttrain.config.resources import is_quantity

GPU_RESOURCE = "nvidia.com/gpu"
WORKSPACE_PATH = "/workspace"
"""Mount path of the workspace volume (also ``$POSTTRAIN_WORKSPACE`` in the task)."""
TENANT_ENV_KEYS = (
    "POSTTRAIN_TENANT",
    "POSTTRAIN_LOCAL_QUEUE",
    "S3_PREFIX",
    "AWS_ENDPOINT_URL",
    "MLFLOW_S3_ENDPOINT_URL",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "REDIS_KEY_PREFIX",
    "REDIS_USERNAME",
)
"""Keys of the tenant ConfigMap ``posttrain-tenant`` (``posttrain.cluster.tenant.render_tenant``)."""
OPTIONAL_TENANT_ENV_KEYS = (ISTIO_SIDECAR_KEY, JOBSET_RESTART_JOB_KEY)
"""Keys added to the tenant ConfigMap later: mapped as optional so older tenants' steps still start."""
S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
"""Keys of the tenant Secret ``s3-credentials``, exposed under the same names."""

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _quantity(field: str, value: str) -> str:
    if not is_quantity(value):
        raise ValueError(f"{field}: {value!r} is not a Kubernetes quantity such as '8', '500m' or '64Gi'")
    return value


def use_kueue_queue(
    task: PipelineTask, queue: str = LOCAL_QUEUE, priority_class: str = INTERACTIVE_PRIORITY,
) -> PipelineTask:
    """Label the task's pod for Kueue: ``kueue.x-k8s.io/queue-name: <queue>`` and ``kueue.x-k8s.io/priority-class``.

    Kueue admits labelled pods only in namespaces its pod integration manages
    (``managedJobsNamespaceSelector``); every tenant namespace has a LocalQueue named
    ``posttrain`` (``posttrain.cluster.tenant.LOCAL_QUEUE``), the default here.

    Args:
        task: The pipeline task.
        queue: LocalQueue name (a DNS-1123 label); a plain string, since KFP cannot put a pipeline
            parameter into a pod label.
        priority_class: Kueue WorkloadPriorityClass of the pod, also fixed at compile time (so
            the pipelines' ``priority_class`` parameter reaches only the SAO JobSet, which the
            launcher creates at run time); "" for none.

    Raises:
        TypeError: ``queue`` or ``priority_class`` is a pipeline parameter (``PipelineChannel``) rather than a string.
        ValueError: ``queue`` or ``priority_class`` is not a DNS-1123 label.
    """
    for field, value in (("queue", queue), ("priority_class", priority_class)):
        if not isinstance(value, str):
            raise TypeError(f"{field}: pod labels are fixed at compile time; got {type(value).__name__}, pass a str")
        if (value or field == "queue") and (len(value) > 63 or not _DNS1123.match(value)):
            raise ValueError(f"{field}: {value!r} is not a DNS-1123 label (lowercase a-z0-9 '-', <= 63)")
    if priority_class:
        kubernetes.add_pod_label(task, PRIORITY_LABEL, priority_class)
    return kubernetes.add_pod_label(task, QUEUE_LABEL, queue)


def request_gpus(
    task: PipelineTask, gpus: int, *, cpu: str = "8", memory: str = "64Gi", shm: str = "16Gi",
) -> PipelineTask:
    """Ask for ``gpus`` NVIDIA GPUs with CPU, memory and shared memory to feed them.

    Sets the accelerator (``nvidia.com/gpu``, request = limit = ``gpus``), a CPU request, memory
    request = limit, a toleration of the ``nvidia.com/gpu`` NoSchedule taint, and ``/dev/shm`` as a
    memory-backed emptyDir of ``shm`` bytes (the container runtime's default is 64 MiB).

    Args:
        task: The pipeline task.
        gpus: Devices, 1..64.
        cpu: CPU request (cores, quantity).
        memory: Memory request and limit (bytes, quantity).
        shm: Size limit of ``/dev/shm`` (bytes, quantity; it counts against the pod's memory).

    Raises:
        ValueError: ``gpus`` out of range or a malformed quantity.
    """
    if not isinstance(gpus, int) or not 1 <= gpus <= 64:
        raise ValueError(f"gpus: must be an integer in [1, 64], got {gpus!r}")
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpus)
    task.set_cpu_request(_quantity("cpu", cpu))
    task.set_memory_request(_quantity("memory", memory)).set_memory_limit(memory)
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    return kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory",
                                      size_limit=_quantity("shm", shm))


def mount_workspace(
    task: PipelineTask, *, size: str = "200Gi", claim: str | None = None, storage_class: str | None = None,
) -> PipelineTask:
    """Give a training step scratch space at ``/workspace`` (run directory, weights, checkpoints).

    Without ``claim``: a generic ephemeral volume of ``size`` (created with the pod, deleted with it;
    needs a default StorageClass or ``storage_class``). With ``claim``: that existing
    PersistentVolumeClaim, so a retried step finds its checkpoints and resumes. Either way the task
    gets ``POSTTRAIN_WORKSPACE=/workspace``.

    Args:
        task: The pipeline task.
        size: Ephemeral volume size (bytes, quantity); ignored with ``claim``.
        claim: Existing PVC name in the tenant namespace, or None.
        storage_class: StorageClass of the ephemeral volume (None: the cluster default).

    Raises:
        ValueError: a malformed size or claim name.
    """
    if claim is not None:
        if not _DNS1123.match(claim):
            raise ValueError(f"claim: {claim!r} is not a valid PersistentVolumeClaim name")
        kubernetes.mount_pvc(task, pvc_name=claim, mount_path=WORKSPACE_PATH)
    else:
        kubernetes.add_ephemeral_volume(task, volume_name="workspace", mount_path=WORKSPACE_PATH,
                                        access_modes=["ReadWriteOnce"], size=_quantity("size", size),
                                        storage_class_name=storage_class)
    return task.set_env_variable("POSTTRAIN_WORKSPACE", WORKSPACE_PATH)


def use_tenant_config(task: PipelineTask) -> PipelineTask:
    """Expose the tenant's ConfigMap ``posttrain-tenant`` and Secret ``s3-credentials`` as environment.

    The step then finds MLflow (``MLFLOW_TRACKING_URI``), S3 (``AWS_ENDPOINT_URL``, credentials)
    and the tenant's S3 prefix, exactly as the SAO JobSet's pods do (``envFrom`` there). The keys
    ``POSTTRAIN_ISTIO_SIDECAR`` and ``POSTTRAIN_JOBSET_RESTART_JOB`` are mapped as optional: tenants
    rendered before they existed lack them, and the SAO launcher then opts the JobSet's pods out of
    sidecar injection and renders the failure policy a stock JobSet accepts.
    """
    kubernetes.use_config_map_as_env(task, config_map_name=TENANT_CONFIG_MAP,
                                     config_map_key_to_env={k: k for k in TENANT_ENV_KEYS})
    kubernetes.use_config_map_as_env(task, config_map_name=TENANT_CONFIG_MAP,
                                     config_map_key_to_env={k: k for k in OPTIONAL_TENANT_ENV_KEYS}, optional=True)
    return kubernetes.use_secret_as_env(task, secret_name=S3_CREDENTIALS_SECRET,
                                        secret_key_to_env={k: k for k in S3_CREDENTIAL_KEYS})


def use_pod_identity(task: PipelineTask) -> PipelineTask:
    """Expose the pod's ``metadata.name`` and ``metadata.namespace`` as ``POD_NAME`` and ``POD_NAMESPACE``.

    ``posttrain.cluster.launcher.launcher_pod_from_env`` reads them, and ``run_owner`` reads the pod:
    the JobSet the step creates is owned by the run's Argo Workflow (deleted with the run, not with
    this pod), and a SIGTERM is told apart as a cancel or an eviction (``termination_cause``).
    """
    kubernetes.use_field_path_as_env(task, env_name="POD_NAME", field_path="metadata.name")
    return kubernetes.use_field_path_as_env(task, env_name="POD_NAMESPACE", field_path="metadata.namespace")
