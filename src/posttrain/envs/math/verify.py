r"""Math answer verification (math-verify 0.9.0) with a deadline, safe from any thread.

``verify_answer`` checks the final answer of a response against a reference answer and says
whether an LLM judge is needed because the reference is prose ("all odd $n$") that math-verify
cannot compare. ``averify_answer`` is the same for an asyncio loop (the loop is not blocked).

How. Extraction, normalisation and plain numbers are pure string work in-process
(``posttrain.envs.math.answers``): GSM8K, BeyondAIME and the synthetic tasks are compared with
exact rational arithmetic and never reach a worker, so the common RL case costs microseconds.
Anything else goes to math-verify in a worker subprocess with a per-call deadline
(``posttrain.envs.math.verifier_pool``, which explains why a subprocess and not ``signal.alarm``).

Guarantees:
    * ``verify_answer`` returns within roughly ``timeout_s`` plus a worker restart whenever the
      pool is warm; the first call also waits for the worker to import sympy (bounded by
      ``startup_timeout_s``).
    * Any string input (garbage, unbalanced braces, huge exponents) yields a ``VerifyResult``;
      it never raises because of the response or reference text.
    * Model text cannot run code: LaTeX goes through the latex2sympy grammar, and math-verify
      hands only strings of digits, operators and parentheses to sympy's ``parse_expr`` (which
      uses ``eval`` inside); all of it happens in the child process, never in the caller.

Not guaranteed:
    * Mathematical completeness: math-verify may call equal answers different (e.g. unusual
      notation); prose references are flagged ``needs_judge`` by a word heuristic, which can miss
      prose written entirely in symbols.
    * Memory limits for the worker (it is a trusted library parsing bounded strings).

Run ``python -m posttrain.envs.math.verify RESPONSE REFERENCE`` to check one answer by hand.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass

from posttrain.envs.math.answers import (
    AnswerStyle,
    extract_with_marker,
    normalise_answer,
    parse_plain_number,
    reference_is_prose,
)
from posttrain.envs.math.verifier_pool import MathVerifier, default_verifier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of checking one response against one reference.

    Attributes:
        correct: The extracted answer equals the reference (math-verify, or exact numbers).
        extracted: The final answer text found in the response, or ``None``.
        needs_judge: The reference is prose or unparsable, so ``correct`` is only an exact string
            comparison and an LLM judge should grade the response.
        reason: One of ``exact_number``, ``verified``, ``mismatch``, ``no_answer``,
            ``answer_unparsable``, ``reference_needs_judge``, ``timeout``, ``error``.
    """

    correct: bool
    extracted: str | None
    needs_judge: bool
    reason: str


def verify_answer(
    response: str,
    reference: str,
    *,
    style: AnswerStyle = "auto",
    timeout_s: float = 5.0,
    verifier: MathVerifier | None = None,
) -> VerifyResult:
    r"""Check a response's final answer against a reference answer.

    Order of checks: the reference is normalised (``$`` removed, final period dropped); a prose
    reference (``reference_is_prose``) or one math-verify cannot parse gets ``needs_judge=True``
    and only an exact string comparison; with no extracted answer the result is ``no_answer``;
    two plain numbers are compared exactly in-process (``exact_number``; with ``####`` answers a
    trailing unit word is allowed, ``#### 18 dollars``); anything else goes to math-verify in a
    worker process, with both sides wrapped as ``\boxed{...}``.

    Args:
        response: The assistant's full text.
        reference: The gold answer (LaTeX or plain text; ``$`` delimiters allowed).
        style: Where to look for the answer (see ``extract_answer``).
        timeout_s: Deadline for math-verify on this call (seconds); a worker that overruns is
            killed and the result is ``timeout`` (``correct=False``).
        verifier: Worker pool to use; ``default_verifier()`` when ``None``.

    Returns:
        A ``VerifyResult``.

    Raises:
        TypeError: ``response`` or ``reference`` is not a string.
        ValueError: unknown ``style`` or a non-positive ``timeout_s``.
        VerifierError: the worker process could not be started at all.

    Example:
        >>> verify_answer(r"The answer is \boxed{0.5}", r"\frac{1}{2}").correct
        True
    """
    if not isinstance(response, str):
        raise TypeError(f"response: expected str, got {type(response).__name__}")
    if not isinstance(reference, str):
        raise TypeError(f"reference: expected str, got {type(reference).__name__}")
    if style not in ("boxed", "hashes", "auto"):
        raise ValueError(f"style: expected boxed, hashes or auto, got {style!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
    found = extract_with_marker(response, style)
    extracted, marker = found if found else (None, "")
    ref = normalise_answer(reference)
    pred = normalise_answer(extracted) if extracted is not None else None

    ref_number = parse_plain_number(ref)
    if ref_number is not None:
        if pred is None:
            return VerifyResult(False, None, False, "no_answer")
        pred_number = parse_plain_number(pred, allow_unit_words=marker == "hashes")
        if pred_number is not None:
            return VerifyResult(pred_number == ref_number, extracted, False, "exact_number")

    exact = pred is not None and " ".join(pred.split()) == " ".join(ref.split())
    if not ref or reference_is_prose(ref):
        return VerifyResult(exact, extracted, True, "reference_needs_judge")

    pool = verifier or default_verifier()
    if pred is None:
        ok = pool.reference_parses(ref, timeout_s)
        if ok is None:
            return VerifyResult(False, None, False, "timeout")
        return VerifyResult(False, None, not ok, "no_answer" if ok else "reference_needs_judge")

    reply = pool.ask(ref, pred, timeout_s)
    if reply is None:
        return VerifyResult(exact, extracted, False, "timeout")
    pool.remember_reference(ref, bool(reply["gold_ok"]))
    if not reply["gold_ok"]:
        return VerifyResult(exact, extracted, True, "reference_needs_judge")
    if reply["error"]:
        log.warning("math-verify failed on answer %.80r vs %.80r: %s", pred, ref, reply["error"])
        return VerifyResult(exact, extracted, False, "error")
    if not reply["pred_ok"]:
        return VerifyResult(exact, extracted, False, "answer_unparsable")
    correct = bool(reply["correct"]) or exact
    return VerifyResult(correct, extracted, False, "verified" if correct else "mismatch")


async def averify_answer(
    response: str,
    reference: str,
    *,
    style: AnswerStyle = "auto",
    timeout_s: float = 5.0,
    verifier: MathVerifier | None = None,
) -> VerifyResult:
    """``verify_answer`` run in a thread so an asyncio loop keeps serving other episodes.

    Raises:
        The same errors as ``verify_answer``.
    """
    return await asyncio.to_thread(
        verify_answer, response, reference, style=style, timeout_s=timeout_s, verifier=verifier
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: ``RESPONSE REFERENCE`` prints one result."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m posttrain.envs.math.verify RESPONSE REFERENCE", file=sys.stderr)
        return 2
    print(verify_answer(args[0], args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
