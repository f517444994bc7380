"""The run's time account from real generator snapshots: summed over generators, written as JSON, Markdown and PNG."""

from __future__ import annotations

import time

import pytest

from posttrain.account import LEARNER_STATES, RunAccount, StateClock
from posttrain.config import load_config
from posttrain.inference.metering import GeneratorStats
from posttrain.runners.accounting import (
    REQUESTED_CLUSTER,
    account_markdown,
    build_account,
    generator_accounts,
    record_account,
)


def _snapshot(units: int) -> dict[str, float]:
    stats = GeneratorStats()
    stats.mark_started(units=units)
    stats.episode_started()
    stats.request_started()
    stats.request_finished()
    stats.episode_finished()
    return stats.snapshot()


def test_generator_accounts_add_up_over_generators_and_request_their_cores():
    """Two generators of 8 cores: the engine account sums both walls; requested = summed wall x 8; the slots'
    account is in slot-seconds (4 and 2 slots) and requests nothing."""
    a, b = _snapshot(4), _snapshot(2)
    engine, slots = generator_accounts([a, b], cores=8.0, gpus=1.0)
    assert engine.role == "generator" and engine.processes == 2 and engine.used_by == "engine_busy"
    assert engine.wall_s == a["account/engine/wall_s"] + b["account/engine/wall_s"]
    assert engine.requested_cpu_s == 8.0 * engine.wall_s and engine.requested_gpu_s == engine.wall_s
    assert engine.gap() < 1e-9 and slots.gap() < 1e-9
    assert slots.role == "generator_slots" and slots.requested_cpu_s == 0.0
    assert generator_accounts([], cores=8.0, gpus=1.0) == []


def test_record_account_writes_the_json_the_table_and_the_plot(tmp_path):
    config = load_config(None, ["technique=grpo", "grpo.async=false"])
    clock = StateClock(LEARNER_STATES, initial="preparing")
    clock.switch("training")
    account = build_account(config, clock, 0.0, [_snapshot(8)], trained_tokens=10.0, heldout_before=0.1,
                            heldout_after=0.2, generators_in_process=True)
    assert account.variant == "sync" and [r.role for r in account.roles] == ["learner", "generator", "generator_slots"]
    assert account.roles[1].requested_cpu_s == 0.0  # the engine runs in the learner's pod
    rows = record_account(account, tmp_path / "run", tracker=None)
    assert rows[0][0].startswith("time: learner (") and rows[-1][0] == "cost (CPU-seconds)"
    assert RunAccount.from_json((tmp_path / "run" / "account.json").read_text()) == account
    assert "| generator_slots (slot-s) | waiting_for_group |" in account_markdown(account)
    assert (tmp_path / "run" / "account.png").read_bytes().startswith(b"\x89PNG")


def test_a_run_that_fails_is_charged_with_its_account_up_to_the_error(tmp_path, monkeypatch):
    """The body of ``tracked_run`` raises after preparation: the MLflow run is FAILED, tagged with an account whose
    outcome is ``failed`` and whose learner wall covers preparation; the tenant's report counts it; the error goes on."""
    from mlflow import MlflowClient

    from posttrain.runners.common import tracked_run
    from posttrain.tracking.cost import tenant_report

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("POSTTRAIN_TENANT", "team-x")
    config = load_config(None, ["technique=sft", f"output_dir={tmp_path}", "run_name=broken"])
    with pytest.raises(RuntimeError, match="disk on fire"), tracked_run(config) as run:
        with run.timer("training"):
            raise RuntimeError("disk on fire")
    account = RunAccount.from_json((tmp_path / "broken" / "account.json").read_text())
    learner = account.roles[0]
    assert account.outcome == "failed" and account.tenant == "team-x"
    assert learner.shares["preparing"] > 0 and learner.gap() < 1e-9
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    (mlflow_run,) = MlflowClient(tracking_uri=uri).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=uri).search_experiments()])
    assert mlflow_run.info.status == "FAILED" and mlflow_run.data.tags["posttrain.outcome"] == "failed"
    report = tenant_report(uri, "team-x")
    assert report.total.runs == 1 and report.total.failed_runs == 1 and report.total.requested_cpu_s > 0


