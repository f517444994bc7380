"""The cluster branch of the ``train_sao`` pipeline step: stage the run's files, launch the JobSet, follow it.

``train_sao_cluster`` uploads the prepared dataset and a config pointing below the run's prefix,
creates the SAO JobSet (learner, generators, Redis; gang-admitted by Kueue through the ``queue``
label; pod counts and resources from the config's ``learner`` and ``generator`` sections) or re-attaches to it after a retried step, and follows it to ``Completed``. The Model
artifact it writes holds no weights: ``posttrain_model.json`` and the artifact's metadata name the
checkpoint the learner uploads (``checkpoint_uri``). ``posttrain.kfp.train.train_sao`` calls it for
``mode="cluster"``.

Try it against the current kubeconfig with a prepared Dataset artifact: ``python -c "from
posttrain.kfp.train_cluster import train_sao_cluster; print(train_sao_cluster('/tmp/ds', '/tmp/model',
queue='posttrain', run_id='try', learner_image='...', generator_image='...', poll_s=30,
timeout_s=3600).metadata)"``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from posttrain.cluster.jobset import SAOImages, jobset_name, sao_jobset_for_config
from posttrain.cluster.tenant import (
    ISTIO_SIDECAR_KEY,
    JOBSET_RESTART_JOB_KEY,
    REDIS_CREDENTIALS_SECRET,
    TENANT_CONFIG_MAP,
)
from posttrain.config import RunConfig
from posttrain.kfp.artifacts import (
    CONFIG_FILE,
    MODEL_INFO_FILE,
    PipelineStepError,
    StepOutputs,
    expect_technique,
    load_prepared,
    markdown_table,
)
from posttrain.kfp.config_fields import with_fields
from posttrain.kfp.kube import kube_clients, runs_uri
from posttrain.storage import is_s3_uri, storage_for

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api, CustomObjectsApi


def _bool_from_env(key: str) -> bool:
    value = os.environ.get(key, "false").strip().lower()
    if value not in ("true", "false"):
        raise PipelineStepError(f"{key}: {value!r} (ConfigMap {TENANT_CONFIG_MAP}) must be 'true' or 'false'")
    return value == "true"


def istio_sidecar_from_env() -> bool:
    """Whether the JobSet's pods keep Istio sidecars: ``$POSTTRAIN_ISTIO_SIDECAR`` from the tenant ConfigMap.

    Unset (a tenant rendered before the key existed) or ``"false"``: the pods opt out of injection.

    Raises:
        PipelineStepError: any value other than true/false (case-insensitive), naming the key.
    """
    return _bool_from_env(ISTIO_SIDECAR_KEY)


def restart_job_from_env() -> bool:
    """Whether the cluster's JobSet controller runs with the ``RestartJob`` feature gate.

    Read from ``$POSTTRAIN_JOBSET_RESTART_JOB`` of the tenant ConfigMap (``posttrain tenant render
    --jobset-restart-job``).

    Unset or ``"false"`` (what a stock JobSet v0.12 accepts): a failed learner restarts the whole
    group. ``"true"``: the learner Job is recreated alone and Redis keeps its stream; on a cluster
    without the gate the JobSet webhook then refuses the JobSet at creation.

    Raises:
        PipelineStepError: any value other than true/false (case-insensitive), naming the key.
    """
    return _bool_from_env(JOBSET_RESTART_JOB_KEY)


def train_sao_cluster(
    dataset_dir: Path | str, model_out: Path | str, *, queue: str, run_id: str, learner_image: str,
    generator_image: str, poll_s: float, timeout_s: float, priority_class: str = "",
) -> StepOutputs:
    """Stage the run's files, create (or re-attach to) the SAO JobSet and follow it to ``Completed``.

    Everything the pods exchange lives under ``<runs_uri>/<jobset name>``: ``config.yaml`` (with
    ``weights_uri``, ``final_model_uri`` and, on S3, ``checkpoints_uri`` pointing below it),
    ``dataset/``, ``weights/`` (the ``S3WeightStore``), ``checkpoints/`` (the learner's checkpoints
    and start model, so a restarted learner pod resumes) and ``final_model/``, which the learner
    uploads at the end and the returned ``checkpoint_uri`` names.

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset`` (technique sao).
        model_out: Model artifact directory; gets ``posttrain_model.json`` only (no weights).
        queue: Kueue LocalQueue of the JobSet.
        run_id: Pipeline run id; the JobSet name derives from it, so a retry re-attaches.
        learner_image: Learner image.
        generator_image: Generator image.
        poll_s: Seconds between JobSet status reads.
        timeout_s: Seconds before giving up on the JobSet.
        priority_class: Kueue WorkloadPriorityClass (label on the JobSet and its pods); "": none.

    The JobSet's pods opt out of Istio sidecar injection unless the tenant ConfigMap sets
    ``POSTTRAIN_ISTIO_SIDECAR: "true"`` (``istio_sidecar_from_env``); its failure policy restarts a
    failed learner alone only where the ConfigMap says the JobSet controller has the ``RestartJob``
    gate (``restart_job_from_env``).

    Returns:
        Metrics ``jobset_restarts`` and ``generators``; metadata with ``checkpoint_uri``, ``jobset``,
        ``namespace`` and ``config_uri``; a Markdown summary; an HTML page with the reward curve of
        the learner's MLflow run.

    The JobSet is owned by the run's Argo Workflow (read from this step's pod, ``POD_NAME`` /
    ``POD_NAMESPACE`` or KFP's ``KFP_POD_NAME``), so deleting the run deletes it and a moved launcher
    pod does not. On SIGTERM the step exits with status 143 after deleting the JobSet if the run was
    cancelled, or leaving it for a retried step to re-attach to if this pod is being evicted or
    drained (``posttrain.cluster.launcher.termination_cause``).

    Raises:
        PipelineStepError: an image is missing, the runs location is not set, or the dataset is not sao's.
        posttrain.cluster.launcher.JobSetError: the JobSet failed, timed out or conflicts.
        posttrain.cluster.launcher.Terminated: SIGTERM arrived (``jobset_deleted`` says whether the JobSet went).
    """
    if not learner_image or not generator_image:
        raise PipelineStepError("learner_image / generator_image: both are required in cluster mode")
    istio_sidecar = istio_sidecar_from_env()
    restart_job = restart_job_from_env()
    # The launcher needs the kubernetes package (the kfp extra): imported once the arguments are checked.
    from posttrain.cluster.launcher import (
        cancel_on_termination,
        launch_or_attach,
        launcher_pod_from_env,
        run_owner,
        wait_for_jobset,
    )

    cfg, manifest = load_prepared(dataset_dir)
    expect_technique(manifest, "sao")
    namespace, api, core = kube_clients()
    name = jobset_name(run_id)
    base = f"{runs_uri()}/{name}"
    store = storage_for(base)
    store.upload_dir(Path(dataset_dir), f"{base}/dataset")
    # The pods share no volume: tasks, weights and the final model all live under the run's prefix.
    checkpoint_uri = f"{base}/final_model"
    fields = {**{k: f"{base}/dataset/{v}" for k, v in manifest["files"].items()},
              "weights_uri": f"{base}/weights", "final_model_uri": checkpoint_uri}
    if is_s3_uri(base):  # a restarted learner pod resumes from checkpoints kept there
        fields["checkpoints_uri"] = f"{base}/checkpoints"
    staged = with_fields(cfg, fields)
    config_uri = f"{base}/{CONFIG_FILE}"
    store.write_bytes(config_uri, yaml.safe_dump(staged.model_dump(mode="json", by_alias=True), sort_keys=False).encode())
    # Pod counts and resources come from the config: learner.nodes x learner.resources (torchrun
    # with one process per GPU), generator.num_processes x generator.resources.
    body = sao_jobset_for_config(staged, run_id, namespace, SAOImages(learner=learner_image, generator=generator_image),
                                 queue, config_uri, REDIS_CREDENTIALS_SECRET, priority_class=priority_class or None,
                                 istio_sidecar=istio_sidecar, restart_job=restart_job)
    # The run's Workflow owns the JobSet (deleting the run deletes it; a moved launcher pod does not).
    pod_name, pod_namespace = launcher_pod_from_env()
    owner = run_owner(core, pod_name, pod_namespace, namespace)
    gateway = staged.gateway.mode != "disabled"
    ensured: list[str] = []
    if gateway:  # the token Secret the gateway pod reads exists before its JobSet; the run's Workflow owns it
        from posttrain.cluster.gateway import ensure_gateway_secret, gateway_object_name

        ensure_gateway_secret(core, name, namespace, owner.reference() if owner else None)
        ensured.append(gateway_object_name(name))
    # SIGTERM: a cancelled run deletes the JobSet, an evicted or drained launcher leaves it running.
    with cancel_on_termination(api, core, namespace, name, pod_name=pod_name, pod_namespace=pod_namespace,
                               workflow=owner):
        launch_or_attach(api, core, namespace, body, owner=owner, ensured_secrets=ensured)
        if gateway:  # Service and NetworkPolicy (and the Secret) owned by the JobSet: deleted with it
            _gateway_objects(api, core, namespace, name, staged.gateway.agent_pod_labels)
        lr = cfg.learner.resources
        print(f"JobSet {namespace}/{name}: queue {queue}, priority {priority_class or '(none)'}, "
              f"Istio sidecars {'kept' if istio_sidecar else 'opted out'}, "
              f"learner restarts {'alone (RestartJob gate)' if restart_job else 'with the group'}, "
              f"owner {f'Workflow {owner.name}' if owner else '(none)'}, {cfg.learner.nodes} learner pod(s) x {lr.gpus} "
              f"GPU(s), {cfg.generator.num_processes} generators x {cfg.generator.resources.gpus} GPU(s), config {config_uri}",
              flush=True)
        status = wait_for_jobset(api, core, namespace, name, poll_s=poll_s, timeout_s=timeout_s,
                                 on_status=lambda s: print(s.summary(), flush=True))
    info = {"technique": "sao", "run_name": cfg.run_name, "jobset": name, "namespace": namespace,
            "checkpoint_uri": checkpoint_uri, "config_uri": config_uri}
    out = Path(model_out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MODEL_INFO_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    metrics = {"jobset_restarts": float(status.restarts), "generators": float(cfg.generator.num_processes)}
    md = f"# SAO training on the cluster: JobSet {namespace}/{name}\n\n" + markdown_table({**info, **metrics})
    return StepOutputs(metrics=metrics, metadata=info, markdown=md, html=_learner_curve(cfg), **_learner_account(cfg))


def _learner_account(cfg: RunConfig) -> dict[str, Any]:
    """The time account the JobSet's learner logged to its MLflow run (found by its tag), as ``StepOutputs`` fields."""
    from posttrain.kfp.artifacts import learner_account_outputs
    from posttrain.tracking import default_tracking_uri, experiment_name, find_learner_run

    uri = cfg.tracking.tracking_uri or default_tracking_uri()
    return learner_account_outputs(uri, find_learner_run(uri, experiment_name(cfg), cfg.run_name))


