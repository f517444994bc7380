"""The OpenAI-compatible judge client against a loopback HTTP server started by the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.fake_openai_judge import FakeJudge
from posttrain.eval.grading import (
    JUDGE_PROMPT,
    GradeResult,
    JudgeClient,
    JudgeError,
    resolve_with_judge,
)


@pytest.fixture()
def fake_judge() -> Iterator[FakeJudge]:
    fake = FakeJudge()
    yield fake
    fake.close()


NEEDS = GradeResult(status="needs_judge", method="none", reason="reference_needs_judge", extracted="all odd n")


def test_judge_correct_verdict_grades_needs_judge_sample_correct(fake_judge: FakeJudge) -> None:
    fake_judge.script = [(200, "Both describe the odd integers.\nVERDICT: CORRECT")]
    client = JudgeClient(fake_judge.url, "judge-model", api_key="sekrit")
    r = resolve_with_judge(NEEDS, client, problem="Find all n.", reference="odd $n$", response="... \\boxed{all odd n}")
    assert (r.status, r.method) == ("correct", "judge")
    assert "VERDICT: CORRECT" in r.judge_reply
    headers, body = fake_judge.requests[0]
    assert body["path"] == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sekrit"
    assert body["model"] == "judge-model" and body["temperature"] == 0.0
    content = body["messages"][0]["content"]
    assert "Find all n." in content and "odd $n$" in content and "all odd n" in content
    assert content.endswith("VERDICT: INCORRECT")  # the prompt's last line names both verdicts


def test_judge_incorrect_verdict_and_last_verdict_wins(fake_judge: FakeJudge) -> None:
    fake_judge.script = [(200, "At first VERDICT: CORRECT, but n=1 is missing.\nVERDICT: INCORRECT")]
    r = resolve_with_judge(NEEDS, JudgeClient(fake_judge.url, "m"), problem="p", reference="r", response="x")
    assert r.status == "wrong"


def test_judge_server_error_is_retried_then_succeeds(fake_judge: FakeJudge) -> None:
    fake_judge.script = [(500, "boom"), (200, "VERDICT: CORRECT")]
    client = JudgeClient(fake_judge.url, "m", max_retries=2, retry_backoff_s=0.0)
    assert client.judge(problem="p", reference="r", response="x", extracted=None).correct
    assert len(fake_judge.requests) == 2


def test_judge_without_verdict_leaves_sample_needs_judge(fake_judge: FakeJudge) -> None:
    fake_judge.script = [(200, "I think it is probably fine.")]
    r = resolve_with_judge(NEEDS, JudgeClient(fake_judge.url, "m"), problem="p", reference="r", response="x")
    assert r.status == "needs_judge" and r.reason.startswith("judge_failed")


def test_judge_client_error_is_not_retried(fake_judge: FakeJudge) -> None:
    fake_judge.script = [(400, "bad request")]
    with pytest.raises(JudgeError, match="HTTP 400"):
        JudgeClient(fake_judge.url, "m", retry_backoff_s=0.0).judge(problem="p", reference="r", response="x", extracted=None)
    assert len(fake_judge.requests) == 1


def test_unreachable_judge_fails_after_bounded_retries() -> None:
    client = JudgeClient("http://127.0.0.1:9/v1", "m", max_retries=1, retry_backoff_s=0.0, timeout_s=2.0)
    with pytest.raises(JudgeError, match="after 2 attempts"):
        client.judge(problem="p", reference="r", response="x", extracted=None)


def test_graded_results_never_reach_the_judge(fake_judge: FakeJudge) -> None:
    done = GradeResult(status="wrong", method="math_verify", reason="mismatch", extracted="3")
    assert resolve_with_judge(done, JudgeClient(fake_judge.url, "m"), problem="p", reference="r", response="x") is done
    assert fake_judge.requests == []


def test_prompt_shows_only_the_tail_of_a_long_response() -> None:
    client = JudgeClient("http://127.0.0.1:1/v1", "m", response_chars=100)
    prompt = client.prompt(problem="p", reference="r", response="A" * 500 + "THE END", extracted="7")
    assert "[...]" in prompt and "THE END" in prompt and "A" * 200 not in prompt
    assert set(JUDGE_PROMPT.split("{")[1:]) and "{problem}" in JUDGE_PROMPT
