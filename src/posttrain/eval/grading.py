"""Math answer grading for evaluation: math-verify with a timeout, a "needs judge" outcome, an LLM judge.

``grade_math`` turns ``posttrain.envs.math.verify.verify_answer`` into one of three outcomes:

* ``correct`` / ``wrong``: decided by exact number comparison or math-verify, or by an exact
  (whitespace-normalised) string match with a prose reference;
* ``needs_judge``: the reference is prose or a set of functions math-verify cannot compare
  ("all odd $n$", "$f(x)=x+c$ for some $c$"), math-verify timed out or failed, or (for
  benchmarks that allow prose answers) the response's answer does not parse. Such a sample is
  never silently scored wrong: reports list it separately and keep it out of the scores.

An optional judge model behind any OpenAI-compatible ``/v1/chat/completions`` endpoint grades
the "needs judge" samples (``JudgeClient``) with the prompt ``JUDGE_PROMPT`` written for this
project (documented in ``docs/evaluation.md``). The judge sees the problem, the reference answer
and the end of the response, and must finish with ``VERDICT: CORRECT`` or ``VERDICT: INCORRECT``;
any other reply leaves the sample "needs judge".

Run: ``python -m posttrain.eval.grading RESPONSE REFERENCE`` grades one answer by hand.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.request
from typing import Literal

import msgspec

from posttrain.envs.math.answers import AnswerStyle, reference_is_prose
from posttrain.envs.math.verifier_pool import MathVerifier
from posttrain.envs.math.verify import VerifyResult, verify_answer

log = logging.getLogger(__name__)

GradeStatus = Literal["correct", "wrong", "needs_judge"]

JUDGE_API_KEY_ENV = "POSTTRAIN_JUDGE_API_KEY"
"""Environment variable holding the judge endpoint's bearer token (optional)."""

JUDGE_PROMPT = """You are grading the final answer of a solution to a competition mathematics problem.

Problem:
{problem}

Reference answer (correct):
{reference}

End of the candidate's response:
{response}

Candidate's marked final answer: {extracted}

Decide whether the candidate's final answer is mathematically equivalent to the reference answer.
- Grade only the final answer, not the reasoning or its style.
- Equivalent forms count as correct: a reordered set or list, an algebraically equal expression,
  the same family of functions with differently named parameters, a condition stated in other words
  that selects exactly the same objects.
- A final answer that selects more or fewer objects than the reference (a missing case, an extra
  solution, a missing or wrong condition on a parameter) is incorrect.
- No final answer, or several final answers that disagree, is incorrect.

Think briefly, then end your reply with exactly one line, either
VERDICT: CORRECT
or
VERDICT: INCORRECT"""
"""The judge prompt (our own wording). Placeholders: problem, reference, response, extracted."""

_VERDICT_RE = re.compile(r"VERDICT:\s*(CORRECT|INCORRECT)\b")


class GradeResult(msgspec.Struct, kw_only=True, frozen=True):
    """How one response was graded.

    Attributes:
        status: ``correct``, ``wrong`` or ``needs_judge`` (not graded; never counted as wrong).
        method: What decided it: ``exact_number``, ``math_verify``, ``exact_match`` (prose reference
            copied exactly), ``judge``, ``no_answer`` or ``none`` (still needs a judge).
        reason: The verifier's reason code (``verified``, ``mismatch``, ``reference_needs_judge``,
            ``answer_unparsable``, ``timeout``...) or the judge's outcome.
        extracted: The final answer found in the response, or None.
        judge_reply: The judge's reply text when a judge decided (kept for audit), else "".
    """

    status: GradeStatus
    method: str
    reason: str
    extracted: str | None = None
    judge_reply: str = ""

    @property
    def correct(self) -> bool | None:
        """True / False when graded, None when it still needs a judge."""
        return None if self.status == "needs_judge" else self.status == "correct"


