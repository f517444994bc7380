"""The learner against poisoned entries, ticketless entries, lost admission counters and lost generator positions.

Issue 23, items 7, 15, 17 and 18.

Same harness as ``test_loop.py``: the real learner loop in one process on the in-memory queue,
admission and version key, fed by its scripted generator (tiny model, B = 4).

Run: ``python -m pytest -q tests/unit/learner/test_learner_faults.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import redis
from test_loop import _prepared, _trained_entry_ids, _transport

from posttrain.config import RunConfig
from posttrain.learner.checkpoint import latest_checkpoint
from posttrain.learner.loop import run_learner
from posttrain.learner.setup import LearnerTransport
from posttrain.rollout.admission import MemoryAdmissionController
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryStream
from posttrain.rollout.positions import read_positions, restore_positions
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis


def test_an_out_of_vocabulary_entry_is_dead_lettered_and_the_learner_goes_on(tmp_path, tiny_model):
    """The audit's crash loop: one rollout with token id vocab + 100 put with a ticket, as a generator would.

    Before: ``IndexError: index out of range in self`` in the forward pass, the entry left pending.
    Now: it is dead-lettered with the reason, its admission place comes back (refunded 4 warm-up + 1),
    and the run trains its 3 versions on 16 other rollouts.

    The same run gets one rollout marked ``outcome="infra_error"`` (issue 32: its sandbox died; a producer
    sent it anyway), with a ticket: dropped on arrival (ledger reason ``infra_error: tool_killed``, its
    entry id), never trained, its place refunded (+1), counted apart from stale drops.
    """
    import msgspec

    config = _prepared(tmp_path, "sao", tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    transport, generator = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    poison = generator.rollout(0, None, reward=1.0)
    poison.token_ids[3] = tiny_model.vocab_size + 100
    failed = msgspec.structs.replace(generator.rollout(1, None, 0.0), outcome="infra_error", infra_cause="tool_killed")
    put = []
    for rollout in (poison, failed):
        ticket = admission.acquire(0)
        assert ticket is not None
        put.append(generator.queue.put(rollout))
        admission.consume(ticket)
    poison_id, failed_id = put

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)

    assert summary.policy_version == 3
    ids = _trained_entry_ids(config)
    assert len(ids) == len(set(ids)) == 16 and poison_id not in ids and failed_id not in ids
    [dead] = transport.queue.dead_letters()
    assert dead.original_id == poison_id
    assert dead.reason == (f"token_ids[3]: id {tiny_model.vocab_size + 100} is outside the model's vocabulary "
                           f"(vocab_size {tiny_model.vocab_size})")
    lines = [json.loads(x) for x in (RunContext(config).run_dir / "learner_ledger.jsonl").read_text().splitlines()]
    dropped = [d for line in lines for d in line["dropped"]]
    assert [(d["entry_id"], d["reason"]) for d in dropped] == [(failed_id, "infra_error: tool_killed")]
    assert (summary.counters["infra_dropped"], summary.counters["stale_dropped"]) == (1, 0)
    assert admission.state().refunded_total == 4 + 1 + 1
    assert transport.queue.pending() == []


def test_entries_without_admission_tickets_do_not_crash_the_warmup_refund(tmp_path, tiny_model):
    """4 entries from a producer outside admission; the critic warm-up batch refunds 4 with nothing consumed.

    Before: ``ValueError: count: must be in [0, consumed=0], got 4`` killed the learner. Now the
    refund is counted as unticketed and the iteration is recorded.
    """
    config = _prepared(tmp_path, "sao", tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    transport, generator = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    transport.announce = lambda version: None  # no generator: only the external producer
    for k in range(4):
        generator.queue.put(generator.rollout(k, None, reward=float(k % 2)))

    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False, max_iterations=1)

    assert summary.iterations == 1
    state = admission.state()
    assert (state.consumed, state.refunded_total, state.unticketed_total) == (0, 0, 4)


def _fresh_transport(tmp_path: Path, config: RunConfig, tiny_model) -> tuple[LearnerTransport, MemoryAdmissionController]:
    """A new stream, admission counters and version key: what a Redis recreated with an emptyDir holds."""
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=1)
    transport, _ = _transport(tmp_path, config, tiny_model, MemoryStream(), admission, versions)
    return transport, admission


def test_a_learner_resumed_on_a_fresh_redis_wastes_no_rollouts_as_stale(tmp_path, tiny_model):
    """Audit row 4c at small scale: B = 4, tau = 1, checkpoint every 2 versions; stop at version 4, resume on fresh state.

    On fresh counters capacity at version 4 is (4 + 1 + 1) x 4 = 24 rollouts against 0 consumed: the
    generator starts 24 at once, 16 more than tau allows, and the learner then drops the ones that
    fall more than 1 version behind (measured before the fix: ``stale_dropped`` 16, against 16
    trained). Re-based, the counters hold 4 x 4 = 16 consumed: 8 start, and nothing is dropped over
    versions 5-8.
    """
    config = _prepared(tmp_path, "sao", tiny_model)
    config = RunConfig.model_validate({**config.model_dump(), "sao": {
        **config.sao.model_dump(), "steps": 8, "max_staleness": 1, "checkpoint_every": 2}})
    first, _ = _fresh_transport(tmp_path, config, tiny_model)
    stopped = run_learner(config, first, start_model_dir=tiny_model.path, progress=False, max_iterations=5)
    assert stopped.policy_version == 4 and stopped.counters["stale_dropped"] == 0

    second, admission = _fresh_transport(tmp_path, config, tiny_model)
    summary = run_learner(config, second, start_model_dir=tiny_model.path, progress=False)

    assert summary.policy_version == 8
    assert summary.counters["stale_dropped"] == 0
    assert admission.state().rebased_total == 16
    assert second.queue.pending() == []


def test_a_resume_on_the_same_redis_is_not_rebased(tmp_path, tiny_model):
    """Counters that survived (same stream, admission, key) are left alone: re-basing them would starve generators."""
    config = _prepared(tmp_path, "sao", tiny_model)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    first, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    run_learner(config, first, start_model_dir=tiny_model.path, progress=False, max_iterations=2)
    second, _ = _transport(tmp_path, config, tiny_model, stream, admission, versions)
    summary = run_learner(config, second, start_model_dir=tiny_model.path, progress=False)
    assert summary.policy_version == 3 and admission.state().rebased_total == 0


def test_a_learner_resumed_on_a_fresh_redis_gives_the_generators_their_positions_back(tmp_path, tiny_model):
    """Item 18 on a fresh Redis, the learner's side. The positions live in a real Valkey (the rest in memory).

    Generators 0 and 3 have reserved 64 and 128 episode counters. The learner checkpoints at
    version 2 (1 warm-up + 2 iterations) with ``{"0": 64, "3": 128}``; then the server loses its
    data (FLUSHALL). The resumed learner writes both positions back before it first sets the
    version key (the key generators wait for before they reserve), and its final checkpoint keeps
    them. Before the fix the checkpoint held no positions and the hash stayed empty.
    """
    config = _prepared(tmp_path, "sao", tiny_model)
    config = RunConfig.model_validate({**config.model_dump(), "sao": {
        **config.sao.model_dump(), "steps": 4, "checkpoint_every": 2}})
    ctx = RunContext(config)
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)

        def transport() -> LearnerTransport:
            t, _ = _fresh_transport(tmp_path, config, tiny_model)
            t.read_positions = lambda: read_positions(client, ctx.keys)
            t.restore_positions = lambda positions: restore_positions(client, ctx.keys, positions)
            return t

        client.hset(ctx.keys.generator_positions, mapping={"0": 64, "3": 128})
        stopped = run_learner(config, transport(), start_model_dir=tiny_model.path, progress=False, max_iterations=3)
        assert stopped.policy_version == 2
        saved = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())["state"]
        assert saved["generator_positions"] == {"0": 64, "3": 128}

        client.flushall()  # the Redis pod recreated on an empty emptyDir
        second = transport()
        at_version_key: list[dict[str, int]] = []
        set_version = second.versions.set

        def set_and_record(version: int) -> None:
            at_version_key.append(read_positions(client, ctx.keys))
            set_version(version)

        second.versions.set = set_and_record  # type: ignore[method-assign]
        summary = run_learner(config, second, start_model_dir=tiny_model.path, progress=False)

        assert summary.policy_version == 4
        assert at_version_key[0] == {"0": 64, "3": 128}  # restored before generators may reserve
        assert read_positions(client, ctx.keys) == {"0": 64, "3": 128}
        final = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())["state"]
        assert final["generator_positions"] == {"0": 64, "3": 128}


@pytest.mark.parametrize("starts_empty", [True, False], ids=["embedded-server", "external-redis"])
def test_a_resume_on_the_runs_own_embedded_redis_is_an_info_line_an_external_redis_that_lost_its_data_a_warning(
        tmp_path, tiny_model, caplog, starts_empty):
    """A learner resumed at version 3 finds the admission counters at 0 and the generators' positions gone.

    On the embedded server ``posttrain run`` starts for the call, that is by design (it starts empty on every
    run): a resumed ``make demo`` printed two warnings "(a fresh Redis?)" on the console. Now they are info
    lines of the run log (the console shows WARNING and above), saying so. On an external Redis the same
    finding means the server lost its data: still two warnings."""
    from posttrain.learner.setup import guard_transport
    from posttrain.models.hf import load_policy

    config = _prepared(tmp_path, "sao", tiny_model)
    transport, admission = _fresh_transport(tmp_path, config, tiny_model)
    transport.restore_positions = lambda positions: sorted(positions)  # the emptied hash: every index raised
    transport.starts_empty = starts_empty
    with caplog.at_level(logging.INFO, logger="posttrain.learner"):
        guard_transport(config, transport, load_policy(tiny_model.path), 3, {"0": 64})

    records = [r for r in caplog.records if r.name == "posttrain.learner"]
    assert admission.state().rebased_total == 3 * 4 and len(records) == 2
    assert [r.levelno for r in records] == [logging.INFO if starts_empty else logging.WARNING] * 2
    why = "the run's embedded Redis starts empty on a resume" if starts_empty else "an external server that lost its data"
    assert all(why in r.getMessage() for r in records)


def test_a_learner_killed_between_a_drop_and_its_ledger_line_loses_no_dropped_entry_nor_its_count(
        tmp_path, tiny_model, monkeypatch):
    """Issue 32 (the audit's kill of every role, its learner half). B = 4, tau = 1, checkpoint at v2 and v4.

    When v2 is announced, 4 rollouts of version 0 arrive (with tickets) behind the v1 ones; the
    iteration at learner v3 reads them (lag 3 > 1) and drops them, then the learner dies before
    its ledger line (the train step raises, as a SIGKILL there would). A new learner resumes from
    the v2 checkpoint on the same stream and finishes.

    Before the fix the 4 were acknowledged at once: acked, in no ledger line, and ``stale_dropped``
    ended 0 (the checkpoint's count). Now they stay pending until the checkpoint covering their line:
    the second life drops them again, every acknowledged entry is in the ledger, ``stale_dropped``
    is 4, and their admission places came back once (4 warm-up + 4 refunds, not 12)."""
    import msgspec

    from posttrain.learner.setup import Learner
    from posttrain.rollout.queue import ROLLOUT_ID_FIELD

    config = _prepared(tmp_path, "sao", tiny_model)
    config = RunConfig.model_validate({**config.model_dump(), "sao": {
        **config.sao.model_dump(), "steps": 4, "max_staleness": 1, "checkpoint_every": 2}})
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=1)
    stream = MemoryStream()

    def transport() -> LearnerTransport:
        t, generator = _transport(tmp_path, config, tiny_model, stream, admission, versions)
        fill = generator.announce

        def announce(version: int) -> None:
            if version == 2 and not stale:
                for k in range(4):
                    ticket = admission.acquire(0)
                    assert ticket is not None
                    old = msgspec.structs.replace(generator.rollout(100 + k, None, 0.0), policy_version=0,
                                                  turn_policy_versions=[0])
                    stale.append(generator.queue.put(old))
                    admission.consume(ticket)
            fill(version)

        t.announce = announce
        return t

    stale: list[str] = []
    train = Learner.train

    def die_after_a_drop(self: Learner, entries):  # the first life dies with drops not yet in a ledger line
        if self.source.drops._for_ledger:
            raise RuntimeError("SIGKILL")
        return train(self, entries)

    monkeypatch.setattr(Learner, "train", die_after_a_drop)
    try:
        run_learner(config, transport(), start_model_dir=tiny_model.path, progress=False)
        raise AssertionError("the first life was to die")
    except RuntimeError as exc:
        assert str(exc) == "SIGKILL"
    monkeypatch.setattr(Learner, "train", train)
    summary = run_learner(config, transport(), start_model_dir=tiny_model.path, progress=False)

    assert summary.policy_version == 4 and len(stale) == 4
    lines = [json.loads(x) for x in (RunContext(config).run_dir / "learner_ledger.jsonl").read_text().splitlines()]
    in_ledger = {r["rollout_id"] for line in lines for r in line["rollouts"] + line["dropped"]}
    delivered = [seq for seq in stream.entries if seq <= stream.last_delivered]
    acked = [seq for seq in delivered if seq not in stream.pel]
    acked_rollouts = {stream.entries[seq][ROLLOUT_ID_FIELD].decode() for seq in acked}
    assert acked and acked_rollouts <= in_ledger, f"acked but in no ledger line: {acked_rollouts - in_ledger}"
    assert stream.pel == {}  # the last checkpoint acknowledged the second drops too
    assert summary.counters["stale_dropped"] == 4
    assert admission.state().refunded_total == 4 + 4


def test_a_run_whose_infra_failure_share_passes_the_bound_stops_with_one_line_after_a_checkpoint(tmp_path, tiny_model):
    """``generator.max_infra_error_share=0.25`` over at least 4 episodes. When v1 is announced 8 episodes
    have failed for the infrastructure (4 grader_killed, 4 tool_killed) and the generator then sends
    its 8 more (20 completed): 8 of 28 is 29%. The learner checkpoints the 2 iterations it trained and
    stops with one line naming the share, the setting and the causes (exit 1)."""
    from posttrain.learner.liveness import LearnerStopped
    from posttrain.rollout.admission import ReissuedTask

    config = _prepared(tmp_path, "sao", tiny_model)
    config = RunConfig.model_validate({**config.model_dump(), "generator": {
        **config.generator.model_dump(), "max_infra_error_share": 0.25, "infra_min_episodes": 4}})
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    transport, generator = _transport(tmp_path, config, tiny_model, MemoryStream(), admission, versions)

    def announce(version: int) -> None:
        for cause in ("grader_killed", "tool_killed") * 4 if version == 1 else ():
            ticket = admission.acquire(0)
            assert ticket is not None
            admission.release_infra(ticket, cause, ReissuedTask("t0", 1, cause))
        generator.announce(version)

    transport.announce = announce
    try:
        run_learner(config, transport, start_model_dir=tiny_model.path, progress=False)
        raise AssertionError("the run was to stop")
    except LearnerStopped as exc:
        message, code = str(exc), exc.exit_code
    assert code == 1 and "\n" not in message
    assert message.startswith("learner stopped at policy version ")
    assert message.startswith("learner stopped at policy version 1 of 3: 8 of 28 finished episodes failed for the "
                              "infrastructure (grader_killed 4, tool_killed 4): 29% > "
                              "generator.max_infra_error_share=0.25; stopped after a final checkpoint"), message
    saved = json.loads((latest_checkpoint(RunContext(config).checkpoints_dir) / "state.json").read_text())["state"]
    assert saved["iteration"] == 2
