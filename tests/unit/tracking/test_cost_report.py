"""``posttrain cost report`` on a real MLflow registry (sqlite) holding two tenants' runs (issue 35).

Each run records its account the way every technique's run does (``record_account`` with a real
``Tracker``), so the report reads what runs write. Tenant A's report never includes tenant B's runs,
whichever experiment they share.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from posttrain.account import RoleAccount, RunAccount
from posttrain.cluster.workload_cost import cost_cli
from posttrain.runners.accounting import record_account
from posttrain.tracking import Tracker
from posttrain.tracking.cost import tenant_report


def _run(uri: str, tmp: Path, tenant: str, technique: str, month: str, cpu_s: float, experiment: str,
         outcome: str = "finished") -> str:
    """One run of ``tenant`` whose learner requested ``cpu_s`` CPU-seconds (10 s x cpu_s/10 cores)."""
    learner = RoleAccount("learner", 10.0, {"training": 8.0, "other": 2.0}, requested_cpu_s=cpu_s, used_cpu_s=5.0)
    account = RunAccount(tenant, technique, month, [learner], trained_tokens=100.0, outcome=outcome)
    run_dir = tmp / f"{tenant}-{technique}-{month}-{cpu_s}"
    with Tracker(uri, experiment, run_name=run_dir.name, tags={"posttrain.tenant": tenant}) as tracker:
        record_account(account, run_dir, tracker)
        return tracker.run_id


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, list[str]]]:
    """Team A: sft in 2026-11 (100 CPU-s), two grpo runs in 2026-12 (200, and 300 for one that failed). Team B: one grpo run in 2026-12
    (5000 CPU-s) in the same experiment as A's, and one in its own. A run without an account (not tagged) too."""
    tmp_path = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = {"team-a": [_run(uri, tmp_path, "team-a", "sft", "2026-11", 100.0, "shared"),
                      _run(uri, tmp_path, "team-a", "grpo", "2026-12", 200.0, "shared"),
                      _run(uri, tmp_path, "team-a", "grpo", "2026-12", 300.0, "team-a", outcome="failed")],
           "team-b": [_run(uri, tmp_path, "team-b", "grpo", "2026-12", 5000.0, "shared"),
                      _run(uri, tmp_path, "team-b", "sao", "2026-12", 7000.0, "team-b")]}
    with Tracker(uri, "shared", run_name="no-account", tags={"posttrain.tenant": "team-a"}) as t:
        t.log_metrics({"cost/requested_cpu_s": 1e9})  # not tagged posttrain.account: not a finished account
    return uri, ids


def test_a_tenants_report_sums_its_own_runs_by_technique_and_month_and_never_anothers(registry):
    uri, ids = registry
    a = tenant_report(uri, "team-a")
    assert sorted(a.run_ids) == sorted(ids["team-a"])
    assert not set(a.run_ids) & set(ids["team-b"])
    assert a.total.requested_cpu_s == 600.0 and a.total.runs == 3
    assert {k: v.requested_cpu_s for k, v in a.by_technique.items()} == {"sft": 100.0, "grpo": 500.0}
    assert {k: v.runs for k, v in a.by_month.items()} == {"2026-11": 1, "2026-12": 2}
    assert a.total.trained_tokens == 300.0 and a.total.wall_s == 30.0 and a.source == "mlflow"
    assert a.total.failed_runs == 1 and a.by_technique["grpo"].failed_runs == 1  # a failed run is charged too
    b = tenant_report(uri, "team-b")
    assert sorted(b.run_ids) == sorted(ids["team-b"]) and b.total.requested_cpu_s == 12000.0


def test_the_command_prints_json_for_showback_and_names_its_source(registry, capsys):
    uri, ids = registry
    assert cost_cli(["--tenant", "team-a", "--json", "--tracking-uri", uri]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tenant"] == "team-a" and doc["source"] == "mlflow" and doc["total"]["requested_cpu_s"] == 600.0
    assert cost_cli(["--tenant", "team-a", "--tracking-uri", uri]) == 0
    text = capsys.readouterr().out
    assert "source: MLflow runs' time accounts" in text and "| grpo " in text and "| 2026-11 " in text


def test_since_counts_runs_started_that_day_or_later(registry):
    uri, _ = registry
    assert tenant_report(uri, "team-a", since=datetime.date(2000, 1, 1)).total.runs == 3
    assert tenant_report(uri, "team-a", since=datetime.date(2999, 1, 1)).total.runs == 0


def test_bad_arguments_are_one_line_each(registry, capsys):
    uri, _ = registry
    assert cost_cli(["--tenant", "Team A'", "--tracking-uri", uri]) == 2
    assert "--tenant: \"Team A'\" is not a tenant name" in capsys.readouterr().err
    assert cost_cli(["--tenant", "team-a", "--since", "12/01/2026", "--tracking-uri", uri]) == 2
    assert "--since: '12/01/2026' is not a date YYYY-MM-DD" in capsys.readouterr().err


def test_a_missing_store_is_one_line_naming_the_uri_and_nothing_is_created(tmp_path, capsys, monkeypatch):
    """A read-only report used to create an empty sqlite file (and ./runs for the default URI) and print zeros,
    or print a 39-line MlflowException traceback for a plain path."""
    missing = tmp_path / "nowhere" / "x.db"
    for uri in (f"sqlite:///{missing}", str(missing), f"file://{missing}"):
        assert cost_cli(["--tenant", "default", "--tracking-uri", uri]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and uri in err and "--tracking-uri" in err, err
    assert not missing.parent.exists()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert cost_cli(["--tenant", "default"]) == 2
    assert "sqlite:///" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_a_store_that_mlflow_refuses_is_one_line(tmp_path, capsys):
    """An existing folder is MLflow's file store, which refuses (maintenance mode): one line, exit 1."""
    (tmp_path / "store").mkdir()
    code = cost_cli(["--tenant", "default", "--tracking-uri", str(tmp_path / "store")])
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1 and str(tmp_path / "store") in err, err


def test_a_tenant_without_runs_is_one_line_listing_the_tenants_that_have_some(registry, capsys):
    uri, _ = registry
    assert cost_cli(["--tenant", "nobody", "--tracking-uri", uri]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'nobody'" in err and "team-a, team-b" in err, err
    # A known tenant with no run since the day asked for is an empty report, not an error.
    assert cost_cli(["--tenant", "team-a", "--since", "2999-01-01", "--tracking-uri", uri]) == 0


def test_an_interrupted_run_is_shown_apart_from_the_failed_ones(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _run(uri, tmp_path, "team-c", "sao", "2026-12", 10.0, "e", outcome="interrupted")
    _run(uri, tmp_path, "team-c", "sao", "2026-12", 20.0, "e", outcome="failed")
    report = tenant_report(uri, "team-c")
    assert (report.total.runs, report.total.failed_runs, report.total.interrupted_runs) == (2, 1, 1)
    assert report.total.requested_cpu_s == 30.0  # both are charged
    assert cost_cli(["--tenant", "team-c", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "|     2 |      1 |           1 |" in out, out
