"""posttrain on a Kubernetes cluster: the SAO JobSet, its launcher, tenant rendering, offline validation.

Modules (import the one you need; nothing here connects to a cluster on import). The pipeline step
that launches the JobSet is ``posttrain.kfp.train_cluster``.

* ``jobset``: ``build_sao_jobset`` builds the learner + generators + Redis JobSet (gang-admitted by Kueue;
  learner pods under ``torchrun``); ``sao_jobset_for_config`` takes pod counts and resources from a run config.
* ``jobset_webhook``: the JobSet v0.12 admission webhook's rules (feature gates, mutually exclusive and
  immutable fields), applied offline; ``build_sao_jobset`` checks its output with it.
* ``launcher``: ``launch_or_attach`` / ``wait_for_jobset`` submit it through the ``kubernetes`` client,
  re-attach after a retried step, follow it with a watch and explain a failure; the run's Argo
  Workflow owns the JobSet, and ``cancel_on_termination`` tells a cancelled run (delete) from an
  evicted launcher (keep) (needs the ``kfp`` extra, which brings ``kubernetes``).
* ``gateway``: the rollout gateway's replicated job in the JobSet, and its Secret, Service and
  NetworkPolicy (``apply_gateway_objects`` creates them, owned by the JobSet; docs/gateway.md).
* ``jobset_status``: ``jobset_status`` / ``pod_failures`` read what a JobSet is doing and which of its
  containers failed; the launcher reports through them.
* ``tenant``: ``render_tenant`` renders a team's Namespace, Kueue queues, RBAC, ConfigMap and Redis ACL
  template; ``tenant_cli`` prints them as YAML.
* ``schedule``: KFP recurring runs for scheduled retraining (``posttrain schedule``).
* ``validate``: checks objects offline against Kubernetes schemas and the vendored CRDs in
  ``manifests/crds``.

The tests of this package run against a real kube-apiserver (``tests/kube_control_plane.py``);
``docs/kubeflow.md`` says per item which tier tests what.
"""