def _gateway_objects(api: CustomObjectsApi, core: CoreV1Api, namespace: str, name: str,
                     agent_labels: dict[str, str]) -> None:
    """Create the gateway's Service and NetworkPolicy, owned by the JobSet ``name``."""
    from kubernetes.client import NetworkingV1Api

    from posttrain.cluster.gateway import GATEWAY_PORT, apply_gateway_objects
    from posttrain.cluster.jobset_status import (
        JOBSET_GROUP,
        JOBSET_PLURAL,
        JOBSET_VERSION,
        REQUEST_TIMEOUT_S,
        kube_timeout,
    )

    stored = api.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name,
                                              _request_timeout=kube_timeout(REQUEST_TIMEOUT_S))
    done = apply_gateway_objects(core, NetworkingV1Api(core.api_client), stored, agent_labels)
    print(f"gateway: {', '.join(done)}; agents with labels {agent_labels} reach http://{name}-gateway.{namespace}.svc:"
          f"{GATEWAY_PORT} with the token in Secret {name}-gateway", flush=True)


def _learner_curve(cfg: RunConfig) -> str:
    """The reward-curve page of the learner's MLflow run (found by its tag), or a page saying there is none."""
    from posttrain.kfp.curves import reward_curve_page
    from posttrain.tracking import default_tracking_uri, experiment_name, find_learner_run

    uri = cfg.tracking.tracking_uri or default_tracking_uri()
    run_id = find_learner_run(uri, experiment_name(cfg), cfg.run_name)
    if not run_id:
        return (f"<!doctype html><html><body><p>No MLflow run of the learner of {cfg.run_name} "
                f"in {uri}.</p></body></html>\n")
    return reward_curve_page(uri, run_id, cfg.run_name)
