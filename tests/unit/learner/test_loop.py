"""The asynchronous learner loop end to end in one process, on the in-memory queue, admission and a local weight store.

A scripted generator answers every weight announcement by taking every admission ticket left and
putting one rollout per ticket on the queue (SAO), or one group of G rollouts (async GRPO). The
rollouts are fixed token sequences whose behaviour logprobs are the start policy's, so the DIS
band keeps their tokens. With tau = 2 and B = 4 the capacity at version v is (v + 3) * 4 rollouts
not refunded:

    publish v0  -> 12 rollouts put (v0)
    iteration 1 -> SAO critic warm-up on rollouts 1-4 (no version: their 4 places are refunded)
    iteration 2 -> v1 on rollouts 5-8              -> capacity 16, 16 - 8 = 8 more put (v1)
    iteration 3 -> v2 on rollouts 9-12 (lag 1)     -> capacity 20, 4 more put (v2)
    iteration 4 -> v3 on rollouts 13-16 (lag 1)    -> capacity 24, 4 more put (v3); done
                                                      16 trained, 28 put, 24 counted as consumed

Run: ``python -m pytest -q tests/unit/learner/test_loop.py``.
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import torch

import posttrain.learner.setup as learner_setup
from posttrain.config import RunConfig
from posttrain.learner.checkpoint import latest_checkpoint
from posttrain.learner.ledger import LEDGER_NAME, read_ledger, staleness_violations
from posttrain.learner.loop import run_learner
from posttrain.learner.setup import LearnerTransport
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy
from posttrain.records import Rollout
from posttrain.rollout.admission import MemoryAdmissionController
from posttrain.rollout.lengths import length_metrics
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryRolloutQueue, MemoryStream
from posttrain.runtime import RunContext
from posttrain.weight_sync.store import FilesystemWeightStore

PROMPT_LEN, ACTION_LEN = 6, 6


def _config(tmp_path: Path, technique: str) -> RunConfig:
    common = {"output_dir": str(tmp_path / "runs"), "run_name": "loop", "technique": technique,
              "queue": {"block_ms": 1, "claim_idle_ms": 60_000}}
    if technique == "sao":
        return RunConfig.model_validate({**common, "sao": {
            "steps": 3, "batch_size": 4, "micro_batch_size": 2, "max_staleness": 2, "checkpoint_every": 2,
            "optim": {"lr": 1e-3}, "critic": {"warmup_steps": 1, "lr": 1e-3}}})
    return RunConfig.model_validate({**common, "grpo": {
        "async": True, "steps": 3, "prompts_per_step": 2, "group_size": 2, "micro_batch_size": 2,
        "max_staleness": 2, "checkpoint_every": 2, "optim": {"lr": 1e-3}, "loss": {"dis_mask": True}}})


class ScriptedGenerator:
    """Fills the queue from the admission tickets left whenever the learner announces a version."""

    def __init__(self, start_model: Path, queue: MemoryRolloutQueue, admission: MemoryAdmissionController,
                 versions: MemoryPolicyVersionStore, vocab: int, group_size: int = 1, uniform_every: int = 0,
                 reward: float | None = None, behaviour_logprob: float | None = None) -> None:
        self.queue, self.admission, self.versions, self.group_size = queue, admission, versions, group_size
        self.uniform_every = uniform_every  # every this many-th GRPO group has equal rewards (0: none)
        self.reward = reward  # every rollout's reward (an environment that always gives it); None: mixed
        self.behaviour_logprob = behaviour_logprob  # every action token's (None: the start policy's)
        self.groups = 0
        gen = torch.Generator().manual_seed(0)
        self.sequences = torch.randint(3, vocab, (8, PROMPT_LEN + ACTION_LEN), generator=gen)
        model = load_policy(start_model).eval()
        with torch.no_grad():
            logits = model(input_ids=self.sequences, attention_mask=torch.ones_like(self.sequences)).logits
            self.logprobs = token_logprobs(logits, self.sequences)
        self.announced: list[int] = []
        self.put = 0
        self.unread_after_fill: list[int] = []  # rollouts admitted and not yet read by the learner, per announcement

    def rollout(self, k: int, group_id: str | None, reward: float) -> Rollout:
        row = k % len(self.sequences)
        mask = [False] * PROMPT_LEN + [True] * ACTION_LEN
        lp = [float(x) if m else 0.0 for x, m in zip(self.logprobs[row].tolist(), mask, strict=True)]
        if self.behaviour_logprob is not None:
            lp = [self.behaviour_logprob if m else 0.0 for m in mask]
        version = self.versions.get()
        reward = reward if self.reward is None else self.reward
        return Rollout(rollout_id=uuid.uuid4().hex, task_id=f"t{row}", env_name="scripted",
                       token_ids=self.sequences[row].tolist(), behaviour_logprobs=lp, action_mask=mask, reward=reward,
                       policy_version=version, turn_policy_versions=[version], group_id=group_id, metrics={"correct": reward})

    def announce(self, version: int) -> None:
        self.announced.append(version)
        while True:
            tickets = [self.admission.acquire(0) for _ in range(self.group_size)]
            held = [t for t in tickets if t is not None]
            if len(held) < self.group_size:
                for t in held:
                    self.admission.release(t)
                self.unread_after_fill.append(self.queue.lag())
                return
            group_id = uuid.uuid4().hex if self.group_size > 1 else None
            uniform = self.group_size > 1 and self.uniform_every > 0 and self.groups % self.uniform_every == 0
            for i, ticket in enumerate(held):  # SAO alternates rewards; each GRPO group holds a 0 and a 1
                reward = 1.0 if uniform else float((self.put if self.group_size == 1 else i) % 2)
                self.queue.put(self.rollout(self.put, group_id, reward=reward))
                self.admission.consume(ticket)
                self.put += 1
            self.groups += 1


def _transport(tmp_path: Path, config: RunConfig, tiny_model, stream: MemoryStream,
               admission: MemoryAdmissionController, versions: MemoryPolicyVersionStore,
               group_size: int = 1, uniform_every: int = 0, **scripted: float) -> tuple[LearnerTransport, ScriptedGenerator]:
    queue = MemoryRolloutQueue(stream, consumer="learner-0")
    generator = ScriptedGenerator(tiny_model.path, MemoryRolloutQueue(stream, consumer="generator"), admission,
                                  versions, tiny_model.vocab_size, group_size, uniform_every, **scripted)
    transport = LearnerTransport(queue=queue, admission=admission, versions=versions,
                                 store=FilesystemWeightStore(RunContext(config).weights_dir),
                                 announce=generator.announce, generator_stats=dict)
    return transport, generator


def _prepared(tmp_path: Path, technique: str, tiny_model) -> RunConfig:
    config = _config(tmp_path, technique)
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    return config


def _trained_entry_ids(config: RunConfig) -> list[str]:
    return [i for line in read_ledger(RunContext(config).run_dir / LEDGER_NAME) for i in line["entry_ids"]]


def test_sao_loop_trains_every_parameter_publishes_each_version_and_acks_every_trained_entry(tmp_path, tiny_model):
    config = _prepared(tmp_path, "sao", tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    transport, generator = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    start = {k: v.clone() for k, v in load_policy(tiny_model.path).state_dict().items()}
    logged: list[dict[str, float]] = []

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False,
                          sink=lambda metrics, version: logged.append(metrics))

    assert (summary.policy_version, summary.iterations) == (3, 4)  # one critic warm-up, then three versions
    # each batch's per-rollout staleness: rollouts 1-8 at lag 0, 9-12 (v0) and 13-16 (v1) at lag 1
    assert [[m[f"staleness/batch_hist_{s}"] for s in range(3)] for m in logged] == [
        [4, 0, 0], [4, 0, 0], [0, 4, 0], [0, 4, 0]]
    assert [m["staleness/batch_mean"] for m in logged] == [0, 0, 1, 1]
    assert all(m["policy/entropy"] > 0 for m in logged[1:]) and "policy/entropy" not in logged[0]
    assert generator.announced == [0, 1, 2, 3] and versions.get() == 3
    assert transport.store.latest_version() == 3
    trained = load_policy(summary.final_model_dir).state_dict()
    unchanged = [k for k, v in start.items() if torch.equal(v, trained[k])]
    assert not unchanged, f"parameters the loop never trained: {unchanged}"
    ids = _trained_entry_ids(config)
    assert len(ids) == 16 and len(set(ids)) == 16
    assert transport.queue.pending() == []  # the final checkpoint covers every trained entry
    assert generator.put == 28 and summary.counters["rollouts_trained"] == 16
    assert summary.counters["stale_dropped"] == 0
    assert admission.state().consumed == 24  # 28 put, the warm-up's 4 refunded
    assert latest_checkpoint(RunContext(config).checkpoints_dir).name == "iter-000004"


def test_async_grpo_loop_trains_on_whole_groups(tmp_path, tiny_model):
    config = _prepared(tmp_path, "grpo", tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(), admission, versions, group_size=2)

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)

    assert (summary.policy_version, summary.iterations) == (3, 3)  # no critic, every group has unequal rewards
    lines = read_ledger(RunContext(config).run_dir / LEDGER_NAME)
    for line in lines:
        groups: dict[str, int] = {}
        for rollout in line["rollouts"]:
            groups[rollout["group_id"]] = groups.get(rollout["group_id"], 0) + 1
        assert sorted(groups.values()) == [2, 2]
    assert transport.queue.pending() == []


def test_async_grpo_with_uniform_groups_keeps_admitted_unread_rollouts_within_the_admission_bound(tmp_path, tiny_model):
    """Admission lets (v + tau + 1) * B rollouts start by version v, and each version consumes one
    batch of B, so at most (tau + 1) * B = 3 * 8 = 24 admitted rollouts wait unread. One group in
    four has equal rewards and trains nothing, but the batch still makes a version: its places must
    not come back. Refunding those 2 rollouts per version let 24 + 2v wait after version v (26, 28,
    30...), until FIFO reads turned the excess stale."""
    config = _config(tmp_path, "grpo").model_copy(deep=True)
    config.grpo.steps, config.grpo.prompts_per_step = 4, 4
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=8, max_staleness=2)
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(), admission, versions,
                                      group_size=2, uniform_every=4)

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)

    assert (summary.policy_version, summary.iterations) == (4, 4)
    lines = read_ledger(RunContext(config).run_dir / LEDGER_NAME)
    rewards = [sorted(r["reward"] for r in line["rollouts"]) for line in lines]
    assert all(r.count(1.0) == 5 for r in rewards)  # each batch: one uniform group (1, 1), three (0, 1)
    assert generator.unread_after_fill == [24] * 5
    assert summary.counters["stale_dropped"] == 0
    assert admission.state().consumed == (4 + 2 + 1) * 8  # 56 put, nothing refunded


def test_a_learner_stopped_mid_run_resumes_without_losing_or_repeating_an_entry(tmp_path, tiny_model):
    config = _prepared(tmp_path, "sao", tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    first, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    stopped = run_learner(config, first, start_model_dir=tiny_model.path, progress=False, max_iterations=2)
    assert (stopped.policy_version, stopped.iterations) == (1, 2)

    second, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    summary = run_learner(config, second, start_model_dir=tiny_model.path, progress=False)

    assert summary.policy_version == 3
    ids = _trained_entry_ids(config)
    assert len(ids) == len(set(ids)) == 16
    assert second.queue.pending() == []


def test_a_resumed_learner_counts_this_lifes_tokens_and_a_rerun_at_the_final_version_counts_none(tmp_path, tiny_model):
    """The counters are cumulative over a run's lives (checkpointed); a life's time account must charge only
    what that life trained. Before, a re-run of a finished run reported the whole run's trained tokens."""
    config = _prepared(tmp_path, "sao", tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    first, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    stopped = run_learner(config, first, start_model_dir=tiny_model.path, progress=False, max_iterations=2)
    first_tokens = stopped.counters["action_tokens_trained"]
    assert first_tokens > 0 and stopped.this_life("action_tokens_trained") == first_tokens
    assert stopped.trained_this_life

    second, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    finished = run_learner(config, second, start_model_dir=tiny_model.path, progress=False)
    assert finished.counters_at_start["action_tokens_trained"] == first_tokens
    assert finished.iterations_at_start == stopped.iterations
    assert finished.this_life("action_tokens_trained") == finished.counters["action_tokens_trained"] - first_tokens > 0

    third, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    rerun = run_learner(config, third, start_model_dir=tiny_model.path, progress=False)
    assert rerun.policy_version == finished.policy_version
    assert rerun.counters["action_tokens_trained"] == finished.counters["action_tokens_trained"]  # cumulative
    assert rerun.this_life("action_tokens_trained") == 0.0
    assert not rerun.trained_this_life


def test_a_learner_stopped_by_ctrl_c_charges_what_it_trained_to_its_lifes_account(tmp_path, tiny_model):
    """Ctrl-C (a real SIGINT) once version 2 is published: the learner checkpoints and raises ``LearnerStopped``.
    Its counters died with it, so ``posttrain run`` recorded the interrupted life with 0 trained tokens (a new
    user's demo: 53 versions trained, 0 tokens; the resumed life then cost 5x per 1k tokens). The error now
    carries the learner's summary: the failed account charges this life's tokens, those of the checkpoint the
    re-run loads, and the resumed life only the rest. The checkpoint is named by iteration (the critic's
    warm-up is iteration 1, so iter-000003 holds version 2): the resume hint names both."""
    import os
    import signal
    import time

    from posttrain.account import LEARNER_STATES, RunAccount, StateClock
    from posttrain.learner.liveness import LearnerStopped
    from posttrain.runners.accounting import record_failed_account
    from posttrain.runners.sao import resume_from

    config = _prepared(tmp_path, "sao", tiny_model)
    ctx = RunContext(config)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    first, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    announce = first.announce

    def ctrl_c_after_version_2(version: int) -> None:
        announce(version)
        if version == 2:
            os.kill(os.getpid(), signal.SIGINT)

    first.announce = ctrl_c_after_version_2
    clock, cpu_started = StateClock(LEARNER_STATES), time.process_time()
    with pytest.raises(LearnerStopped) as err:
        run_learner(config, first, start_model_dir=tiny_model.path, progress=False, clock=clock)
    stopped = err.value
    assert stopped.exit_code == 130 and str(stopped).startswith("learner stopped at policy version 2 of 3: interrupted")
    checkpoint = latest_checkpoint(ctx.checkpoints_dir)
    state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))["state"]
    assert (checkpoint.name, state["iteration"], state["policy_version"]) == ("iter-000003", 3, 2)
    assert resume_from(ctx) == f" from {checkpoint} (learner iteration 3, policy version 2)"
    assert stopped.summary is not None and stopped.summary.policy_version == 2
    tokens = stopped.summary.this_life("action_tokens_trained")
    assert tokens == state["counters"]["action_tokens_trained"] > 0

    record_failed_account(config, clock, cpu_started, tmp_path / "life1", None, stopped, this_life_only=True)
    account = RunAccount.from_json((tmp_path / "life1" / "account.json").read_text(encoding="utf-8"))
    assert account.outcome == "interrupted" and account.trained_tokens == tokens

    second, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    finished = run_learner(config, second, start_model_dir=tiny_model.path, progress=False)
    assert finished.policy_version == 3
    assert finished.this_life("action_tokens_trained") == finished.counters["action_tokens_trained"] - tokens > 0


