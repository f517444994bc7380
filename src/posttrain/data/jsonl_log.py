"""Reading the JSONL files a run writes about itself: ``metrics.jsonl`` and the learner's ledger.

Datasets are read by ``posttrain.data.tasks`` and ``posttrain.data.formats`` (size limits, quarantine, bad-row
policy); these files are the platform's own output, so a bad line is an error naming the file and line, not a row
to skip. Example: ``[r["reward/mean"] for r in read_json_lines(run_dir / "metrics.jsonl", "step") if "reward/mean"
in r]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_lines(path: Path, required: str | None = None) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one per line, in order; blank lines are skipped.

    Args:
        path: A JSONL file (``metrics.jsonl``, ``learner_ledger.jsonl``).
        required: A key every object must have (``"step"``, ``"iteration"``); None checks only that each line is an
            object.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a line that is not JSON, not an object, or lacks ``required``; the message names the file and the
            1-based line number (``metrics.jsonl:3: not JSON (...)``).
    """
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or (required is not None and required not in row):
                expected = f"an object with {required!r}" if required is not None else "an object"
                raise ValueError(f"{path}:{number}: expected {expected}")
            out.append(row)
    return out
