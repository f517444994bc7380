"""Reading the project's Dockerfiles as instructions, for the image tests (``tests/manifests``)."""

from __future__ import annotations

import re
from pathlib import Path

IMAGES = Path(__file__).resolve().parents[1] / "images"
"""``images/``: one folder per role, each with its Dockerfile."""


def dockerfile(role: str) -> str:
    """The text of ``images/<role>/Dockerfile``."""
    return (IMAGES / role / "Dockerfile").read_text()


def instructions(role: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, argument) pairs of the role's Dockerfile, continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile(role))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args_of(role: str) -> dict[str, str]:
    """The Dockerfile's ``ARG name=default`` values."""
    return {k: v for k, _, v in (a.partition("=") for kind, a in instructions(role) if kind == "ARG")}