class PoisonedGradients:
    """Makes the policy's gradient NaN on chosen policy updates (0-based), through a hook on one parameter.

    The hook runs once per micro-batch backward; ``micro_batches`` per update tells the updates apart.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, poisoned: Callable[[int], bool], micro_batches: int) -> None:
        self.poisoned, self.micro_batches, self.calls = poisoned, micro_batches, 0
        original = learner_setup.resume_policy

        def resume_policy(*args, **kwargs):
            resumed = original(*args, **kwargs)
            next(p for p in resumed.policy.model.parameters() if p.requires_grad).register_hook(self._hook)
            return resumed

        monkeypatch.setattr(learner_setup, "resume_policy", resume_policy)

    def _hook(self, grad: torch.Tensor) -> torch.Tensor:
        update, self.calls = self.calls // self.micro_batches, self.calls + 1
        return torch.full_like(grad, float("nan")) if self.poisoned(update) else grad


def test_a_non_finite_gradient_skips_the_update_counts_it_and_the_run_goes_on(tmp_path, tiny_model, monkeypatch):
    """tau = 4 (capacity (v + 5) * 4), B = 4 in micro-batches of 2. The first two policy updates get
    a NaN gradient: each is skipped (no optimizer step, no version, its batch's places refunded),
    counted in skipped_nonfinite, and the learner goes on: 1 warm-up + 2 skipped + 3 versions = 6
    iterations. Before, clip_and_step raised FloatingPointError and the learner died."""
    config = _config(tmp_path, "sao").model_copy(deep=True)
    config.sao.max_staleness = 4
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    poison = PoisonedGradients(monkeypatch, lambda update: update < 2, micro_batches=2)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=4)
    transport, _ = _transport(tmp_path, config, tiny_model, MemoryStream(), admission, versions)
    logged: list[dict[str, float]] = []

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False,
                          sink=lambda metrics, version: logged.append(metrics))

    assert (summary.policy_version, summary.iterations) == (3, 6)
    assert poison.calls == 10  # 5 policy updates x 2 micro-batches
    assert summary.counters["skipped_nonfinite"] == 2
    assert [m["learner/skipped_nonfinite"] for m in logged] == [0, 1, 2, 2, 2, 2]
    assert [math.isnan(m.get("policy/grad_norm", 0.0)) for m in logged] == [False, True, True, False, False, False]
    lines = read_ledger(RunContext(config).run_dir / LEDGER_NAME)
    assert [line["policy_version"] for line in lines] == [0, 0, 0, 1, 2, 3]
    assert admission.state().refunded_total == 12  # the warm-up's 4 and the skipped batches' 8


def test_non_finite_gradients_in_a_row_stop_the_learner_with_a_one_line_error(tmp_path, tiny_model, monkeypatch):
    """Every policy update gets a NaN gradient and sao.max_nonfinite_iterations is 2: after the
    warm-up, two skipped iterations in a row stop the run with an error that names the field."""
    from posttrain.learner.optim import NonFiniteGradientError

    config = _config(tmp_path, "sao").model_copy(deep=True)
    config.sao.max_nonfinite_iterations = 2
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    PoisonedGradients(monkeypatch, lambda update: True, micro_batches=2)
    versions = MemoryPolicyVersionStore()
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(),
                                      MemoryAdmissionController(versions, batch_size=4, max_staleness=2), versions)

    with pytest.raises(NonFiniteGradientError, match=r"^sao\.max_nonfinite_iterations: 2 learner iterations in a row") as err:
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)

    assert "\n" not in str(err.value)
    assert generator.announced == [0] and versions.get() == 0
    assert len(read_ledger(RunContext(config).run_dir / LEDGER_NAME)) == 3


@pytest.mark.parametrize("technique", ["sft", "dpo"])
def test_techniques_off_the_asynchronous_runtime_are_refused_with_the_field(tmp_path, tiny_model, technique):
    from posttrain.config.load import ConfigError

    config = _prepared(tmp_path, "sao", tiny_model).model_copy(update={"technique": technique})
    versions = MemoryPolicyVersionStore()
    transport, _ = _transport(tmp_path, config, tiny_model, MemoryStream(),
                              MemoryAdmissionController(versions, batch_size=4, max_staleness=2), versions)
    with pytest.raises(ConfigError, match="technique"):
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)


def test_a_batch_smaller_than_the_ranks_is_refused_with_the_field_before_anything_is_written(tmp_path, tiny_model):
    from posttrain.config.load import ConfigError
    from posttrain.parallel.world import World

    config = _prepared(tmp_path, "sao", tiny_model)
    versions = MemoryPolicyVersionStore()
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(),
                                      MemoryAdmissionController(versions, batch_size=4, max_staleness=2), versions)
    with pytest.raises(ConfigError, match=r"sao.batch_size: a batch of 4 rollouts cannot feed 8 learner ranks"):
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False, world=World(size=8))
    assert transport.store.latest_version() is None and generator.announced == []


class TwoTurnGenerator(ScriptedGenerator):
    """Puts two-turn rollouts: turn 0 (3 tokens) sampled ``lag`` versions before the current one
    (at least version 0), an observation token, turn 1 (2 tokens) at the current version: a long
    episode whose weights changed between its turns."""

    lag = 3

    def rollout(self, k: int, group_id: str | None, reward: float) -> Rollout:
        r = super().rollout(k, group_id, reward)
        mask = [False] * PROMPT_LEN + [True] * 3 + [False] + [True] * 2
        lp = [float(x) if m else 0.0 for x, m in zip(self.logprobs[k % len(self.sequences)].tolist(), mask, strict=True)]
        now = self.versions.get()
        old = max(0, now - self.lag)
        return msgspec.structs.replace(r, action_mask=mask, behaviour_logprobs=lp, policy_version=old,
                                       turn_policy_versions=[old, now], num_turns=2)


def test_the_ledger_shows_no_token_trained_more_than_tau_versions_after_it_was_sampled(tmp_path, tiny_model):
    """SAO, tau = 1, B = 4, no critic warm-up, four versions. Rollouts put at version v have turns at
    versions (max(0, v - 3), v); the learner reads them in order, so at learner version 2 and 3 it
    trains rollouts put at versions 1 and 2, whose first turn (version 0) lags 2-3 > tau: those
    tokens are masked, their second turns (lag 1) train. Read from the ledger alone: every token
    that got policy gradient was sampled at most tau versions before the version that trained it;
    8 rollouts whose oldest turn was too old still trained their fresh turn (the old rule dropped
    them), with 3 of their 5 action tokens masked for staleness (the other 2 train unless the DIS band
    masks them: the policy moves between versions)."""
    config = _config(tmp_path, "sao").model_copy(deep=True)
    config.sao.steps, config.sao.max_staleness, config.sao.critic.warmup_steps = 4, 1, 0
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=1)
    queue = MemoryRolloutQueue(MemoryStream(), consumer="learner-0")
    generator = TwoTurnGenerator(tiny_model.path, MemoryRolloutQueue(queue.stream, consumer="generator"), admission,
                                 versions, tiny_model.vocab_size)
    transport = LearnerTransport(queue=queue, admission=admission, versions=versions,
                                 store=FilesystemWeightStore(RunContext(config).weights_dir),
                                 announce=generator.announce, generator_stats=dict)

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)

    assert summary.policy_version == 4 and summary.counters["stale_dropped"] == 0
    lines = read_ledger(RunContext(config).run_dir / LEDGER_NAME)
    assert [(line["learner_version"], line["max_staleness"]) for line in lines] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert staleness_violations(lines) == []
    rescued = [r for line in lines for r in line["rollouts"] if line["learner_version"] - r["policy_version"] > 1]
    assert len(rescued) == 8
    assert all(r["stale_masked_tokens"] == 3.0 and r["trained_tokens"] + r["dis_masked_tokens"] == 2.0 for r in rescued)
    assert sum(r["trained_tokens"] for r in rescued) > 0
    assert all(r["trained_version_min"] >= line["learner_version"] - 1 for line in lines for r in line["rollouts"]
               if r["trained_tokens"])
    # the run's length accounting: 16 one-call episodes started and trained; 8 x 3 of 80 update tokens stale
    lengths = length_metrics(summary.counters)
    assert (lengths["length/started_calls_0-2"], lengths["length/trained_calls_0-2"]) == (16, 16)
    assert lengths["tokens/stale_masked_share"] == pytest.approx(24 / 80)


def test_a_ledger_line_with_a_token_trained_past_tau_is_reported():
    """The check itself: learner version 5, tau 2, a rollout whose oldest trained token is of version 2 (lag 3)."""
    line = {"iteration": 7, "learner_version": 5, "max_staleness": 2, "rollouts": [
        {"rollout_id": "ok", "policy_version": 1, "trained_tokens": 4.0, "trained_version_min": 3.0},
        {"rollout_id": "late", "policy_version": 2, "trained_tokens": 1.0, "trained_version_min": 2.0},
        {"rollout_id": "warm-up", "policy_version": 0, "trained_tokens": 0.0, "trained_version_min": None},
        {"rollout_id": "grpo", "policy_version": 2}]}
    problems = staleness_violations([line])
    assert len(problems) == 2 and "rollout late trained a token of version 2.0 at learner version 5" in problems[0]
    assert "rollout grpo" in problems[1]


def _stops_without_progress(err: pytest.ExceptionInfo, config: RunConfig, iterations: int, cause: str,
                            shares: str) -> None:
    """One line naming the setting, the cause and the shares; exit status 1; a checkpoint covers what was trained."""
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 1
    assert (f"no progress for {iterations} learner iterations in a row (learner.max_iterations_without_progress="
            f"{iterations}): {cause} in all {iterations}; {shares}; stopped after a final checkpoint") in message, message
    checkpoint = latest_checkpoint(RunContext(config).checkpoints_dir)
    assert checkpoint is not None
    trained = len(read_ledger(RunContext(config).run_dir / LEDGER_NAME))
    assert checkpoint.name == f"iter-{trained:06d}"


def test_async_grpo_on_a_reward_that_is_always_zero_stops_within_the_bound_with_one_line(tmp_path, tiny_model, capsys):
    """Every rollout's reward is 0, so every group is uniform and no version is ever published (the stall of
    issue 36: 21 iterations of 64 rollouts, silently, until the outer timeout). tau = 6 lets 7 batches of 2 groups
    of 2 in at version 0; the bound is 4: the learner stops after 4 iterations, having said so at 1, 2 and 3,
    checkpoints the 4 batches it read and ends with one line. Before, it trained all 6 iterations it was allowed."""
    from posttrain.learner.liveness import LearnerStopped

    config = _config(tmp_path, "grpo").model_copy(deep=True)
    config.grpo.max_staleness, config.learner.max_iterations_without_progress = 6, 4
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=6)
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(), admission, versions,
                                      group_size=2, reward=0.0)
    logged: list[dict[str, float]] = []

    with pytest.raises(LearnerStopped) as err:
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False, max_iterations=6,
                    sink=lambda metrics, version: logged.append(metrics))

    assert str(err.value).startswith("learner stopped at policy version 0 of 3: no progress")
    _stops_without_progress(err, config, 4, "every group uniform (equal rewards, zero advantage)",
                            "uniform groups 100% (8 of 8 groups), stale drops 0% (0 of 16 rollouts), "
                            "masked tokens n/a (no update tokens)")
    assert generator.put == 28 and versions.get() == 0
    assert [m["progress/iterations_without_progress"] for m in logged] == [1, 2, 3, 4]
    assert all(m["progress/uniform_groups_frac"] == 1.0 for m in logged)
    status = [line for line in capsys.readouterr().out.splitlines() if line.startswith("learner: no progress")]
    assert [line.split(" iterations")[0] for line in status] == [f"learner: no progress for {i}" for i in (1, 2, 3)]
    assert all("uniform groups 100%" in line and "stops at 4 (learner.max_iterations_without_progress)" in line
               for line in status)
    assert transport.queue.pending() == []  # the final checkpoint covers the 4 batches: acknowledged


def test_sao_whose_every_token_is_masked_stops_within_the_bound(tmp_path, tiny_model):
    """The generator reports behaviour log-probability 0 (probability 1) for every action token, so pi/pi_behav is
    about 1/1024, far below the DIS band: every token is masked. Each update still publishes a version (a zero
    gradient steps the optimizer), but none trains a token; with the bound at 3 the learner stops at version 3 of
    10 (the batch-normalised advantage: no critic warm-up). Before, it published all 10 versions."""
    from posttrain.learner.liveness import LearnerStopped

    config = _config(tmp_path, "sao").model_copy(deep=True)
    config.sao.steps, config.sao.advantage, config.learner.max_iterations_without_progress = 10, "batch_norm", 3
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    versions = MemoryPolicyVersionStore()
    transport, _ = _transport(tmp_path, config, tiny_model, MemoryStream(),
                              MemoryAdmissionController(versions, batch_size=4, max_staleness=2), versions,
                              behaviour_logprob=0.0)

    with pytest.raises(LearnerStopped) as err:
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)

    assert str(err.value).startswith("learner stopped at policy version 3 of 10: no progress")
    _stops_without_progress(err, config, 3, "every action token masked (staleness bound or DIS band)",
                            "uniform groups n/a (no groups), stale drops 0% (0 of 12 rollouts), "
                            "masked tokens 100% (72 of 72 update tokens)")


@pytest.mark.timeout(120)
def test_sao_whose_every_rollout_is_dropped_as_stale_stops_within_the_bound(tmp_path, tiny_model):
    """tau = 0, B = 4, no critic. The first batch (version 0) trains version 1; then only rollouts of version 0
    arrive (a backlog left by an older learner), each one version too old: all dropped. Each 4 drops count as an
    iteration without progress; with the bound at 3 the learner stops after 12 drops, the version-1 checkpoint
    covering everything it trained. Before, it waited for fresh rollouts forever (here: the test's timeout)."""
    from posttrain.learner.liveness import LearnerStopped

    config = _config(tmp_path, "sao").model_copy(deep=True)
    config.sao.max_staleness, config.sao.checkpoint_every, config.sao.advantage = 0, 1, "batch_norm"
    config.learner.max_iterations_without_progress = 3
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    versions = MemoryPolicyVersionStore()
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(),
                                      MemoryAdmissionController(versions, batch_size=4, max_staleness=0), versions)
    fill = generator.announce

    def announce(version: int) -> None:
        if version == 0:
            return fill(version)
        old = [generator.rollout(k, None, float(k % 2)) for k in range(16)]
        for r in old:
            generator.queue.put(msgspec.structs.replace(r, policy_version=0, turn_policy_versions=[0]))

    transport.announce = announce

    with pytest.raises(LearnerStopped) as err:
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)

    assert str(err.value).startswith("learner stopped at policy version 1 of 3: no progress")
    _stops_without_progress(err, config, 3, "every rollout dropped as stale",
                            "uniform groups n/a (no groups), stale drops 100% (12 of 12 rollouts), "
                            "masked tokens n/a (no update tokens)")


