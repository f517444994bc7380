"""SWE grading: apply the model's patch, run FAIL_TO_PASS and PASS_TO_PASS tests, grade the test log.

Two backends run the tests, both ending in ``grade_test_log``:

* ``KubernetesSweBackend`` (SWE-bench Verified): one pod per instance from the instance's
  SWE-bench evaluation image (``swebench/sweb.eval.x86_64.<id>:latest``, the repository at
  ``/testbed``; an optional registry prefix for mirrors). A ConfigMap carries the model patch,
  the test patch and the eval script; the pod has CPU/memory/ephemeral-storage limits, an
  ``activeDeadlineSeconds`` time limit, no service-account token, no DNS, and a label selected
  by a deny-all NetworkPolicy (created once per namespace), so it has no egress.
* ``LocalSweBackend`` (the self-made repair tasks): copies the task's repository, applies the
  patch and runs the test command inside ``posttrain.envs.sandbox`` (no network, resource limits).

The eval script follows the SWE-bench harness's steps (our own script): apply the model patch
(``git apply``, falling back to ``patch --fuzz``), reset the test files the test patch touches to
the base commit, apply the test patch, run the repository's test command on those test files, and
print markers (``>>>>> ...``) that the grader checks.

Log grading is implemented here rather than with the ``swebench`` package: its grading module
(4.1.0 is the version that reads our classic 12-column data) imports the harness, which pulls
docker, modal, datasets and ghapi into the trainer image, for two small parsers (pytest ``-rA``
and Django's verbose runner) and a set comparison. The semantics match SWE-bench's: a test
passes when its status is PASSED or XFAIL, fails when FAILED, ERROR or absent from the log;
skipped tests count for neither; an instance is resolved when every FAIL_TO_PASS and every
PASS_TO_PASS test passes. Test names are the first whitespace-separated token after the status
(pytest) or the text before `` ... `` (Django), which is how the dataset spells them.

Guarantees:
    * The model's patch and the tests never run on the caller's machine in the Kubernetes
      backend; the pod cannot reach the network if the cluster enforces NetworkPolicy (and has
      no resolver either way), cannot use the API server (no token), and is killed by the
      kubelet after ``timeout_s``; the caller stops waiting after ``timeout_s`` plus a grace and
      deletes the pod and its ConfigMap in every case.
    * The local backend runs the patch step and the tests in ``run_in_sandbox`` (its own
      guarantees: no network, CPU, wall, memory, process and file limits) on a private copy of
      the repository; the task's hidden test files are written by this process between the two
      steps, after refusing directories the patch turned into symbolic links, so a patch can
      neither replace them nor redirect their writing outside the copy.
    * A log without the test-run markers, or a patch that does not apply, is graded unresolved
      with the reason, never resolved.

Not guaranteed:
    * Egress denial depends on the cluster's CNI enforcing NetworkPolicy.
    * The per-repository test commands (``REPO_SPECS``) cover the repositories in our data
      (django, sphinx) and fall back to ``pytest -rA``; other repositories may need an entry.
    * Image pulls: the evaluation images (GBs each) must be pullable by the cluster.
    * Test infrastructure: a patch may add or change files the tests load (``conftest.py``,
      ``pytest.ini``, the Django test settings); only the hidden files of local tasks and the
      files the SWE-bench test patch touches are restored. Review resolved patches that touch them.

Run: ``python -m posttrain.eval.swe_grading INSTANCE_ID`` prints the eval script and pod spec of
the gold patch for inspection (nothing is created).
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from posttrain.eval.benchmarks import BenchmarkDataError, data_dir, swe_eval_image

TestStatus = Literal["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"]
Framework = Literal["pytest", "django"]

MARK_PATCH_APPLIED = ">>>>> PATCH_APPLIED"
MARK_PATCH_FAILED = ">>>>> PATCH_APPLY_FAILED"
MARK_TEST_PATCH_FAILED = ">>>>> TEST_PATCH_APPLY_FAILED"
MARK_START = ">>>>> START_TESTS"
MARK_END = ">>>>> END_TESTS"
"""Markers the eval script prints; the grader requires START and END around the test output."""

MAX_CONFIGMAP_BYTES = 900 * 1024
"""Largest patch + script payload put in one ConfigMap (the API limit is 1 MiB per object)."""

EGRESS_POLICY_NAME = "posttrain-swe-eval-deny-all"
"""NetworkPolicy that denies all ingress and egress of SWE eval pods."""
POD_ROLE_LABEL = ("posttrain.io/role", "swe-eval")
"""Label (key, value) on every SWE eval pod; the NetworkPolicy selects it."""


class SweGradingError(RuntimeError):
    """A SWE evaluation could not be run (bad instance data, oversized patch, API failure)."""


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


# ---------------------------------------------------------------------------------------------
# Log parsing and grading
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Eval script
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepoSpec:
    """How to run one repository's tests in its SWE-bench image.

    Attributes:
        framework: Log format (``pytest`` or ``django``).
        test_command: Shell command; the test targets are appended.
        targets: ``files`` (test file paths) or ``django_modules`` (``tests/a/test_b.py`` -> ``a.test_b``).
        setup: Shell lines run before the tests (environment variables, config tweaks).
    """

    framework: Framework
    test_command: str
    targets: Literal["files", "django_modules"] = "files"
    setup: tuple[str, ...] = field(default=())


REPO_SPECS: dict[str, RepoSpec] = {
    "django/django": RepoSpec(
        framework="django",
        test_command="./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
        targets="django_modules",
        setup=("export LANG=en_US.UTF-8", "export LC_ALL=en_US.UTF-8", "export LANGUAGE=en_US:en"),
    ),
    "sphinx-doc/sphinx": RepoSpec(
        framework="pytest",
        test_command="tox --current-env -epy39 -v --",
        setup=("sed -i 's/pytest -rA/pytest/; s/pytest/pytest -rA/' tox.ini",),
    ),
}
"""Per-repository test commands for the repositories in our data; others use ``DEFAULT_SPEC``."""

DEFAULT_SPEC = RepoSpec(framework="pytest", test_command="python -m pytest -rA -p no:cacheprovider")
"""Fallback: plain pytest with the ``-rA`` summary."""

_DIFF_PATH = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def patch_paths(patch: str) -> list[str]:
    """Paths (the ``b/`` side) a unified git diff touches, in order, without duplicates."""
    seen: dict[str, None] = {}
    for m in _DIFF_PATH.finditer(patch):
        seen.setdefault(m.group(2), None)
    return list(seen)


def eval_targets(test_patch: str, spec: RepoSpec) -> list[str]:
    """What to pass to the test command: the test files of ``test_patch`` (or Django module labels).

    Only Python test modules count (``test*.py`` / ``*_test.py`` / ``tests.py``); fixture files the
    test patch adds (``tests/roots/...rst``) are not targets.
    """
    files = [
        p
        for p in patch_paths(test_patch)
        if p.endswith(".py") and (Path(p).name.startswith("test") or Path(p).name.endswith("_test.py"))
    ]
    if spec.targets == "django_modules":
        return [p.removeprefix("tests/").removesuffix(".py").replace("/", ".") for p in files if p.startswith("tests/")]
    return files


def build_eval_script(instance: SweInstance, *, patch_dir: str = "/eval", workdir: str = "/testbed") -> str:
    """The bash script a SWE-bench evaluation pod runs (reads ``model.patch`` and ``test.patch`` from ``patch_dir``).

    Steps: activate the image's ``testbed`` conda environment when present; apply the model patch
    (``git apply``, else ``patch --fuzz=5``; failure prints ``MARK_PATCH_FAILED`` and exits 3);
    reset the files the test patch touches to ``base_commit``; apply the test patch (failure
    prints ``MARK_TEST_PATCH_FAILED``, exit 4); run the repository's setup lines and test command
    between ``MARK_START`` and ``MARK_END``.
    """
    spec = REPO_SPECS.get(instance.repo, DEFAULT_SPEC)
    targets = " ".join(_shell_quote(t) for t in eval_targets(instance.test_patch, spec))
    reset = "\n".join(
        f"git checkout {_shell_quote(instance.base_commit)} -- {_shell_quote(p)} 2>/dev/null || true"
        for p in patch_paths(instance.test_patch)
    )
    setup = "\n".join(spec.setup)
    return f"""#!/bin/bash
