"""What the Kubeflow pipeline steps run: one function per component of ``components/``.

Each KFP component is a few lines that call one function here with local paths (the artifact
directories KFP hands it) and copy the returned ``StepResult`` into its output artifacts with
``write_outputs``. Nothing here imports ``kfp``, so every function is also callable (and tested)
without a pipeline.

The steps and the files they exchange:

* ``prepare_dataset(config, technique, model, dataset, steps, run_id, out_dir)``: resolves the run
  config (file path or ``s3://`` URI) with the per-run knobs applied, resolves ``model`` (a path, an
  ``s3://`` URI or ``models:/<name>@<alias>`` / ``models:/<name>/<version>`` in the MLflow registry),
  validates the training data and writes the Dataset artifact directory::

      config.yaml      the resolved run config (data paths relative to this directory)
      manifest.json    technique, run name, pipeline run id, dataset/config hashes, base model
      train.jsonl      RL tasks (grpo, sao) or the sft/dpo rows, validated
      tasks.jsonl      sft/dpo only: the environment's training tasks (tokenizer text, warm start)
      eval.jsonl       held-out tasks of the config's environment

* ``train_sao`` (``mode="local"``: generator processes, learner and embedded Redis inside the step;
  ``mode="cluster"``: one JobSet through ``posttrain.cluster.jobset`` / ``launcher``) and
  ``train_technique`` (sft, dpo, grpo) write a transformers checkpoint into the Model artifact
  directory, with ``posttrain_model.json`` beside it.
* ``evaluate`` scores the checkpoint on the held-out tasks (avg@k of the environment's verifier)
  and renders Markdown and HTML reports.
* ``register_model`` registers the checkpoint in MLflow with its lineage and eval scores
  (alias ``challenger``) and moves ``champion`` to it only if it beats the current champion.

Training steps work in ``$POSTTRAIN_WORKSPACE/<run_name>`` when that directory exists (a volume mounted by
``components/k8s.py::mount_workspace``; a retried step resumes from its checkpoints), otherwise in a
temporary directory removed on success and kept (path logged) on failure.

Try a step by hand: ``python -c "from posttrain import kfp_entry as k;
print(k.prepare_dataset('configs/sao_demo_cpu.yaml', 'sao', '', '', 2, 'try', '/tmp/ds').metrics)"``.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from posttrain.config import ConfigError, RunConfig, load_config

log = logging.getLogger("posttrain.kfp_entry")

PIPELINE_TECHNIQUES = ("sft", "dpo", "grpo", "sao")
"""Techniques a pipeline can select with its ``technique`` parameter."""
RL_TECHNIQUES = ("grpo", "sao")
"""Techniques that train on environment tasks (``data.train_path``)."""
STEPS_FIELD = {"sft": "sft.steps", "dpo": "dpo.steps", "grpo": "grpo.steps", "sao": "sao.steps"}
"""Config field the pipeline's ``steps`` parameter sets (optimizer steps / policy versions)."""
DATA_FIELD = {"sft": "sft.data_path", "dpo": "dpo.data_path", "grpo": "data.train_path", "sao": "data.train_path"}
"""Config field the pipeline's ``dataset`` parameter sets."""
SAO_MODES = ("local", "cluster")
"""``train_sao`` modes: processes inside the step, or one JobSet admitted by Kueue."""

CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
TASKS_FILE = "tasks.jsonl"
MODEL_INFO_FILE = "posttrain_model.json"
"""Written into every Model artifact directory: technique, run name, MLflow run id, checkpoint URI."""
HELDOUT_METRIC = "heldout.accuracy"
"""Eval-score key registered on model versions (tag ``eval.heldout.accuracy``) and used for promotion."""
SOURCE_ROOT_ENV = "POSTTRAIN_HOME"
"""Directory that relative config paths are also looked up in (default ``/opt/posttrain``, the images' source root)."""
DEFAULT_SOURCE_ROOT = "/opt/posttrain"
WORKSPACE_ENV = "POSTTRAIN_WORKSPACE"
RUNS_URI_ENV = "POSTTRAIN_RUNS_URI"
"""Where cluster-mode SAO puts the config, tasks and final checkpoint of a JobSet (``s3://`` prefix or a
shared path); default ``$S3_PREFIX/runs`` from the tenant ConfigMap."""
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>[0-9]+))$")


class PipelineStepError(RuntimeError):
    """A pipeline step cannot go on; the message names the parameter, file or field at fault."""


