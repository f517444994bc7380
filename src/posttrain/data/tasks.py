"""Load and validate RL task files: generic JSONL, GSM8K, DAPO-Math-17k and BeyondAIME.

Every loader turns dataset rows into ``posttrain.records.Task`` and reports a bad row either by
stopping (``DatasetError`` naming file, line and field) or, with ``on_bad_row="quarantine"``, by
writing the row and the reason to a quarantine JSONL file and going on; the number of quarantined
rows is returned in ``TaskLoadResult`` and logged.

The generic RL task format (one JSON object per line)::

    {"prompt": "Compute 2 + 2.", "reference": "4", "task_id": "optional", "metadata": {"k": "v"}}

Data files live in the repository's ``data/`` directory, or in ``$POSTTRAIN_DATA_DIR``.

Run ``python -m posttrain.data.tasks FILE ENV_NAME`` to validate a task file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from posttrain.records import Task

log = logging.getLogger(__name__)

OnBadRow = Literal["stop", "quarantine"]
"""What to do with a malformed row: raise ``DatasetError``, or quarantine it and go on."""


class DatasetError(ValueError):
    """A dataset row is malformed; the message names the file, the line (1-based) and the field."""

    def __init__(self, path: Path | str, line: int, field: str, reason: str) -> None:
        self.path, self.line, self.field, self.reason = str(path), line, field, reason
        super().__init__(f"{path}:{line}: field {field!r}: {reason}")


@dataclass
class TaskLoadResult:
    """Tasks read from one file, and how many rows were quarantined instead.

    Attributes:
        tasks: The valid tasks, in file order.
        num_quarantined: Rows written to the quarantine file (0 with ``on_bad_row="stop"``).
        quarantine_path: Where they went, if anywhere.
    """

    tasks: list[Task] = field(default_factory=list)
    num_quarantined: int = 0
    quarantine_path: Path | None = None


def data_dir() -> Path:
    """The dataset directory: ``$POSTTRAIN_DATA_DIR``, else ``<repository root>/data``.

    Raises:
        FileNotFoundError: the directory does not exist.
    """
    env = os.environ.get("POSTTRAIN_DATA_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {path} does not exist (set POSTTRAIN_DATA_DIR to the directory holding gsm8k/, ...)"
        )
    return path


class RowSink:
    """Applies the bad-row policy: raise, or append ``{file, line, field, reason, row}`` to a file.

    Quarantine writes are idempotent: a row already in the quarantine file with the same
    ``file``, ``line``, ``field`` and ``reason`` is not written again. Every process of a run that
    loads the task file (learner, each generator, the evaluator) and every reload after a restart
    therefore leaves each bad row in the file exactly once. Check and append happen under an
    exclusive ``fcntl.flock`` on the quarantine file, so processes loading at the same moment do
    not both write. ``count`` is the number of bad rows *this* load met, written or already there.
    """

    def __init__(self, path: Path, on_bad_row: OnBadRow, quarantine_path: Path | None) -> None:
        if on_bad_row not in ("stop", "quarantine"):
            raise ValueError(f"on_bad_row: expected 'stop' or 'quarantine', got {on_bad_row!r}")
        if on_bad_row == "quarantine" and quarantine_path is None:
            raise ValueError("quarantine_path: required when on_bad_row='quarantine'")
        self.path, self.on_bad_row, self.quarantine_path = path, on_bad_row, quarantine_path
        self.count = 0
        self.written = 0
        """Rows this sink appended (``count`` minus the ones another load had written already)."""
        self._known: set[tuple[str, int, str, str]] = set()
        self._read_upto = 0

    def _scan(self, fh: BinaryIO) -> None:
        """Add the keys of quarantine lines written since the last scan (by any process) to ``_known``.

        Raises:
            DatasetError: a line of the quarantine file that is not a JSON object (names the byte offset).
        """
        fh.seek(self._read_upto)
        for line in fh:
            start = self._read_upto
            self._read_upto += len(line)
            try:
                rec = json.loads(line)
                key = (str(rec["file"]), int(rec["line"]), str(rec["field"]), str(rec["reason"]))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
                raise DatasetError(
                    self.quarantine_path or "<quarantine>", 0, "<json>",
                    f"quarantine file has an unreadable record at byte {start}: {exc}",
                ) from exc
            self._known.add(key)

    def bad(self, err: DatasetError, raw: Any) -> None:
        """Raise ``err`` (``stop``), or quarantine the row unless the file already holds it (``quarantine``).

        Raises:
            DatasetError: ``err`` with ``on_bad_row="stop"``, or an unreadable quarantine file.
        """
        if self.on_bad_row == "stop":
            raise err
        assert self.quarantine_path is not None
        self.count += 1
        key = (err.path, err.line, err.field, err.reason)
        if key in self._known:
            return
        self.quarantine_path.parent.mkdir(parents=True, exist_ok=True)
        record = {"file": err.path, "line": err.line, "field": err.field, "reason": err.reason, "row": raw}
        data = (json.dumps(record, default=str, ensure_ascii=False) + "\n").encode("utf-8")
        with self.quarantine_path.open("a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                self._scan(fh)
                if key not in self._known:
                    fh.write(data)  # append mode: always at the end of the file
                    fh.flush()
                    self._known.add(key)
                    self._read_upto += len(data)
                    self.written += 1
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def result(self, tasks: list[Task]) -> TaskLoadResult:
        """Wrap up, logging the quarantine count."""
        if self.count:
            log.warning("%s: quarantined %d bad rows into %s", self.path, self.count, self.quarantine_path)
        return TaskLoadResult(tasks, self.count, self.quarantine_path if self.count else None)


MAX_ROW_BYTES = 8 * 2**20
"""Longest row of a dataset file (bytes, newline excluded): 8 MiB. A longer row is a bad row (field
``<row>``); it is skipped in 1 MiB pieces and never held in memory whole."""

_SKIP_CHUNK = 2**20


def _raw_lines(fh: BinaryIO, limit: int) -> Iterator[tuple[int, int, bytes | None, int]]:
    """``(line_number, byte_offset, line_bytes, size)`` per line; ``line_bytes`` is None for a line over ``limit`` bytes.

    Reads at most ``limit + 1`` bytes at a time, so memory stays bounded whatever the file holds;
    ``size`` counts the line's bytes without its newline for an oversized line.
    """
    offset, lineno = 0, 0
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        lineno += 1
        start, size = offset, len(line)
        if size > limit and not line.endswith(b"\n"):
            newline = 0
            while True:  # skip the rest of the oversized line
                chunk = fh.readline(_SKIP_CHUNK)
                size += len(chunk)
                if chunk.endswith(b"\n"):
                    newline = 1
                if not chunk or newline:
                    break
            offset += size
            yield lineno, start, None, size - newline
            continue
        offset += size
        yield lineno, start, line, size


def jsonl_rows(path: Path, sink: RowSink, what: str = "task file") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line_number, object)`` for each non-blank line, read as a stream; bad lines go to ``sink``.

    A line that is not UTF-8 (field ``<utf-8>``: the byte, its offset in the file and its column),
    longer than ``MAX_ROW_BYTES`` (field ``<row>``), not JSON, or not a JSON object is a bad row.
    ``what`` names the file in the error for a missing one (``task file``, ``sft file``...).

    Raises:
        FileNotFoundError: ``path`` is not a file.
        DatasetError: a bad line with ``on_bad_row="stop"``.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    limit = MAX_ROW_BYTES
    with path.open("rb") as fh:
        for lineno, offset, raw, size in _raw_lines(fh, limit):
            if raw is None:
                sink.bad(DatasetError(path, lineno, "<row>", f"row is {size} bytes, over the limit of {limit} bytes "
                                      "(posttrain.data.tasks.MAX_ROW_BYTES)"), f"<{size} bytes, not kept>")
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte = raw[exc.start : exc.start + 1].hex()
                sink.bad(DatasetError(path, lineno, "<utf-8>", f"not UTF-8: byte 0x{byte} at byte offset "
                                      f"{offset + exc.start} of the file (byte {exc.start + 1} of the line)"),
                         raw.decode("utf-8", errors="replace").rstrip("\n"))
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                sink.bad(DatasetError(path, lineno, "<json>", f"invalid JSON: {exc.msg}"), line.rstrip("\n"))
                continue
            if not isinstance(obj, dict):
                sink.bad(DatasetError(path, lineno, "<json>", f"expected an object, got {type(obj).__name__}"), obj)
                continue
            yield lineno, obj


def text_field(obj: dict[str, Any], key: str, path: Path, lineno: int, *, allow_number: bool = False) -> str:
    """A required non-empty string field (numbers accepted and converted when ``allow_number``)."""
    if key not in obj:
        raise DatasetError(path, lineno, key, "missing")
    value = obj[key]
    if allow_number and isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise DatasetError(path, lineno, key, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise DatasetError(path, lineno, key, "empty")
    return value


def _metadata(obj: dict[str, Any], path: Path, lineno: int) -> dict[str, str]:
    """Optional ``metadata``: an object of scalars (converted to strings)."""
    meta = obj.get("metadata", {})
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise DatasetError(path, lineno, "metadata", f"expected an object, got {type(meta).__name__}")
    out: dict[str, str] = {}
    for k, v in meta.items():
        if isinstance(v, dict | list):
            raise DatasetError(path, lineno, f"metadata.{k}", f"expected a scalar, got {type(v).__name__}")
        out[str(k)] = "" if v is None else str(v)
    return out


TASK_FIELDS = ("task_id", "prompt", "reference", "metadata")
"""The fields of a generic RL task row; any other key is a bad row (a typo must not drop data)."""


def read_tasks_jsonl(
    path: Path | str,
    env_name: str,
    *,
    on_bad_row: OnBadRow = "stop",
    quarantine_path: Path | str | None = None,
    data_source: str | None = None,
) -> TaskLoadResult:
    """Read a generic RL task file (see the module docstring for the row format).

    ``task_id`` defaults to ``<file stem>-<line number>``; ids must be unique within the file.
    ``reference`` may be a JSON number (converted to its string). A key outside ``TASK_FIELDS`` is
    a bad row (field: the key). The file is read as a stream (``jsonl_rows``).

    Args:
        path: The JSONL file.
        env_name: Environment that runs these tasks (``Task.env_name``).
        on_bad_row: ``stop`` raises on the first bad row; ``quarantine`` writes it to
            ``quarantine_path`` with the reason and skips it.
        quarantine_path: JSONL file to append bad rows to (required with ``quarantine``).
        data_source: ``Task.data_source``; the file stem when ``None``.

    Returns:
        The tasks and the quarantine count.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetError: a bad row with ``on_bad_row="stop"``; or no valid task at all (line 0, field
            ``<file>``), so an empty file is refused at load time instead of starving generators.
        ValueError: bad ``on_bad_row`` / missing ``quarantine_path``.
    """
    p = Path(path)
    sink = RowSink(p, on_bad_row, Path(quarantine_path) if quarantine_path is not None else None)
    tasks: list[Task] = []
    seen: set[str] = set()
    for lineno, obj in jsonl_rows(p, sink):
        try:
            for key in obj:
                if key not in TASK_FIELDS:
                    raise DatasetError(p, lineno, key, f"unknown field (allowed: {', '.join(TASK_FIELDS)})")
            task_id = obj.get("task_id", f"{p.stem}-{lineno}")
            if not isinstance(task_id, str) or not task_id:
                raise DatasetError(p, lineno, "task_id", f"expected a non-empty string, got {task_id!r}")
            if task_id in seen:
                raise DatasetError(p, lineno, "task_id", f"duplicate id {task_id!r}")
            task = Task(
                task_id=task_id,
                env_name=env_name,
                prompt=text_field(obj, "prompt", p, lineno),
                reference=text_field(obj, "reference", p, lineno, allow_number=True).strip(),
                data_source=data_source if data_source is not None else p.stem,
                metadata=_metadata(obj, p, lineno),
            )
        except DatasetError as err:
            sink.bad(err, obj)
            continue
        seen.add(task_id)
        tasks.append(task)
    result = sink.result(tasks)
    if not tasks:  # an empty train file made every generator die in randrange and the run hang
        raise DatasetError(p, 0, "<file>", f"no valid task ({result.num_quarantined} quarantined)")
    return result


def load_tasks_jsonl(
    path: Path | str,
    env_name: str,
    *,
    on_bad_row: OnBadRow = "stop",
    quarantine_path: Path | str | None = None,
) -> list[Task]:
    """``read_tasks_jsonl`` returning only the tasks (the quarantine count is logged).

    Raises:
        The same errors as ``read_tasks_jsonl``.
    """
    return read_tasks_jsonl(path, env_name, on_bad_row=on_bad_row, quarantine_path=quarantine_path).tasks


def gsm8k_final_answer(answer: str) -> str | None:
    r"""The number after the last ``####`` in a GSM8K solution, thousands commas removed.

    Example:
        >>> gsm8k_final_answer("48/2 = <<48/2=24>>24\n#### 1,072")
        '1072'
    """
    pos = answer.rfind("####")
    if pos < 0:
        return None
    final = answer[pos + 4 :].strip().replace(",", "")
    return final or None


def load_gsm8k(
    split: Literal["train", "test"],
    env_name: str = "gsm8k",
    *,
    path: Path | str | None = None,
    on_bad_row: OnBadRow = "stop",
    quarantine_path: Path | str | None = None,
) -> TaskLoadResult:
    """Load GSM8K (``data/gsm8k/{split}.jsonl``): ``question`` → prompt, number after ``####`` → reference.

    Task ids are ``gsm8k-<split>-<line number, 5 digits>``; ``metadata["solution"]`` holds the
    worked solution (used for SFT).

    Raises:
        FileNotFoundError: the file is missing.
        DatasetError: a bad row (missing ``question``/``answer``, no ``####``) with ``on_bad_row="stop"``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    p = Path(path) if path is not None else data_dir() / "gsm8k" / f"{split}.jsonl"
    sink = RowSink(p, on_bad_row, Path(quarantine_path) if quarantine_path is not None else None)
    tasks: list[Task] = []
    for lineno, obj in jsonl_rows(p, sink):
        try:
            question = text_field(obj, "question", p, lineno)
            answer = text_field(obj, "answer", p, lineno)
            final = gsm8k_final_answer(answer)
            if final is None:
                raise DatasetError(p, lineno, "answer", "no final answer after '####'")
        except DatasetError as err:
            sink.bad(err, obj)
            continue
        tasks.append(
            Task(
                task_id=f"gsm8k-{split}-{lineno:05d}",
                env_name=env_name,
                prompt=question,
                reference=final,
                data_source="gsm8k",
                metadata={"solution": answer},
            )
        )
    return sink.result(tasks)


def load_beyond_aime(
    env_name: str = "math_tool",
    *,
    path: Path | str | None = None,
    on_bad_row: OnBadRow = "stop",
    quarantine_path: Path | str | None = None,
) -> TaskLoadResult:
    """Load BeyondAIME (``data/beyond_aime/beyondaime_test.jsonl``: ``problem``, integer ``answer``).

    Task ids are ``beyondaime-<line number, 3 digits>``.

    Raises:
        FileNotFoundError: the file is missing.
        DatasetError: a bad row with ``on_bad_row="stop"``.
    """
    p = Path(path) if path is not None else data_dir() / "beyond_aime" / "beyondaime_test.jsonl"
    sink = RowSink(p, on_bad_row, Path(quarantine_path) if quarantine_path is not None else None)
    tasks: list[Task] = []
    for lineno, obj in jsonl_rows(p, sink):
        try:
            problem = text_field(obj, "problem", p, lineno)
            answer = text_field(obj, "answer", p, lineno, allow_number=True).strip()
        except DatasetError as err:
            sink.bad(err, obj)
            continue
        tasks.append(
            Task(
                task_id=f"beyondaime-{lineno:03d}",
                env_name=env_name,
                prompt=problem,
                reference=answer,
                data_source="beyond_aime",
            )
        )
    return sink.result(tasks)


def load_dapo_math(
    env_name: str = "math_tool",
    *,
    path: Path | str | None = None,
    on_bad_row: OnBadRow = "stop",
    quarantine_path: Path | str | None = None,
) -> TaskLoadResult:
    """Load DAPO-Math-17k (verl parquet: ``prompt`` = [{role, content}], ``reward_model.ground_truth``).

    Read with pyarrow. Task ids are ``dapo-<extra_info.index>`` (row number when absent); the
    "line" in error messages is the 1-based row number.

    Raises:
        FileNotFoundError: the file is missing.
        ImportError: pyarrow is not installed (with the install command).
        DatasetError: a bad row with ``on_bad_row="stop"``.
    """
    p = Path(path) if path is not None else data_dir() / "dapo_math_17k" / "dapo_math_17k_dedup.parquet"
    if not p.is_file():
        raise FileNotFoundError(f"task file {p} does not exist")
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(f"reading {p} needs pyarrow: pip install pyarrow") from exc
    sink = RowSink(p, on_bad_row, Path(quarantine_path) if quarantine_path is not None else None)
    tasks: list[Task] = []
    seen: set[str] = set()
    for row_no, row in enumerate(pq.read_table(p).to_pylist(), start=1):
        try:
            prompt = row.get("prompt")
            if not isinstance(prompt, list) or not prompt:
                raise DatasetError(p, row_no, "prompt", "expected a non-empty list of messages")
            users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
            if not users or not isinstance(users[-1].get("content"), str) or not users[-1]["content"].strip():
                raise DatasetError(p, row_no, "prompt", "no user message with text content")
            reward_model = row.get("reward_model")
            if not isinstance(reward_model, dict):
                raise DatasetError(p, row_no, "reward_model", "expected an object")
            truth = reward_model.get("ground_truth")
            if not isinstance(truth, str) or not truth.strip():
                raise DatasetError(p, row_no, "reward_model.ground_truth", f"expected a non-empty string, got {truth!r}")
            extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
            task_id = f"dapo-{extra.get('index', row_no)}"
            if task_id in seen:
                raise DatasetError(p, row_no, "extra_info.index", f"duplicate id {task_id!r}")
        except DatasetError as err:
            sink.bad(err, row)
            continue
        seen.add(task_id)
        tasks.append(
            Task(
                task_id=task_id,
                env_name=env_name,
                prompt=users[-1]["content"],
                reference=truth.strip(),
                data_source=str(row.get("data_source") or "dapo_math_17k"),
            )
        )
    return sink.result(tasks)


def main(argv: list[str] | None = None) -> int:
    """Command line: validate a generic task file and print the count."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m posttrain.data.tasks FILE ENV_NAME", file=sys.stderr)
        return 2
    try:
        tasks = load_tasks_jsonl(args[0], args[1])
    except (DatasetError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(tasks)} tasks OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
