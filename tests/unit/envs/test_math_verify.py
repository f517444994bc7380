"""Answer extraction and math-verify checking: correctness, judge flags, threads, asyncio, timeouts, garbage.

The verifier runs math-verify in a worker subprocess (real math-verify, no mocks); one pool is
shared by the module and closed at the end.
"""

from __future__ import annotations

import asyncio
import csv
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from posttrain.envs.math.answers import extract_answer, reference_is_prose
from posttrain.envs.math.verifier_pool import MathVerifier
from posttrain.envs.math.verify import averify_answer, verify_answer

DATA = Path(__file__).resolve().parents[3] / "data"


@pytest.fixture(scope="module")
def pool() -> Iterator[MathVerifier]:
    verifier = MathVerifier(num_workers=2)
    yield verifier
    verifier.close()


def test_extract_boxed_takes_the_last_balanced_box_with_nested_braces() -> None:
    text = r"first \boxed{1} then \boxed{\frac{a}{b^{2}}} and a broken \boxed{x"
    assert extract_answer(text, "boxed") == r"\frac{a}{b^{2}}"
    assert extract_answer(r"\boxed{\{1,2\}}", "boxed") == r"\{1,2\}"
    assert extract_answer(r"\fbox{7}", "boxed") == "7"
    assert extract_answer("no box here", "boxed") is None


def test_extract_hashes_takes_the_rest_of_the_line_after_the_last_marker() -> None:
    assert extract_answer("work\n#### 12\n#### 18 \nthanks", "hashes") == "18"
    assert extract_answer("####   ", "hashes") is None


def test_extract_auto_prefers_whichever_marker_comes_last() -> None:
    assert extract_answer(r"\boxed{3} ... #### 4", "auto") == "4"
    assert extract_answer(r"#### 4 ... \boxed{3}", "auto") == "3"
    with pytest.raises(ValueError, match="style"):
        extract_answer("x", "latex")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="response"):
        extract_answer(None)  # type: ignore[arg-type]


def test_plain_numbers_are_compared_exactly_without_a_worker() -> None:
    """1,000 == 1000, $18 == 18, 0.50 == 0.5, 18 dollars == 18 (#### style only); 34 != 35."""
    assert verify_answer("#### 1,000", "1000").reason == "exact_number"
    assert verify_answer("#### $18.", "18").correct
    assert verify_answer(r"\boxed{0.50}", "0.5").correct
    assert verify_answer("#### 18 dollars", "18").correct
    r = verify_answer(r"\boxed{34}", "35")
    assert (r.correct, r.reason, r.extracted) == (False, "exact_number", "34")


def test_symbolic_answers_are_verified_by_math_verify(pool: MathVerifier) -> None:
    """0.5 == 1/2; (x+1)^2 == x^2+2x+1; {1,2} == {2,1}; [1,3) interval; 10% == 0.1."""
    cases = [
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{x^2+2x+1}", "(x+1)^2"),
        (r"\boxed{2, 1}", "1,2"),
        (r"\boxed{[1,3)}", "[1,3)"),
        (r"\boxed{0.1}", r"10\%"),
        (r"\boxed{\dfrac{pq}{q+p}}", r"$\frac{pq}{p+q}$"),
    ]
    for response, reference in cases:
        result = verify_answer(response, reference, verifier=pool)
        assert (result.correct, result.reason) == (True, "verified"), (response, reference, result)
    wrong = verify_answer(r"\boxed{x^2+1}", "(x+1)^2", verifier=pool)
    assert (wrong.correct, wrong.reason, wrong.needs_judge) == (False, "mismatch", False)


def test_missing_answer_is_incorrect_and_reports_no_answer(pool: MathVerifier) -> None:
    r = verify_answer("I think it is seven", r"\frac{7}{2}", verifier=pool)
    assert (r.correct, r.extracted, r.reason, r.needs_judge) == (False, None, "no_answer", False)


def test_prose_references_need_a_judge() -> None:
    for ref in ("odd $n$", "All powers of 2", "$f(x)=x$ for some constant $c$", "no solutions"):
        assert reference_is_prose(ref), ref
        assert verify_answer(r"\boxed{n}", ref).needs_judge
    for ref in (r"\frac{pq}{p+q}", r"$\left\lfloor \log_{2}a\right\rfloor +1$", "3, 4", r"2\sqrt{3}"):
        assert not reference_is_prose(ref), ref
    exact = verify_answer(r"\boxed{odd n}", "odd $n$")
    assert (exact.correct, exact.needs_judge, exact.reason) == (True, True, "reference_needs_judge")