@dataclass
class StepResult:
    """What a step returns for its KFP outputs.

    Attributes:
        metrics: Scalars for the step's ``Output[Metrics]`` (KFP shows them in the run's UI).
        metadata: Set on the step's main output artifact (``Dataset`` / ``Model``).
        markdown: Body of the step's ``Output[Markdown]`` report ("" when it has none).
        html: Body of the step's ``Output[HTML]`` report ("" when it has none).
        text: One line the component returns as its ``str`` output ("" when it returns nothing).
    """

    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    markdown: str = ""
    html: str = ""
    text: str = ""


def write_outputs(
    result: StepResult, *, metrics: Any = None, artifact: Any = None, markdown: Any = None, html_report: Any = None
) -> None:
    """Copy a ``StepResult`` into KFP output artifacts (any object with ``log_metric`` / ``metadata`` / ``path``).

    Args:
        result: The step's result.
        metrics: An ``Output[Metrics]``: each ``result.metrics`` item is logged.
        artifact: The main output artifact: ``result.metadata`` is merged into its metadata.
        markdown: An ``Output[Markdown]``: ``result.markdown`` is written to its path.
        html_report: An ``Output[HTML]``: ``result.html`` is written to its path.
    """
    if metrics is not None:
        for key, value in result.metrics.items():
            metrics.log_metric(key, float(value))
    if artifact is not None:
        artifact.metadata.update(result.metadata)
    for target, body in ((markdown, result.markdown), (html_report, result.html)):
        if target is not None:
            Path(target.path).parent.mkdir(parents=True, exist_ok=True)
            Path(target.path).write_text(body, encoding="utf-8")


# ------------------------------------------------------------------------------------ locations
def resolve_location(location: str, what: str) -> str:
    """Normalise a file location: ``s3://`` URIs pass through, paths are looked up in two places.

    A path is tried as given, then under ``$POSTTRAIN_HOME`` (default ``/opt/posttrain``, where the
    images keep ``configs/``).

    Args:
        location: Path (absolute or relative) or ``s3://`` URI.
        what: Name of the parameter, for the error message.

    Raises:
        PipelineStepError: an empty location or a path found in neither place.
    """
    if not location:
        raise PipelineStepError(f"{what}: empty; give a file path or an s3:// URI")
    if location.startswith("s3://"):
        return location
    path = Path(location[len("file://") :] if location.startswith("file://") else location)
    if path.exists():
        return str(path.resolve())
    root = Path(os.environ.get(SOURCE_ROOT_ENV, DEFAULT_SOURCE_ROOT))
    if not path.is_absolute() and (root / path).exists():
        return str((root / path).resolve())
    raise PipelineStepError(f"{what}: {location} not found (looked in {Path.cwd()} and {root})")


