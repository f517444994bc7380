"""Each technique end to end on the tiny CPU model: ``posttrain run configs/<technique>_cpu.yaml``.

Each test runs the shipped config (with fewer steps where the behaviour shows sooner) through
``posttrain.runners.run`` into a temporary output directory with MLflow on sqlite there, and checks
that the model learned (SFT/CPT loss falls, DPO preference accuracy rises, GRPO reward rises),
that the final model is an HF safetensors directory with its resolved config, and that the run
logged to MLflow and registered the model. Torch runs single-threaded: on a shared 2-core
machine that is many times faster than two contending threads.
"""

import json
import time
from pathlib import Path

import pytest
import torch
import yaml

from posttrain.config import RunConfig, load_config
from posttrain.learner.ledger import LEDGER_NAME, read_ledger
from posttrain.runners import run
from time_account import check_account

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _config(name: str, out: Path, *overrides: str) -> RunConfig:
    path = REPO / "configs" / f"{name}_cpu.yaml"
    return load_config(path, [f"output_dir={out}", *overrides])


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch, tmp_path):
    """One torch thread here and in child processes; MLflow on sqlite in the test's directory."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.chdir(REPO)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _metric(run_dir: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [float(r[key]) for r in rows if key in r]


def _quarters(values: list[float]) -> tuple[float, float]:
    k = max(1, len(values) // 4)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def _check_outputs(config: RunConfig, expected_metric: str) -> None:
    """Final model directory, an MLflow run with the metric, and a registered version linked to it."""
    from mlflow import MlflowClient

    final = Path(config.output_dir) / config.run_name / "final_model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "resolved_config.yaml"):
        assert (final / name).is_file(), name
    assert yaml.safe_load((final / "resolved_config.yaml").read_text(encoding="utf-8"))["technique"] == config.technique
    uri = f"sqlite:///{(Path(config.output_dir) / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    versions = client.search_model_versions(f"name='{config.tracking.registered_model}'")
    assert len(versions) == 1
    version = versions[0]
    # The first version of a registered model is its champion (models:/<name>@champion loads it).
    assert client.get_model_version_by_alias(config.tracking.registered_model, "champion").version == version.version
    assert "eval.heldout.accuracy" in version.tags
    assert version.tags["posttrain.technique"] == config.technique
    assert version.tags["posttrain.source"] == str(final.resolve()) and version.source.startswith("models:/")
    mlflow_run = client.get_run(version.run_id)
    assert expected_metric in mlflow_run.data.metrics
    assert mlflow_run.info.status == "FINISHED"


def test_sft_run_lowers_the_loss_and_registers_the_model(tmp_path):
    config = _config("sft", tmp_path, "sft.steps=12", "sft.max_examples=60", "sft.max_seq_len=256",
                     "sft.checkpoint_every=6", "eval.num_tasks=4", "generator.max_new_tokens=8")
    t0 = time.monotonic()
    summary = run(config)
    check_account(summary.run_dir, {"learner"}, time.monotonic() - t0)
    losses = _metric(summary.run_dir, "loss/sft")
    assert len(losses) == 12
    assert losses[-1] < 0.8 * losses[0]
    checkpoint = summary.run_dir / "checkpoints" / "iter-000012"  # DCP layout (learner/checkpoint.py)
    assert (checkpoint / "state.json").is_file() and (checkpoint / "dcp" / ".metadata").is_file()
    _check_outputs(config, "loss/sft")


def test_cpt_run_lowers_the_loss_on_raw_text(tmp_path):
    config = _config("cpt", tmp_path, "sft.steps=12", "sft.max_examples=60", "sft.max_seq_len=256",
                     "eval.num_tasks=4", "generator.max_new_tokens=8")
    summary = run(config)
    losses = _metric(summary.run_dir, "loss/sft")
    assert losses[-1] < 0.8 * losses[0]
    _check_outputs(config, "loss/sft")


def test_bad_rows_are_quarantined_beside_the_output(tmp_path):
    """Two bad rows among three: the run trains on the good one and writes both with their reasons."""
    data = tmp_path / "mine.jsonl"
    good = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "#### 4"}]}
    data.write_text("\n".join([json.dumps(good), "{oops", json.dumps({"messages": [{"role": "user", "content": "q"}]})])
                    + "\n", encoding="utf-8")
    config = _config("sft", tmp_path, f"sft.data_path={data}", "sft.steps=2", "sft.batch_size=1",
                     "sft.micro_batch_size=1", "eval.num_tasks=2", "generator.max_new_tokens=4")
    summary = run(config)
    quarantined = [json.loads(line) for line in (summary.run_dir / "quarantine-sft.jsonl").read_text().splitlines()]
    assert [(q["line"], q["field"]) for q in quarantined] == [(2, "<json>"), (3, "messages")]
    assert ("quarantined rows", "2") in summary.rows


def test_dpo_run_raises_preference_accuracy(tmp_path):
    config = _config("dpo", tmp_path, "dpo.steps=16", "dpo.max_examples=40", "dpo.heldout_fraction=0.2",
                     "eval.num_tasks=4", "generator.max_new_tokens=8")
    t0 = time.monotonic()
    summary = run(config)
    check_account(summary.run_dir, {"learner"}, time.monotonic() - t0)
    early, late = _quarters(_metric(summary.run_dir, "dpo/accuracy"))
    assert late > early and late >= 0.75
    heldout = _metric(summary.run_dir, "heldout/dpo/accuracy")
    assert heldout[0] == 0.0 and heldout[-1] > heldout[0]  # before training every margin is 0
    row = dict(summary.rows)["held-out preference accuracy (reward margin > 0) before -> after"]
    assert row.startswith("0.000 (policy = reference: every margin is 0) -> ")  # the summary says why
    _check_outputs(config, "dpo/accuracy")


# The shipped GRPO config's 300-step warm start and 60 steps show a held-out gain (docs/techniques.md); the test
# trains on 16 tasks of sums up to 49 after a 30-step warm start, where the training reward rises within 40 steps.
CHEAP_GRPO = ["data.env_args.high=50", "data.env_args.heldout_fraction=0.1", "data.env_args.unmarked_fraction=0.0",
              "data.num_train_tasks=16", "data.num_eval_tasks=8", "warm_start.steps=30", "warm_start.batch_size=16",
              "grpo.steps=40", "grpo.optim.lr=3.0e-4", "eval.num_tasks=8", "eval.samples_per_task=1"]


def test_grpo_sync_run_raises_the_reward_and_logs_throughput(tmp_path, capsys):
    """16 training tasks, a 30-step warm start (about 20-30% correct), 40 GRPO steps of 8 prompts x 8 rollouts; the
    last quarter's mean reward beats the first quarter's by 0.1 or more. No progress bar on the console."""
    config = _config("grpo", tmp_path, *CHEAP_GRPO)
    t0 = time.monotonic()
    summary = run(config)
    account = check_account(summary.run_dir, {"learner", "generator", "generator_slots"}, time.monotonic() - t0)
    slots = {r.role: r for r in account.roles}["generator_slots"].shares
    # Members of a group end at different times and the batch waits for the slowest; between batches the
    # engine waits for the learner. Neither can be zero with 8 x 8 episodes of different lengths.
    assert slots["waiting_for_group"] > 0 and slots["waiting_for_learner"] > 0 and slots["running"] > 0
    assert account.variant == "sync" and account.heldout_before is not None and account.heldout_after is not None
    console = capsys.readouterr()
    assert "grpo: " not in console.out + console.err  # the per-step tqdm bar ("grpo:  12%|...") is gone
    early, late = _quarters(_metric(summary.run_dir, "reward/mean"))
    assert late > early + 0.1
    for key in ("throughput/rollouts_per_s", "throughput/trained_action_tokens_per_s", "generator/busy_fraction_mean"):
        assert _metric(summary.run_dir, key), key
    ledger = read_ledger(summary.run_dir / LEDGER_NAME)  # every iteration's batch, in order
    assert [line["iteration"] for line in ledger] == list(range(1, config.grpo.steps + 1))
    assert all(len(line["rollouts"]) == config.grpo.batch_rollouts and not line["dropped"] for line in ledger)
    assert all(sum(r["action_tokens"]) > 0 for line in ledger for r in line["rollouts"])
    _check_outputs(config, "reward/mean")


@pytest.mark.timeout(420)
def test_grpo_async_run_trains_on_whole_groups_with_dis(tmp_path):
    config = _config("grpo_async", tmp_path, *CHEAP_GRPO)
    t0 = time.monotonic()
    summary = run(config)
    account = check_account(summary.run_dir, {"learner", "generator", "generator_slots"}, time.monotonic() - t0)
    assert {r.role: r for r in account.roles}["learner"].shares["waiting_for_batch"] > 0
    assert account.variant == "async"
    groups = _metric(summary.run_dir, "grpo/groups")
    assert groups and all(g == config.grpo.prompts_per_step for g in groups)
    assert _metric(summary.run_dir, "mask/frac_total")
    early, late = _quarters(_metric(summary.run_dir, "reward/mean"))
    assert late > early + 0.1
    assert _metric(summary.run_dir, "generator/busy_fraction_mean")
    ledger = read_ledger(summary.run_dir / LEDGER_NAME)
    for line in ledger:  # whole groups, each rollout's entry beside it; drops say why
        assert len(line["rollouts"]) == len(line["entry_ids"]) == config.grpo.batch_rollouts
        assert len({r["group_id"] for r in line["rollouts"]}) == config.grpo.prompts_per_step
        assert all(d["reason"] in ("stale group", "surplus member", "no group id") for d in line["dropped"])
    _check_outputs(config, "reward/mean")


def test_gkd_at_lambda_0_distils_on_fixed_sequences_without_redis_generators_or_waiting_for_rollouts(
        tmp_path, capsys, monkeypatch):
    """``posttrain run configs/gkd_cpu.yaml gkd.lmbda=0`` (supervised KD): REDIS_URL names a closed port, so any
    Redis use would fail after a 1 s reconnect window, and no generator process may start. The run builds its
    teacher and student, distils 4 versions on fixed sequences alone (every row fixed, no rollout), evaluates and
    registers; the console's progress line shows the distillation loss. Before, gkd.lmbda 0 was refused."""
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:9")
    fixed = tmp_path / "fixed.jsonl"  # the task's own kind of answers, as a team's ground truth would be
    fixed.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                                      {"role": "assistant", "content": f"#### {a + b}"}]}) + "\n"
                             for a in range(4) for b in range(4)), encoding="utf-8")
    config = _config("gkd", tmp_path, "gkd.lmbda=0", f"gkd.data_path={fixed}", "gkd.steps=4", "gkd.batch_size=8",
                     "gkd.micro_batch_size=8", "gkd.checkpoint_every=2", "gkd.teacher.build_steps=20",
                     "warm_start.steps=5", "eval.num_tasks=4", "eval.samples_per_task=1", "queue.reconnect_window_s=1")
    t0 = time.monotonic()
    summary = run(config)
    account = check_account(summary.run_dir, {"learner"}, time.monotonic() - t0)
    assert {r.role: r for r in account.roles}["learner"].shares["training"] > 0

    out = capsys.readouterr().out
    assert "[4/5] gkd: 4 policy versions of 0 on-policy + 8 fixed sequences" in out
    assert "no generator (lambda 0: supervised KD on the fixed sequences)" in out
    assert "policy version 4/4: distillation loss " in out
    assert dict(summary.rows)["on-policy share (lambda)"] == "0/8 sequences per batch"
    assert not list((summary.run_dir / "logs").glob("generator-*")) and not (summary.run_dir / "weights").exists()
    assert _metric(summary.run_dir, "gkd/on_policy_share") == [0.0] * 4
    assert all(v > 0 for v in _metric(summary.run_dir, "loss/gkd"))
    ledger = read_ledger(summary.run_dir / LEDGER_NAME)
    assert [line["iteration"] for line in ledger] == [1, 2, 3, 4] and not any(line["rollouts"] for line in ledger)
    _check_outputs(config, "loss/gkd")


