"""Offline validation of Kubernetes objects: built-in kinds and the custom resources we write.

There is no API server in CI, so manifests are checked against schemas instead:

* built-in kinds (Pod, Job, StatefulSet, RBAC, NetworkPolicy...) with ``kubernetes-validate``
  in strict mode (unknown fields are errors) for one fixed Kubernetes version;
* custom resources (JobSet ``jobset.x-k8s.io/v1alpha2``, Kueue ``kueue.x-k8s.io/v1beta2``
  ClusterQueue/LocalQueue/ResourceFlavor/WorkloadPriorityClass) with ``jsonschema`` against the
  ``openAPIV3Schema`` of the upstream CRDs vendored in ``manifests/crds/``; strict mode adds
  ``additionalProperties: false`` wherever the CRD lists properties and does not preserve unknown
  fields, so a misspelt field (``spec.cohort`` for ``spec.cohortName``) is an error instead of being
  pruned silently by the API server;
* a JobSet's child Jobs (the pod templates inside ``replicatedJobs``) are also fed to
  ``kubernetes-validate``.

Kinds known to neither are errors (the ``kubernetes-validate`` CLI only warns about them). CEL rules
(``x-kubernetes-validations``), defaulting and admission webhooks are not evaluated.

Run: ``python -m posttrain.cluster.validate PATH...`` (files or directories of YAML); prints one
line per problem and exits 1 if there is any.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33"
"""Kubernetes minor version whose built-in schemas the manifests must satisfy."""

CRD_DIR_ENV = "POSTTRAIN_CRD_DIR"
"""Environment variable naming the directory of vendored CRD YAMLs (default: ``<repo>/manifests/crds``)."""

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class ManifestError(ValueError):
    """One or more objects failed validation.

    Attributes:
        source: Where the objects came from (file path, or a description).
        errors: One message per problem, each naming the object, the field path and the rule.
    """

    def __init__(self, source: str, errors: list[str]):
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: {len(errors)} problem(s):\n  " + "\n  ".join(errors))


def default_crd_dir() -> Path:
    """Directory holding the vendored CRD YAMLs.

    Returns:
        ``$POSTTRAIN_CRD_DIR`` when set, else ``manifests/crds`` of the repository checkout this
        module lives in.

    Raises:
        FileNotFoundError: if the directory does not exist (e.g. an installed wheel without the
            repository; set ``POSTTRAIN_CRD_DIR``).
    """
    env = os.environ.get(CRD_DIR_ENV)
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "manifests" / "crds"
    if not path.is_dir():
        raise FileNotFoundError(
            f"CRD schema directory {path} does not exist; set {CRD_DIR_ENV} to a directory holding "
            "the vendored jobset/kueue CRD YAMLs (manifests/crds in the repository)"
        )
    return path


@functools.lru_cache(maxsize=4)
def load_crd_schemas(crd_dir: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Read every CustomResourceDefinition in ``crd_dir/*.yaml``.

    Args:
        crd_dir: Directory of CRD YAML files.

    Returns:
        ``{(apiVersion, kind): openAPIV3Schema}`` for every served version, e.g.
        ``("kueue.x-k8s.io/v1beta2", "ClusterQueue")``.

    Raises:
        ValueError: a file has a CRD without a schema for one of its versions.
    """
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(Path(crd_dir).glob("*.yaml")):
        text = path.read_text()
        for doc in yaml.load_all(text, Loader=yaml.CSafeLoader):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if schema is None:
                    raise ValueError(f"{path}: CRD {kind} version {version['name']} has no openAPIV3Schema")
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def _strictify(schema: Any) -> Any:
    """Add ``additionalProperties: false`` to every object schema that lists its properties.

    Objects marked ``x-kubernetes-preserve-unknown-fields`` or with their own
    ``additionalProperties`` keep accepting extra keys, as the API server would.
    """
    if isinstance(schema, dict):
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in schema
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _strictify(value)
    elif isinstance(schema, list):
        for value in schema:
            _strictify(value)
    return schema


@functools.lru_cache(maxsize=32)
def _crd_validator(api_version: str, kind: str, strict: bool, crd_dir: str) -> jsonschema.Draft7Validator | None:
    schema = load_crd_schemas(crd_dir).get((api_version, kind))
    if schema is None:
        return None
    schema = copy.deepcopy(schema)
    # metadata is validated by the API server's ObjectMeta rules (checked in _metadata_errors).
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    if strict:
        _strictify(schema)
    return jsonschema.Draft7Validator(schema)