def _gkd_config(tmp_path: Path, tiny_model, teacher_vocab: int | None = None) -> RunConfig:
    """GKD with a teacher of its own (a tiny model of another seed, same tokenizer) and four fixed chat rows:
    batches of 4 = 2 on-policy rollouts (lambda 0.5) + 2 fixed sequences, tau 1, forward KL."""
    import json

    from posttrain.models.hf import build_tiny_model

    teacher = tmp_path / "teacher"
    build_tiny_model(teacher, vocab_size=teacher_vocab or tiny_model.vocab_size, seed=1)
    for f in tiny_model.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy2(f, teacher / f.name)
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Compute {a} + {a}."},
                                                      {"role": "assistant", "content": f"#### {2 * a}"}]}) + "\n"
                             for a in range(4)), encoding="utf-8")
    config = RunConfig.model_validate({
        "output_dir": str(tmp_path / "runs"), "run_name": "loop", "technique": "gkd",
        "queue": {"block_ms": 1, "claim_idle_ms": 60_000},
        "gkd": {"teacher": {"path": str(teacher)}, "lmbda": 0.5, "data_path": str(fixed), "steps": 3, "batch_size": 4,
                "micro_batch_size": 2, "max_staleness": 1, "checkpoint_every": 1, "loss": {"beta": 0.0},
                "optim": {"lr": 1e-3}}})
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    return config