def test_a_resumed_learner_sums_its_lives_through_the_checkpoint_json(tmp_path):
    """Issue 35: the learner's account is saved in the checkpoint's state.json (JSON, no pickle); the next
    life carries it, so the recorded account counts both lives' seconds and says ``processes: 2``."""
    import json

    import torch

    from posttrain.learner.checkpoint import LearnerState, load_checkpoint, save_checkpoint
    from posttrain.learner.types import Trainable

    first = StateClock(LEARNER_STATES, initial="training")
    model = torch.nn.Linear(2, 1)
    path = save_checkpoint(tmp_path, state=LearnerState(iteration=1, account=first.record()),
                           parts={"policy": Trainable(model, None, None)}, resolved_config_yaml="a: 1\n")
    saved = json.loads((path / "state.json").read_text())["state"]["account"]
    assert saved["lives"] == 1 and set(saved["shares"]) == {*LEARNER_STATES, "other"}
    restored = load_checkpoint(path, parts={"policy": Trainable(torch.nn.Linear(2, 1), None, None)})
    second = StateClock(LEARNER_STATES, initial="waiting_for_batch")
    second.carry(restored.account)
    config = load_config(None, ["technique=sao", "learner.nodes=2", "learner.resources.cpu=3",
                                "learner.resources.gpus=1"])
    account = build_account(config, second, 0.0, [], trained_tokens=0.0, heldout_before=None, heldout_after=None,
                            generators_in_process=False, requested=REQUESTED_CLUSTER)
    learner = account.roles[0]
    assert learner.processes == 2 and learner.gap() < 1e-9
    assert learner.requested_cpu_s == pytest.approx(learner.wall_s * 3 * 2)  # 2 learner pods of 3 cores
    assert learner.requested_gpu_s == pytest.approx(learner.wall_s * 2)
    assert learner.shares["training"] >= saved["shares"]["training"] > 0
    assert learner.wall_s >= sum(saved["shares"].values())
    assert learner.used_cpu_s >= saved["used_cpu_s"]


def test_a_restarted_generator_adds_its_earlier_lifes_account():
    """The second life reads the first's last snapshot (the run's telemetry hash) and sums it: every state's
    seconds are at least the first life's, the lives are 2, and the summed account still adds up."""
    first = _snapshot(4)
    stats = GeneratorStats()
    stats.mark_started(units=2)
    assert stats.carry_account(first)
    stats.episode_started()
    second = stats.snapshot()
    assert second["account/lives"] == 2.0
    for key, value in first.items():
        if key.startswith(("account/engine/", "account/slots/")) and key.endswith("_s") and "requested" not in key:
            assert second[key] >= value, key
    engine, slots = generator_accounts([second], cores=1.0, gpus=0.0)
    assert engine.processes == 2 and engine.gap() < 1e-9 and slots.gap() < 1e-9
    assert not GeneratorStats().carry_account(first)  # before mark_started: nothing to add to
    fresh = GeneratorStats()
    fresh.mark_started()
    assert not fresh.carry_account({"rollouts": 3.0})  # a snapshot without an account: a first life