def test_a_rerun_of_a_finished_run_is_charged_only_for_its_own_life_and_keeps_the_summary(tmp_path):
    """`make demo` twice: the second run resumed at the final step, trained nothing, and was logged as a new
    MLflow run with the real run's trained tokens (the report counted them twice) and overwrote summary.md with
    its own empty figures. Now it records its own seconds and 0 tokens under <run>/rerun; the report counts
    the tokens once."""
    from posttrain.runners.accounting import RERUN_DIR, RERUN_ROW
    from posttrain.tracking.cost import tenant_report

    config = _config("sft", tmp_path, "sft.steps=4", "sft.max_examples=16", "sft.max_seq_len=128",
                     "sft.checkpoint_every=4", "eval.num_tasks=2", "generator.max_new_tokens=4")
    first = run(config)
    summary_md = (first.run_dir / "summary.md").read_text(encoding="utf-8")
    tokens = json.loads((first.run_dir / "account.json").read_text(encoding="utf-8"))["trained_tokens"]
    assert tokens > 0 and RERUN_ROW not in first.rows
    second = run(config)
    assert RERUN_ROW in second.rows
    assert (first.run_dir / "summary.md").read_text(encoding="utf-8") == summary_md
    rerun = json.loads((first.run_dir / RERUN_DIR / "account.json").read_text(encoding="utf-8"))
    assert rerun["trained_tokens"] == 0 and rerun["roles"][0]["processes"] == 1
    report = tenant_report(f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}", "default")
    assert report.total.runs == 2 and report.total.trained_tokens == tokens