def test_gkd_loop_distils_the_teacher_on_streamed_and_fixed_rows_and_resumes_without_repeating_an_entry(
        tmp_path, tiny_model):
    """lambda 0.5 of batch 4: admission counts the 2 on-policy rollouts per version (tau 1: capacity (v + 2) x 2),
    the learner adds 2 fixed sequences. Stopped after 2 iterations, resumed to version 3: every streamed
    rollout trained once, each batch's metrics show half its rows on-policy, and the distilled student
    is closer to the teacher (forward KL on the scripted sequences) than the start model was."""
    from posttrain.learner.gkd_step import mixed_batch
    from posttrain.losses import DistillLossInputs, generalized_jsd_loss

    config = _gkd_config(tmp_path, tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=2, max_staleness=1)
    stream = MemoryStream()
    logged: list[dict[str, float]] = []
    first, generator = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    stopped = run_learner(config, first, start_model_dir=tiny_model.path, progress=False, max_iterations=2,
                          sink=lambda metrics, version: logged.append(metrics))
    assert (stopped.policy_version, stopped.iterations) == (2, 2)
    second, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    summary = run_learner(config, second, start_model_dir=tiny_model.path, progress=False,
                          sink=lambda metrics, version: logged.append(metrics))

    assert (summary.policy_version, summary.iterations) == (3, 3)
    ids = _trained_entry_ids(config)
    assert len(ids) == len(set(ids)) == 6 and second.queue.pending() == []
    assert [m["gkd/on_policy_share"] for m in logged] == [0.5, 0.5, 0.5]
    assert all(0 < m["gkd/on_policy_token_share"] < 1 and m["loss/gkd"] > 0 for m in logged)
    assert all(k in logged[0] for k in ("gkd/agreement", "gkd/reverse_kl", "staleness/batch_mean", "reward/mean"))
    batch = mixed_batch([generator.rollout(k, None, 0.0) for k in range(4)], [], tiny_model.pad_id, 0)

    def forward_kl(model_dir: Path) -> float:
        with torch.no_grad():
            logits = [load_policy(d).eval()(input_ids=batch.token_ids).logits for d in (model_dir, config.gkd.teacher.path)]
        return generalized_jsd_loss(DistillLossInputs(logits[0], logits[1], batch.token_ids, batch.action_mask),
                                    config.gkd.loss).metrics["gkd/divergence"]

    assert forward_kl(summary.final_model_dir) < forward_kl(tiny_model.path)