def grade_from_verify(result: VerifyResult, *, unparsable_answer_needs_judge: bool = False) -> GradeResult:
    """Map a ``VerifyResult`` to a ``GradeResult`` (the policy of this module, in one place).

    ================================  ==========================================================
    verifier reason                   outcome
    ================================  ==========================================================
    exact_number                      correct / wrong (exact rational comparison)
    verified / mismatch               correct / wrong (math-verify); but needs_judge when
                                      ``unparsable_answer_needs_judge`` and the answer is prose
                                      (math-verify then compares a number picked out of a
                                      sentence: "1 if isosceles, otherwise 2" "equals" 2)
    no_answer                         wrong (the prompt asks for a marked final answer)
    reference_needs_judge             correct if the answer equals the reference text exactly,
                                      else needs_judge
    answer_unparsable                 needs_judge when ``unparsable_answer_needs_judge``, else wrong
    timeout / error                   correct on an exact text match, else needs_judge
    ================================  ==========================================================

    Raises:
        ValueError: an unknown verifier reason (a newer verifier than this mapping knows).
    """
    r, x = result.reason, result.extracted
    if r == "exact_number":
        return GradeResult(status="correct" if result.correct else "wrong", method="exact_number", reason=r, extracted=x)
    if r in ("verified", "mismatch"):
        if unparsable_answer_needs_judge and x is not None and reference_is_prose(x.replace("$", "")):
            return GradeResult(status="needs_judge", method="none", reason="answer_is_prose", extracted=x)
        return GradeResult(status="correct" if result.correct else "wrong", method="math_verify", reason=r, extracted=x)
    if r == "no_answer":
        return GradeResult(status="wrong", method="no_answer", reason=r, extracted=x)
    if r in ("reference_needs_judge", "timeout", "error"):
        if result.correct:
            return GradeResult(status="correct", method="exact_match", reason=r, extracted=x)
        return GradeResult(status="needs_judge", method="none", reason=r, extracted=x)
    if r == "answer_unparsable":
        if unparsable_answer_needs_judge:
            return GradeResult(status="needs_judge", method="none", reason=r, extracted=x)
        return GradeResult(status="wrong", method="math_verify", reason=r, extracted=x)
    raise ValueError(f"reason: unknown verifier reason {r!r}")


def grade_math(
    response: str,
    reference: str,
    *,
    answer_style: AnswerStyle = "boxed",
    unparsable_answer_needs_judge: bool = False,
    timeout_s: float = 5.0,
    verifier: MathVerifier | None = None,
) -> GradeResult:
    """Grade one response's final answer against a reference answer (no judge).

    Args:
        response: The assistant's full text.
        reference: The gold answer (LaTeX or text).
        answer_style: Where the final answer sits (``boxed``, ``hashes``, ``auto``).
        unparsable_answer_needs_judge: Report answers math-verify cannot parse as "needs judge".
        timeout_s: math-verify deadline for this answer (seconds); overrunning gives "needs judge".
        verifier: math-verify worker pool; the process-wide one when None.

    Raises:
        TypeError, ValueError: as ``verify_answer`` (non-string input, bad style or timeout).
        posttrain.envs.math.verifier_pool.VerifierError: the math-verify worker could not start.
    """
    result = verify_answer(response, reference, style=answer_style, timeout_s=timeout_s, verifier=verifier)
    return grade_from_verify(result, unparsable_answer_needs_judge=unparsable_answer_needs_judge)


class JudgeError(RuntimeError):
    """The judge endpoint failed or replied without a verdict; the message says which."""


class JudgeVerdict(msgspec.Struct, kw_only=True, frozen=True):
    """A judge model's decision.

    Attributes:
        correct: The judge's verdict.
        reply: The judge's full reply text (kept for audit in the report).
    """

    correct: bool
    reply: str


