"""``posttrain schedule`` against a loopback fake KFP API (``tests/fakes/fake_kfp_api.py``) with the real ``kfp.Client``."""

from pathlib import Path

import pytest
import yaml

from fakes.fake_kfp_api import FakeKFPAPI
from posttrain.cli import main as posttrain_main
from posttrain.cluster.schedule import ScheduleError, check_cron, parse_params, pipeline_inputs, schedule_cli

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipelines" / "compiled" / "post_training.yaml"


@pytest.fixture
def kfp_api(monkeypatch, tmp_path):
    # kfp.Client reads and may write ~/.config/kfp/context.json: keep it in the test's home.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KF_PIPELINES_TOKEN", raising=False)
    with FakeKFPAPI() as fake:
        yield fake


def schedule(fake, *extra):
    return schedule_cli(["--host", fake.url, "--namespace", "team-a", "--name", "nightly-sao",
                         "--pipeline", str(PIPELINE), "--registered-model", "team-a-policy", *extra])


def test_schedule_creates_a_recurring_run_that_retrains_from_the_champion(kfp_api, capsys):
    rc = schedule(kfp_api, "--cron", "0 0 2 * * *", "--param", "technique=sao", "--param", "steps=200")
    assert rc == 0, capsys.readouterr().err
    (run,) = kfp_api.recurring_runs.values()
    assert run["display_name"] == "nightly-sao"
    assert run["trigger"] == {"cron_schedule": {"cron": "0 0 2 * * *"}}
    assert run["runtime_config"]["parameters"] == {
        "technique": "sao", "steps": 200, "model": "models:/team-a-policy@champion",
        "priority_class": "posttrain-scheduled"}
    assert run["no_catchup"] is True and run["max_concurrency"] == "1" and run["mode"] == "ENABLE"
    assert run["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "post-training"
    (exp,) = kfp_api.experiments.values()
    assert exp["display_name"] == "scheduled-retraining" and exp["namespace"] == "team-a"
    assert run["experiment_id"] == exp["experiment_id"]
    assert "created recurring run" in capsys.readouterr().out


def test_schedule_sends_the_committed_pipeline_spec_with_caching_off(kfp_api):
    assert schedule(kfp_api, "--cron", "0 30 1 * * *") == 0
    (run,) = kfp_api.recurring_runs.values()
    ir = next(yaml.safe_load_all(PIPELINE.read_text()))
    sent = run["pipeline_spec"]["pipeline_spec"]
    assert sent["root"]["inputDefinitions"] == ir["root"]["inputDefinitions"]
    assert set(sent["deploymentSpec"]["executors"]) == set(ir["deploymentSpec"]["executors"])
    assert all(not t.get("cachingOptions", {}).get("enableCache", False)
               for t in sent["root"]["dag"]["tasks"].values())
    # The Kubernetes platform section (tenant ConfigMap, GPU tolerations) travels with the spec.
    platform = run["pipeline_spec"]["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert "exec-evaluate" in platform


def test_schedule_twice_with_the_same_arguments_leaves_the_recurring_run_alone(kfp_api, capsys):
    assert schedule(kfp_api, "--cron", "0 0 2 * * *") == 0
    first = set(kfp_api.recurring_runs)
    assert schedule(kfp_api, "--cron", "0 0 2 * * *") == 0
    assert set(kfp_api.recurring_runs) == first
    assert len(kfp_api.calls("POST", r"/recurringruns$")) == 1
    assert kfp_api.calls("DELETE", r"/recurringruns/") == []
    assert capsys.readouterr().out.splitlines()[-1].startswith("unchanged recurring run")


def test_schedule_with_a_new_cron_replaces_the_recurring_run(kfp_api, capsys):
    assert schedule(kfp_api, "--cron", "0 0 2 * * *") == 0
    (old_id,) = kfp_api.recurring_runs
    assert schedule(kfp_api, "--cron", "0 0 4 * * 1") == 0
    (run,) = kfp_api.recurring_runs.values()
    assert run["recurring_run_id"] != old_id
    assert run["trigger"]["cron_schedule"]["cron"] == "0 0 4 * * 1"
    assert f"(replaced {old_id})" in capsys.readouterr().out


def test_schedule_disable_keeps_one_disabled_recurring_run(kfp_api):
    assert schedule(kfp_api, "--cron", "0 0 2 * * *") == 0
    assert schedule(kfp_api, "--cron", "0 0 2 * * *", "--disable") == 0
    (run,) = kfp_api.recurring_runs.values()
    assert run["mode"] == "DISABLE" and run["status"] == "DISABLED"


def test_failed_update_restores_the_previous_recurring_run(kfp_api, capsys):
    assert schedule(kfp_api, "--cron", "0 0 2 * * *") == 0
    (old,) = kfp_api.recurring_runs.values()
    kfp_api.fail_next("POST", r"/recurringruns$", 500)
    assert schedule(kfp_api, "--cron", "0 0 3 * * *") == 1
    err = capsys.readouterr().err
    assert "failed (HTTP 500" in err and "was restored as" in err
    (restored,) = kfp_api.recurring_runs.values()
    assert restored["trigger"] == old["trigger"]
    assert restored["runtime_config"] == old["runtime_config"]
    assert restored["description"] == old["description"]


def test_two_recurring_runs_with_the_name_are_refused(kfp_api, capsys):
    assert schedule(kfp_api, "--cron", "0 0 2 * * *") == 0
    (run,) = kfp_api.recurring_runs.values()
    kfp_api.recurring_runs["rr-copy"] = {**run, "recurring_run_id": "rr-copy"}
    assert schedule(kfp_api, "--cron", "0 0 5 * * *") == 1
    assert "2 recurring runs are named 'nightly-sao'" in capsys.readouterr().err


def test_a_five_field_cron_is_rejected_before_any_request(kfp_api, capsys):
    assert schedule(kfp_api, "--cron", "0 2 * * *") == 1
    assert "has 5 fields; KFP wants 6 with seconds first" in capsys.readouterr().err
    assert kfp_api.requests == []


def test_unknown_or_mistyped_parameters_are_rejected(kfp_api, capsys):
    assert schedule(kfp_api, "--cron", "0 0 2 * * *", "--param", "lr=0.1") == 1
    assert "--param lr: the pipeline has no such parameter" in capsys.readouterr().err
    assert schedule(kfp_api, "--cron", "0 0 2 * * *", "--param", "steps=many") == 1
    assert "--param steps='many': not a valid NUMBER_INTEGER" in capsys.readouterr().err
    assert kfp_api.requests == []


def test_without_a_registered_model_the_champion_cannot_be_named(kfp_api, capsys):
    rc = schedule_cli(["--host", kfp_api.url, "--name", "n", "--cron", "0 0 2 * * *", "--pipeline", str(PIPELINE)])
    assert rc == 1
    assert "--registered-model: needed" in capsys.readouterr().err


def test_the_registered_model_can_come_from_a_local_config(kfp_api):
    config = REPO / "configs" / "sao_demo_cpu.yaml"
    rc = schedule_cli(["--host", kfp_api.url, "--name", "n", "--cron", "0 0 2 * * *",
                       "--pipeline", str(PIPELINE), "--param", f"config={config}"])
    assert rc == 0
    (run,) = kfp_api.recurring_runs.values()
    assert run["runtime_config"]["parameters"]["model"] == "models:/sao-demo-policy@champion"


def test_check_cron_and_parse_params_units():
    """Hand-checked: '0 0 2 * * *' is six fields; steps is NUMBER_INTEGER in the compiled pipeline."""
    assert check_cron(" 0  0 2 * * * ") == "0 0 2 * * *"
    with pytest.raises(ScheduleError, match="not a cron field"):
        check_cron("0 0 2 * * ;rm")
    inputs = pipeline_inputs(PIPELINE)
    assert parse_params(["steps=7", "technique=dpo"], inputs) == {"steps": 7, "technique": "dpo"}
    with pytest.raises(ScheduleError, match="expected name=value"):
        parse_params(["steps"], inputs)


def test_posttrain_schedule_with_a_separator_reaches_schedule_cli(kfp_api):
    rc = posttrain_main(["schedule", "--", "--host", kfp_api.url, "--name", "n", "--cron", "0 0 2 * * *",
                         "--pipeline", str(PIPELINE), "--registered-model", "m"])
    assert rc == 0 and len(kfp_api.recurring_runs) == 1


def test_posttrain_schedule_accepts_options_first(kfp_api):
    rc = posttrain_main(["schedule", "--host", kfp_api.url, "--name", "n", "--cron", "0 0 2 * * *",
                         "--pipeline", str(PIPELINE), "--registered-model", "m"])
    assert rc == 0


def test_an_unreachable_kfp_api_is_one_error_line_not_a_traceback(capsys):
    """A port nothing listens on (bound, then closed): exit 1 and one ``error:`` line naming --host."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rc = posttrain_main(["schedule", "--host", f"http://127.0.0.1:{port}", "--name", "n", "--cron", "0 0 2 * * *",
                         "--pipeline", str(PIPELINE), "--registered-model", "m"])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert err.startswith(f"error: --host http://127.0.0.1:{port}: KFP API unreachable") and "\n" not in err


def test_recurring_runs_default_to_the_scheduled_priority_and_keep_an_explicit_one(kfp_api, capsys):
    """Interactive runs (pipeline default posttrain-interactive) preempt scheduled retraining, not the reverse."""
    inputs = pipeline_inputs(PIPELINE)
    assert inputs["priority_class"]["defaultValue"] == "posttrain-interactive"
    assert schedule(kfp_api, "--cron", "0 0 2 * * *") == 0
    (run,) = kfp_api.recurring_runs.values()
    assert run["runtime_config"]["parameters"]["priority_class"] == "posttrain-scheduled"
    assert "priority posttrain-scheduled" in capsys.readouterr().out
    assert schedule(kfp_api, "--cron", "0 0 2 * * *", "--param", "priority_class=posttrain-interactive") == 0
    (run,) = kfp_api.recurring_runs.values()
    assert run["runtime_config"]["parameters"]["priority_class"] == "posttrain-interactive"