def _describe(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = f"{meta['namespace']}/" if isinstance(meta, Mapping) and meta.get("namespace") else ""
    name = meta.get("name", "<unnamed>") if isinstance(meta, Mapping) else "<unnamed>"
    return f"{obj.get('kind', '<no kind>')} {ns}{name}"


def _metadata_errors(obj: Mapping[str, Any]) -> list[str]:
    """ObjectMeta rules the schemas do not express: name format and label syntax."""
    errors: list[str] = []
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return ["metadata: missing or not a mapping"]
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        errors.append("metadata.name: missing")
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain (lowercase a-z0-9 '-' '.', <= 253)")
    namespace = meta.get("namespace")
    if namespace is not None and (len(namespace) > 63 or not _DNS1123_LABEL.match(namespace)):
        errors.append(f"metadata.namespace: {namespace!r} is not a DNS-1123 label")
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label_name = key.rpartition("/")
        if not _LABEL_NAME.match(label_name) or len(label_name) > 63 or len(prefix) > 253:
            errors.append(f"metadata.labels: key {key!r} is not a valid label name")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(f"metadata.labels[{key}]: value {value!r} is not a valid label value (<= 63 chars)")
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str):
            errors.append(f"metadata.annotations[{key}]: value must be a string, got {type(value).__name__}")
    return errors


def validate_builtin(
    obj: Mapping[str, Any], *, kubernetes_version: str = KUBERNETES_VERSION, strict: bool = True
) -> list[str]:
    """Validate a built-in kind with ``kubernetes-validate``.

    Args:
        obj: The object as a plain dict (``apiVersion``, ``kind``, ``metadata``...).
        kubernetes_version: Kubernetes version whose schemas apply, e.g. ``"1.33"``.
        strict: Reject fields the schema does not define.

    Returns:
        Problems as ``"<Kind> <ns>/<name>: <field.path>: <message>"``; empty when valid.
        ``kubernetes-validate`` stops at the first schema error, so at most one schema problem is
        reported per object. A kind without a built-in schema is a problem, not a pass.
    """
    where = _describe(obj)
    errors = [f"{where}: {e}" for e in _metadata_errors(obj)]
    try:
        kubernetes_validate.validate(dict(obj), kubernetes_version, strict=strict)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path) or "<root>"
        errors.append(f"{where}: {path}: {exc.message}")
    except kubernetes_validate.SchemaNotFoundError as exc:
        errors.append(f"{where}: {exc.message} (and no vendored CRD defines it)")
    return errors


