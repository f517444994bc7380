"""Cancelling episodes in flight that the learner can no longer train (``generator.inflight``).

Real asyncio tasks on a real event loop; each "episode" is a coroutine that reports its turns'
policy versions through ``on_turn`` and then waits, as an episode waiting on a tool call does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from posttrain.generator.inflight import InFlightEpisodes


def episode(versions: list[int], result: str, wait: asyncio.Event) -> Callable[[Callable[[int], None]], object]:
    """An episode that samples one turn per version in ``versions``, then waits for ``wait``, then returns ``result``."""

    def start(on_turn: Callable[[int], None]):
        async def go() -> str:
            for v in versions:
                on_turn(v)
                await asyncio.sleep(0)
            await wait.wait()
            return result

        return go()

    return start


def test_abort_cancels_exactly_the_units_past_the_bound() -> None:
    """Learner at 5, tau 2: oldest 0 and 2 are stale (5 - 2 = 3 > 2), oldest 3 is not, no turn yet is unknown."""

    async def go() -> tuple[list[str | None], int, int]:
        running, release = InFlightEpisodes(), asyncio.Event()
        runs = [asyncio.create_task(running.run(episode(vs, name, release)))
                for vs, name in (([4, 0], "a"), ([2], "b"), ([3, 5], "c"), ([], "d"))]
        await asyncio.sleep(0.05)  # every episode has reported its turns and waits on its "tool"
        assert len(running) == 4
        cancelled = running.abort_stale(learner_version=5, max_staleness=2)
        again = running.abort_stale(learner_version=5, max_staleness=2)  # already aborted: not counted twice
        release.set()
        return list(await asyncio.gather(*runs)), cancelled + again, running.aborted_total

    results, cancelled, total = asyncio.run(go())
    assert results == [None, None, "c", "d"]
    assert (cancelled, total) == (2, 2)


def test_a_unit_under_the_bound_is_kept_and_a_finished_one_is_returned() -> None:
    """tau 4 with the learner at 4: an episode of version 0 is exactly at the bound and still trainable."""

    async def go() -> tuple[str | None, str | None, int]:
        running, release = InFlightEpisodes(), asyncio.Event()
        done = asyncio.Event()
        done.set()
        kept = asyncio.create_task(running.run(episode([0], "kept", release)))
        finished = await running.run(episode([0], "finished", done))
        await asyncio.sleep(0.01)
        n = running.abort_stale(learner_version=4, max_staleness=4)
        release.set()
        return await kept, finished, n + len(running)

    kept, finished, rest = asyncio.run(go())
    assert (kept, finished, rest) == ("kept", "finished", 0)


def test_a_group_is_as_old_as_its_oldest_member() -> None:
    """Two members report versions 3 and 1 through one callback: the unit's oldest is 1, stale at 4 with tau 2."""

    async def go() -> str | None:
        running, release = InFlightEpisodes(), asyncio.Event()

        def start(on_turn: Callable[[int], None]):
            async def member(v: int) -> str:
                on_turn(v)
                await release.wait()
                return "member"

            async def group() -> str:
                return "/".join(await asyncio.gather(member(3), member(1)))

            return group()

        task = asyncio.create_task(running.run(start))
        await asyncio.sleep(0.01)
        assert running.abort_stale(learner_version=4, max_staleness=2) == 1
        return await task

    assert asyncio.run(go()) is None


def test_cancelling_the_caller_cancels_the_unit_and_raises() -> None:
    """A stopping generator cancels its slots: ``run`` raises CancelledError (not None) and the episode stops too."""

    async def go() -> tuple[bool, bool]:
        running, never = InFlightEpisodes(), asyncio.Event()
        state = {"cancelled": False}

        def start(on_turn: Callable[[int], None]):
            async def go_on() -> str:
                on_turn(0)
                try:
                    await never.wait()
                except asyncio.CancelledError:
                    state["cancelled"] = True
                    raise
                return "never"

            return go_on()

        slot = asyncio.create_task(running.run(start))
        await asyncio.sleep(0.01)
        running.abort_stale(learner_version=10, max_staleness=0)  # aborted and stopped at once
        slot.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slot
        return state["cancelled"], slot.cancelled()

    assert asyncio.run(go()) == (True, True)


def test_errors_of_the_unit_propagate() -> None:
    async def go() -> None:
        def start(on_turn: Callable[[int], None]):
            async def boom() -> str:
                raise ValueError("engine returned a malformed result")

            return boom()

        await InFlightEpisodes().run(start)

    with pytest.raises(ValueError, match="malformed"):
        asyncio.run(go())


@pytest.mark.parametrize(("overrides", "cancels"), [
    ([], False),  # sao.staleness_rule: token (the default): later turns are fresh, nothing is cancelled
    (["sao.staleness_rule=episode"], True),
    (["sao.staleness_rule=episode", "generator.abort_stale_episodes=false"], False),
    (["technique=grpo", "grpo.async=true", "grpo.loss.dis_mask=true"], True),  # groups keep the episode rule
])
def test_generators_cancel_old_episodes_only_under_the_episode_rule(overrides, cancels):
    from posttrain.config import load_config
    from posttrain.generator.worker import abort_stale_episodes

    assert abort_stale_episodes(load_config(None, overrides)) is cancels


def test_a_cancelled_unit_reports_the_turns_it_had_sampled() -> None:
    """Three turns (versions 0, 1, 1), cancelled at learner 4 with tau 2: ``on_abort(3)``; a kept one reports nothing."""

    async def go() -> tuple[list[int], list[str | None]]:
        running, release, seen = InFlightEpisodes(), asyncio.Event(), []
        runs = [asyncio.create_task(running.run(episode(vs, name, release), on_abort=seen.append))
                for vs, name in (([0, 1, 1], "old"), ([3], "new"))]
        await asyncio.sleep(0.05)
        running.abort_stale(learner_version=4, max_staleness=2)
        release.set()
        return seen, list(await asyncio.gather(*runs))

    seen, results = asyncio.run(go())
    assert seen == [3] and results == [None, "new"]


def test_generator_stats_count_cancelled_episodes_by_tool_call_bucket() -> None:
    from posttrain.inference.metering import GeneratorStats

    stats = GeneratorStats()
    for calls, bucket in ((1, "0-2"), (9, "9+"), (12, "9+")):
        stats.episode_aborted(calls, bucket)
    snap = stats.snapshot()
    assert (snap["stale_aborted_calls_0-2"], snap["stale_aborted_calls_9+"], snap["stale_aborted_calls_sum"]) == (
        1.0, 2.0, 22.0)
