"""Grading a SWE test log: the eval script's markers, pytest and Django log parsers, ``grade_test_log``.

Log grading is implemented here rather than with the ``swebench`` package: its grading module
(4.1.0 is the version that reads our classic 12-column data) imports the harness, which pulls
docker, modal, datasets and ghapi into the trainer image, for two small parsers (pytest ``-rA``
and Django's verbose runner) and a set comparison. The semantics match SWE-bench's: a test
passes when its status is PASSED or XFAIL, fails when FAILED, ERROR or absent from the log;
skipped tests count for neither; an instance is resolved when every FAIL_TO_PASS and every
PASS_TO_PASS test passes. Test names are the first whitespace-separated token after the status
(pytest) or the text before `` ... `` (Django), which is how the dataset spells them.

Guarantees:
    * A log without the test-run markers, or a patch that does not apply, is graded unresolved
      with the reason, never resolved.

Example: ``grade_test_log(log, ["tests/test_a.py::test_one"], [], "pytest").resolved``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

TestStatus = Literal["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"]
Framework = Literal["pytest", "django"]

MARK_PATCH_APPLIED = ">>>>> PATCH_APPLIED"
MARK_PATCH_FAILED = ">>>>> PATCH_APPLY_FAILED"
MARK_TEST_PATCH_FAILED = ">>>>> TEST_PATCH_APPLY_FAILED"
MARK_START = ">>>>> START_TESTS"
MARK_END = ">>>>> END_TESTS"
"""Markers the eval script prints; the grader requires START and END around the test output."""

_PYTEST_STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
_PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)")
_PYTEST_VERBOSE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_DJANGO_STATUS = {
    "ok": "PASSED",
    "OK": "PASSED",
    "FAIL": "FAILED",
    "ERROR": "ERROR",
    "expected failure": "XFAIL",
    "unexpected success": "FAILED",
}
_DJANGO_LINE = re.compile(r"^(?P<name>.+?) \.\.\. (?P<rest>.*)$")
_DJANGO_BLOCK = re.compile(r"^(FAIL|ERROR): (\S+ \([\w.]+\))")


def _normalise_pytest_status(status: str) -> TestStatus:
    # An unexpected pass of an xfail test counts as a failure (strict xfail semantics).
    return "FAILED" if status == "XPASS" else status  # type: ignore[return-value]


def parse_pytest_log(log: str) -> dict[str, TestStatus]:
    """Test statuses from pytest output (``-rA`` summary lines and ``-v`` result lines).

    ``PASSED tests/test_x.py::test_a[p q]`` gives ``{"tests/test_x.py::test_a[p": "PASSED"}``: the
    name is the first whitespace-separated token, as SWE-bench's data spells parametrised names.
    Later lines override earlier ones (the ``-rA`` summary comes last). ``SKIPPED [1] file:line``
    summary lines name no test and are ignored.
    """
    out: dict[str, TestStatus] = {}
    for raw in log.splitlines():
        line = raw.strip()
        m = _PYTEST_SUMMARY.match(line)
        if m and not m.group(2).startswith("["):
            out[m.group(2)] = _normalise_pytest_status(m.group(1))
            continue
        m = _PYTEST_VERBOSE.match(line)
        if m:
            out[m.group(1)] = _normalise_pytest_status(m.group(2))
    return out


def parse_django_log(log: str) -> dict[str, TestStatus]:
    """Test statuses from Django's ``runtests.py --verbosity 2`` output.

    ``test_x (app.tests.T) ... ok`` gives ``{"test_x (app.tests.T)": "PASSED"}``. A test with a
    docstring prints it on the next line, which then carries `` ... ok``; the docstring line is the
    name (as in the dataset). When test output splits a line (``name ... <output>`` then the status
    alone on a later line), the status goes to the pending name. ``FAIL:``/``ERROR:`` block headers
    mark their test failed.
    """
    out: dict[str, TestStatus] = {}
    pending: str | None = None
    for raw in log.splitlines():
        line = raw.rstrip()
        block = _DJANGO_BLOCK.match(line)
        if block:
            out[block.group(2)] = "FAILED" if block.group(1) == "FAIL" else "ERROR"
            continue
        m = _DJANGO_LINE.match(line)
        if m:
            name, rest = m.group("name").strip(), m.group("rest").strip()
            status = _django_status(rest)
            if status is None:
                pending = name
            else:
                out[name] = status
                pending = None
            continue
        if pending is not None:
            status = _django_status(line.strip())
            if status is not None:
                out[pending] = status
                pending = None
    return out


def _django_status(text: str) -> TestStatus | None:
    if text in _DJANGO_STATUS:
        return _DJANGO_STATUS[text]  # type: ignore[return-value]
    if text.startswith("skipped"):
        return "SKIPPED"
    return None


LOG_PARSERS = {"pytest": parse_pytest_log, "django": parse_django_log}
"""Framework name -> log parser."""


class SweGrade(msgspec.Struct, kw_only=True):
    """Outcome of grading one instance's test log.

    Attributes:
        resolved: Every FAIL_TO_PASS and PASS_TO_PASS test passed.
        status: ``resolved``, ``unresolved``, ``patch_failed``, ``test_patch_failed``, ``no_test_run``,
            ``timeout`` or ``error``.
        reason: One line explaining the status.
        fail_to_pass_passed: FAIL_TO_PASS tests that passed.
        fail_to_pass_failed: FAIL_TO_PASS tests that failed or did not run.
        pass_to_pass_passed: PASS_TO_PASS tests that passed.
        pass_to_pass_failed: PASS_TO_PASS tests that failed or did not run.
    """

    resolved: bool
    status: str
    reason: str
    fail_to_pass_passed: list[str] = msgspec.field(default_factory=list)
    fail_to_pass_failed: list[str] = msgspec.field(default_factory=list)
    pass_to_pass_passed: list[str] = msgspec.field(default_factory=list)
    pass_to_pass_failed: list[str] = msgspec.field(default_factory=list)


def _split(tests: Sequence[str], statuses: Mapping[str, TestStatus]) -> tuple[list[str], list[str]]:
    passed, failed = [], []
    for t in tests:
        s = statuses.get(t)
        if s in ("PASSED", "XFAIL"):
            passed.append(t)
        elif s is None or s in ("FAILED", "ERROR"):
            failed.append(t)
    return passed, failed


def grade_test_log(
    log: str, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str], framework: Framework
) -> SweGrade:
    """Grade a test log produced by ``build_eval_script`` (or the local backend).

    With both test lists empty (the self-made tasks, whose hidden tests are all required) the
    instance is resolved when at least one test ran and every test that ran passed (a skip
    counts against it, as in the SWE environment's own grader).

    Args:
        log: Combined stdout/stderr of the eval script.
        fail_to_pass: Tests that must pass after the patch (they failed before it).
        pass_to_pass: Tests that must keep passing.
        framework: ``pytest`` or ``django`` (which log parser applies).

    Raises:
        ValueError: unknown framework.
    """
    if framework not in LOG_PARSERS:
        raise ValueError(f"framework: expected one of {sorted(LOG_PARSERS)}, got {framework!r}")
    if MARK_PATCH_FAILED in log:
        return SweGrade(resolved=False, status="patch_failed", reason="the model's patch does not apply")
    if MARK_TEST_PATCH_FAILED in log:
        return SweGrade(resolved=False, status="test_patch_failed", reason="the test patch does not apply after the model's patch")
    start, end = log.find(MARK_START), log.rfind(MARK_END)
    if start < 0 or end < start:
        return SweGrade(resolved=False, status="no_test_run", reason="the log has no complete test run (missing markers)")
    statuses = LOG_PARSERS[framework](log[start:end])
    if not fail_to_pass and not pass_to_pass:
        ok = sorted(t for t, st in statuses.items() if st in ("PASSED", "XFAIL"))
        bad = sorted(t for t, st in statuses.items() if st not in ("PASSED", "XFAIL"))
        resolved = bool(ok) and not bad
        return SweGrade(
            resolved=resolved,
            status="resolved" if resolved else "unresolved",
            reason=f"all tests required: {len(ok)} passed, {len(bad)} failed, errored or skipped",
            fail_to_pass_passed=ok,
            fail_to_pass_failed=bad,
        )
    f2p_ok, f2p_bad = _split(fail_to_pass, statuses)
    p2p_ok, p2p_bad = _split(pass_to_pass, statuses)
    resolved = not f2p_bad and not p2p_bad and bool(f2p_ok)
    reason = (
        f"FAIL_TO_PASS {len(f2p_ok)}/{len(fail_to_pass)} passed, PASS_TO_PASS {len(p2p_ok)}/{len(pass_to_pass)} passed"
    )
    return SweGrade(
        resolved=resolved,
        status="resolved" if resolved else "unresolved",
        reason=reason,
        fail_to_pass_passed=f2p_ok,
        fail_to_pass_failed=f2p_bad,
        pass_to_pass_passed=p2p_ok,
        pass_to_pass_failed=p2p_bad,
    )

class SweRunResult(msgspec.Struct, kw_only=True):
    """What one evaluation run produced.

    Attributes:
        instance_id: The instance.
        grade: The grading outcome.
        log: The eval script's output (cut to its last 200,000 characters).
        wall_s: Seconds from submission to the grade.
        backend: ``kubernetes`` or ``local``.
    """

    instance_id: str
    grade: SweGrade
    log: str
    wall_s: float
    backend: str

