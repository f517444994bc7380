"""The benchmark registry: a plain dict from name to ``Benchmark`` (loader, grading policy, categories).

Each benchmark reads its copy under the repository's ``data/`` directory (override with the
environment variable ``POSTTRAIN_DATA_DIR``) and yields ``Task`` records; nothing is downloaded.

=====================  =====  ==========================================================  ==========
name                   tasks  source file (under data/)                                   categories
=====================  =====  ==========================================================  ==========
beyond_aime              100  beyond_aime/beyondaime_test.jsonl (integer answers)         none
imo_answerbench          400  imo_answerbench/answerbench_v2.csv (v2, 2026-02-12)         Category
gsm8k                   1319  gsm8k/test.jsonl (``#### n`` answers)                        none
math500                  500  math/math500_test.json                                      subject
swe_bench_verified        50  swe_bench_verified/swebench_verified_mini50.csv             difficulty
swe_repair                24  the packaged self-made tasks (``posttrain/envs/swe/tasks``)  category
=====================  =====  ==========================================================  ==========

SWE-bench Verified here is the 50-instance "mini" subset (the full 500 could not be obtained
offline; ``data/swe_bench_verified/SOURCE.md``); its difficulty labels come from OpenAI's
public annotation file. SWE tasks are evaluated in patch mode: the model reads the issue (and, for
the small self-made tasks, the repository's files) and answers with a unified diff, which
``posttrain.eval.swe`` applies and tests. Licences and attribution: ``data/ATTRIBUTION.md``.

Run: ``python -m posttrain.eval.benchmarks`` lists the benchmarks and their task counts.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from posttrain.records import Task

DATA_DIR_ENV = "POSTTRAIN_DATA_DIR"
"""Environment variable that overrides the data directory."""

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Appended to every math prompt (the answer is graded from the last ``\\boxed{}``)."""

SWE_PATCH_INSTRUCTION = (
    "Fix the issue. Answer with a single unified diff (``git diff`` format, paths prefixed a/ and b/, "
    "relative to the repository root) inside one ```diff fenced block. Change only source files; do not "
    "add or edit tests."
)
"""Appended to every SWE prompt; the patch is taken from the last ```diff block of the response."""

GradingKind = Literal["math", "swe"]


class BenchmarkDataError(ValueError):
    """A benchmark file is missing or has a malformed row; the message names file, line and field."""


def data_dir() -> Path:
    """The data directory: ``$POSTTRAIN_DATA_DIR`` when set, else ``<repo>/data``.

    Raises:
        BenchmarkDataError: the directory does not exist.
    """
    env = os.environ.get(DATA_DIR_ENV)
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "data"
    if not path.is_dir():
        raise BenchmarkDataError(
            f"data directory {path} does not exist (set {DATA_DIR_ENV} to the directory holding the benchmark files)"
        )
    return path


def _require(path: Path) -> Path:
    if not path.is_file():
        raise BenchmarkDataError(f"{path}: benchmark file not found")
    return path


def _field(row: dict[str, object], name: str, where: str) -> object:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BenchmarkDataError(f"{where}: field {name!r} missing or empty")
    return value


@dataclass(frozen=True)
class Benchmark:
    """One evaluation set and how to grade it.

    Attributes:
        name: Registry key (also the ``Task.data_source`` of its tasks).
        description: One line for reports and ``--help``.
        kind: ``math`` (final-answer grading, ``posttrain.eval.grading``) or ``swe`` (patch plus
            tests, ``posttrain.eval.swe``).
        load: ``load(data_dir) -> list[Task]``, in the file's order.
        category_key: ``Task.metadata`` key of the per-category breakdown, or None.
        answer_style: Where the final answer sits in a response (``boxed``, ``hashes``, ``auto``).
        unparsable_answer_needs_judge: A response answer math-verify cannot parse is reported as
            "needs judge" (prose-answer benchmarks) instead of wrong.
        max_new_tokens: Default generation budget per response (tokens).
        licence: Licence of the data (short form; details in ``data/ATTRIBUTION.md``).
    """

    name: str
    description: str
    kind: GradingKind
    load: Callable[[Path], list[Task]] = field(repr=False)
    category_key: str | None = None
    answer_style: Literal["boxed", "hashes", "auto"] = "boxed"
    unparsable_answer_needs_judge: bool = False
    max_new_tokens: int = 4096
    licence: str = ""


