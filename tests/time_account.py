"""What every technique's end-to-end test checks of the run's time account (issue 35).

``check_account(run_dir, roles, within_s)``: ``account.json`` is in the run directory; every role's
shares add up to its wall time within 2%; the learner's wall time lies within the test's own measure
of the run (``within_s``: seconds around ``run(config)``), and each generator's within that times the
generators; the summary shows the account; MLflow holds the metrics, the tags and the artifacts.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.account import ADD_UP_TOLERANCE, RoleAccount, RunAccount


def check_account(run_dir: Path, roles: set[str], within_s: float, tracking_db: Path | None = None) -> RunAccount:
    """Check the run's ``account.json`` (module docstring) and return it.

    Args:
        run_dir: The run's directory.
        roles: The roles the account must hold (``learner``, ``generator``, ``generator_slots``).
        within_s: Wall seconds the test measured around the run.
        tracking_db: The MLflow sqlite file (default: ``mlflow.db`` beside the run directory).
    """
    from mlflow import MlflowClient

    account = RunAccount.from_json((run_dir / "account.json").read_text(encoding="utf-8"))
    by_role: dict[str, RoleAccount] = {r.role: r for r in account.roles}
    assert set(by_role) == roles, sorted(by_role)
    for role in account.roles:
        assert role.wall_s > 0, role
        assert abs(sum(role.shares.values()) - role.wall_s) <= ADD_UP_TOLERANCE * role.wall_s, role
    learner = by_role["learner"]
    assert learner.wall_s <= within_s, (learner.wall_s, within_s)
    assert learner.requested_cpu_s > 0 and learner.used_cpu_s > 0
    if "generator" in by_role:
        engine = by_role["generator"]
        assert engine.wall_s <= within_s * engine.processes, (engine.wall_s, within_s, engine.processes)
        assert engine.shares["generating"] > 0 and engine.used_by == "engine_busy"
    summary = (run_dir / "summary.md").read_text(encoding="utf-8")
    assert "time: learner" in summary and "cost (CPU-seconds)" in summary
    db = tracking_db or run_dir.parent / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{db.resolve()}")
    runs = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()],
                                          filter_string="tags.`posttrain.account` = '1'")
            if r.data.tags.get("posttrain.run_dir") == str(run_dir.resolve())]
    assert len(runs) == 1, len(runs)
    mlflow_run = runs[0]
    assert mlflow_run.data.tags["posttrain.tenant"] == account.tenant
    assert mlflow_run.data.tags["posttrain.technique"] == account.technique
    assert mlflow_run.data.metrics["time/learner/wall_s"] == learner.wall_s
    artifacts = {a.path for a in client.list_artifacts(mlflow_run.info.run_id)}
    assert {"account.json", "account.md", "account.png"} <= artifacts, artifacts
    return account