# posttrain SWE eval script for {instance.instance_id}
set -u
if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; conda activate testbed; fi
cd {_shell_quote(workdir)}
git config --global --add safe.directory {_shell_quote(workdir)} 2>/dev/null || true
if [ -s {patch_dir}/model.patch ]; then
  if git apply --verbose --whitespace=nowarn {patch_dir}/model.patch || patch --batch --fuzz=5 -p1 -i {patch_dir}/model.patch; then
    echo "{MARK_PATCH_APPLIED}"
  else
    echo "{MARK_PATCH_FAILED}"; exit 3
  fi
else
  echo "{MARK_PATCH_APPLIED} (empty patch)"
fi
{reset}
if ! git apply --verbose --whitespace=nowarn {patch_dir}/test.patch; then echo "{MARK_TEST_PATCH_FAILED}"; exit 4; fi
{setup}
echo "{MARK_START}"
{spec.test_command} {targets}
rc=$?
echo "{MARK_END} rc=$rc"
exit 0
"""


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


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


# ---------------------------------------------------------------------------------------------
# Kubernetes backend
# ---------------------------------------------------------------------------------------------


def _k8s_name(prefix: str, instance_id: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", instance_id.lower()).strip("-")[:40].strip("-")
    return f"{prefix}-{slug}-{uuid.uuid4().hex[:8]}"


def swe_pod_manifest(
    name: str,
    instance: SweInstance,
    configmap: str,
    *,
    namespace: str = "default",
    image_prefix: str = "",
    resources: Mapping[str, str] | None = None,
    timeout_s: int = 1800,
    labels: Mapping[str, str] | None = None,
    image_pull_secrets: Sequence[str] = (),
) -> dict[str, Any]:
    """The evaluation pod of one instance: runs ``/eval/eval.sh`` from ``configmap`` in its image.

    Requests equal limits (``resources``: cpu, memory, ephemeral-storage); ``activeDeadlineSeconds``
    is ``timeout_s``; no service-account token, no service links, no DNS resolver
    (``dnsPolicy: None`` with 127.0.0.1), never restarted; labelled for the deny-all NetworkPolicy.
    """
    res = dict(resources or {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "posttrain",
                "app.kubernetes.io/component": "swe-eval",
                POD_ROLE_LABEL[0]: POD_ROLE_LABEL[1],
                **dict(labels or {}),
            },
            "annotations": {"posttrain.io/instance-id": instance.instance_id},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": timeout_s,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "terminationGracePeriodSeconds": 5,
            "imagePullSecrets": [{"name": s} for s in image_pull_secrets],
            "containers": [
                {
                    "name": "eval",
                    "image": image_prefix + instance.image,
                    "command": ["bash", "/eval/eval.sh"],
                    "resources": {"requests": dict(res), "limits": dict(res)},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["NET_RAW"]}},
                    "volumeMounts": [{"name": "eval", "mountPath": "/eval", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "eval", "configMap": {"name": configmap}}],
        },
    }


class KubernetesSweBackend:
    """Runs each SWE-bench instance's tests in its own pod (see the module docstring).

    Args:
        api_client: A ``kubernetes.client.ApiClient``; None loads in-cluster config, else kubeconfig.
        namespace: Namespace for the pods, ConfigMaps and the NetworkPolicy.
        image_prefix: Prepended to every image name (a registry mirror, ``registry.local/``).
        cpu: CPU request and limit per pod (Kubernetes quantity).
        memory: Memory request and limit per pod.
        ephemeral_storage: Ephemeral-storage request and limit per pod.
        timeout_s: Pod ``activeDeadlineSeconds``, and how long the caller waits (plus ``grace_s``).
        grace_s: Extra seconds the caller waits for the kubelet to report the deadline.
        poll_interval_s: Seconds between pod status reads.
        labels: Extra pod labels (``kueue.x-k8s.io/queue-name``, tenant labels...).
        image_pull_secrets: Secret names for pulling the images.
        create_network_policy: Create the deny-all NetworkPolicy if it is missing.

    Raises:
        SweGradingError: no ``api_client`` and neither in-cluster config nor a kubeconfig.
        ValueError: ``timeout_s < 1``.
    """

    def __init__(
        self,
        api_client: Any = None,
        *,
        namespace: str = "default",
        image_prefix: str = "",
        cpu: str = "2",
        memory: str = "4Gi",
        ephemeral_storage: str = "10Gi",
        timeout_s: int = 1800,
        grace_s: float = 60.0,
        poll_interval_s: float = 2.0,
        labels: Mapping[str, str] | None = None,
        image_pull_secrets: Sequence[str] = (),
        create_network_policy: bool = True,
    ) -> None:
        import kubernetes

        if api_client is None:
            try:
                kubernetes.config.load_incluster_config()
            except kubernetes.config.ConfigException:
                try:
                    kubernetes.config.load_kube_config()
                except (kubernetes.config.ConfigException, OSError) as exc:
                    raise SweGradingError(f"no Kubernetes access: not in a cluster and no usable kubeconfig ({exc})") from exc
            api_client = kubernetes.client.ApiClient()
        if timeout_s < 1:
            raise ValueError(f"timeout_s: must be >= 1, got {timeout_s}")
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.net = kubernetes.client.NetworkingV1Api(api_client)
        self.namespace = namespace
        self.image_prefix = image_prefix
        self.resources = {"cpu": cpu, "memory": memory, "ephemeral-storage": ephemeral_storage}
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.poll_interval_s = poll_interval_s
        self.labels = dict(labels or {})
        self.image_pull_secrets = list(image_pull_secrets)
        self.create_network_policy = create_network_policy
        self._policy_ready = False

    def network_policy(self) -> dict[str, Any]:
        """The deny-all (ingress and egress) NetworkPolicy for SWE eval pods."""
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": EGRESS_POLICY_NAME,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "posttrain", "app.kubernetes.io/component": "swe-eval"},
            },
            "spec": {
                "podSelector": {"matchLabels": {POD_ROLE_LABEL[0]: POD_ROLE_LABEL[1]}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": [],
            },
        }

    def pod_manifest(self, name: str, instance: SweInstance, configmap: str) -> dict[str, Any]:
        """The pod that runs ``eval.sh`` from ``configmap`` in the instance's image (``swe_pod_manifest``)."""
        return swe_pod_manifest(
            name,
            instance,
            configmap,
            namespace=self.namespace,
            image_prefix=self.image_prefix,
            resources=self.resources,
            timeout_s=self.timeout_s,
            labels=self.labels,
            image_pull_secrets=self.image_pull_secrets,
        )

    def _ensure_policy(self) -> None:
        from kubernetes.client.exceptions import ApiException

        if self._policy_ready or not self.create_network_policy:
            return
        try:
            self.net.create_namespaced_network_policy(self.namespace, self.network_policy())
        except ApiException as exc:
            if exc.status != 409:
                raise SweGradingError(f"create NetworkPolicy {EGRESS_POLICY_NAME}: HTTP {exc.status} {exc.reason}") from exc
        self._policy_ready = True

    def run(self, instance: SweInstance, model_patch: str) -> SweRunResult:
        """Evaluate ``model_patch`` on ``instance`` in a fresh pod; always deletes the pod and ConfigMap.

        Raises:
            SweGradingError: the payload is too large for a ConfigMap, or the API refused to create
                the objects. A pod that fails, times out or prints no test run is graded, not raised.
        """
        from kubernetes.client.exceptions import ApiException

        started = time.monotonic()
        script = build_eval_script(instance)
        data = {"model.patch": model_patch, "test.patch": instance.test_patch, "eval.sh": script}
        size = sum(len(v.encode()) for v in data.values())
        if size > MAX_CONFIGMAP_BYTES:
            raise SweGradingError(f"{instance.instance_id}: patch payload is {size} bytes, over {MAX_CONFIGMAP_BYTES}")
        self._ensure_policy()
        name = _k8s_name("swe-eval", instance.instance_id)
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace, "labels": {POD_ROLE_LABEL[0]: POD_ROLE_LABEL[1]}},
            "data": data,
        }
        framework = REPO_SPECS.get(instance.repo, DEFAULT_SPEC).framework
        try:
            self.core.create_namespaced_config_map(self.namespace, cm)
            try:
                self.core.create_namespaced_pod(self.namespace, self.pod_manifest(name, instance, name))
                phase = self._wait(name)
                log = self._log(name)
                if phase == "timeout" or "DeadlineExceeded" in phase:
                    grade = SweGrade(resolved=False, status="timeout", reason=f"pod ran past {self.timeout_s} s")
                else:
                    grade = grade_test_log(log, instance.fail_to_pass, instance.pass_to_pass, framework)
            finally:
                self._delete("pod", name)
        except ApiException as exc:
            raise SweGradingError(f"{instance.instance_id}: Kubernetes API HTTP {exc.status} {exc.reason}") from exc
        finally:
            self._delete("configmap", name)
        return SweRunResult(
            instance_id=instance.instance_id, grade=grade, log=log[-200_000:], wall_s=time.monotonic() - started,
            backend="kubernetes",
        )

    def _wait(self, name: str) -> str:
        """Poll until the pod is Succeeded/Failed; return its phase (with the reason) or ``timeout``."""
        deadline = time.monotonic() + self.timeout_s + self.grace_s
        while time.monotonic() < deadline:
            pod = self.core.read_namespaced_pod(name, self.namespace)
            phase = pod.status.phase if pod.status else None
            if phase in ("Succeeded", "Failed"):
                reason = pod.status.reason or ""
                return f"{phase}:{reason}" if reason else phase
            time.sleep(self.poll_interval_s)
        return "timeout"

    def _log(self, name: str) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            return str(self.core.read_namespaced_pod_log(name, self.namespace, container="eval"))
        except ApiException as exc:
            return f"(no log: HTTP {exc.status} {exc.reason})"

    def _delete(self, kind: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "pod":
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
            else:
                self.core.delete_namespaced_config_map(name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise SweGradingError(f"delete {kind} {name}: HTTP {exc.status} {exc.reason}") from exc


# ---------------------------------------------------------------------------------------------
# Local backend (self-made repair tasks)
# ---------------------------------------------------------------------------------------------


class LocalRepairInstance(msgspec.Struct, kw_only=True, frozen=True):
    """A self-made repository-repair task graded on this machine.

    Attributes:
        instance_id: Task id.
        repo_dir: Directory with the repository at its broken state (copied, never modified).
        test_command: argv run in the repository root after the patch (``python -m pytest -rA tests``).
        fail_to_pass: Tests that must pass after the patch; empty together with ``pass_to_pass``
            means every test that runs must pass.
        pass_to_pass: Tests that must keep passing.
        hidden_files: Relative path -> content written after the patch (the grading tests).
        framework: Log format of the test command.
    """

    instance_id: str
    repo_dir: str
    test_command: list[str]
    fail_to_pass: list[str]
    pass_to_pass: list[str] = msgspec.field(default_factory=list)
    hidden_files: dict[str, str] = msgspec.field(default_factory=dict)
    framework: Framework = "pytest"


class LocalSweBackend:
    """Applies the patch and runs the tests in ``posttrain.envs.sandbox`` on a private copy of the repo.

    Two sandboxed commands: ``git apply`` of the model's patch, then (after this process has
    written the hidden test files, refusing any path whose directories the patch turned into
    symbolic links) the test command.

    Args:
        wall_time_s: Wall-clock limit of the test run (seconds); the patch step gets 60 s.
        cpu_time_s: CPU seconds per process.
        memory_bytes: Address space per process (bytes).
        isolation: Sandbox isolation mode (``auto``, ``bwrap``, ``process``).
    """

    def __init__(
        self,
        *,
        wall_time_s: float = 300.0,
        cpu_time_s: float = 240.0,
        memory_bytes: int = 2 << 30,
        isolation: Literal["auto", "bwrap", "process"] = "auto",
    ) -> None:
        self.wall_time_s = wall_time_s
        self.cpu_time_s = cpu_time_s
        self.memory_bytes = memory_bytes
        self.isolation = isolation

    def _sandbox(self, script: str, work: Path, wall_time_s: float, files: Mapping[str, str] | None = None) -> Any:
        from posttrain.envs.sandbox import SandboxError, run_in_sandbox

        try:
            return run_in_sandbox(
                ["bash", "-c", script],
                files=dict(files or {}),
                workdir=work,
                wall_time_s=wall_time_s,
                cpu_time_s=min(self.cpu_time_s, wall_time_s),
                memory_bytes=self.memory_bytes,
                max_output_bytes=1 << 20,
                isolation=self.isolation,
            )
        except SandboxError as exc:
            raise SweGradingError(f"sandbox failed: {exc}") from exc

    def run(self, instance: LocalRepairInstance, model_patch: str) -> SweRunResult:
        """Evaluate ``model_patch`` on a fresh copy of ``instance.repo_dir``.

        Raises:
            SweGradingError: the repository directory is missing, a hidden file path is absolute or
                climbs out (``..``), or the sandbox could not start.
        """
        started = time.monotonic()
        repo = Path(instance.repo_dir)
        if not repo.is_dir():
            raise SweGradingError(f"{instance.instance_id}: repo_dir {repo} is not a directory")
        for rel in instance.hidden_files:
            p = Path(rel)
            if p.is_absolute() or ".." in p.parts or not p.parts:
                raise SweGradingError(f"{instance.instance_id}: hidden file path {rel!r} is unsafe")
        scratch = Path(tempfile.mkdtemp(prefix="posttrain-swe-"))
        try:
            work = scratch / "repo"
            shutil.copytree(repo, work, symlinks=True)
            apply = self._sandbox(
                f"""if [ ! -s .posttrain_model.patch ]; then echo "{MARK_PATCH_APPLIED} (empty patch)"; rm -f .posttrain_model.patch; exit 0; fi
if git apply --verbose --whitespace=nowarn .posttrain_model.patch; then echo "{MARK_PATCH_APPLIED}"; rc=0; else echo "{MARK_PATCH_FAILED}"; rc=3; fi
rm -f .posttrain_model.patch
exit $rc""",
                work,
                60.0,
                files={".posttrain_model.patch": model_patch},
            )
            log = apply.stdout + apply.stderr
            if MARK_PATCH_APPLIED not in apply.stdout:
                grade = SweGrade(resolved=False, status="patch_failed", reason="the model's patch does not apply")
            else:
                problem = _write_hidden(work, instance.hidden_files)
                if problem:
                    grade = SweGrade(resolved=False, status="error", reason=problem)
                else:
                    command = " ".join(_shell_quote(a) for a in instance.test_command)
                    tests = self._sandbox(
                        f'echo "{MARK_START}"\n{command}\nrc=$?\necho "{MARK_END} rc=$rc"\n', work, self.wall_time_s
                    )
                    log += tests.stdout + ("\n" + tests.stderr if tests.stderr else "")
                    if tests.timed_out:
                        grade = SweGrade(
                            resolved=False, status="timeout", reason=f"tests ran past their limit ({tests.killed_reason})"
                        )
                    else:
                        grade = grade_test_log(log, instance.fail_to_pass, instance.pass_to_pass, instance.framework)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return SweRunResult(
            instance_id=instance.instance_id, grade=grade, log=log[-200_000:], wall_s=time.monotonic() - started, backend="local"
        )


GRADER_DIR = ".posttrain_grader"
"""Directory (inside the repository copy) that receives a self-made task's hidden tests."""


def local_instance_from_task_dir(task_dir: Path) -> LocalRepairInstance:
    """A ``LocalRepairInstance`` for a self-made task directory (``posttrain.envs.swe.tasks`` layout).

    The hidden tests go to ``GRADER_DIR`` with an empty ``pytest.ini``; pytest runs with
    ``--noconftest``, ``-c`` that file and plugin autoload disabled, so configuration or
    ``conftest.py`` files a patch adds do not change how the tests run. Every hidden test must pass.

    Raises:
        SweGradingError: the task directory is malformed.
    """
    from posttrain.envs.swe.tasks import SWETaskError, load_task_spec

    try:
        spec = load_task_spec(Path(task_dir))
    except SWETaskError as exc:
        raise SweGradingError(str(exc)) from exc
    hidden = {f"{GRADER_DIR}/{rel}": data.decode("utf-8") for rel, data in spec.hidden_test_files().items()}
    hidden[f"{GRADER_DIR}/pytest.ini"] = "[pytest]\n"
    return LocalRepairInstance(
        instance_id=spec.task_id,
        repo_dir=str(spec.repo_dir),
        test_command=[
            "env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", sys.executable, "-s", "-m", "pytest", "-rA",
            "-p", "no:cacheprovider", "--noconftest", "-c", f"{GRADER_DIR}/pytest.ini", "--rootdir", GRADER_DIR, GRADER_DIR,
        ],
        fail_to_pass=[],
        pass_to_pass=[],
        hidden_files=hidden,
        framework="pytest",
    )


def _write_hidden(work: Path, files: Mapping[str, str]) -> str | None:
    """Write the hidden test files into ``work``; return why not when the patch made a path unsafe.

    Every directory on the way must be a real directory (not a symbolic link the patch created),
    and an existing file at the target is unlinked first, so nothing is written outside ``work``.
    """
    for rel, text in files.items():
        current = work
        for part in Path(rel).parts[:-1]:
            current = current / part
            if current.is_symlink():
                return f"hidden file {rel!r}: {current.relative_to(work)} is a symbolic link after the patch"
            current.mkdir(exist_ok=True)
        target = work / rel
        if target.is_symlink() or target.exists():
            if target.is_dir() and not target.is_symlink():
                return f"hidden file {rel!r}: the patch made it a directory"
            target.unlink()
        target.write_text(text, encoding="utf-8")
    return None


def main(argv: list[str] | None = None) -> int:
    """Print the eval script and pod manifest for an instance's gold patch (creates nothing)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m posttrain.eval.swe_grading INSTANCE_ID", file=sys.stderr)
        return 2
    instances = load_swe_instances()
    if args[0] not in instances:
        print(f"error: unknown instance {args[0]!r}", file=sys.stderr)
        return 1
    inst = instances[args[0]]
    print(build_eval_script(inst))
    print(json.dumps(swe_pod_manifest("swe-eval-preview", inst, "swe-eval-preview"), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
