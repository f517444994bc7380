"""``posttrain cost report --cluster`` on a real API server: two tenants' Kueue Workloads, their status written
through the status subresource as Kueue's controller would (there is no Kueue controller here; issue 35).

Run: .venv/bin/python -m pytest -q tests/cluster/test_workload_cost.py
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from posttrain.cluster.workload_cost import TECHNIQUE_LABEL, workload_report

KUEUE = ("kueue.x-k8s.io", "v1beta2")
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _cond(kind: str, when: str, status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "lastTransitionTime": when, "reason": kind, "message": kind}


def _workload(kube: Any, ns: str, name: str, *, technique: str, gpus_per_generator: int, admitted: str | None,
              finished: str | None, usage: bool) -> None:
    """A SAO JobSet's Workload: learner (1 pod, 32 cores, 6 GPUs) and generator (2 pods of 8 cores, N GPUs).

    ``usage``: Kueue's ``resourceUsage`` in the admission (else the report multiplies template x count)."""
    def pod_set(role: str, count: int, cpu: str, gpu: int) -> dict[str, Any]:
        return {"name": role, "count": count, "template": {"spec": {"containers": [{
            "name": role, "image": "x", "resources": {"requests": {"cpu": cpu, "nvidia.com/gpu": str(gpu)}}}]}}}

    kube.apply([{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                 "metadata": {"name": name, "namespace": ns, "labels": {TECHNIQUE_LABEL: technique}},
                 "spec": {"queueName": "posttrain", "podSets": [pod_set("learner", 1, "32", 6),
                                                                 pod_set("generator", 2, "8", gpus_per_generator)]}}])
    conditions = []
    status: dict[str, Any] = {}
    if admitted:
        conditions += [_cond("QuotaReserved", admitted), _cond("Admitted", admitted)]
        assignments = []
        for role, count, cpu, gpu in (("learner", 1, 32, 6), ("generator", 2, 8, gpus_per_generator)):
            a: dict[str, Any] = {"name": role, "count": count, "flavors": {"cpu": "default"}}
            if usage:
                a["resourceUsage"] = {"cpu": str(cpu * count), "nvidia.com/gpu": str(gpu * count)}
            assignments.append(a)
        status["admission"] = {"clusterQueue": f"{ns}-cq", "podSetAssignments": assignments}
    if finished:
        conditions.append(_cond("Finished", finished))
    status["conditions"] = conditions
    kube.set_status(*KUEUE, ns, "workloads", name, status)


@pytest.fixture(scope="module")
def two_tenants(kube):
    a, b = kube.namespace("team-a"), kube.namespace("team-b")
    # A: one finished SAO run, admitted 10:00 -> 11:00 (3600 s), with Kueue's resourceUsage;
    #    one still running since 11:30 (1800 s to NOW), requests from the template; one never admitted.
    _workload(kube, a, "jobset-sao-1", technique="sao", gpus_per_generator=1, admitted="2026-12-06T10:00:00Z",
              finished="2026-12-06T11:00:00Z", usage=True)
    _workload(kube, a, "jobset-grpo-2", technique="grpo", gpus_per_generator=1, admitted="2026-12-06T11:30:00Z",
              finished=None, usage=False)
    _workload(kube, a, "jobset-sao-3", technique="sao", gpus_per_generator=1, admitted=None, finished=None,
              usage=False)
    # B: a big run in the same cluster, which A's report must never count.
    _workload(kube, b, "jobset-sao-1", technique="sao", gpus_per_generator=8, admitted="2026-12-06T00:00:00Z",
              finished="2026-12-06T11:00:00Z", usage=True)
    yield a, b
    kube.delete_namespace(a)
    kube.delete_namespace(b)


def test_the_cluster_report_is_requests_times_admitted_time_of_the_tenants_own_workloads(kube, two_tenants):
    """Per run: learner 32 cores + generators 2 x 8 = 48 cores, 6 + 2 x 1 = 8 GPUs.
    sao-1: 3600 s admitted -> 172800 CPU-s, 28800 GPU-s. grpo-2: 1800 s -> 86400 CPU-s, 14400 GPU-s. sao-3: 0."""
    a, b = two_tenants
    api = k8s.CustomObjectsApi(kube.admin())
    report = workload_report(api, a, now=NOW)
    assert report.source == "kueue"
    assert sorted(report.run_ids) == sorted(f"{a}/{n}" for n in ("jobset-sao-1", "jobset-grpo-2", "jobset-sao-3"))
    assert not any(r.startswith(f"{b}/") for r in report.run_ids)
    assert report.total.requested_cpu_s == 172800.0 + 86400.0
    assert report.total.requested_gpu_s == 28800.0 + 14400.0
    assert report.by_technique["sao"].requested_cpu_s == 172800.0 and report.by_technique["sao"].runs == 2
    assert report.by_technique["grpo"].wall_s == 1800.0
    assert report.by_pod_set["learner"].requested_gpu_s == 6 * (3600.0 + 1800.0)
    assert report.by_pod_set["generator"].requested_cpu_s == 16 * (3600.0 + 1800.0)
    # sao-3 was never admitted, so it counts (at zero cost) in the month of its creation, which is the real clock's.
    created = datetime.fromisoformat(api.get_namespaced_custom_object(
        *KUEUE, a, "workloads", "jobset-sao-3")["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    assert sum(line.runs for line in report.by_month.values()) == 3
    assert report.by_month["2026-12"].requested_cpu_s == report.total.requested_cpu_s
    assert report.by_month[created.strftime("%Y-%m")].runs >= 1
    assert "source: Kueue Workloads" in report.table()
    other = workload_report(api, b, now=NOW)
    assert other.total.requested_gpu_s == (6 + 16) * 11 * 3600.0 and len(other.run_ids) == 1
    later = workload_report(api, a, since=date(2026, 12, 7), now=NOW)
    assert later.run_ids == [f"{a}/jobset-sao-3"] and later.total.requested_cpu_s == 0.0
    assert workload_report(api, a, since=created.date() + timedelta(days=1), now=NOW).total.runs == 0


def test_the_command_reads_the_kube_context_and_says_it_used_kueue(kube, two_tenants, tmp_path, monkeypatch, capsys):
    """``posttrain cost report --tenant A --cluster --json`` with ``$KUBECONFIG`` naming the server: A's three
    Workloads, none of B's; the document names its source."""
    from posttrain.cli import main

    a, b = two_tenants
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube.write_kubeconfig(tmp_path / "kubeconfig", a)))
    assert main(["cost", "report", "--tenant", a, "--cluster", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "kueue" and doc["tenant"] == a and doc["total"]["runs"] == 3
    assert all(r.startswith(f"{a}/") for r in doc["run_ids"])
