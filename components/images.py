"""Container images the components run in (built from ``images/<role>/Dockerfile``).

Change the registry and tag here, then run ``python -m pipelines.compile`` so the committed
pipeline YAML picks them up. Production deployments should pin digests
(``registry/posttrain/trainer@sha256:...``); the tag is what ``docker build -t`` in each
Dockerfile's header produces.

* ``BASE_IMAGE``: no torch; data preparation and MLflow registration (``prepare_dataset``,
  ``register_model``).
* ``TRAINER_IMAGE``: CUDA torch + posttrain; every step that loads a model (``train_*``,
  ``evaluate``) and the launcher of the SAO JobSet.
* ``GENERATOR_IMAGE``: vLLM + posttrain; the generator pods of the SAO JobSet.

Run: ``python -m components.images`` prints them.
"""

REGISTRY = "posttrain"
"""Image name prefix (a registry host and path in production, e.g. ``ghcr.io/acme/posttrain``)."""
TAG = "0.1.0"
"""Image tag shared by the three roles."""

BASE_IMAGE = f"{REGISTRY}/base:{TAG}"
TRAINER_IMAGE = f"{REGISTRY}/trainer:{TAG}"
GENERATOR_IMAGE = f"{REGISTRY}/generator:{TAG}"

if __name__ == "__main__":
    print("\n".join((BASE_IMAGE, TRAINER_IMAGE, GENERATOR_IMAGE)))
