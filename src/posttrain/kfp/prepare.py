"""The ``prepare_dataset`` step: resolve the run config with the per-run knobs, write the Dataset artifact.

The artifact directory it writes (``load_prepared`` reads it back)::

    config.yaml      the resolved run config (data paths relative to this directory)
    manifest.json    technique, run name, pipeline run id, dataset/config hashes, base model
    train.jsonl      RL tasks (grpo, sao, gkd) or the sft/dpo rows, validated
    tasks.jsonl      sft/dpo only: the environment's training tasks (tokenizer text, warm start)
    eval.jsonl       held-out tasks of the config's environment
    fixed.jsonl      gkd with gkd.lmbda < 1 only: the fixed sequences (gkd.data_path), validated

For ``gkd`` the teacher (``gkd.teacher.path``) is resolved like the model: ``models:/<name>@<alias>``
through the MLflow registry (distil a team's champion), a path made absolute, an ``s3://`` URI kept
(the training step downloads it); the manifest records it as ``teacher_model``.

Runs in the torch-free ``base`` image. Try it: ``python -c "from posttrain.kfp.prepare import
prepare_dataset; print(prepare_dataset('configs/sao_demo_cpu.yaml', 'sao', '', '', 2, 'try', '/tmp/ds').metrics)"``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from posttrain.config import ConfigError, load_config
from posttrain.kfp.artifacts import (
    CONFIG_FILE,
    EVAL_FILE,
    MANIFEST_FILE,
    TASKS_FILE,
    TRAIN_FILE,
    PipelineStepError,
    StepOutputs,
)
from posttrain.kfp.config_fields import DATA_FIELD, get_field, overrides, with_fields
from posttrain.kfp.locations import (
    check_checkpoint,
    local_file,
    resolve_location,
    resolve_model,
    run_name_for,
)

PIPELINE_TECHNIQUES = ("sft", "dpo", "grpo", "sao", "gkd")
"""Techniques a pipeline can select with its ``technique`` parameter."""
RL_TECHNIQUES = ("grpo", "sao", "gkd")
"""Techniques that train on environment tasks (``data.train_path``)."""


FIXED_FILE = "fixed.jsonl"
"""GKD's fixed sequences in the Dataset artifact (``gkd.data_path``)."""


def _resolve_teacher(cfg: Any) -> tuple[Any, str]:
    """``cfg`` with ``gkd.teacher.path`` resolved (module docstring) and the teacher's lineage label.

    Raises:
        PipelineStepError: a ``models:/`` URI naming no version, a path found nowhere, or no checkpoint there.
    """
    location = cfg.gkd.teacher.path
    if not location:
        return cfg, f"built by the run ({cfg.gkd.teacher.build_steps} SFT steps of the base model)"
    path, label = resolve_model(location, cfg.tracking.tracking_uri)
    if not path.startswith("s3://"):
        path = resolve_location(path, "gkd.teacher.path")
    check_checkpoint(path, "gkd.teacher.path")
    return with_fields(cfg, {"gkd.teacher.path": path}), label if label != location else path


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
) -> StepOutputs:
    """Resolve the run config with the per-run knobs and write the Dataset artifact directory.

    Args:
        config: Run config YAML: a path (also looked up under ``$POSTTRAIN_HOME``) or ``s3://`` URI.
        technique: One of ``PIPELINE_TECHNIQUES``; overrides the config's ``technique``.
        model: "" keeps the config's model; else a path, ``s3://`` URI or ``models:/...`` (``resolve_model``).
        dataset: "" keeps the config's data; else the training file (path or ``s3://``) for
            ``DATA_FIELD[technique]``: RL tasks for grpo/sao/gkd, sft rows, dpo pairs.
        steps: 0 keeps the config's; else ``STEPS_FIELD[technique]`` (optimizer steps / policy versions).
        run_id: Pipeline run id; suffixes the run name (``run_name_for``).
        out_dir: The Dataset artifact directory to create (see the module docstring).

    Returns:
        Metrics ``train_rows`` and ``eval_rows`` (tasks or rows); metadata technique, run name,
        dataset hash and base model.

    Raises:
        PipelineStepError: unknown technique, negative steps, missing files, no training data, a GKD
            teacher that cannot be found.
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
    check_checkpoint(model_path, what)
    data_path = str(local_file(dataset, scratch / "dataset.jsonl", "dataset")) if dataset else ""
    run_name = run_name_for(base.run_name, run_id)
    cfg = load_config(config_path, overrides(technique, model_path, data_path, steps, run_name))
    if cfg.tracking.tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI"):
        from posttrain.tracking import default_tracking_uri

        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(
            update={"tracking_uri": default_tracking_uri(Path(base.output_dir))})})
    # Task files named by the config (possibly s3://) are copied here, so later steps read only the artifact.
    for dotted, name in (("data.train_path", "tasks_source.jsonl"), ("data.eval_path", "eval_source.jsonl")):
        location = get_field(cfg, dotted)
        if location and not (dotted == DATA_FIELD[technique] and data_path):
            cfg = with_fields(cfg, {dotted: str(local_file(str(location), scratch / name, dotted))})
    teacher_label = ""
    if technique == "gkd":
        cfg, teacher_label = _resolve_teacher(cfg)
    ctx = RunContext(cfg.model_copy(update={"output_dir": str(scratch)}))
    files = {DATA_FIELD[technique]: TRAIN_FILE, "data.eval_path": EVAL_FILE}
    if technique == "gkd" and cfg.gkd.fixed_rows and cfg.gkd.data_path:
        from posttrain.data.formats import load_rows

        fixed = local_file(cfg.gkd.data_path, scratch / "fixed_source.jsonl", "gkd.data_path")
        load_rows(fixed, "sft", on_bad_row=cfg.data.on_bad_row, quarantine_path=out / "quarantine-fixed.jsonl")
        shutil.copyfile(fixed, out / FIXED_FILE)
        files["gkd.data_path"] = FIXED_FILE
    if technique in RL_TECHNIQUES:
        n_train = _write_tasks(out / TRAIN_FILE, ctx.tasks("train"))
    else:
        from posttrain.data.formats import load_rows

        source = get_field(cfg, DATA_FIELD[technique])
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
    resolved = with_fields(cfg, files)
    (out / CONFIG_FILE).write_text(yaml.safe_dump(resolved.model_dump(mode="json", by_alias=True), sort_keys=False),
                                   encoding="utf-8")
    manifest = {
        "technique": technique,
        "run_name": run_name,
        "pipeline_run_id": run_id,
        "config_source": config,
        "dataset_source": dataset or str(get_field(base, DATA_FIELD[technique]) or f"env:{cfg.data.env}"),
        "base_model": model_label or (cfg.model.path or "tiny (model.tiny, built from scratch)"),
        "dataset_hash": dataset_hash([out / f for f in files.values()]),
        "config_hash": config_hash(resolved.model_dump(mode="json", by_alias=True)),
        "files": files,
        "train_rows": n_train,
        "eval_rows": n_eval,
    }
    if teacher_label:
        manifest["teacher_model"] = teacher_label
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    if scratch.exists():
        shutil.rmtree(scratch)
    meta: dict[str, Any] = {k: manifest[k] for k in ("technique", "run_name", "dataset_hash", "config_hash",
                                                     "base_model", "teacher_model") if k in manifest}
    return StepOutputs(metrics={"train_rows": float(n_train), "eval_rows": float(n_eval)}, metadata=meta)