def test_gkd_at_lambda_0_distils_on_fixed_sequences_alone_with_no_stream_generator_or_weights_and_resumes(
        tmp_path, tiny_model):
    """gkd.lmbda 0 (supervised KD, which the GKD paper includes): every batch is 4 fixed sequences scored by the
    teacher. The learner runs with no transport at all (no stream, admission, version key or weight store), never
    waits for a rollout, publishes no weights (nobody samples), and a generator refuses to start in one line.
    Stopped after 2 iterations and resumed to version 3: each batch's rows are all fixed, the ledger has 3 lines
    without rollouts, and the student is closer to the teacher on the fixed sequences than the start model.
    Before, gkd.lmbda 0 was refused ("Input should be greater than 0")."""
    import asyncio

    from posttrain.config.load import ConfigError
    from posttrain.config.roles import samples_on_policy
    from posttrain.generator.worker import serve
    from posttrain.learner.gkd_step import load_fixed_sequences, mixed_batch
    from posttrain.losses import DistillLossInputs, generalized_jsd_loss

    base = _gkd_config(tmp_path, tiny_model)
    config = RunConfig.model_validate({**base.model_dump(), "gkd": {**base.gkd.model_dump(), "lmbda": 0.0}})
    assert (config.gkd.on_policy_rows, config.gkd.fixed_rows, samples_on_policy(config)) == (0, 4, False)
    logged: list[dict[str, float]] = []
    stopped = run_learner(config, None, start_model_dir=tiny_model.path, progress=False, max_iterations=2,
                          sink=lambda metrics, version: logged.append(metrics))
    assert (stopped.policy_version, stopped.iterations) == (2, 2)
    summary = run_learner(config, None, start_model_dir=tiny_model.path, progress=False,
                          sink=lambda metrics, version: logged.append(metrics))

    assert (summary.policy_version, summary.iterations) == (3, 3) and summary.counters["rollouts_trained"] == 0
    assert [m["gkd/on_policy_share"] for m in logged] == [0.0, 0.0, 0.0]
    assert all(m["loss/gkd"] > 0 and m["gkd/trained_tokens"] > 0 and "reward/mean" not in m for m in logged)
    assert not any(k.startswith(("queue/", "admission/", "generator/")) for m in logged for k in m)
    assert not RunContext(config).weights_dir.exists()  # nothing published: no generator loads it
    assert [len(line["rollouts"]) for line in read_ledger(RunContext(config).run_dir / LEDGER_NAME)] == [0, 0, 0]
    with pytest.raises(ConfigError, match=r"^gkd.lmbda: 0 trains on fixed sequences only .* start only the learner$"):
        asyncio.run(serve(config, "g0", "redis://127.0.0.1:1", 0))
    with pytest.raises(ValueError, match="takes no transport"):
        run_learner(config, _transport(tmp_path, config, tiny_model, MemoryStream(), MemoryAdmissionController(
            MemoryPolicyVersionStore(), batch_size=1, max_staleness=1), MemoryPolicyVersionStore())[0],
            start_model_dir=tiny_model.path, progress=False)

    from posttrain.models.hf import load_tokenizer

    fixed = load_fixed_sequences(config.gkd.data_path, load_tokenizer(tiny_model.path), max_seq_len=64, limit=None,
                                 on_bad_row="stop", quarantine_path=tmp_path / "q.jsonl")
    batch = mixed_batch([], fixed, tiny_model.pad_id, 0)

    def forward_kl(model_dir: Path) -> float:
        with torch.no_grad():
            logits = [load_policy(d).eval()(input_ids=batch.token_ids).logits for d in (model_dir, config.gkd.teacher.path)]
        return generalized_jsd_loss(DistillLossInputs(logits[0], logits[1], batch.token_ids, batch.action_mask),
                                    config.gkd.loss).metrics["gkd/divergence"]

    assert forward_kl(summary.final_model_dir) < forward_kl(tiny_model.path)


