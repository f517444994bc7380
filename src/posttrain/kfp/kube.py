"""The Kubernetes API of wherever a pipeline step runs, and where cluster-mode runs keep their files.

``kube_clients`` connects with the in-cluster service account inside a pod and with the kubeconfig
elsewhere; ``runs_uri`` is the shared location (``$POSTTRAIN_RUNS_URI``, else ``$S3_PREFIX/runs``
from the tenant ConfigMap) that the step and the JobSet pods exchange files through. Needs the
``kubernetes`` package (the ``kfp`` extra) only when ``kube_clients`` is called.

Try it against the current kubeconfig: ``python -c "from posttrain.kfp.kube import kube_clients;
print(kube_clients()[0])"``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from posttrain.kfp.artifacts import PipelineStepError

RUNS_URI_ENV = "POSTTRAIN_RUNS_URI"
"""Where cluster-mode SAO puts the config, tasks and final checkpoint of a JobSet (``s3://`` prefix or a
shared path); default ``$S3_PREFIX/runs`` from the tenant ConfigMap."""
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""The namespace of the pod's service account, mounted into every pod."""
CLIENT_RETRIES = 1
"""urllib3 retries of one request on a connection error or read timeout (the client's default is 3).
With ``posttrain.cluster.jobset_status.REQUEST_TIMEOUT_S`` on every call, an API server that stops
answering costs at most ``(1 + CLIENT_RETRIES) * REQUEST_TIMEOUT_S`` seconds per call; the launcher's
own loops retry further, bounded."""


def kube_clients() -> tuple[str, Any, Any]:
    """The namespace and ``CustomObjectsApi`` / ``CoreV1Api`` clients of wherever this step runs.

    In a pod: the in-cluster config and the service account's namespace. Elsewhere: the kubeconfig
    (``$KUBECONFIG``) and its current context's namespace. ``$POSTTRAIN_NAMESPACE`` overrides the
    namespace (the JobSet then gets no owner when it is not the pod's own namespace:
    ``posttrain.cluster.launcher.run_owner``). The clients retry a failed connection
    ``CLIENT_RETRIES`` times; callers pass ``_request_timeout`` on every call.

    Raises:
        kubernetes.config.ConfigException: no in-cluster config and no usable kubeconfig.
    """
    from kubernetes import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        namespace = Path(SA_NAMESPACE_FILE).read_text(encoding="utf-8").strip()
    else:
        # Read $KUBECONFIG now: the kubernetes package captures it at import time otherwise.
        kubeconfig = os.environ.get("KUBECONFIG")
        config.load_kube_config(config_file=kubeconfig)
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        namespace = (active or {}).get("context", {}).get("namespace", "default")
    namespace = os.environ.get("POSTTRAIN_NAMESPACE", namespace)
    cfg = client.Configuration.get_default_copy()
    cfg.retries = CLIENT_RETRIES
    api_client = client.ApiClient(configuration=cfg)
    return namespace, client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)


def runs_uri() -> str:
    """Where cluster-mode runs keep their files: ``$POSTTRAIN_RUNS_URI``, else ``$S3_PREFIX`` + ``runs``.

    Raises:
        PipelineStepError: neither is set (the tenant ConfigMap is not mounted into the step).
    """
    explicit = os.environ.get(RUNS_URI_ENV)
    if explicit:
        return explicit.rstrip("/")
    prefix = os.environ.get("S3_PREFIX")
    if prefix:
        return prefix.rstrip("/") + "/runs"
    raise PipelineStepError(
        f"{RUNS_URI_ENV} / S3_PREFIX: neither is set; cluster mode needs the tenant ConfigMap "
        "(components/k8s.py use_tenant_config) or an explicit location the JobSet pods can read"
    )
