"""Recorded conversations with rewards -> SFT rows with their provenance (``posttrain traces import``).

A team's agents ran somewhere else (their own model, an API, an older checkpoint) and recorded
each conversation with a reward. Those traces carry text, not the token ids and behaviour
logprobs of *our* policy, so they cannot train as SAO rollouts (docs/gateway.md, "Recorded traces":
the DIS ratio pi_theta / pi_behav has no pi_behav, and rendering the text back into tokens is
exactly the re-tokenisation the gateway exists to avoid). What they can be is data: the rewarded
ones become SFT rows (rejection-sampling fine-tuning), each with where it came from.

Input, one JSON object per line::

    {"id": "t-17", "messages": [...OpenAI chat messages, tool calls included...], "reward": 1.0,
     "source": "prod-agent-v3", "metadata": {"ticket": "42"}}

``id``, ``source`` and ``metadata`` (string values) are optional. Output, one SFT row per trace with
``reward >= --min-reward``, in the format ``posttrain.data.formats`` reads (``sft``)::

    {"id": "t-17", "messages": [{"role": ..., "content": ...}], "provenance": {"source_file": ...,
     "line": "3", "trace_id": "t-17", "reward": "1.0", "source": "prod-agent-v3", "importer": ..., ...}}

The messages are put in the policy's format as the gateway renders them
(``posttrain.chat.openai.policy_messages``: tool calls as ``<tool_call>`` text, tool results
wrapped and merged per turn), so an imported trace and a gateway episode of the same exchange are
the same tokens; trailing messages after the last assistant message are dropped (nothing to learn
from them). Every bad row is reported with file, line and field, and stops the import or goes to a
quarantine file (``--on-bad-row``); traces below the bar are counted, not written.

Run ``posttrain traces import TRACES.jsonl --out sft.jsonl [--min-reward 1.0]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.chat.openai import MessageError, policy_messages
from posttrain.data.formats import parse_sft_row
from posttrain.data.tasks import DatasetError, OnBadRow, RowSink, jsonl_rows

IMPORTER = "posttrain traces import"
"""``provenance.importer`` of every row this module writes."""

ALLOWED_KEYS = ("id", "messages", "reward", "source", "metadata")
"""Fields of an input trace."""


@dataclass
class ImportSummary:
    """What an import did (counts of traces).

    Attributes:
        read: Traces read (valid and bad).
        imported: SFT rows written.
        below_min_reward: Valid traces whose reward is under the bar (not written).
        bad: Bad rows (stopped on or quarantined).
        out: The SFT file written.
    """

    read: int
    imported: int
    below_min_reward: int
    bad: int
    out: Path


def trace_to_sft_row(obj: dict[str, Any], path: Path, lineno: int, seen: set[str],
                     source_file: str | None = None) -> tuple[float, dict[str, Any]]:
    """One trace as ``(reward, SFT row)``; the row passes the SFT row checks (``parse_sft_row``).

    Raises:
        DatasetError: naming the field: an unknown key, a missing or non-finite ``reward``, a
            non-list ``messages``, a message the policy's format refuses (``messages[i]...``), no
            assistant message, a duplicate ``id``, or ``metadata`` that is not an object of strings.
    """
    for key in obj:
        if key not in ALLOWED_KEYS:
            raise DatasetError(path, lineno, key, f"unknown field (allowed: {', '.join(ALLOWED_KEYS)})")
    reward = obj.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise DatasetError(path, lineno, "reward", f"expected a finite number, got {reward!r}")
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise DatasetError(path, lineno, "metadata", "expected an object of string values")
    source = obj.get("source", "")
    if not isinstance(source, str):
        raise DatasetError(path, lineno, "source", f"expected a string, got {type(source).__name__}")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise DatasetError(path, lineno, "messages", "expected a list of message objects")
    try:
        rendered = policy_messages(messages)
    except MessageError as exc:
        raise DatasetError(path, lineno, _field(exc.param), str(exc)) from None
    last = max((i for i, m in enumerate(rendered) if m["role"] == "assistant"), default=None)
    if last is None:
        raise DatasetError(path, lineno, "messages", "no assistant message to learn from")
    trace_id = obj.get("id", f"{path.stem}-{lineno}")
    provenance = {**{f"metadata.{k}": v for k, v in metadata.items()},
                  "source_file": source_file or str(path), "line": str(lineno), "trace_id": str(trace_id),
                  "reward": repr(float(reward)), "importer": IMPORTER,
                  "policy": "external: no behaviour logprobs of the trained policy"}
    if source:
        provenance["source"] = source
    row = {"id": trace_id, "messages": rendered[: last + 1], "provenance": provenance}
    parse_sft_row(row, path, lineno, seen)  # the written row is one the SFT loader accepts
    seen.add(str(trace_id))
    return float(reward), row


def _field(param: str) -> str:
    """``messages.3.tool_call_id`` -> ``messages[3].tool_call_id`` (the loaders' field names)."""
    parts = param.split(".")
    if len(parts) >= 2 and parts[0] == "messages":
        return f"messages[{parts[1]}]" + "".join(f".{p}" for p in parts[2:])
    return param


def import_traces(path: Path | str, out: Path | str, *, min_reward: float = 1.0, on_bad_row: OnBadRow = "stop",
                  quarantine_path: Path | str | None = None) -> ImportSummary:
    """Write the SFT rows of the traces in ``path`` with ``reward >= min_reward`` to ``out`` (module docstring).

    ``out`` is replaced atomically, and only when at least one row is written.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetError: a bad row with ``on_bad_row="stop"``, or no trace reaches ``min_reward``
            (line 0, field ``reward``).
        ValueError: ``min_reward`` is not finite, or ``quarantine`` without ``quarantine_path``.
    """
    if not math.isfinite(min_reward):
        raise ValueError(f"min_reward: must be finite, got {min_reward}")
    src, dst = Path(path), Path(out)
    sink = RowSink(src, on_bad_row, Path(quarantine_path) if quarantine_path is not None else None)
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    below = 0
    for lineno, obj in jsonl_rows(src, sink):
        try:
            reward, row = trace_to_sft_row(obj, src, lineno, seen, src.name)
        except DatasetError as exc:
            sink.bad(exc, obj)
            continue
        if reward < min_reward:
            below += 1
            continue
        rows.append(row)
    if not rows:
        raise DatasetError(src, 0, "reward", f"no trace reaches --min-reward {min_reward} ({below} below, "
                                             f"{sink.count} bad); nothing written")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(dst)
    return ImportSummary(read=len(rows) + below + sink.count, imported=len(rows), below_min_reward=below,
                         bad=sink.count, out=dst)


def traces_cli(argv: list[str]) -> int:
    """``posttrain traces import FILE --out OUT [--min-reward R] [--on-bad-row stop|quarantine]``; the exit status."""
    p = argparse.ArgumentParser(prog="posttrain traces import", description=__doc__.splitlines()[0])
    p.add_argument("file", help="recorded traces, JSONL ({messages, reward[, id, source, metadata]})")
    p.add_argument("--out", required=True, help="SFT rows to write (JSONL, the sft format of docs/data.md)")
    p.add_argument("--min-reward", type=float, default=1.0, help="import traces with at least this reward (1.0)")
    p.add_argument("--on-bad-row", choices=("stop", "quarantine"), default="stop",
                   help="a bad trace stops the import (default) or goes to --quarantine")
    p.add_argument("--quarantine", default=None, help="quarantine file (default: OUT with .quarantine.jsonl)")
    args = p.parse_args(argv)
    quarantine = args.quarantine or str(Path(args.out).with_suffix(".quarantine.jsonl"))
    t0 = time.monotonic()
    try:
        summary = import_traces(args.file, args.out, min_reward=args.min_reward, on_bad_row=args.on_bad_row,
                                quarantine_path=quarantine if args.on_bad_row == "quarantine" else None)
    except (DatasetError, FileNotFoundError, ValueError) as exc:
        print(f"posttrain traces import: {exc}", file=sys.stderr)
        return 2
    print(f"{summary.imported} SFT rows written to {summary.out} ({summary.below_min_reward} traces below reward "
          f"{args.min_reward}, {summary.bad} bad{' (in ' + quarantine + ')' if summary.bad else ''}) in "
          f"{time.monotonic() - t0:.1f} s")
    return 0
