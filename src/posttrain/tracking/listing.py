"""Registry listing: what ``posttrain models list|show`` prints (``list_models``, ``show_model``).

Example: ``show_model("team-a-policy", alias="champion")`` is the one version serving now.
"""

from __future__ import annotations

import msgspec

from posttrain.tracking.client import TrackingError, mlflow_client
from posttrain.tracking.registry import ModelVersionInfo, get_alias_version, get_model_version, version_info


class ModelSummary(msgspec.Struct, kw_only=True):
    """One registered model as ``list_models`` reports it.

    Attributes:
        name: Registered model name.
        latest_version: Highest version number (0 when it has none).
        aliases: ``{alias: version}``.
        description: Model description.
    """

    name: str
    latest_version: int
    aliases: dict[str, int]
    description: str


def list_models(tracking_uri: str | None = None) -> list[ModelSummary]:
    """Every registered model with its latest version and aliases, sorted by name."""
    client = mlflow_client(tracking_uri)
    out = []
    for rm in client.search_registered_models():
        versions = client.search_model_versions(f"name='{rm.name}'")
        out.append(
            ModelSummary(
                name=rm.name,
                latest_version=max((int(v.version) for v in versions), default=0),
                aliases={a: int(v) for a, v in (rm.aliases or {}).items()},
                description=rm.description or "",
            )
        )
    return sorted(out, key=lambda m: m.name)


def show_model(name: str, *, version: int | str | None = None, alias: str | None = None, tracking_uri: str | None = None) -> list[ModelVersionInfo]:
    """One version (by ``version`` or ``alias``) or, with neither, every version newest first.

    Raises:
        TrackingError: unknown model, version or alias; or both ``version`` and ``alias`` given.
    """
    from mlflow.exceptions import MlflowException

    if version is not None and alias is not None:
        raise TrackingError("show_model: give version or alias, not both")
    client = mlflow_client(tracking_uri)
    if version is not None:
        return [version_info(get_model_version(client, name, version), client)]
    if alias is not None:
        mv = get_alias_version(client, name, alias)
        if mv is None:
            raise TrackingError(f"registered model {name!r} has no alias {alias!r}")
        return [version_info(mv, client)]
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        raise TrackingError(f"no registered model {name!r} ({exc})") from exc
    versions = client.search_model_versions(f"name='{name}'")
    return sorted((version_info(v, client) for v in versions), key=lambda v: -v.version)