def local_file(location: str, dest: Path, what: str) -> Path:
    """A local path for one file: a path as found, or an ``s3://`` object downloaded to ``dest``.

    Paths are not copied, so a later error about a row names the user's file.

    Raises:
        PipelineStepError: it does not exist or cannot be read (named by ``what``).
    """
    from posttrain.storage import StorageError, storage_for

    source = resolve_location(location, what)
    if not source.startswith("s3://"):
        if not Path(source).is_file():
            raise PipelineStepError(f"{what}: {location} is not a file")
        return Path(source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        dest.write_bytes(storage_for(source).read_bytes(source))
    except StorageError as exc:
        raise PipelineStepError(f"{what}: cannot read {location}: {exc}") from exc
    return dest


def resolve_model(model: str, tracking_uri: str | None) -> tuple[str, str]:
    """Turn the pipeline's ``model`` parameter into a checkpoint location and a lineage label.

    Args:
        model: "" (the config's model), a path, an ``s3://`` URI, or ``models:/<name>@<alias>`` /
            ``models:/<name>/<version>`` (resolved now, through the MLflow registry, to that
            version's source: a scheduled retrain starts from whatever is ``champion`` when it runs).
        tracking_uri: MLflow URI for ``models:/`` lookups (None: ``$MLFLOW_TRACKING_URI`` or the default).

    Returns:
        ``(location, label)``; ``("", "")`` for "".

    Raises:
        PipelineStepError: a ``models:/`` URI that does not parse or names no version.
    """
    if not model:
        return "", ""
    if not model.startswith("models:/"):
        return model, model
    match = _MODELS_URI.match(model)
    if match is None:
        raise PipelineStepError(f"model: {model!r} is not models:/<name>@<alias> or models:/<name>/<version>")
    from posttrain.tracking import TrackingError, show_model

    try:
        (version,) = show_model(
            match["name"], version=match["version"], alias=match["alias"], tracking_uri=tracking_uri
        )
    except TrackingError as exc:
        raise PipelineStepError(f"model: {model}: {exc}") from exc
    return version.source, f"{model} = {version.name} version {version.version} ({version.source})"


def _check_checkpoint(location: str, what: str) -> None:
    """Fail early unless ``location`` ("" = none) holds a transformers checkpoint (``config.json``).

    Raises:
        PipelineStepError: no ``config.json`` there, or it cannot be read.
    """
    if not location:
        return
    from posttrain.storage import StorageError, storage_for

    try:
        found = storage_for(location).exists(location.rstrip("/") + "/config.json")
    except (StorageError, ValueError) as exc:
        raise PipelineStepError(f"{what}: cannot read {location}: {exc}") from exc
    if not found:
        raise PipelineStepError(f"{what}: {location} has no config.json (expected a transformers checkpoint directory)")


def _local_model(cfg: RunConfig, work: Path) -> RunConfig:
    """``cfg`` with an ``s3://`` ``model.path`` downloaded into ``work`` (training reads local directories)."""
    if not cfg.model.path or not cfg.model.path.startswith("s3://"):
        return cfg
    from posttrain.storage import materialize

    return _with_fields(cfg, {"model.path": str(materialize(cfg.model.path, work / "base-model-download"))})


def run_name_for(base: str, run_id: str) -> str:
    """Run name of one pipeline run: ``<config run_name>-<first 8 alphanumerics of the run id>``.

    The MLflow run, the Redis keys and the run directory derive from it, so two pipeline runs of
    the same config never share a stream. An empty ``run_id`` keeps ``base``.
    """
    suffix = re.sub(r"[^A-Za-z0-9]", "", run_id)[:8].lower()
    return f"{base[: 100 - len(suffix) - 1]}-{suffix}" if suffix else base


def _overrides(technique: str, model_path: str, dataset: str, steps: int, run_name: str) -> list[str]:
    # Values are JSON-quoted so YAML parses them as strings ("yes", "1e3" and ":" stay text).
    items = [f"technique={json.dumps(technique)}", f"run_name={json.dumps(run_name)}"]
    if model_path:
        items.append(f"model.path={json.dumps(model_path)}")
    if dataset:
        items.append(f"{DATA_FIELD[technique]}={json.dumps(dataset)}")
    if steps:
        items.append(f"{STEPS_FIELD[technique]}={int(steps)}")
    return items


def _get_field(cfg: RunConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


# ------------------------------------------------------------------------------------ prepare
def _write_tasks(path: Path, tasks: list[Any]) -> int:
    with path.open("w", encoding="utf-8") as f:
        for t in tasks:
            row = {"task_id": t.task_id, "prompt": t.prompt, "reference": t.reference}
            if t.metadata:
                row["metadata"] = dict(t.metadata)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(tasks)


def prepare_dataset(
    config: str, technique: str, model: str, dataset: str, steps: int, run_id: str, out_dir: Path | str
) -> StepResult:
    """Resolve the run config with the per-run knobs and write the Dataset artifact directory.

    Args:
        config: Run config YAML: a path (also looked up under ``$POSTTRAIN_HOME``) or ``s3://`` URI.
        technique: One of ``PIPELINE_TECHNIQUES``; overrides the config's ``technique``.
        model: "" keeps the config's model; else a path, ``s3://`` URI or ``models:/...`` (``resolve_model``).
        dataset: "" keeps the config's data; else the training file (path or ``s3://``) for
            ``DATA_FIELD[technique]``: RL tasks for grpo/sao, sft rows, dpo pairs.
        steps: 0 keeps the config's; else ``STEPS_FIELD[technique]`` (optimizer steps / policy versions).
        run_id: Pipeline run id; suffixes the run name (``run_name_for``).
        out_dir: The Dataset artifact directory to create (see the module docstring).

    Returns:
        Metrics ``train_rows`` and ``eval_rows`` (tasks or rows); metadata technique, run name,
        dataset hash and base model.

    Raises:
        PipelineStepError: unknown technique, negative steps, missing files, no training data.
        posttrain.config.ConfigError: the config (with the overrides) does not validate.
        posttrain.data.tasks.DatasetError: a malformed row (file, line, field) with ``on_bad_row: stop``.
    """
    from posttrain.runtime import RunContext
    from posttrain.tracking import config_hash, dataset_hash

    if technique not in PIPELINE_TECHNIQUES:
        raise PipelineStepError(f"technique: {technique!r} is not one of {list(PIPELINE_TECHNIQUES)}")
    if steps < 0:
        raise PipelineStepError(f"steps: must be >= 0 (0 keeps the config's), got {steps}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / ".inputs"
    config_path = local_file(config, scratch / "config.yaml", "config")
    try:
        base = load_config(config_path)
    except ConfigError as exc:
        if config_path == Path(resolve_location(config, "config")):
            raise
        raise ConfigError(f"config {config} (downloaded to {config_path}): {exc}") from exc
    model_path, model_label = resolve_model(model, base.tracking.tracking_uri)
    what = "model" if model_path else "model.path"
    model_path = model_path or base.model.path or ""
    if model_path and not model_path.startswith("s3://"):
        model_path = resolve_location(model_path, what)  # absolute: later steps may run elsewhere
    _check_checkpoint(model_path, what)
    data_path = str(local_file(dataset, scratch / "dataset.jsonl", "dataset")) if dataset else ""
    run_name = run_name_for(base.run_name, run_id)
    cfg = load_config(config_path, _overrides(technique, model_path, data_path, steps, run_name))
    if cfg.tracking.tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI"):
        from posttrain.tracking import default_tracking_uri

        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(
            update={"tracking_uri": default_tracking_uri(Path(base.output_dir))})})
    # Task files named by the config (possibly s3://) are copied here, so later steps read only the artifact.
    for dotted, name in (("data.train_path", "tasks_source.jsonl"), ("data.eval_path", "eval_source.jsonl")):
        location = _get_field(cfg, dotted)
        if location and not (dotted == DATA_FIELD[technique] and data_path):
            cfg = _with_fields(cfg, {dotted: str(local_file(str(location), scratch / name, dotted))})
    ctx = RunContext(cfg.model_copy(update={"output_dir": str(scratch)}))
    files = {DATA_FIELD[technique]: TRAIN_FILE, "data.eval_path": EVAL_FILE}
    if technique in RL_TECHNIQUES:
        n_train = _write_tasks(out / TRAIN_FILE, ctx.tasks("train"))
    else:
        from posttrain.data.formats import load_rows

        source = _get_field(cfg, DATA_FIELD[technique])
        if not source:
            raise PipelineStepError(
                f"{DATA_FIELD[technique]}: required for technique {technique}; set the pipeline's dataset "
                "parameter or the config field"
            )
        local = local_file(str(source), scratch / "train_source.jsonl", DATA_FIELD[technique])
        rows = load_rows(local, "dpo" if technique == "dpo" else "sft", on_bad_row=cfg.data.on_bad_row,
                         quarantine_path=out / "quarantine-train.jsonl")
        shutil.copyfile(local, out / TRAIN_FILE)
        n_train = len(rows.records)
        # The environment's training tasks still train the tiny model's tokenizer (and a warm start).
        _write_tasks(out / TASKS_FILE, ctx.tasks("train"))
        files["data.train_path"] = TASKS_FILE
    if n_train == 0:
        raise PipelineStepError(f"{DATA_FIELD[technique]}: no training rows")
    n_eval = _write_tasks(out / EVAL_FILE, ctx.tasks("eval"))
    resolved = _with_fields(cfg, files)
    (out / CONFIG_FILE).write_text(yaml.safe_dump(resolved.model_dump(mode="json", by_alias=True), sort_keys=False),
                                   encoding="utf-8")
    manifest = {
        "technique": technique,
        "run_name": run_name,
        "pipeline_run_id": run_id,
        "config_source": config,
        "dataset_source": dataset or str(_get_field(base, DATA_FIELD[technique]) or f"env:{cfg.data.env}"),
        "base_model": model_label or (cfg.model.path or "tiny (model.tiny, built from scratch)"),
        "dataset_hash": dataset_hash([out / f for f in files.values()]),
        "config_hash": config_hash(resolved.model_dump(mode="json", by_alias=True)),
        "files": files,
        "train_rows": n_train,
        "eval_rows": n_eval,
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    if scratch.exists():
        shutil.rmtree(scratch)
    meta = {k: manifest[k] for k in ("technique", "run_name", "dataset_hash", "config_hash", "base_model")}
    return StepResult(metrics={"train_rows": float(n_train), "eval_rows": float(n_eval)}, metadata=meta)


def _with_fields(cfg: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with dotted fields replaced (validated again)."""
    data = cfg.model_dump(mode="json", by_alias=True)
    for dotted, value in values.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return RunConfig.model_validate(data)


def load_prepared(dataset_dir: Path | str, work_dir: Path | str | None = None) -> tuple[RunConfig, dict[str, Any]]:
    """Read a Dataset artifact: the resolved config (data paths made absolute) and the manifest.

    Args:
        dataset_dir: Directory written by ``prepare_dataset``.
        work_dir: Becomes the config's ``output_dir`` (the run directory is ``<work_dir>/<run_name>``);
            None keeps the config's.

    Raises:
        PipelineStepError: the directory lacks ``config.yaml`` or ``manifest.json``.
    """
    root = Path(dataset_dir)
    for name in (CONFIG_FILE, MANIFEST_FILE):
        if not (root / name).is_file():
            raise PipelineStepError(f"dataset artifact {root}: no {name} (was it written by prepare_dataset?)")
    manifest = json.loads((root / MANIFEST_FILE).read_text(encoding="utf-8"))
    cfg = load_config(root / CONFIG_FILE)
    values: dict[str, Any] = {k: str((root / v).resolve()) for k, v in manifest["files"].items()}
    if work_dir is not None:
        values["output_dir"] = str(Path(work_dir).resolve())
    return _with_fields(cfg, values), manifest


@contextlib.contextmanager
def workspace(run_name: str) -> Iterator[Path]:
    """Working directory of a training step (see the module docstring).

    Yields:
        ``$POSTTRAIN_WORKSPACE/<run_name>`` when that variable names an existing directory (the
        mounted volume; kept, so a retry resumes), else a fresh temporary directory (removed when
        the block succeeds, kept and logged when it raises). Under ``kfp.local`` the variable is set
        but ``/workspace`` does not exist, so local runs use temporary directories.
    """
    root = os.environ.get(WORKSPACE_ENV)
    if root and Path(root).is_dir():
        path = Path(root) / run_name
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=f"posttrain-{run_name}-"))
    try:
        yield path
    except BaseException:
        log.error("step failed; its working directory is kept for inspection: %s", path)
        raise
    shutil.rmtree(path)


def _export_model(src: Path, model_out: Path | str, info: Mapping[str, Any]) -> None:
    out = Path(model_out)
    shutil.copytree(src, out, dirs_exist_ok=True)
    (out / MODEL_INFO_FILE).write_text(json.dumps(dict(info), indent=1) + "\n", encoding="utf-8")


def _table(rows: Mapping[str, Any]) -> str:
    lines = ["| item | value |", "|---|---|"]
    for key, value in rows.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"| {key} | {shown.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- train
def train_sao(
    dataset_dir: Path | str,
    model_out: Path | str,
    *,
    mode: str,
    queue: str,
    run_id: str,
    learner_image: str = "",
    generator_image: str = "",
    poll_s: float = 30.0,
    timeout_s: float = 7 * 86400.0,
) -> StepResult:
    """SAO (Single-Rollout Asynchronous Optimization, arXiv 2607.07508) from a prepared dataset.

    ``mode="local"``: the SFT warm start, then ``generator.num_processes`` generator processes, the
    learner in this process and an embedded Redis (``posttrain.runners.sao.train_sao``); the final policy
    is copied into ``model_out``. ``mode="cluster"``: one JobSet (learner, generators, Redis)
    labelled with ``queue`` for Kueue, created or re-attached by run id and followed to the end
    (``_train_sao_cluster``).

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset``.
        model_out: Model artifact directory to fill.
        mode: ``local`` or ``cluster``.
        queue: Kueue LocalQueue of the JobSet (cluster mode).
        run_id: Pipeline run id (the JobSet name derives from it).
        learner_image: Learner image (cluster mode).
        generator_image: Generator image (cluster mode).
        poll_s: Seconds between JobSet status reads (cluster mode).
        timeout_s: Seconds before giving up on the JobSet (cluster mode).

    Returns:
        Metrics (policy versions, rollouts trained and dropped, generator busy fraction), the model
        metadata and a Markdown summary.

    Raises:
        PipelineStepError: unknown mode, or a prepared dataset of another technique.
        posttrain.cluster.launcher.JobSetError: the JobSet failed, timed out or conflicts (cluster mode).
    """
    if mode not in SAO_MODES:
        raise PipelineStepError(f"mode: {mode!r} is not one of {list(SAO_MODES)}")
    if mode == "cluster":
        return _train_sao_cluster(dataset_dir, model_out, queue=queue, run_id=run_id, learner_image=learner_image,
                                  generator_image=generator_image, poll_s=poll_s, timeout_s=timeout_s)
    from posttrain.runners.common import metrics_sink, prepare, warm_start
    from posttrain.runners.sao import train_sao
    from posttrain.runtime import RunContext
    from posttrain.tracking import Tracker

    cfg, manifest = load_prepared(dataset_dir)
    _expect(manifest, "sao")
    with workspace(cfg.run_name) as work:
        cfg = _local_model(load_prepared(dataset_dir, work)[0], work)
        ctx = RunContext(cfg)
        tracker = Tracker(cfg.tracking.tracking_uri, cfg.tracking.experiment, run_name=cfg.run_name,
                          tags={"posttrain.technique": "sao", "posttrain.pipeline_run": run_id})
        with tracker:
            tracker.log_params(cfg.model_dump(mode="json", by_alias=True))
            sink = metrics_sink(ctx, tracker)
            prepare(ctx)
            start = warm_start(ctx, sink)
            summary = train_sao(ctx, start, sink)
        metrics = {"policy_version": float(summary.policy_version), **{k: float(v) for k, v in summary.counters.items()}}
        info = {"technique": "sao", "run_name": cfg.run_name, "mlflow_run_id": tracker.run_id,
                "policy_version": summary.policy_version}
        _export_model(summary.final_model_dir, model_out, info)
    md = f"# SAO training: {cfg.run_name}\n\n" + _table({**info, **metrics})
    return StepResult(metrics=metrics, metadata=info, markdown=md)


def _expect(manifest: Mapping[str, Any], technique: str) -> None:
    if manifest.get("technique") != technique:
        raise PipelineStepError(
            f"dataset artifact was prepared for technique {manifest.get('technique')!r}, not {technique!r}"
        )


def kube_clients() -> tuple[str, Any, Any]:
    """The namespace and ``CustomObjectsApi`` / ``CoreV1Api`` clients of wherever this step runs.

    In a pod: the in-cluster config and the service account's namespace. Elsewhere: the kubeconfig
    (``$KUBECONFIG``) and its current context's namespace. ``$POSTTRAIN_NAMESPACE`` overrides the
    namespace.

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
    return namespace, client.CustomObjectsApi(), client.CoreV1Api()


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


def _train_sao_cluster(
    dataset_dir: Path | str, model_out: Path | str, *, queue: str, run_id: str, learner_image: str,
    generator_image: str, poll_s: float, timeout_s: float,
) -> StepResult:
    """Stage the run's files, create (or re-attach to) the SAO JobSet and follow it to ``Completed``.

    Everything the pods exchange lives under ``<runs_uri>/<jobset name>``: ``config.yaml`` (with
    ``weights_uri``, ``final_model_uri`` and, on S3, ``checkpoints_uri`` pointing below it),
    ``dataset/``, ``weights/`` (the ``S3WeightStore``), ``checkpoints/`` (the learner's checkpoints
    and start model, so a restarted learner pod resumes) and ``final_model/``, which the learner uploads at the end and the returned
    ``checkpoint_uri`` names.
    """
    from posttrain.cluster.jobset import SAOImages, build_sao_jobset, jobset_name
    from posttrain.cluster.launcher import launch_or_attach, wait_for_jobset
    from posttrain.cluster.tenant import REDIS_CREDENTIALS_SECRET
    from posttrain.storage import is_s3_uri, storage_for

    if not learner_image or not generator_image:
        raise PipelineStepError("learner_image / generator_image: both are required in cluster mode")
    cfg, manifest = load_prepared(dataset_dir)
    _expect(manifest, "sao")
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
    staged = _with_fields(cfg, fields)
    config_uri = f"{base}/{CONFIG_FILE}"
    store.write_bytes(config_uri, yaml.safe_dump(staged.model_dump(mode="json", by_alias=True), sort_keys=False).encode())
    body = build_sao_jobset(run_id, namespace, SAOImages(learner=learner_image, generator=generator_image),
                            cfg.generator.num_processes, queue, config_uri, REDIS_CREDENTIALS_SECRET)
    launch_or_attach(api, core, namespace, body)
    print(f"JobSet {namespace}/{name}: queue {queue}, {cfg.generator.num_processes} generators, config {config_uri}",
          flush=True)
    status = wait_for_jobset(api, core, namespace, name, poll_s=poll_s, timeout_s=timeout_s,
                             on_status=lambda s: print(s.summary(), flush=True))
    info = {"technique": "sao", "run_name": cfg.run_name, "jobset": name, "namespace": namespace,
            "checkpoint_uri": checkpoint_uri, "config_uri": config_uri}
    out = Path(model_out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MODEL_INFO_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    metrics = {"jobset_restarts": float(status.restarts), "generators": float(cfg.generator.num_processes)}
    md = f"# SAO training on the cluster: JobSet {namespace}/{name}\n\n" + _table({**info, **metrics})
    return StepResult(metrics=metrics, metadata=info, markdown=md)


def train_technique(dataset_dir: Path | str, model_out: Path | str, technique: str, *, run_id: str = "") -> StepResult:
    """SFT, DPO or GRPO from a prepared dataset through ``posttrain.runners.run``.

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset``.
        model_out: Model artifact directory to fill with the final checkpoint.
        technique: ``sft``, ``dpo`` or ``grpo`` (must match the prepared dataset).
        run_id: Pipeline run id (an MLflow tag).

    Returns:
        The technique's summary rows that are numbers, as metrics; a Markdown summary.

    Raises:
        PipelineStepError: a technique mismatch, or no final checkpoint after training.
    """
    from posttrain.runners import run
    from posttrain.runtime import RunContext

    if technique not in ("sft", "dpo", "grpo"):
        raise PipelineStepError(f"technique: {technique!r} is not sft, dpo or grpo")
    cfg, manifest = load_prepared(dataset_dir)
    _expect(manifest, technique)
    with workspace(cfg.run_name) as work:
        cfg = _local_model(load_prepared(dataset_dir, work)[0], work)
        # The pipeline's register_model step registers the model; training must not do it twice.
        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"register_final": False})})
        summary = run(cfg)
        final = RunContext(cfg).final_model_dir
        if not (final / "config.json").is_file():
            raise PipelineStepError(f"{technique}: training finished without a checkpoint in {final}")
        metrics: dict[str, float] = {}
        for key, value in summary.rows:
            try:
                metrics[re.sub(r"[^A-Za-z0-9_]+", "_", key).strip("_")] = float(value)
            except (TypeError, ValueError):
                continue  # text rows (paths, names) belong in the report, not in Metrics
        info = {"technique": technique, "run_name": cfg.run_name, "pipeline_run": run_id}
        _export_model(final, model_out, info)
    md = f"# {technique.upper()} training: {cfg.run_name}\n\n" + summary.table() + "\n"
    return StepResult(metrics=metrics, metadata=info, markdown=md)