def test_gkd_with_a_teacher_of_another_vocabulary_is_refused_in_one_line_before_anything_is_published(
        tmp_path, tiny_model):
    from posttrain.config.load import ConfigError

    config = _gkd_config(tmp_path, tiny_model, teacher_vocab=tiny_model.vocab_size + 8)
    versions = MemoryPolicyVersionStore()
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(),
                                      MemoryAdmissionController(versions, batch_size=2, max_staleness=1), versions)
    with pytest.raises(ConfigError, match=r"^gkd.teacher.path: the teacher in .* has a vocabulary of \d+ tokens") as err:
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)
    assert "\n" not in str(err.value)
    assert transport.store.latest_version() is None and generator.announced == []


@pytest.mark.parametrize(("advantage", "correction"), [("running_mean", "tis"), ("batch_norm", "none")])
def test_sao_loop_without_a_critic_trains_each_version_with_its_baseline_and_correction(tmp_path, tiny_model, advantage,
                                                                                        correction):
    """The learning race's ablations (b) and (a) through the whole loop (``bench.learning_race``'s quick ``baseline``
    and ``correction`` runs checked this before one quick smoke replaced them): no critic, so no warm-up iteration and
    no critic in the checkpoint; three versions of B = 4 from the alternating rewards, every entry trained once; the
    running-mean baseline's window (the last 8 rewards) is saved with the checkpoint."""
    config = _prepared(tmp_path, "sao", tiny_model).model_copy(deep=True)
    config.sao.advantage, config.sao.loss.correction = advantage, correction
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(), admission, versions)
    logged: list[dict[str, float]] = []

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False,
                          sink=lambda metrics, version: logged.append(metrics))

    assert (summary.policy_version, summary.iterations) == (3, 3)
    assert not any(k.startswith("value/") for m in logged for k in m)
    ids = _trained_entry_ids(config)
    assert len(ids) == len(set(ids)) == 12 and transport.queue.pending() == []
    checkpoint = latest_checkpoint(RunContext(config).checkpoints_dir)
    state = json.loads((checkpoint / "state.json").read_text())["state"]
    assert state["baseline_rewards"] == ([0.0, 1.0] * 4 if advantage == "running_mean" else [])


