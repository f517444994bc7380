"""SWE-bench Verified instances: what grading needs for each (never shown to the model).

``load_swe_instances`` reads ``data/swe_bench_verified`` (the 50-instance mini set and the
Verified image map) into ``SweInstance`` records: repository, base commit, gold and test patches,
the FAIL_TO_PASS / PASS_TO_PASS test lists and the evaluation image. ``SweGradingError`` is the
one error type of SWE evaluation (``SweInfraError`` when the grading infrastructure failed).

Example: ``load_swe_instances()["django__django-11790"].fail_to_pass``.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import msgspec

from posttrain.envs.base import InfraError
from posttrain.eval.benchmarks import BenchmarkDataError, data_dir, swe_eval_image


class SweGradingError(RuntimeError):
    """A SWE evaluation could not be run (bad instance data, oversized patch, API failure)."""


class SweInfraError(SweGradingError, InfraError):
    """The grading infrastructure failed under a SWE evaluation (its sandbox could not start or clean up).

    An ``InfraError`` with the sandbox's ``cause``: the evaluation runs the sample again and leaves it
    out of the scores if it keeps failing (``posttrain.eval.infra``), never scoring it as unresolved.
    """


class SweInstance(msgspec.Struct, kw_only=True, frozen=True):
    """A SWE-bench instance with everything grading needs (never shown to the model).

    Attributes:
        instance_id: ``owner__repo-number``.
        repo: ``owner/repo``.
        base_commit: Commit the repository is checked out at.
        version: Repository version label of the dataset.
        patch: Gold patch (for harness checks: it must resolve the instance).
        test_patch: Patch adding/changing the tests.
        fail_to_pass: Tests that must go from failing to passing.
        pass_to_pass: Tests that must keep passing.
        image: Evaluation image.
        env_image: Environment image from the Verified image map (informational).
    """

    instance_id: str
    repo: str
    base_commit: str
    version: str
    patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    image: str
    env_image: str = ""


def load_swe_instances(root: Path | None = None) -> dict[str, SweInstance]:
    """SWE-bench Verified mini instances by id, from ``data/swe_bench_verified``.

    Raises:
        BenchmarkDataError: a missing file, field, or a FAIL_TO_PASS/PASS_TO_PASS value that is not
            a JSON list of strings (file:line: field).
    """
    base = (root or data_dir()) / "swe_bench_verified"
    path = base / "swebench_verified_mini50.csv"
    if not path.is_file():
        raise BenchmarkDataError(f"{path}: benchmark file not found")
    image_map = json.loads((base / "verified500_instance_to_env_image.json").read_text(encoding="utf-8"))
    csv.field_size_limit(sys.maxsize)
    out = {}
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            where = f"{path}:{reader.line_num}"
            lists = {}
            for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
                try:
                    value = json.loads(row.get(name) or "")
                except json.JSONDecodeError as exc:
                    raise BenchmarkDataError(f"{where}: field {name!r} is not JSON ({exc.msg})") from exc
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise BenchmarkDataError(f"{where}: field {name!r} must be a JSON list of strings")
                lists[name] = value
            for name in ("instance_id", "repo", "base_commit", "test_patch"):
                if not row.get(name):
                    raise BenchmarkDataError(f"{where}: field {name!r} missing or empty")
            iid = row["instance_id"]
            out[iid] = SweInstance(
                instance_id=iid,
                repo=row["repo"],
                base_commit=row["base_commit"],
                version=row.get("version", ""),
                patch=row.get("patch", ""),
                test_patch=row["test_patch"],
                fail_to_pass=lists["FAIL_TO_PASS"],
                pass_to_pass=lists["PASS_TO_PASS"],
                image=swe_eval_image(iid),
                env_image=str(image_map.get(iid, "")),
            )
    return out