# ----------------------------------------------------------------------------------- evaluate
def model_location(uri: str, path: str, metadata: Mapping[str, Any]) -> str:
    """Where a Model artifact's checkpoint is, for reading or registering.

    ``metadata["checkpoint_uri"]`` when a step recorded one (cluster SAO writes the checkpoint
    outside the pipeline root); else the artifact's ``uri`` when it is an object-store URI
    (``minio://`` becomes ``s3://``: the same bucket through the S3 API); else the local ``path``.
    """
    if metadata.get("checkpoint_uri"):
        return str(metadata["checkpoint_uri"])
    if uri.startswith("s3://"):
        return uri
    if uri.startswith("minio://"):
        return "s3://" + uri[len("minio://") :]
    return path


def evaluate(dataset_dir: Path | str, model_dir: str, *, local_model_dir: str = "") -> StepResult:
    """Score a checkpoint on the held-out tasks of the prepared dataset (``eval.json`` of the run).

    avg@k over ``eval.num_tasks`` tasks with ``eval.samples_per_task`` samples each, graded by the
    environment's verifier (``posttrain.eval.heldout.evaluate_policy``).

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset``.
        model_dir: Checkpoint location (``model_location``): a directory or ``s3://`` URI.
        local_model_dir: A local copy of it when the caller has one (KFP downloads artifacts).

    Returns:
        Metrics ``heldout_accuracy``, ``heldout_reward_mean``, ``heldout_action_tokens_mean``,
        ``heldout_rollouts``; Markdown and HTML reports.

    Raises:
        posttrain.storage.StorageError: the checkpoint cannot be read.
    """
    from posttrain.eval.heldout import evaluate_policy
    from posttrain.runtime import RunContext
    from posttrain.storage import materialize

    cfg, manifest = load_prepared(dataset_dir)
    with workspace(f"{cfg.run_name}-eval") as work:
        cfg, _ = load_prepared(dataset_dir, work)
        local = Path(local_model_dir) if local_model_dir and Path(local_model_dir, "config.json").is_file() \
            else materialize(model_dir, work / "checkpoint")
        scores = evaluate_policy(RunContext(cfg), local)
    metrics = {f"heldout_{k}": float(v) for k, v in scores.items()}
    facts = {"run": cfg.run_name, "technique": manifest["technique"], "environment": cfg.data.env,
             "checkpoint": model_dir, "tasks": min(cfg.eval.num_tasks, manifest["eval_rows"]),
             "samples per task": cfg.eval.samples_per_task, **metrics}
    md = f"# Held-out evaluation: {cfg.run_name}\n\n" + _table(facts)
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(f'{v:.4f}' if isinstance(v, float) else str(v))}"
                   "</td></tr>" for k, v in facts.items())
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>Evaluation {html.escape(cfg.run_name)}</title>"
            "<style>body{font-family:sans-serif}th{text-align:left;padding-right:2em}</style></head><body>"
            f"<h1>Held-out evaluation: {html.escape(cfg.run_name)}</h1><table>{rows}</table></body></html>\n")
    return StepResult(metrics=metrics, metadata={"checkpoint": model_dir}, markdown=md, html=page)