class JudgeClient:
    """Grades answers with a judge model behind an OpenAI-compatible chat-completions endpoint.

    Uses ``urllib`` (no extra dependency), temperature 0, and ``JUDGE_PROMPT``.

    Args:
        base_url: Endpoint root including ``/v1`` (``http://judge:8000/v1``); ``/chat/completions`` is appended.
        model: Model name sent in the request.
        api_key: Bearer token; None reads ``POSTTRAIN_JUDGE_API_KEY`` (no header when unset).
        timeout_s: Per-request socket timeout (seconds).
        max_retries: Extra attempts after a connection error or HTTP 5xx/429 (bounded; 4xx fails at once).
        retry_backoff_s: Sleep before retry i is ``retry_backoff_s * 2**i`` (seconds).
        max_tokens: Tokens the judge may write.
        response_chars: Only the last this many characters of a response are shown (the final answer is at the end).

    Raises:
        ValueError: ``base_url`` not http(s), or a negative ``max_retries``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        retry_backoff_s: float = 1.0,
        max_tokens: int = 1024,
        response_chars: int = 6000,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge base_url: must start with http:// or https://, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries: must be >= 0, got {max_retries}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get(JUDGE_API_KEY_ENV)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.max_tokens = max_tokens
        self.response_chars = response_chars

    def prompt(self, *, problem: str, reference: str, response: str, extracted: str | None) -> str:
        """The filled-in ``JUDGE_PROMPT`` (the response cut to its last ``response_chars`` characters)."""
        tail = response[-self.response_chars :]
        if len(response) > self.response_chars:
            tail = "[...]\n" + tail
        return JUDGE_PROMPT.format(
            problem=problem.strip(),
            reference=reference.strip(),
            response=tail.strip(),
            extracted=extracted if extracted is not None else "(none marked)",
        )

    def _post(self, body: bytes) -> dict[str, object]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                    parsed = json.loads(reply.read().decode("utf-8"))
                    if not isinstance(parsed, dict):
                        raise JudgeError(f"judge {self.url}: reply is not a JSON object")
                    return parsed
            except urllib.error.HTTPError as exc:
                if exc.code < 500 and exc.code != 429:
                    raise JudgeError(f"judge {self.url}: HTTP {exc.code} {exc.reason}") from exc
                last = exc
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last = exc
            except json.JSONDecodeError as exc:
                raise JudgeError(f"judge {self.url}: reply is not JSON ({exc.msg})") from exc
            log.warning("judge %s attempt %d/%d failed: %s", self.url, attempt + 1, self.max_retries + 1, last)
        raise JudgeError(f"judge {self.url}: no answer after {self.max_retries + 1} attempts: {last}")

    def judge(self, *, problem: str, reference: str, response: str, extracted: str | None) -> JudgeVerdict:
        """Ask the judge whether the response's final answer matches the reference.

        Raises:
            JudgeError: the endpoint failed after the retries, replied with an unexpected
                shape, or its reply has no ``VERDICT:`` line.
        """
        body = json.dumps(
            {
                "model": self.model,
                "messages": [
                    {
                        "role": "user",
                        "content": self.prompt(
                            problem=problem, reference=reference, response=response, extracted=extracted
                        ),
                    }
                ],
                "temperature": 0.0,
                "max_tokens": self.max_tokens,
            }
        ).encode("utf-8")
        reply = self._post(body)
        try:
            content = reply["choices"][0]["message"]["content"]  # type: ignore[index]
        except (KeyError, IndexError, TypeError) as exc:
            raise JudgeError(f"judge {self.url}: reply has no choices[0].message.content") from exc
        if not isinstance(content, str):
            raise JudgeError(f"judge {self.url}: message content is not text")
        verdicts = _VERDICT_RE.findall(content)
        if not verdicts:
            raise JudgeError(f"judge {self.url}: no 'VERDICT: CORRECT|INCORRECT' line in reply {content[-200:]!r}")
        return JudgeVerdict(correct=verdicts[-1] == "CORRECT", reply=content)


def resolve_with_judge(
    result: GradeResult, judge: JudgeClient | None, *, problem: str, reference: str, response: str
) -> GradeResult:
    """Grade a "needs judge" result with the judge; other results are returned unchanged.

    A judge failure is logged and leaves the result "needs judge" with the failure as its reason
    (the sample stays out of the scores, it is not scored wrong).
    """
    if result.status != "needs_judge" or judge is None:
        return result
    try:
        verdict = judge.judge(problem=problem, reference=reference, response=response, extracted=result.extracted)
    except JudgeError as exc:
        log.warning("judge failed, sample stays 'needs judge': %s", exc)
        return GradeResult(status="needs_judge", method="none", reason=f"judge_failed: {exc}"[:300], extracted=result.extracted)
    return GradeResult(
        status="correct" if verdict.correct else "wrong",
        method="judge",
        reason=f"judge after {result.reason}",
        extracted=result.extracted,
        judge_reply=verdict.reply[-2000:],
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: grade ``RESPONSE`` against ``REFERENCE`` and print the result."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m posttrain.eval.grading RESPONSE REFERENCE", file=sys.stderr)
        return 2
    print(grade_math(args[0], args[1], answer_style="auto", unparsable_answer_needs_judge=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
