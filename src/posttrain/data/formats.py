"""Users' own training data: SFT (chat ``messages``), CPT (raw ``text``), DPO (preference pairs), RL (tasks).

One JSON object per line; the formats are documented with an example file each in
``docs/data.md`` (examples in ``data/examples/``)::

    sft  {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
         (optional "provenance": {"source": "...", ...}: where the row came from, string values)
    cpt  {"text": "..."}
    dpo  {"prompt": "...", "chosen": "...", "rejected": "..."}
    rl   {"prompt": "...", "reference": "42"}           (the verifier checks the answer against ``reference``)

Every row may carry an ``id`` (``task_id`` for RL); the default is ``<file stem>-<line>``.
Every bad row is reported with file, 1-based line and field (``messages[2].role``). The bad-row
policy (``data.on_bad_row`` in the run config) either stops at the first one (``DatasetError``)
or writes it with the reason to a quarantine JSONL file beside the run's output and goes on;
quarantined rows are counted in ``LoadedRows.num_quarantined``.

Run ``python -m posttrain.data.formats FILE {sft,cpt,dpo,rl}`` to list every bad row of a file.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from posttrain.data.tasks import DatasetError, OnBadRow, RowSink, jsonl_rows, read_tasks_jsonl, text_field
from posttrain.records import PreferencePair, SFTExample, Task

RowPolicy = RowSink
"""Applies ``on_bad_row`` to one file: ``RowPolicy(path, on_bad_row, quarantine_path).bad(DatasetError, raw_row)``
raises (``stop``) or appends ``{file, line, field, reason, row}`` to the quarantine file (``quarantine``)."""

DataFormat = Literal["sft", "cpt", "dpo", "rl"]
"""Row format of a training file."""

ROLES = ("system", "user", "assistant", "tool")
"""Allowed ``messages[i].role`` values."""

R = TypeVar("R")


@dataclass
class LoadedRows(Generic[R]):
    """Valid records of one file, the line each came from, and the quarantine count.

    Attributes:
        path: The file read.
        records: Valid records in file order.
        lines: ``lines[i]`` is the 1-based line of ``records[i]`` (for errors found later, e.g. at
            tokenisation).
        num_quarantined: Rows written to the quarantine file (0 with ``on_bad_row="stop"``).
        quarantine_path: Where they went, if anywhere.
    """

    path: Path
    records: list[R] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    num_quarantined: int = 0
    quarantine_path: Path | None = None


def _row_id(obj: dict[str, Any], key: str, path: Path, lineno: int, seen: set[str]) -> str:
    value = obj.get(key, f"{path.stem}-{lineno}")
    if not isinstance(value, str) or not value:
        raise DatasetError(path, lineno, key, f"expected a non-empty string, got {value!r}")
    if value in seen:
        raise DatasetError(path, lineno, key, f"duplicate id {value!r}")
    return value


def _check_keys(obj: dict[str, Any], allowed: tuple[str, ...], path: Path, lineno: int) -> None:
    for key in obj:
        if key not in allowed:
            raise DatasetError(path, lineno, key, f"unknown field (allowed: {', '.join(allowed)})")


def parse_sft_row(obj: dict[str, Any], path: Path, lineno: int, seen: set[str]) -> SFTExample:
    """Validate one chat row: ``messages`` (and optional ``id`` and ``provenance``, an object of strings).

    The conversation starts with a non-assistant message, ends with an assistant message, and
    has no two assistant messages in a row (the shape ``render_sft_example`` renders).

    Raises:
        DatasetError: naming the field (``messages``, ``messages[i].role``, ``messages[i].content``, ``id``).
    """
    _check_keys(obj, ("messages", "id", "provenance"), path, lineno)
    example_id = _row_id(obj, "id", path, lineno, seen)
    provenance = obj.get("provenance", {})
    if not isinstance(provenance, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in provenance.items()):
        raise DatasetError(path, lineno, "provenance", "expected an object of string values")
    messages = obj.get("messages")
    if messages is None:
        raise DatasetError(path, lineno, "messages", "missing")
    if not isinstance(messages, list) or len(messages) < 2:
        raise DatasetError(path, lineno, "messages", "expected a list of at least 2 messages")
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DatasetError(path, lineno, f"messages[{i}]", f"expected an object, got {type(m).__name__}")
        extra = set(m) - {"role", "content"}
        if extra:
            raise DatasetError(path, lineno, f"messages[{i}].{sorted(extra)[0]}", "unknown field (allowed: role, content)")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise DatasetError(path, lineno, f"messages[{i}].role", f"expected one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise DatasetError(path, lineno, f"messages[{i}].content", f"expected a string, got {type(content).__name__}")
        if role == "assistant" and not content.strip():
            raise DatasetError(path, lineno, f"messages[{i}].content", "empty assistant message (nothing to train on)")
        if i and role == "assistant" and out[-1]["role"] == "assistant":
            raise DatasetError(path, lineno, f"messages[{i}].role", "two assistant messages in a row")
        out.append({"role": role, "content": content})
    if out[0]["role"] == "assistant":
        raise DatasetError(path, lineno, "messages[0].role", "the conversation must start with a prompt, not 'assistant'")
    if out[-1]["role"] != "assistant":
        raise DatasetError(
            path, lineno, f"messages[{len(out) - 1}].role", "the conversation must end with an assistant message"
        )
    return SFTExample(example_id=example_id, messages=out, provenance=dict(provenance))


def parse_cpt_row(obj: dict[str, Any], path: Path, lineno: int, seen: set[str]) -> SFTExample:
    """Validate one raw-text row: ``text`` (and optional ``id``).

    Raises:
        DatasetError: naming the field (``text`` or ``id``).
    """
    _check_keys(obj, ("text", "id"), path, lineno)
    example_id = _row_id(obj, "id", path, lineno, seen)
    return SFTExample(example_id=example_id, text=text_field(obj, "text", path, lineno))


def parse_dpo_row(obj: dict[str, Any], path: Path, lineno: int, seen: set[str]) -> PreferencePair:
    """Validate one preference row: ``prompt``, ``chosen``, ``rejected`` (and optional ``id``).

    Raises:
        DatasetError: naming the field; ``rejected`` when it equals ``chosen`` (no preference).
    """
    _check_keys(obj, ("prompt", "chosen", "rejected", "id"), path, lineno)
    pair_id = _row_id(obj, "id", path, lineno, seen)
    prompt = text_field(obj, "prompt", path, lineno)
    chosen = text_field(obj, "chosen", path, lineno)
    rejected = text_field(obj, "rejected", path, lineno)
    if chosen == rejected:
        raise DatasetError(path, lineno, "rejected", "identical to 'chosen' (a pair must express a preference)")
    return PreferencePair(pair_id=pair_id, prompt=prompt, chosen=chosen, rejected=rejected)


_PARSERS: dict[str, Callable[[dict[str, Any], Path, int, set[str]], Any]] = {
    "sft": parse_sft_row,
    "cpt": parse_cpt_row,
    "dpo": parse_dpo_row,
}
"""Format -> row parser (RL rows are parsed by ``posttrain.data.tasks.read_tasks_jsonl``)."""


def _id_of(record: Any) -> str:
    return str(getattr(record, "example_id", None) or getattr(record, "pair_id", None))


def load_rows(
    path: Path | str,
    fmt: Literal["sft", "cpt", "dpo"],
    *,
    on_bad_row: OnBadRow = "stop",
    quarantine_path: Path | str | None = None,
    limit: int | None = None,
) -> LoadedRows[Any]:
    """Read and validate an SFT, CPT or DPO file.

    Args:
        path: The JSONL file.
        fmt: ``sft`` (-> ``SFTExample`` with ``messages``), ``cpt`` (-> ``SFTExample`` with
            ``text``) or ``dpo`` (-> ``PreferencePair``).
        on_bad_row: ``stop`` raises on the first bad row; ``quarantine`` appends it with the
            reason to ``quarantine_path`` and goes on.
        quarantine_path: Quarantine JSONL file (required with ``quarantine``).
        limit: Stop after this many valid rows (None: read the whole file).

    Returns:
        ``LoadedRows`` with the records, their line numbers and the quarantine count.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetError: a bad row with ``on_bad_row="stop"``; or no valid row at all (line 0, field
            ``<file>``).
        ValueError: an unknown ``fmt``, a bad ``on_bad_row`` or a missing ``quarantine_path``.
    """
    if fmt not in _PARSERS:
        raise ValueError(f"fmt: expected one of {sorted(_PARSERS)}, got {fmt!r}")
    p = Path(path)
    sink = RowPolicy(p, on_bad_row, Path(quarantine_path) if quarantine_path is not None else None)
    parse = _PARSERS[fmt]
    out: LoadedRows[Any] = LoadedRows(path=p)
    seen: set[str] = set()
    for lineno, obj in jsonl_rows(p, sink, what=f"{fmt} file"):
        if limit is not None and len(out.records) >= limit:
            break
        try:
            record = parse(obj, p, lineno, seen)
        except DatasetError as err:
            sink.bad(err, obj)
            continue
        seen.add(_id_of(record))
        out.records.append(record)
        out.lines.append(lineno)
    result = sink.result([])
    out.num_quarantined, out.quarantine_path = result.num_quarantined, result.quarantine_path
    if not out.records:
        raise DatasetError(p, 0, "<file>", f"no valid {fmt} row ({out.num_quarantined} quarantined)")
    return out


def load_rl_tasks(
    path: Path | str,
    env_name: str,
    *,
    on_bad_row: OnBadRow = "stop",
    quarantine_path: Path | str | None = None,
) -> LoadedRows[Task]:
    """Read an RL task file (``prompt``, ``reference``, optional ``task_id`` and ``metadata``).

    A thin wrapper over ``posttrain.data.tasks.read_tasks_jsonl`` with the same result type as
    ``load_rows``; line numbers are not tracked for tasks (``lines`` is empty).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetError: a bad row with ``on_bad_row="stop"``; or no valid task (line 0, field ``<file>``).
    """
    result = read_tasks_jsonl(path, env_name, on_bad_row=on_bad_row, quarantine_path=quarantine_path)
    return LoadedRows(Path(path), result.tasks, [], result.num_quarantined, result.quarantine_path)


def validate_file(path: Path | str, fmt: DataFormat, env_name: str = "gsm8k") -> tuple[int, list[DatasetError]]:
    """Check every row of a file; return the number of valid rows and one error per bad row.

    Args:
        path: The JSONL file.
        fmt: ``sft``, ``cpt``, ``dpo`` or ``rl``.
        env_name: Environment name given to RL tasks (does not affect validation).

    Returns:
        ``(num_valid, errors)``; each error carries ``path``, ``line``, ``field`` and ``reason``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    with tempfile.TemporaryDirectory() as tmp:
        quarantine = Path(tmp) / "bad.jsonl"
        try:
            if fmt == "rl":
                loaded = load_rl_tasks(path, env_name, on_bad_row="quarantine", quarantine_path=quarantine)
            else:
                loaded = load_rows(path, fmt, on_bad_row="quarantine", quarantine_path=quarantine)
            num_valid = len(loaded.records)
        except DatasetError as err:
            if err.field != "<file>":
                raise
            num_valid = 0
        errors = []
        if quarantine.exists():
            for line in quarantine.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                errors.append(DatasetError(row["file"], int(row["line"]), row["field"], row["reason"]))
    return num_valid, errors