def validate_custom_resource(
    obj: Mapping[str, Any], *, strict: bool = True, crd_dir: Path | None = None
) -> list[str]:
    """Validate a custom resource against its vendored CRD schema.

    Args:
        obj: The object as a plain dict.
        strict: Unknown fields are errors (the API server would prune them silently).
        crd_dir: Directory of CRD YAMLs; default ``default_crd_dir()``.

    Returns:
        Problems as ``"<Kind> <ns>/<name>: <field.path>: <message>"``, all of them, sorted by path.

    Raises:
        KeyError: no vendored CRD serves ``(apiVersion, kind)``.
    """
    crd_path = str(crd_dir or default_crd_dir())
    validator = _crd_validator(str(obj.get("apiVersion")), str(obj.get("kind")), strict, crd_path)
    if validator is None:
        raise KeyError(f"no vendored CRD for apiVersion {obj.get('apiVersion')!r} kind {obj.get('kind')!r}")
    where = _describe(obj)
    errors = [f"{where}: {e}" for e in _metadata_errors(obj)]
    found = sorted(validator.iter_errors(dict(obj)), key=lambda e: [str(p) for p in e.absolute_path])
    errors += [f"{where}: {'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in found]
    return errors


def jobset_child_jobs(jobset: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The batch/v1 Jobs a JobSet's controller would create (first index of each replicatedJob).

    Args:
        jobset: A ``jobset.x-k8s.io/v1alpha2`` JobSet dict.

    Returns:
        One Job per replicatedJob, named ``<jobset>-<replicatedJob>-0``, carrying the template's
        metadata and spec, ready for ``validate_builtin``.
    """
    name = jobset.get("metadata", {}).get("name", "jobset")
    namespace = jobset.get("metadata", {}).get("namespace")
    jobs = []
    for rjob in jobset.get("spec", {}).get("replicatedJobs", []):
        template = rjob.get("template", {})
        meta = dict(template.get("metadata") or {})
        meta["name"] = f"{name}-{rjob.get('name')}-0"
        if namespace:
            meta["namespace"] = namespace
        jobs.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": template.get("spec", {})})
    return jobs


def validate_object(
    obj: Any,
    *,
    strict: bool = True,
    kubernetes_version: str = KUBERNETES_VERSION,
    crd_dir: Path | None = None,
) -> list[str]:
    """Validate one object of any kind we use.

    Custom resources go to ``validate_custom_resource``; a JobSet's child Jobs additionally go to
    ``validate_builtin``; everything else goes to ``validate_builtin``.

    Args:
        obj: The object (a mapping with ``apiVersion`` and ``kind``).
        strict: Unknown fields are errors.
        kubernetes_version: Kubernetes version for built-in kinds.
        crd_dir: Directory of vendored CRDs; default ``default_crd_dir()``.

    Returns:
        All problems found; empty when valid.
    """
    if not isinstance(obj, Mapping):
        return [f"<document>: expected a mapping (a Kubernetes object), got {type(obj).__name__}"]
    missing = [k for k in ("apiVersion", "kind") if not isinstance(obj.get(k), str)]
    if missing:
        return [f"{_describe(obj)}: missing {', '.join(missing)}"]
    crd_path = crd_dir or default_crd_dir()
    if (obj["apiVersion"], obj["kind"]) in load_crd_schemas(str(crd_path)):
        errors = validate_custom_resource(obj, strict=strict, crd_dir=crd_path)
        if obj["kind"] == "JobSet":
            for job in jobset_child_jobs(obj):
                errors += [f"{_describe(obj)} (child) {e}" for e in validate_builtin(
                    job, kubernetes_version=kubernetes_version, strict=strict)]
        return errors
    return validate_builtin(obj, kubernetes_version=kubernetes_version, strict=strict)


def validate_objects(objs: Iterable[Any], **kwargs: Any) -> list[str]:
    """Validate several objects; keyword arguments as for ``validate_object``."""
    errors: list[str] = []
    for obj in objs:
        errors += validate_object(obj, **kwargs)
    return errors


def check_objects(objs: Iterable[Any], source: str, **kwargs: Any) -> None:
    """Validate several objects and raise if any is invalid.

    Raises:
        ManifestError: with every problem found, prefixed by ``source``.
    """
    errors = validate_objects(objs, **kwargs)
    if errors:
        raise ManifestError(source, errors)


def load_yaml_documents(path: Path) -> list[Any]:
    """All non-empty YAML documents of a file.

    Raises:
        ManifestError: the file is not valid YAML (message has the line and column).
    """
    try:
        return [d for d in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(str(path), [f"not valid YAML: {exc}"]) from exc


def validate_path(path: Path, **kwargs: Any) -> list[str]:
    """Validate every document of one YAML file; problems are prefixed ``<file>#<doc index>``."""
    errors = []
    for index, doc in enumerate(load_yaml_documents(path)):
        errors += [f"{path}#{index}: {e}" for e in validate_object(doc, **kwargs)]
    return errors


def main(argv: list[str] | None = None) -> int:
    """Validate YAML files or directories (recursively, ``*.yaml``; ``kustomization.yaml`` skipped).

    Returns:
        0 when everything validates, 1 when any problem was printed, 2 on usage errors.
    """
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m posttrain.cluster.validate PATH...", file=sys.stderr)
        return 2
    files: list[Path] = []
    for arg in args:
        p = Path(arg)
        files += sorted(p.rglob("*.yaml")) if p.is_dir() else [p]
    errors: list[str] = []
    for f in files:
        if f.name == "kustomization.yaml":
            continue
        try:
            errors += validate_path(f)
        except ManifestError as exc:
            errors += [f"{exc.source}: {e}" for e in exc.errors]
    for e in errors:
        print(e)
    print(f"{len(files)} file(s), {len(errors)} problem(s)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
