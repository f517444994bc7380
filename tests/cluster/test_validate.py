"""The offline validator catches what the API server would reject or silently prune.

Run: .venv/bin/python -m pytest -q tests/cluster/test_validate.py
"""

from __future__ import annotations

import copy

import pytest

from posttrain.cluster.validate import (
    ManifestError,
    check_objects,
    default_crd_dir,
    load_crd_schemas,
    main,
    validate_object,
)

CLUSTER_QUEUE = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "ClusterQueue",
    "metadata": {"name": "team-a-cq"},
    "spec": {
        "cohortName": "posttrain",
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": "posttrain-gpu", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}],
        }],
    },
}


def test_a_correct_cluster_queue_validates():
    assert validate_object(CLUSTER_QUEUE) == []


def test_validator_catches_v1beta1_cohort_instead_of_cohort_name():
    """Kueue v1beta2 renamed spec.cohort to spec.cohortName; the API server would prune the old field."""
    bad = copy.deepcopy(CLUSTER_QUEUE)
    bad["spec"]["cohort"] = bad["spec"].pop("cohortName")
    errors = validate_object(bad)
    assert errors == ["ClusterQueue team-a-cq: spec: Additional properties are not allowed ('cohort' was unexpected)"]


def test_non_strict_mode_accepts_unknown_fields_like_the_api_server_would():
    bad = copy.deepcopy(CLUSTER_QUEUE)
    bad["spec"]["cohort"] = "posttrain"
    assert validate_object(bad, strict=False) == []


def test_validator_catches_bad_enums_and_missing_required_fields():
    bad = copy.deepcopy(CLUSTER_QUEUE)
    bad["spec"]["queueingStrategy"] = "Random"
    del bad["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"]
    errors = validate_object(bad)
    assert any("queueingStrategy: 'Random' is not one of ['StrictFIFO', 'BestEffortFIFO']" in e for e in errors)
    assert any("'nominalQuota' is a required property" in e for e in errors)


def test_validator_catches_unknown_fields_in_builtin_kinds():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": "IfNotPresent", "comand": ["x"]}]}}
    errors = validate_object(pod)
    assert len(errors) == 1 and "'comand' was unexpected" in errors[0]


def test_a_kind_with_no_schema_is_an_error_not_a_pass():
    errors = validate_object({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    assert errors and "Couldn't find schema for kind Widget" in errors[0]


def test_invalid_label_values_and_names_are_caught():
    obj = copy.deepcopy(CLUSTER_QUEUE)
    obj["metadata"]["labels"] = {"posttrain.io/run-id": "has spaces", "ok": "x" * 64}
    obj["metadata"]["name"] = "Team_A"
    errors = validate_object(obj)
    assert any("metadata.name: 'Team_A' is not a DNS-1123 subdomain" in e for e in errors)
    assert sum("is not a valid label value" in e for e in errors) == 2


def test_check_objects_raises_with_every_problem_and_the_source():
    bad = copy.deepcopy(CLUSTER_QUEUE)
    bad["spec"]["cohort"] = "x"
    with pytest.raises(ManifestError, match=r"^rendered: 1 problem") as info:
        check_objects([CLUSTER_QUEUE, bad], "rendered")
    assert len(info.value.errors) == 1


def test_vendored_crds_serve_the_versions_we_write():
    schemas = load_crd_schemas(str(default_crd_dir()))
    for key in [("jobset.x-k8s.io/v1alpha2", "JobSet"), ("kueue.x-k8s.io/v1beta2", "ClusterQueue"),
                ("kueue.x-k8s.io/v1beta2", "LocalQueue"), ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"),
                ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass")]:
        assert key in schemas


def test_cli_exit_status_and_messages_name_file_and_document(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n"
                   "apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata: {name: q, namespace: a}\nspec: {clusterqueue: x}\n")
    assert main([str(good)]) == 0
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}#1: LocalQueue a/q: spec: Additional properties are not allowed ('clusterqueue' was unexpected)" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1,\n")
    assert main([str(broken)]) == 1
    assert "not valid YAML" in capsys.readouterr().out
    assert main([]) == 2
