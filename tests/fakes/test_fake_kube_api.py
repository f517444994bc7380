"""The fake API server answers the real kubernetes client the way an API server does (the subset we use).

Run: .venv/bin/python -m pytest -q tests/fakes/test_fake_kube_api.py
"""

from __future__ import annotations

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from fakes.fake_kube_api import FakeKubeAPI, merge_patch, pod_object

G, V, P = "jobset.x-k8s.io", "v1alpha2", "jobsets"


@pytest.fixture
def fake():
    with FakeKubeAPI() as server:
        yield server


@pytest.fixture
def clients(fake):
    client = fake.api_client()
    yield CustomObjectsApi(client), CoreV1Api(client)
    client.close()


def body(name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "JobSet", "metadata": {"name": name, "labels": labels or {}}, "spec": {"x": 1}}


def test_create_get_and_409_on_duplicate(clients):
    api, _ = clients
    created = api.create_namespaced_custom_object(G, V, "ns", P, body("a"))
    assert created["metadata"]["namespace"] == "ns" and created["metadata"]["uid"]
    assert api.get_namespaced_custom_object(G, V, "ns", P, "a")["spec"] == {"x": 1}
    with pytest.raises(ApiException) as info:
        api.create_namespaced_custom_object(G, V, "ns", P, body("a"))
    assert info.value.status == 409 and "AlreadyExists" in info.value.body


def test_missing_object_is_404_and_namespaces_are_separate(clients):
    api, _ = clients
    api.create_namespaced_custom_object(G, V, "ns", P, body("a"))
    with pytest.raises(ApiException) as info:
        api.get_namespaced_custom_object(G, V, "other", P, "a")
    assert info.value.status == 404


def test_list_filters_by_label_selector(clients):
    api, _ = clients
    api.create_namespaced_custom_object(G, V, "ns", P, body("a", {"role": "learner", "run": "1"}))
    api.create_namespaced_custom_object(G, V, "ns", P, body("b", {"role": "generator", "run": "1"}))
    names = lambda sel: [o["metadata"]["name"] for o in api.list_namespaced_custom_object(G, V, "ns", P, label_selector=sel)["items"]]  # noqa: E731
    assert names("run=1") == ["a", "b"]
    assert names("role=learner,run==1") == ["a"]
    assert names("role!=learner") == ["b"]
    assert names("!role") == []


def test_merge_patch_and_delete(clients):
    api, _ = clients
    api.create_namespaced_custom_object(G, V, "ns", P, body("a", {"k": "v"}))
    patched = api.patch_namespaced_custom_object(G, V, "ns", P, "a", {"metadata": {"labels": {"k": None, "n": "1"}}, "spec": {"y": 2}})
    assert patched["metadata"]["labels"] == {"n": "1"} and patched["spec"] == {"x": 1, "y": 2}
    api.delete_namespaced_custom_object(G, V, "ns", P, "a")
    with pytest.raises(ApiException) as info:
        api.delete_namespaced_custom_object(G, V, "ns", P, "a")
    assert info.value.status == 404


def test_core_pods_list_deserialise_and_json_patch(fake, clients):
    _, core = clients
    fake.put("v1", "pods", pod_object("p", "ns", {"a": "b"}, terminated={"exitCode": 1, "reason": "Error", "message": "boom"}))
    pods = core.list_namespaced_pod("ns", label_selector="a=b").items
    assert pods[0].status.container_statuses[0].state.terminated.message == "boom"
    core.patch_namespaced_pod("p", "ns", [{"op": "add", "path": "/metadata/labels/c", "value": "d"}])
    assert fake.get("v1", "pods", "p", "ns")["metadata"]["labels"] == {"a": "b", "c": "d"}


def test_injected_faults_answer_then_stop(fake, clients):
    api, _ = clients
    fake.fail_next("POST", r"/jobsets$", 503, times=1)
    with pytest.raises(ApiException) as info:
        api.create_namespaced_custom_object(G, V, "ns", P, body("a"))
    assert info.value.status == 503
    api.create_namespaced_custom_object(G, V, "ns", P, body("a"))


def test_merge_patch_follows_rfc7386():
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": None, "e": 3}, "d": [2]}) == {"a": {"c": 2, "e": 3}, "d": [2]}