def test_the_learner_ranks_account_replaces_the_torchrun_s_other_time_in_the_parent(tmp_path, monkeypatch):
    """``learner.local_ranks > 1``: rank 0 of ``posttrain learner`` hands its clock to the parent through the
    file named by ``POSTTRAIN_LEARNER_ACCOUNT_FILE`` (the real writer and reader); the parent moves this life's
    split out of the torchrun's ``other`` seconds and adds the earlier lives rank 0 resumed."""
    import json

    from posttrain.account import LEARNER_ACCOUNT_FILE_ENV
    from posttrain.cli import _learner_account
    from posttrain.runners.sao import _fold_rank0_account

    class Ticks:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    t = Ticks()
    rank0 = StateClock(LEARNER_STATES, initial="training", clock=t)
    rank0.carry({"shares": {"training": 50.0, "checkpointing": 5.0}, "used_cpu_s": 40.0, "lives": 1})
    t.now += 6
    rank0.switch("waiting_for_batch")
    t.now += 2
    path = tmp_path / "learner_ranks_account.json"
    monkeypatch.setenv(LEARNER_ACCOUNT_FILE_ENV, str(path))
    _learner_account(None, None, rank0, 0.0, None, "", None, None)
    assert json.loads(path.read_text())["lives"] == 2
    parent = StateClock(LEARNER_STATES, clock=t)  # the torchrun: 10 s counted "other"
    t.now += 10
    _fold_rank0_account(parent, path, run_s=10.0, ranks_cpu_s=3.0)
    shares = parent.shares()
    assert shares["training"] == 56.0 and shares["waiting_for_batch"] == 2.0 and shares["checkpointing"] == 5.0
    assert shares["other"] == 2.0 and parent.lives == 2 and parent.carried_cpu_s == 43.0
    assert sum(shares.values()) == parent.wall_s() == 65.0
    missing = StateClock(LEARNER_STATES, clock=t)
    t.now += 4
    _fold_rank0_account(missing, tmp_path / "absent.json", run_s=4.0, ranks_cpu_s=1.0)  # rank 0 died: stays other
    assert missing.shares()["other"] == 4.0 and missing.carried_cpu_s == 1.0


def test_a_local_run_is_charged_for_the_machine_it_had_and_a_pod_for_its_requests(monkeypatch):
    """The CPU demo (93 s on 2 cores) was charged 3409 requested CPU-seconds and 1251 GPU-seconds, from the default
    cluster pod sizes (learner 32 CPU + 6 GPU, generators 8 CPU + 1 GPU). A local run is charged the cores this
    process may use and the GPUs it uses; in a pod (KUBERNETES_SERVICE_HOST) the pod requests stay."""
    import os

    from posttrain.runners.accounting import REQUESTED_CLUSTER, REQUESTED_LOCAL

    config = load_config(None, ["technique=sao", "learner.device=cpu"])
    clock = StateClock(LEARNER_STATES, initial="training")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    local = build_account(config, clock, 0.0, [_snapshot(4), _snapshot(4)], trained_tokens=1.0, heldout_before=None,
                          heldout_after=None, generators_in_process=False)
    learner, engine = local.roles[0], local.roles[1]
    assert local.requested_by == REQUESTED_LOCAL
    assert learner.requested_cpu_s == pytest.approx(learner.wall_s * len(os.sched_getaffinity(0)))
    assert local.requested_gpu_s() == 0.0 and engine.requested_cpu_s == 0.0  # generators share the run's cores
    assert "(local)" in dict(local.lines())["cost (CPU-seconds)"]
    assert "requested: local" in account_markdown(local)

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    pod = build_account(config, clock, 0.0, [_snapshot(4)], trained_tokens=1.0, heldout_before=None,
                        heldout_after=None, generators_in_process=False)
    assert pod.requested_by == REQUESTED_CLUSTER
    assert pod.roles[0].requested_cpu_s == pytest.approx(pod.roles[0].wall_s * 32)
    assert pod.roles[0].requested_gpu_s == pytest.approx(pod.roles[0].wall_s * 6)
    assert pod.roles[1].requested_cpu_s == pytest.approx(pod.roles[1].wall_s * 8)
    assert RunAccount.from_json(pod.to_json()).requested_by == REQUESTED_CLUSTER


def test_a_ctrl_c_is_charged_as_interrupted_not_failed(tmp_path, monkeypatch):
    """A Ctrl-C'd run used to be counted in the report's ``failed`` column; it is ``interrupted`` now."""
    from posttrain.learner.liveness import LearnerStopped
    from posttrain.runners.accounting import outcome_of
    from posttrain.runners.common import tracked_run
    from posttrain.tracking.cost import tenant_report

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("POSTTRAIN_TENANT", "team-y")
    config = load_config(None, ["technique=sft", f"output_dir={tmp_path}", "run_name=stopped"])
    with pytest.raises(KeyboardInterrupt), tracked_run(config) as run:
        with run.timer("training"):
            raise KeyboardInterrupt
    assert RunAccount.from_json((tmp_path / "stopped" / "account.json").read_text()).outcome == "interrupted"
    report = tenant_report(f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}", "team-y")
    assert (report.total.runs, report.total.failed_runs, report.total.interrupted_runs) == (1, 0, 1)
    assert outcome_of(LearnerStopped("stopped by SIGINT", 130)) == "interrupted"
    assert outcome_of(LearnerStopped("stopped by SIGTERM", 143)) == "interrupted"
    assert outcome_of(LearnerStopped("no live generator", 1)) == "failed"


