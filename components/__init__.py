"""Kubeflow Pipelines components of posttrain: one directory per step, its tests beside it.

Each ``<name>/component.py`` defines one lightweight Python component whose body calls one
step function of ``posttrain.kfp``; ``images.py`` names the container images and ``k8s.py`` holds
the Kubernetes settings (Kueue queue, GPUs, workspace volume, tenant configuration), one helper per
concern. The pipelines that wire them together live in ``pipelines/``.

Run the component tests: ``.venv/bin/python -m pytest -q components``.
"""
