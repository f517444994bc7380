"""Unified diffs: the model's patch pulled out of its response, and the paths a patch touches.

Example: ``extract_patch(response)`` is the last ```diff fenced block of ``response``, or None.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```(?:diff|patch)[^\n]*\n(.*?)```", re.DOTALL)


def extract_patch(response: str) -> str | None:
    """The unified diff in a model response, or None when there is none.

    The last ```diff (or ```patch) fenced block wins; without one, the text from the first
    ``diff --git`` / ``--- a/`` line to the end.
    """
    blocks = _FENCE.findall(response)
    if blocks:
        text = blocks[-1]
    else:
        m = re.search(r"^(diff --git |--- a/)", response, re.MULTILINE)
        if not m:
            return None
        text = response[m.start() :]
    text = text.strip("\n")
    return text + "\n" if text else None

_DIFF_PATH = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def patch_paths(patch: str) -> list[str]:
    """Paths (the ``b/`` side) a unified git diff touches, in order, without duplicates."""
    seen: dict[str, None] = {}
    for m in _DIFF_PATH.finditer(patch):
        seen.setdefault(m.group(2), None)
    return list(seen)