def test_a_rerun_that_trained_nothing_keeps_the_runs_summary_and_account_files(tmp_path):
    """A re-run of a finished run (resumed at the final version) used to overwrite <run>/summary.md with its own
    near-empty figures; it now writes its summary and account under <run>/rerun and says so in a row."""

    from posttrain.runners.accounting import RERUN_DIR, RERUN_ROW
    from posttrain.runners.common import TrackedRun, _no_sink
    from posttrain.runtime import RunContext

    config = load_config(None, ["technique=grpo", "grpo.async=false", f"output_dir={tmp_path}", "run_name=r"])
    ctx = RunContext(config)
    ctx.run_dir.mkdir(parents=True)
    fresh = TrackedRun(config, ctx, None, _no_sink, time.monotonic())
    fresh.trained_tokens = 8888.0
    first = fresh.summary([("rows", "the real run")])
    real_summary = (ctx.run_dir / "summary.md").read_text(encoding="utf-8")
    real_account = (ctx.run_dir / "account.json").read_text(encoding="utf-8")
    assert RERUN_ROW not in first.rows and "the real run" in real_summary

    rerun = TrackedRun(config, ctx, None, _no_sink, time.monotonic())
    rerun.trained_nothing, rerun.heldout_before, rerun.heldout_after = True, 0.3, 0.5
    second = rerun.summary([("rows", "the re-run")])
    assert RERUN_ROW in second.rows
    assert (ctx.run_dir / "summary.md").read_text(encoding="utf-8") == real_summary
    assert (ctx.run_dir / "account.json").read_text(encoding="utf-8") == real_account
    assert "the re-run" in (ctx.run_dir / RERUN_DIR / "summary.md").read_text(encoding="utf-8")
    again = RunAccount.from_json((ctx.run_dir / RERUN_DIR / "account.json").read_text(encoding="utf-8"))
    assert again.trained_tokens == 0 and "cost/requested_cpu_s_per_point" not in again.derived()  # it gained nothing


def test_a_posttrain_run_life_records_only_its_own_seconds_a_learner_pod_every_life():
    """Each `posttrain run` is an MLflow run of its own, and the report sums runs: a resumed life that also counted
    the lives it carried from the checkpoint charged them twice (a `make demo` re-run: the whole run again). A
    learner pod resumes its predecessor's MLflow run, so it keeps every life."""
    config = load_config(None, ["technique=sao", "learner.device=cpu"])
    cpu_started = time.process_time()  # this life's CPU counts from here (a test process has run other tests before)
    clock = StateClock(LEARNER_STATES, initial="evaluating")
    clock.carry({"shares": {"training": 80.0, "checkpointing": 5.0}, "used_cpu_s": 60.0, "lives": 1})
    life = build_account(config, clock, cpu_started, [], trained_tokens=0.0, heldout_before=None, heldout_after=None,
                         generators_in_process=False, this_life_only=True)
    learner = life.roles[0]
    assert learner.processes == 1 and learner.shares["training"] == 0.0 and learner.wall_s < 80.0
    assert learner.used_cpu_s < 60.0 and learner.gap() < 1e-9
    every = build_account(config, clock, cpu_started, [], trained_tokens=0.0, heldout_before=None, heldout_after=None,
                          generators_in_process=False, requested=REQUESTED_CLUSTER)
    assert every.roles[0].processes == 2 and every.roles[0].wall_s >= 85.0 and every.roles[0].used_cpu_s >= 60.0
