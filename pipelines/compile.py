"""Compile every posttrain pipeline to ``pipelines/compiled/<name>.yaml`` (the files are committed).

Run from the repository root::

    python -m pipelines.compile            # (re)write pipelines/compiled/*.yaml
    python -m pipelines.compile --check    # exit 1 and name the files that differ from the source
    python -m pipelines.compile --dir DIR  # write (or --check) another directory
    python -m pipelines.compile --registry ghcr.io/acme/posttrain --digests my-digests.yaml --dir out/

Image references come from the lock file ``images/digests.yaml`` (registry, tag, one digest per
role; ``components/images.py``). ``--registry`` and ``--digests FILE`` replace them for one run: they
are checked, then the compile runs in a fresh interpreter with ``$POSTTRAIN_IMAGE_REGISTRY`` /
``$POSTTRAIN_IMAGE_LOCK`` set, because the components read the images when they are imported.
``--check`` compares with what the current lock produces, so a changed digest without a recompile
is drift.

Each file is KFP's two-document YAML: the pipeline spec (IR) and its ``platforms.kubernetes``
settings. Upload one in the Kubeflow UI (Pipelines -> Upload pipeline) or pass it to
``posttrain schedule``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kfp import compiler

COMPILED_DIR = Path(__file__).resolve().parent / "compiled"


def compile_all(out_dir: Path = COMPILED_DIR) -> dict[str, Path]:
    """Compile each pipeline of ``PIPELINES`` to ``<out_dir>/<name>.yaml``; return name -> path."""
    from pipelines.post_training import PIPELINES

    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, pipeline in PIPELINES.items():
        path = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(pipeline, str(path))
        written[name] = path
    return written


def drifted(committed_dir: Path = COMPILED_DIR) -> list[str]:
    """Names of the pipelines whose committed YAML differs from a fresh compile (or is missing).

    Also lists committed ``*.yaml`` files that no pipeline produces any more.
    """
    from pipelines.post_training import PIPELINES

    with tempfile.TemporaryDirectory() as tmp:
        fresh = compile_all(Path(tmp))
        out = [name for name, path in fresh.items()
               if not (committed_dir / path.name).is_file()
               or (committed_dir / path.name).read_text(encoding="utf-8") != path.read_text(encoding="utf-8")]
    stale = sorted(p.stem for p in committed_dir.glob("*.yaml") if p.stem not in PIPELINES)
    return out + [f"{name} (no such pipeline)" for name in stale]


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 drift found with ``--check``)."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.compile", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    parser.add_argument("--dir", type=Path, default=COMPILED_DIR, help="where the compiled files live")
    parser.add_argument("--registry", default=None, help="image registry and path (default: images/digests.yaml's)")
    parser.add_argument("--digests", type=Path, default=None, help="image lock file (default: images/digests.yaml)")
    args = parser.parse_args(argv)
    if args.registry or args.digests:
        return _compile_with_images(args)
    if args.check:
        bad = drifted(args.dir)
        for name in bad:
            print(f"{args.dir / name}.yaml differs from the source; run: python -m pipelines.compile",
                  file=sys.stderr)
        return 1 if bad else 0
    for name, path in compile_all(args.dir).items():
        print(f"{name}: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


def _compile_with_images(args: argparse.Namespace) -> int:
    """Check the image overrides, then compile (or check) in a fresh interpreter that reads them."""
    from components.images import LOCK_ENV, LOCK_FILE, REGISTRY_ENV, ImageLockError, load_lock

    lock_path = (args.digests or LOCK_FILE).resolve()
    try:
        lock = load_lock(lock_path, args.registry)
    except ImageLockError as exc:
        print(f"python -m pipelines.compile: error: {exc}", file=sys.stderr)
        return 2
    env = {**os.environ, LOCK_ENV: str(lock_path), REGISTRY_ENV: lock.registry}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "pipelines.compile", "--dir", str(args.dir.resolve())]
    return subprocess.run(cmd + (["--check"] if args.check else []), env=env, cwd=Path.cwd(), check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