def main(argv: list[str] | None = None) -> int:
    """Command line: print every bad row of a file; exit 1 if there is any."""
    args = list(sys.argv[1:] if argv is None else argv)
    formats: dict[str, DataFormat] = {"sft": "sft", "cpt": "cpt", "dpo": "dpo", "rl": "rl"}
    usage = "usage: python -m posttrain.data.formats FILE {sft,cpt,dpo,rl}"
    if len(args) != 2:
        print(usage, file=sys.stderr)
        return 2
    if args[1] not in formats:
        print(f"error: unknown kind {args[1]!r}: expected one of {', '.join(formats)} "
              f"(sft chat messages, cpt raw text, dpo preference pairs, rl tasks; docs/data.md); {usage}",
              file=sys.stderr)
        return 2
    fmt = formats[args[1]]
    # validate_file collects the bad rows through a temporary quarantine file that is gone when it
    # returns; the loaders' "quarantined N rows into <tmp>" warning would point at nothing.
    data_log = logging.getLogger("posttrain.data")
    level = data_log.level
    data_log.setLevel(logging.ERROR)
    try:
        num_valid, errors = validate_file(args[0], fmt)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        data_log.setLevel(level)
    for err in errors:
        print(err)
    print(f"{num_valid} valid rows, {len(errors)} bad rows")
    return 1 if errors or not num_valid else 0


if __name__ == "__main__":
    raise SystemExit(main())