def test_reference_math_verify_cannot_parse_needs_a_judge(pool: MathVerifier) -> None:
    """A dangling \\frac{ or set-builder notation only gets math-verify's string fallback."""
    for ref in (r"\frac{", r"\left\{ (a,b):ab\leq e^{3}\right\}"):
        r = verify_answer(r"\boxed{5}", ref, verifier=pool)
        assert (r.needs_judge, r.correct, r.reason) == (True, False, "reference_needs_judge"), ref


def test_imo_answerbench_gold_answers_wrapped_in_boxed_verify(pool: MathVerifier) -> None:
    """Every 8th row of IMO-AnswerBench v2 (50 rows): boxed gold is correct or flagged for a judge;
    the gold of the next row is not accepted for a non-judge reference."""
    with (DATA / "imo_answerbench" / "answerbench_v2.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    sample = rows[::8]
    judged = 0
    for row, other in zip(sample, sample[1:] + sample[:1], strict=True):
        gold = row["Short Answer"]
        result = verify_answer("Therefore \\boxed{" + gold + "}", gold, verifier=pool)
        assert result.correct, (row["Problem ID"], gold, result)
        judged += result.needs_judge
        if not result.needs_judge and other["Short Answer"].strip() != gold.strip():
            cross = verify_answer("\\boxed{" + other["Short Answer"] + "}", gold, verifier=pool)
            assert not cross.correct, (gold, other["Short Answer"])
    assert judged < len(sample) // 4


def test_all_beyond_aime_gold_answers_wrapped_in_boxed_verify(pool: MathVerifier) -> None:
    lines = (DATA / "beyond_aime" / "beyondaime_test.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 100
    for line in lines:
        answer = str(json.loads(line)["answer"])
        result = verify_answer(f"The answer is \\boxed{{{answer}}}.", answer, verifier=pool)
        assert result.correct and not result.needs_judge, (answer, result)


def test_verify_works_from_a_worker_thread_and_an_asyncio_loop(pool: MathVerifier) -> None:
    """math-verify's own signal.alarm timeouts would raise outside the main thread; ours must not."""
    results = []

    def work() -> None:
        results.append(verify_answer(r"\boxed{\frac{6}{4}}", "1.5", verifier=pool))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.correct for r in results] == [True] * 4

    async def many() -> list[bool]:
        got = await asyncio.gather(*(averify_answer(r"\boxed{\sqrt{4}}", "2", verifier=pool) for _ in range(3)))
        return [r.correct for r in got]

    assert asyncio.run(many()) == [True] * 3


def test_pathological_expression_times_out_and_the_pool_recovers() -> None:
    """Guarantee: a hanging sympy evaluation is killed after timeout_s; the next call still works."""
    verifier = MathVerifier(num_workers=1)
    try:
        slow = verify_answer(r"\boxed{9^{9^{9^{9^{9}}}}}", "x^2+3", timeout_s=0.5, verifier=verifier)
        assert (slow.correct, slow.reason) == (False, "timeout")
        after = verify_answer(r"\boxed{x^2+3}", "3+x^2", verifier=verifier)
        assert (after.correct, after.reason) == (True, "verified")
    finally:
        verifier.close()


def test_garbage_input_never_raises(pool: MathVerifier) -> None:
    """Guarantee: any string yields a VerifyResult."""
    garbage = [
        "",
        "\\boxed{",
        "\\boxed{}}}}{{{",
        "{" * 5000 + "\\boxed{1" + "}" * 5000,
        "\\boxed{\\frac{1}{0}}",
        "\\boxed{" * 20000 + "1",  # thousands of unclosed boxes: extraction stays linear
        "\\boxed{\x00\x01\x02}",
        "#### \\left( \\right.",
        "\\boxed{\\begin{pmatrix} 1 & 2 \\end{pmatrix}}",
        "\\boxed{\U0001f600}",
    ]
    for response in garbage:
        for reference in ("7", "x+1", "}{"):
            result = verify_answer(response, reference, timeout_s=0.5, verifier=pool)
            assert isinstance(result.correct, bool)


def test_bad_arguments_raise_errors_naming_the_field() -> None:
    with pytest.raises(TypeError, match="reference"):
        verify_answer("x", 7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        verify_answer("x", "7", timeout_s=0)


def test_model_text_cannot_run_code_in_the_verifier(pool: MathVerifier, tmp_path: Path) -> None:
    """Guarantee: Python in an answer is parsed as maths (or rejected), never executed."""
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    for response in (payload, rf"\boxed{{{payload}}}", rf"\boxed{{\text{{{payload}}}}}", f"#### (lambda: {payload})()"):
        for reference in ("1", "x+1"):
            verify_answer(response, reference, verifier=pool)
    assert not marker.exists()