def math_prompt(problem: str) -> str:
    """The user message of a math task: the problem, a blank line, then ``MATH_INSTRUCTION``."""
    return f"{problem.strip()}\n\n{MATH_INSTRUCTION}"


def load_beyond_aime(root: Path) -> list[Task]:
    """BeyondAIME: 100 JSONL rows ``{"problem": str, "answer": int}``; ids ``beyond_aime-000``...

    Raises:
        BenchmarkDataError: missing file, invalid JSON, or a missing/non-integer field (file:line: field).
    """
    path = _require(root / "beyond_aime" / "beyondaime_test.jsonl")
    tasks: list[Task] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkDataError(f"{where}: invalid JSON ({exc.msg})") from exc
            problem = str(_field(row, "problem", where))
            answer = _field(row, "answer", where)
            if isinstance(answer, bool) or not isinstance(answer, int):
                raise BenchmarkDataError(f"{where}: field 'answer' must be an integer, got {answer!r}")
            tasks.append(
                Task(
                    task_id=f"beyond_aime-{len(tasks):03d}",
                    env_name="math",
                    prompt=math_prompt(problem),
                    reference=str(answer),
                    data_source="beyond_aime",
                    metadata={"problem": problem},
                )
            )
    return tasks


def load_imo_answerbench(root: Path) -> list[Task]:
    """IMO-AnswerBench v2: 400 CSV rows (Problem ID, Problem, Short Answer, Category, Subcategory, Source).

    Raises:
        BenchmarkDataError: missing file, a missing column, or an empty required field (file:line: field).
    """
    path = _require(root / "imo_answerbench" / "answerbench_v2.csv")
    tasks: list[Task] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        needed = ["Problem ID", "Problem", "Short Answer", "Category"]
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise BenchmarkDataError(f"{path}:1: missing column(s) {missing}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            problem = str(_field(row, "Problem", where))
            tasks.append(
                Task(
                    task_id=str(_field(row, "Problem ID", where)).strip(),
                    env_name="math",
                    prompt=math_prompt(problem),
                    reference=str(_field(row, "Short Answer", where)).strip(),
                    data_source="imo_answerbench",
                    metadata={
                        "problem": problem,
                        "category": str(_field(row, "Category", where)).strip(),
                        "subcategory": (row.get("Subcategory") or "").strip(),
                        "source": (row.get("Source") or "").strip(),
                    },
                )
            )
    return tasks


def gsm8k_final_answer(answer: str, where: str) -> str:
    """The number after the last ``####`` of a GSM8K answer, thousands separators removed.

    Raises:
        BenchmarkDataError: no ``####`` marker or nothing after it.
    """
    if "####" not in answer:
        raise BenchmarkDataError(f"{where}: field 'answer' has no '####' final answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise BenchmarkDataError(f"{where}: field 'answer' is empty after '####'")
    return final


def load_gsm8k(root: Path) -> list[Task]:
    """GSM8K test: 1,319 JSONL rows ``{"question", "answer"}``; the reference is the ``####`` number.

    Raises:
        BenchmarkDataError: missing file, invalid JSON, or a missing field (file:line: field).
    """
    path = _require(root / "gsm8k" / "test.jsonl")
    tasks: list[Task] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkDataError(f"{where}: invalid JSON ({exc.msg})") from exc
            question = str(_field(row, "question", where))
            tasks.append(
                Task(
                    task_id=f"gsm8k-test-{len(tasks):05d}",
                    env_name="math",
                    prompt=math_prompt(question),
                    reference=gsm8k_final_answer(str(_field(row, "answer", where)), where),
                    data_source="gsm8k",
                    metadata={"problem": question},
                )
            )
    return tasks


def load_math500(root: Path) -> list[Task]:
    """MATH-500: a JSON list of ``{problem, answer, difficulty, unique_id}``; category = subject.

    The subject is the middle part of ``unique_id`` (``test/precalculus/807.json`` -> ``precalculus``).

    Raises:
        BenchmarkDataError: missing file, invalid JSON, or a missing field (file: item index: field).
    """
    path = _require(root / "math" / "math500_test.json")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
    if not isinstance(rows, list):
        raise BenchmarkDataError(f"{path}: expected a JSON list of problems")
    tasks: list[Task] = []
    for i, row in enumerate(rows):
        where = f"{path}: item {i}"
        if not isinstance(row, dict):
            raise BenchmarkDataError(f"{where}: expected an object")
        unique_id = str(_field(row, "unique_id", where))
        parts = unique_id.split("/")
        if len(parts) != 3:
            raise BenchmarkDataError(f"{where}: field 'unique_id' {unique_id!r} is not split/subject/file.json")
        problem = str(_field(row, "problem", where))
        tasks.append(
            Task(
                task_id=f"math500-{parts[1]}-{parts[2].removesuffix('.json')}",
                env_name="math",
                prompt=math_prompt(problem),
                reference=str(_field(row, "answer", where)).strip(),
                data_source="math500",
                metadata={"problem": problem, "subject": parts[1], "level": str(row.get("difficulty", ""))},
            )
        )
    return tasks


SWE_EVAL_IMAGE_TEMPLATE = "swebench/sweb.eval.x86_64.{key}:latest"
"""Per-instance SWE-bench evaluation image; ``key`` is the instance id with ``__`` -> ``_1776_``."""


def swe_eval_image(instance_id: str, template: str = SWE_EVAL_IMAGE_TEMPLATE) -> str:
    """The evaluation image of a SWE-bench instance (the repository checked out at ``/testbed``).

    Example: ``django__django-11790`` -> ``swebench/sweb.eval.x86_64.django_1776_django-11790:latest``.
    """
    return template.format(key=instance_id.replace("__", "_1776_"))


def load_swe_bench_verified(root: Path) -> list[Task]:
    """SWE-bench Verified mini (50 instances) as tasks; grading data stays in ``eval.swe``.

    The task's ``metadata`` carries what the agent may see and where it runs: ``repo``,
    ``base_commit``, ``version``, ``image`` (per-instance eval image), ``env_image`` (from the
    Verified image map) and ``difficulty`` (OpenAI annotations). The gold patch, the test patch
    and the test lists are not in the task (``posttrain.eval.swe.instances.load_swe_instances``).

    Raises:
        BenchmarkDataError: missing file or field, or an instance absent from the Verified image map.
    """
    base = root / "swe_bench_verified"
    path = _require(base / "swebench_verified_mini50.csv")
    image_map = json.loads(_require(base / "verified500_instance_to_env_image.json").read_text(encoding="utf-8"))
    difficulty: dict[str, str] = {}
    ann = base / "openai_ensembled_annotations_public.csv"
    if ann.is_file():
        with ann.open(encoding="utf-8", newline="") as f:
            difficulty = {r["instance_id"]: r.get("difficulty", "") for r in csv.DictReader(f)}
    csv.field_size_limit(sys.maxsize)
    tasks: list[Task] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            where = f"{path}:{reader.line_num}"
            instance_id = str(_field(row, "instance_id", where))
            if instance_id not in image_map:
                raise BenchmarkDataError(f"{where}: instance_id {instance_id!r} is not in the Verified image map")
            tasks.append(
                Task(
                    task_id=instance_id,
                    env_name="swe",
                    prompt=(
                        f"Repository: {row['repo']} at commit {row['base_commit']}.\n\nIssue:\n"
                        f"{str(_field(row, 'problem_statement', where)).strip()}\n\n{SWE_PATCH_INSTRUCTION}"
                    ),
                    reference=instance_id,
                    data_source="swe_bench_verified",
                    metadata={
                        "repo": str(_field(row, "repo", where)),
                        "base_commit": str(_field(row, "base_commit", where)),
                        "version": str(_field(row, "version", where)),
                        "image": swe_eval_image(instance_id),
                        "env_image": str(image_map[instance_id]),
                        "difficulty": difficulty.get(instance_id, "") or "unknown",
                    },
                )
            )
    return tasks


def load_swe_repair(root: Path) -> list[Task]:
    """The self-made repository-repair tasks shipped with ``posttrain.envs.swe`` (``root`` is unused).

    The prompt holds the bug report and every source file of the task's repository (they are a
    few hundred bytes each); ``Task.reference`` is the task directory, whose ``hidden_tests/``
    grade the patch.

    Raises:
        BenchmarkDataError: a task directory is malformed.
    """
    from posttrain.envs.swe.tasks import SWETaskError, load_swe_task_specs

    try:
        specs = load_swe_task_specs()
    except SWETaskError as exc:
        raise BenchmarkDataError(str(exc)) from exc
    tasks: list[Task] = []
    for spec in specs:
        files = sorted(p for p in spec.repo_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        listing = "\n\n".join(
            f"--- {p.relative_to(spec.repo_dir).as_posix()} ---\n{p.read_text(encoding='utf-8', errors='replace')}" for p in files
        )
        tasks.append(
            Task(
                task_id=spec.task_id,
                env_name="swe",
                prompt=f"Issue:\n{spec.problem_statement}\n\nRepository files:\n\n{listing}\n\n{SWE_PATCH_INSTRUCTION}",
                reference=str(spec.task_dir),
                data_source="swe_repair",
                metadata={"category": spec.category or "uncategorised", "task_dir": str(spec.task_dir)},
            )
        )
    return tasks


BENCHMARKS: dict[str, Benchmark] = {
    "beyond_aime": Benchmark(
        name="beyond_aime",
        description="BeyondAIME (ByteDance-Seed): 100 olympiad problems with integer answers",
        kind="math",
        load=load_beyond_aime,
        max_new_tokens=16384,
        licence="unconfirmed (Hugging Face card not verified offline)",
    ),
    "imo_answerbench": Benchmark(
        name="imo_answerbench",
        description="IMO-AnswerBench v2 (Google DeepMind IMO-Bench): 400 short-answer olympiad problems",
        kind="math",
        load=load_imo_answerbench,
        category_key="category",
        unparsable_answer_needs_judge=True,
        max_new_tokens=16384,
        licence="CC-BY-4.0",
    ),
    "gsm8k": Benchmark(
        name="gsm8k",
        description="GSM8K test: 1,319 grade-school word problems (for small models)",
        kind="math",
        load=load_gsm8k,
        answer_style="auto",
        max_new_tokens=1024,
        licence="MIT",
    ),
    "math500": Benchmark(
        name="math500",
        description="MATH-500: 500 competition problems in 7 subjects (for small models)",
        kind="math",
        load=load_math500,
        category_key="subject",
        max_new_tokens=4096,
        licence="MIT",
    ),
    "swe_bench_verified": Benchmark(
        name="swe_bench_verified",
        description="SWE-bench Verified mini: 50 real GitHub issues (django, sphinx), graded by their tests",
        kind="swe",
        load=load_swe_bench_verified,
        category_key="difficulty",
        max_new_tokens=8192,
        licence="MIT",
    ),
    "swe_repair": Benchmark(
        name="swe_repair",
        description="Self-made repository-repair tasks (small Python packages, hidden tests), graded locally",
        kind="swe",
        load=load_swe_repair,
        category_key="category",
        max_new_tokens=2048,
        licence="Apache-2.0 (this project)",
    ),
}
"""Every benchmark by name. Add one by adding an entry; nothing else registers."""


def get_benchmark(name: str) -> Benchmark:
    """Look a benchmark up by name.

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise KeyError(f"benchmark {name!r} is not registered; known: {', '.join(sorted(BENCHMARKS))}") from None


def load_tasks(name: str, *, limit: int | None = None, root: Path | None = None) -> list[Task]:
    """The tasks of benchmark ``name``, in file order, the first ``limit`` of them when given.

    Raises:
        KeyError: unknown benchmark.
        ValueError: ``limit < 1``.
        BenchmarkDataError: missing or malformed data (file:line: field).
    """
    bench = get_benchmark(name)
    if limit is not None and limit < 1:
        raise ValueError(f"limit: must be >= 1, got {limit}")
    tasks = bench.load(root if root is not None else data_dir())
    return tasks[:limit] if limit is not None else tasks


def main() -> int:
    """Print each benchmark's name, task count and description."""
    for name, bench in BENCHMARKS.items():
        try:
            count = str(len(load_tasks(name)))
        except BenchmarkDataError as exc:
            count = f"unavailable ({exc})"
        print(f"{name:20s} {count:>6s}  {bench.description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
