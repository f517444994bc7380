"""What the pipeline steps exchange: the Dataset artifact's files, step outputs, the working directory.

A step returns ``StepOutputs`` and its component copies them into the KFP output artifacts with
``write_outputs``. ``load_prepared`` reads the Dataset artifact that ``prepare_dataset`` writes
(file names ``CONFIG_FILE``, ``MANIFEST_FILE``, ``TRAIN_FILE``, ``EVAL_FILE``, ``TASKS_FILE``);
``export_model`` fills a Model artifact directory (a checkpoint plus ``MODEL_INFO_FILE``);
``workspace`` gives a training step its working directory; ``markdown_table`` and ``html_table``
render the reports. Nothing here imports ``kfp``: the artifacts are duck-typed.

Try it: ``python -c "from posttrain.kfp.artifacts import markdown_table; print(markdown_table({'a': 1.0}))"``.
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.config import RunConfig, load_config
from posttrain.kfp.config_fields import with_fields

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
TASKS_FILE = "tasks.jsonl"
MODEL_INFO_FILE = "posttrain_model.json"
"""Written into every Model artifact directory: technique, run name, MLflow run id, checkpoint URI."""
WORKSPACE_ENV = "POSTTRAIN_WORKSPACE"
"""Directory (a mounted volume) that training steps work in when it exists; see ``workspace``."""


class PipelineStepError(RuntimeError):
    """A pipeline step cannot go on; the message names the parameter, file or field at fault."""


@dataclass
class StepOutputs:
    """What a step writes to its KFP outputs.

    Attributes:
        metrics: Scalars for the step's ``Output[Metrics]`` (KFP shows them in the run's UI).
        metadata: Set on the step's main output artifact (``Dataset`` / ``Model``).
        markdown: Body of the step's ``Output[Markdown]`` report ("" when it has none).
        html: Body of the step's ``Output[HTML]`` report ("" when it has none).
        text: One line the component returns as its ``str`` output ("" when it returns nothing).
        account_markdown: The run's time account as Markdown (``posttrain.runners.accounting``: the
            table, and the stacked-bar plot embedded as a PNG data URI) for the training steps'
            ``time_account`` output; "" when the run recorded none.
        account_png: The stacked-bar PNG (bytes) for the ``time_account_plot`` output; b"" when none.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    markdown: str = ""
    html: str = ""
    text: str = ""
    account_markdown: str = ""
    account_png: bytes = b""


def write_outputs(
    result: StepOutputs, *, metrics: Any = None, artifact: Any = None, markdown: Any = None, html_report: Any = None,
    account: Any = None, account_plot: Any = None,
) -> None:
    """Copy ``StepOutputs`` into KFP output artifacts (any object with ``log_metric`` / ``metadata`` / ``path``).

    Args:
        result: The step's outputs.
        metrics: An ``Output[Metrics]``: each ``result.metrics`` item is logged.
        artifact: The main output artifact: ``result.metadata`` is merged into its metadata.
        markdown: An ``Output[Markdown]``: ``result.markdown`` is written to its path.
        html_report: An ``Output[HTML]``: ``result.html`` is written to its path.
        account: An ``Output[Markdown]``: ``result.account_markdown`` (or a line saying the run recorded no
            time account) is written to its path.
        account_plot: An ``Output[Artifact]``: ``result.account_png`` is written to its path (an empty file
            when there is none), with ``metadata["mime_type"] = "image/png"``.
    """
    if metrics is not None:
        for key, value in result.metrics.items():
            metrics.log_metric(key, float(value))
    if artifact is not None:
        artifact.metadata.update(result.metadata)
    account_body = result.account_markdown or "No time account: the run recorded none.\n"
    for target, body in ((markdown, result.markdown), (html_report, result.html),
                         (account, account_body if account is not None else "")):
        if target is not None:
            Path(target.path).parent.mkdir(parents=True, exist_ok=True)
            Path(target.path).write_text(body, encoding="utf-8")
    if account_plot is not None:
        Path(account_plot.path).parent.mkdir(parents=True, exist_ok=True)
        Path(account_plot.path).write_bytes(result.account_png)
        account_plot.metadata["mime_type"] = "image/png"