def test_a_resumed_sao_learner_sets_the_critic_head_bias_once_and_does_not_repeat_the_warm_up(tmp_path, tiny_model):
    """sao.critic.head_bias_init first_batch_mean and 2 critic-only iterations. The scripted rewards alternate
    0, 1, so the first batch's mean is 0.5: only the first run's iteration 0 logs the bias it set (and that
    batch's values start at it). Stopped after 2 iterations (the warm-up), the resumed learner counts on
    from iteration 2: its first iteration already trains the policy, and it never sets the bias again."""
    config = _prepared(tmp_path, "sao", tiny_model)
    config.sao.critic.head_bias_init = "first_batch_mean"
    config.sao.critic.warmup_steps = 2
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    logged: list[dict[str, float]] = []
    first, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    stopped = run_learner(config, first, start_model_dir=tiny_model.path, progress=False, max_iterations=2,
                          sink=lambda metrics, version: logged.append(metrics))
    assert (stopped.policy_version, stopped.iterations) == (0, 2)
    assert [m.get("critic/head_bias_init") for m in logged] == [0.5, None]
    assert logged[0]["value/mean"] == pytest.approx(0.5, abs=0.02)  # at the 2nd of K = 2 updates, from 0.5
    assert all("loss/policy" not in m for m in logged)  # the warm-up trains the critic only

    resumed: list[dict[str, float]] = []
    second, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    summary = run_learner(config, second, start_model_dir=tiny_model.path, progress=False,
                          sink=lambda metrics, version: resumed.append(metrics))
    assert summary.policy_version == 3
    assert len(resumed) == 3 and all("loss/policy" in m for m in resumed)  # no warm-up iteration again
    assert all("critic/head_bias_init" not in m for m in resumed)
