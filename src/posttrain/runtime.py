"""Where a run keeps its files and keys, derived from its config (shared by every role).

A run lives in ``<output_dir>/<run_name>/``::

    resolved_config.yaml   the validated config with overrides applied
    tokenizer/             trained locally (tiny model) or copied from the base model
    base_model/            the initial policy (tiny model built from config, or the given path)
    sft_model/             after the SFT warm start
    teacher_model/         GKD's teacher when the run builds it (gkd.teacher.path unset)
    weights/               the weight store: v000000/, v000001/, ... and LATEST
    checkpoints/           learner checkpoints and LATEST
    final_model/           the trained policy (HF directory), registered in MLflow
    metrics.jsonl          one JSON object per learner step
    quarantine-<split>.jsonl  bad task-file rows (data.on_bad_row=quarantine), one line each
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from posttrain.config import ConfigError, RunConfig
from posttrain.records import Task
from posttrain.rollout.keys import StreamKeys

WORK_PARTS = ("tokenizer", "base_model", "sft_model", "weights", "checkpoints", "final_model")
"""What a run directory holds once its run did work (``RunContext.did_work``); all derive from the config."""


@dataclass
class RunContext:
    """Paths, stream keys and task sources of one run."""

    config: RunConfig

    @property
    def run_dir(self) -> Path:
        """``<output_dir>/<run_name>``."""
        return Path(self.config.output_dir) / self.config.run_name

    @property
    def keys(self) -> StreamKeys:
        """Redis keys of the run (``<key_prefix>:<run_name>:...``)."""
        return StreamKeys(self.config.queue.key_prefix, self.config.run_name)

    @property
    def tokenizer_dir(self) -> Path:
        """Tokenizer directory."""
        return self.run_dir / "tokenizer"

    @property
    def base_model_dir(self) -> Path:
        """Initial policy directory."""
        return self.run_dir / "base_model"

    @property
    def sft_model_dir(self) -> Path:
        """Policy after the SFT warm start."""
        return self.run_dir / "sft_model"

    @property
    def teacher_model_dir(self) -> Path:
        """GKD's teacher: ``gkd.teacher.path`` when set, else ``<run>/teacher_model`` (the run builds it).

        A set path is a local directory by the time a role reads it (pipelines download ``s3://`` ones).
        """
        path = self.config.gkd.teacher.path
        return Path(path) if path else self.run_dir / "teacher_model"

    @property
    def weights_dir(self) -> Path:
        """Weight store root."""
        return self.run_dir / "weights"

    @property
    def checkpoints_dir(self) -> Path:
        """Learner checkpoints root."""
        return self.run_dir / "checkpoints"

    @property
    def final_model_dir(self) -> Path:
        """Final trained policy."""
        return self.run_dir / "final_model"

    def resolved_config_yaml(self) -> str:
        """The config as YAML text (what is saved beside checkpoints and logged to MLflow)."""
        return yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False)

    def save_resolved_config(self) -> Path:
        """Write ``resolved_config.yaml`` into the run directory; return its path.

        A run directory that already holds a run resumes it (its tokenizer, models, checkpoints),
        so it must be the same run: a config whose technique, seed, model or data differ from the
        saved one is refused before anything is overwritten. A directory whose run did no work
        (``did_work``: a run refused or stopped before preparing anything) takes the new config.

        Raises:
            posttrain.config.ConfigError: the run directory holds a run of another technique, seed,
                model or data (the first differing field is named).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "resolved_config.yaml"
        if path.exists() and self.did_work():
            self._check_same_run(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
        path.write_text(self.resolved_config_yaml(), encoding="utf-8")
        return path

    def did_work(self) -> bool:
        """True when the run directory holds something a resume would reuse (``WORK_PARTS``).

        A run stopped before it prepared anything (a data error, a Ctrl-C during MLflow's start) left at
        most its config and logs: a run with another config may take the directory over.
        """
        return any((self.run_dir / part).exists() for part in WORK_PARTS)

    def _check_same_run(self, saved: dict[str, Any]) -> None:
        """Refuse to reuse a run directory for a config that trains something else (see ``save_resolved_config``)."""
        new = self.config.model_dump(mode="json")

        def first_difference(a: Any, b: Any, where: str) -> str | None:
            if isinstance(a, dict) and isinstance(b, dict):
                for key in sorted(set(a) | set(b)):
                    found = first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
                    if found:
                        return found
                return None
            return None if a == b else f"{where}: {a!r} there, {b!r} now"

        for section in ("technique", "seed", "model", "data"):
            found = first_difference(saved.get(section), new.get(section), section)
            if found:
                raise ConfigError(
                    f"{self.run_dir} holds a run started with another config ({found}); a run directory "
                    f"resumes only the run it holds: set another run_name or output_dir, or remove it")

    def tasks(self, split: str) -> list[Task]:
        """Training (``train``) or held-out (``eval``) tasks of the configured environment.

        With ``data.on_bad_row=quarantine`` bad rows of a task file go to ``quarantine_path(split)``,
        once each however many processes load the file.

        Raises:
            posttrain.data.tasks.DatasetError: a malformed task file row (file, line, field).
        """
        from posttrain.data.tasks import load_tasks_jsonl
        from posttrain.envs.registry import default_tasks

        data = self.config.data
        path = data.train_path if split == "train" else data.eval_path
        n = data.num_train_tasks if split == "train" else data.num_eval_tasks
        if path:
            tasks = load_tasks_jsonl(
                Path(path), data.env, on_bad_row=data.on_bad_row, quarantine_path=self.quarantine_path(split)
            )
            return tasks[:n]
        if data.env in ("synthetic_arith", "synthetic_tool", "synthetic_longtail"):
            return default_tasks(data.env, split, n, data.seed, **data.env_args)
        return default_tasks(data.env, split, n, data.seed)

    def quarantine_path(self, split: str) -> Path:
        """``<run_dir>/quarantine-<split>.jsonl``: bad rows of the ``split`` task file (``data.on_bad_row=quarantine``)."""
        return self.run_dir / f"quarantine-{split}.jsonl"

    def quarantined_rows(self) -> int:
        """Bad task-file rows quarantined so far, over the train and eval files (count of rows).

        Every process of the run (learner, generators, evaluator) loads the task files, but a bad row
        is written to its quarantine file only once (``posttrain.data.tasks.RowSink``), so the lines
        of the two files count distinct bad rows. 0 when nothing was quarantined.
        """
        total = 0
        for split in ("train", "eval"):
            path = self.quarantine_path(split)
            if path.is_file():
                with path.open("rb") as fh:
                    total += sum(1 for line in fh if line.strip())
        return total

    def environment(self) -> Any:
        """The configured environment, built with ``data.env_args``."""
        from posttrain.envs.registry import make_environment

        return make_environment(self.config.data.env, **self.config.data.env_args)


MODEL_FILES = "config.json, weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin) " \
    "and a tokenizer (tokenizer.json or tokenizer_config.json)"
"""What a ``model.path`` directory must hold (the files a transformers model directory has)."""


def check_model_dir(path: Path | str, field: str = "model.path") -> None:
    """Refuse a local model directory without a model or tokenizer, naming the files it should hold.

    An empty directory gave a 34-line traceback about sentencepiece from transformers.

    Raises:
        FileNotFoundError: ``path`` does not exist, is not a directory, or lacks config, weights or
            tokenizer (one line naming ``field``, the directory and ``MODEL_FILES``).
    """
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{field}: {p} is not a directory (expected a transformers model directory)")
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    missing = [what for what, names in (("config.json", ("config.json",)), ("weights", weights),
                                        ("tokenizer", ("tokenizer.json", "tokenizer_config.json")))
               if not any((p / name).is_file() for name in names)]
    if missing:
        raise FileNotFoundError(f"{field}: {p} has no model or tokenizer (missing: {', '.join(missing)}); "
                                f"expected {MODEL_FILES}")


INPUT_FILE_FIELDS = ("data.train_path", "data.eval_path", "sft.data_path", "dpo.data_path", "gkd.data_path")
"""Dotted config fields that name a JSONL input file (``check_input_files``)."""


def input_file_format(config: RunConfig, dotted: str) -> str | None:
    """The row format ``check_input_files`` reads the file of field ``dotted`` in: ``rl``, ``sft``, ``cpt``, ``dpo``.

    ``gkd.data_path`` (GKD's fixed sequences, read when ``gkd.lmbda < 1``) holds chat rows, ``sft``.

    None for a field the technique does not read (``dpo.data_path`` of an SFT run): only its metadata
    is checked. Task files (``data.*``) are read by every technique: RL trains on them, and the others
    evaluate on the held-out file and train a tiny model's tokenizer on the tasks.
    """
    if dotted.startswith("data."):
        return "rl"
    if dotted == "sft.data_path" and config.technique in ("sft", "cpt"):
        return config.technique
    if dotted == "dpo.data_path" and config.technique == "dpo":
        return "dpo"
    if dotted == "gkd.data_path" and config.technique == "gkd" and config.gkd.fixed_rows:
        return "sft"  # GKD's fixed sequences are chat rows
    return None


def check_input_files(config: RunConfig) -> None:
    """Check, before any work starts, every local input file the config names: present, a file, and every row valid.

    Reads ``INPUT_FILE_FIELDS``; unset fields and ``s3://`` URIs (downloaded by the role that needs them) are
    skipped. A file the technique reads (``input_file_format``) is read whole (up to its section's
    ``max_examples``), row by row, with the loader the
    run uses later and under ``data.on_bad_row``: with ``stop`` its first bad row is refused here, naming file,
    line and field; with ``quarantine`` bad rows are counted into a temporary file and only a file with no
    valid row is refused (the run writes its own quarantine file when it loads the file again). Nothing is
    written under ``output_dir``. A malformed row used to be found only after the model was built (13-20 s
    in), leaving a run directory behind that then refused a re-run with the fixed file elsewhere.

    Raises:
        posttrain.config.ConfigError: one line naming the field and the path: it does not exist, is not a file,
            or is empty (0 bytes).
        posttrain.data.tasks.DatasetError: a bad row under ``data.on_bad_row: stop``, or no valid row at all
            (``FILE:LINE: field 'NAME': reason``).
    """
    import tempfile

    for dotted in INPUT_FILE_FIELDS:
        section, name = dotted.split(".")
        value = getattr(getattr(config, section, None), name, None)
        if not value or "://" in value:
            continue
        path = Path(value)
        if not path.exists():
            raise ConfigError(f"{dotted}: {path} does not exist")
        if not path.is_file():
            raise ConfigError(f"{dotted}: {path} is not a file")
        if path.stat().st_size == 0:
            raise ConfigError(f"{dotted}: {path} is empty (no rows)")
        fmt = input_file_format(config, dotted)
        if fmt is None:
            continue
        with tempfile.TemporaryDirectory(prefix="posttrain-preflight-") as tmp:
            # A technique's own file is read up to its section's max_examples: the rows after it are never used.
            limit = getattr(config, section).max_examples if section in ("sft", "dpo", "gkd") else None
            _read_rows(config, path, fmt, Path(tmp) / "quarantine.jsonl", limit)


def _read_rows(config: RunConfig, path: Path, fmt: str, quarantine: Path, limit: int | None) -> None:
    """Read every row of ``path`` as the run will (``check_input_files``); raise on what the run would refuse."""
    import logging

    from posttrain.data.formats import load_rows
    from posttrain.data.tasks import read_tasks_jsonl

    policy = config.data.on_bad_row
    data_log = logging.getLogger("posttrain.data")
    level = data_log.level
    data_log.setLevel(logging.ERROR)  # "quarantined N rows into <temporary file>" would point at nothing
    try:
        if fmt == "rl":
            read_tasks_jsonl(path, config.data.env, on_bad_row=policy, quarantine_path=quarantine)
        else:
            load_rows(path, "sft" if fmt == "sft" else "cpt" if fmt == "cpt" else "dpo", on_bad_row=policy,
                      quarantine_path=quarantine, limit=limit)
    finally:
        data_log.setLevel(level)


def check_output_writable(config: RunConfig) -> Path:
    """Check, before any work starts, that ``<output_dir>/<run_name>`` can be created and written; return it.

    Probes the run directory when it exists, else its nearest existing parent, by creating and
    removing a temporary directory there: nothing is left behind. A read-only ``output_dir`` gave
    a ``PermissionError`` traceback after the model was prepared.

    Raises:
        posttrain.config.ConfigError: the run directory cannot be created or written (one line
            naming ``output_dir``, the path and the operating system's reason).
    """
    import tempfile

    run_dir = Path(config.output_dir) / config.run_name
    probe_in = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("."))
    try:
        if not probe_in.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(probe_in))
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=probe_in))
    except OSError as exc:
        where = exc.filename or probe_in
        raise ConfigError(f"output_dir: cannot write the run directory {run_dir} ({where}: "
                          f"{exc.strerror or exc})") from None
    return run_dir