def learner_account_outputs(tracking_uri: str, run_id: str) -> dict[str, Any]:
    """``StepOutputs`` fields of the time account a cluster learner logged to MLflow run ``run_id``.

    The JobSet's learner records ``account.md`` and ``account.png`` as artifacts of its run (the step
    that launched it has none on its disk); they are downloaded and read like ``account_outputs``.
    Empty fields when the run has no account (one warning line when MLflow refused the download).
    """
    from mlflow.exceptions import MlflowException

    from posttrain.tracking.client import mlflow_client

    if not run_id:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            client = mlflow_client(tracking_uri)
            names = {a.path for a in client.list_artifacts(run_id)}
            for name in ("account.md", "account.png"):
                if name in names:
                    client.download_artifacts(run_id, name, tmp)
        except (MlflowException, OSError) as exc:
            logging.getLogger("posttrain.kfp").warning("the learner's time account was not read from %s run %s (%s)",
                                                       tracking_uri, run_id, exc)
            return {}
        return account_outputs(Path(tmp))


def account_outputs(run_dir: Path) -> dict[str, Any]:
    """``StepOutputs`` fields of the time account a run recorded in ``run_dir`` (``account.md``, ``account.png``).

    The Markdown gets the plot embedded as a PNG data URI, so KFP's Markdown viewer shows both. Empty
    fields when the run wrote no account.
    """
    md, png = run_dir / "account.md", run_dir / "account.png"
    if not md.is_file():
        return {}
    data = png.read_bytes() if png.is_file() else b""
    image = (f"\n![time account](data:image/png;base64,{base64.b64encode(data).decode('ascii')})\n"
             if data else "")
    return {"account_markdown": md.read_text(encoding="utf-8") + image, "account_png": data}


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
    return with_fields(cfg, values), manifest


def expect_technique(manifest: Mapping[str, Any], technique: str) -> None:
    """Refuse a Dataset artifact prepared for another technique than the step trains.

    Raises:
        PipelineStepError: ``manifest["technique"]`` is not ``technique``.
    """
    if manifest.get("technique") != technique:
        raise PipelineStepError(
            f"dataset artifact was prepared for technique {manifest.get('technique')!r}, not {technique!r}"
        )


@contextlib.contextmanager
def workspace(run_name: str) -> Iterator[Path]:
    """Working directory of a training step.

    Yields:
        ``$POSTTRAIN_WORKSPACE/<run_name>`` when that variable names an existing directory (the
        volume of ``components/k8s.py::mount_workspace``; kept, so a retried step resumes from its
        checkpoints), else a fresh temporary directory (removed when the block succeeds, kept and
        logged when it raises). Under ``kfp.local`` the variable is set but ``/workspace`` does not
        exist, so local runs use temporary directories.
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


def export_model(src: Path, model_out: Path | str, info: Mapping[str, Any]) -> None:
    """Copy the checkpoint directory ``src`` into the Model artifact ``model_out`` and write ``MODEL_INFO_FILE``.

    Args:
        src: A transformers checkpoint directory.
        model_out: The Model artifact directory (created; existing files are overwritten).
        info: Written as JSON to ``<model_out>/posttrain_model.json``.
    """
    out = Path(model_out)
    shutil.copytree(src, out, dirs_exist_ok=True)
    (out / MODEL_INFO_FILE).write_text(json.dumps(dict(info), indent=1) + "\n", encoding="utf-8")


def _shown(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown_table(rows: Mapping[str, Any]) -> str:
    """A two-column Markdown table (``item | value``) of ``rows``; floats with 4 decimals, ``|`` shown as ``/``."""
    lines = ["| item | value |", "|---|---|"]
    for key, value in rows.items():
        lines.append(f"| {key} | {_shown(value).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def html_table(rows: Mapping[str, Any]) -> str:
    """An HTML ``<table>`` with one ``<tr><th>key</th><td>value</td></tr>`` per item, escaped; floats with 4 decimals."""
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_shown(v))}</td></tr>" for k, v in rows.items())
    return f"<table>{body}</table>"
