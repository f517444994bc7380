"""Print the pinned requirements (or constraints) one image installs, from pyproject.toml + requirements.lock.

The images install posttrain with ``pip install --no-deps .`` and then its dependencies from the
output of this script, because the package's core dependencies pin ``torch`` and the ``base`` image
must not have torch while ``trainer``/``generator`` need a CUDA build of it, not the lock's
``+cpu`` one. Standard library only (it runs inside a bare ``python:3.11`` image at build time).

Usage (from the repository root, or with ``--root``)::

    python images/requirements.py --extra kfp --without torch          # direct deps, pinned
    python images/requirements.py --constraints --without torch        # requirements.lock minus those

* requirements mode: the core ``[project.dependencies]`` plus each ``--extra``, minus ``--without``
  names, each pinned to its ``requirements.lock`` version (extras such as ``kfp[kubernetes]`` kept);
* constraints mode: every ``requirements.lock`` line except ``--without`` names and CPU-only
  builds (local version ``+cpu``), for ``pip install -c`` so transitive versions match the lock;
* ``--skip-installed``: distributions already installed in this interpreter (e.g. by the ``vllm``
  wheel, whose exact pins differ from the CPU lock) keep their version: no lock pin for them, and a
  direct dependency among them is printed with its pyproject range so pip only checks it.

Exit status 2 (with a message naming the field) when an extra does not exist.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?")


def canonical(name: str) -> str:
    """PEP 503 normalised project name: ``PyYAML`` -> ``pyyaml``, ``pydantic_core`` -> ``pydantic-core``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(root: Path) -> dict[str, str]:
    """``{canonical name: "Name==version"}`` from ``requirements.lock``."""
    pins: dict[str, str] = {}
    for line in (root / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            pins[canonical(line.split("==", 1)[0])] = line
    return pins


def installed() -> frozenset[str]:
    """Canonical names of the distributions installed in this interpreter."""
    return frozenset(canonical(d.metadata["Name"]) for d in metadata.distributions() if d.metadata["Name"])


def requirements(root: Path, extras: list[str], without: list[str], keep: frozenset[str] = frozenset()) -> list[str]:
    """Direct dependencies (core + extras, minus ``without``), pinned from the lock when it has them.

    Names in ``keep`` (already installed) are not pinned: their pyproject range is printed instead.

    Raises:
        ValueError: an extra is not defined in ``pyproject.toml``.
    """
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise ValueError(f"--extra {extra!r}: not in [project.optional-dependencies] ({sorted(optional)})")
        specs += optional[extra]
    pins = read_lock(root)
    drop = {canonical(n) for n in without}
    out = []
    for spec in specs:
        match = _NAME.match(spec)
        if match is None:
            raise ValueError(f"cannot parse dependency {spec!r} in pyproject.toml")
        name, extra_part = canonical(match.group(1)), match.group(2) or ""
        if name in drop:
            continue
        pinned = None if name in keep else pins.get(name)
        out.append(pinned.replace("==", f"{extra_part}==", 1) if pinned else spec)
    return out


def constraints(root: Path, without: list[str], keep: frozenset[str] = frozenset()) -> list[str]:
    """Lock lines minus ``without`` names, names in ``keep`` (already installed) and ``+cpu`` builds."""
    drop = {canonical(n) for n in without} | keep
    return [line for name, line in read_lock(root).items() if name not in drop and "+cpu" not in line]


def main(argv: list[str] | None = None) -> int:
    """Print requirement or constraint lines; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="directory with pyproject.toml and requirements.lock")
    parser.add_argument("--extra", action="append", default=[], help="optional-dependency group to add (repeatable)")
    parser.add_argument("--without", action="append", default=[], help="project name to leave out (repeatable)")
    parser.add_argument("--constraints", action="store_true", help="print lock constraints instead of requirements")
    parser.add_argument("--skip-installed", action="store_true", help="do not pin distributions already installed")
    args = parser.parse_args(argv)
    keep = installed() if args.skip_installed else frozenset()
    try:
        if args.constraints:
            lines = constraints(args.root, args.without, keep)
        else:
            lines = requirements(args.root, args.extra, args.without, keep)
    except ValueError as exc:
        print(f"requirements.py: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