# ----------------------------------------------------------------------------------- register
def register_model(
    dataset_dir: Path | str, source: str, model_metadata: Mapping[str, Any], eval_metrics: Mapping[str, Any],
    pipeline_run: str, *, margin: float = 0.0,
) -> StepResult:
    """Register the checkpoint with its lineage and scores; promote it to ``champion`` if it is better.

    Args:
        dataset_dir: Dataset artifact (technique, hashes, base model, registered model name).
        source: Checkpoint location (``model_location``); weights are not copied.
        model_metadata: The Model artifact's metadata (``mlflow_run_id`` links the version to its run).
        eval_metrics: The evaluate step's metrics (``heldout_accuracy`` is required).
        pipeline_run: Pipeline run id (lineage ``posttrain.run``).
        margin: Least improvement in held-out accuracy (fraction) over the champion to promote.

    Returns:
        ``text`` = ``"<model> v<N> champion: <reason>"`` or ``"... challenger: <reason>"``; metrics
        ``registered_version`` and ``promoted`` (1/0); a Markdown summary.

    Raises:
        PipelineStepError: ``heldout_accuracy`` missing from ``eval_metrics``.
        posttrain.tracking.TrackingError: the checkpoint has no ``config.json`` or the registry refuses.
    """
    from posttrain.tracking import Lineage, promote_if_better, register_checkpoint

    if "heldout_accuracy" not in eval_metrics:
        raise PipelineStepError(f"eval_metrics: no heldout_accuracy (got {sorted(eval_metrics)})")
    cfg, manifest = load_prepared(dataset_dir)
    scores = {f"heldout.{k[len('heldout_'):]}": float(v) for k, v in eval_metrics.items() if k.startswith("heldout_")}
    lineage = Lineage(run=pipeline_run or cfg.run_name, technique=manifest["technique"],
                      dataset_hash=manifest["dataset_hash"], config_hash=manifest["config_hash"],
                      base_model=manifest["base_model"], mlflow_run_id=str(model_metadata.get("mlflow_run_id", "")))
    name, uri = cfg.tracking.registered_model, cfg.tracking.tracking_uri
    version = register_checkpoint(source, registered_model=name, lineage=lineage, eval_scores=scores,
                                  tracking_uri=uri, description=f"{manifest['technique']} run {cfg.run_name}")
    decision = promote_if_better(name, version.version, metric=HELDOUT_METRIC, margin=margin, tracking_uri=uri)
    alias = "champion" if decision.promoted else "challenger"
    text = f"{name} v{version.version} {alias}: {decision.reason}"
    facts = {"registered model": name, "version": version.version, "alias": alias, "decision": decision.reason,
             "source": version.source, **{f"eval.{k}": v for k, v in scores.items()}}
    return StepResult(
        metrics={"registered_version": float(version.version), "promoted": float(decision.promoted)},
        metadata={"registered_model": name, "version": version.version, "alias": alias},
        markdown=f"# Registration: {name} v{version.version}\n\n" + _table(facts),
        text=text,
    )
