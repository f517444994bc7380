r"""Final-answer extraction and math answer verification (math-verify 0.9.0), safe from any thread.

``extract_answer`` pulls the final answer out of a model response (the last balanced
``\boxed{...}``, or the rest of the line after the last ``####``). ``verify_answer`` checks it
against a reference answer and says whether an LLM judge is needed because the reference is prose
("all odd $n$") that math-verify cannot compare.

How the timeout is enforced (the design choice):
    math-verify's own timeouts use ``signal.alarm``, which only works in the main thread; called
    from any other thread ``parse`` raises. We therefore call math-verify with its timeouts
    disabled (``parsing_timeout=None``, ``timeout_seconds=None``) inside a small pool of
    long-lived *worker subprocesses* (``python -m posttrain.envs.math.verify --worker``) that speak
    one JSON object per line over stdin/stdout (no pickle). The caller waits for the reply with a
    deadline (``selectors`` on the pipe); a worker that overruns is killed and replaced on the next
    call. This works identically from the main thread, a worker thread or an asyncio loop (use
    ``averify_answer`` there so the loop is not blocked), and a pathological expression can never
    hang or crash the calling process.

    Plain numbers (GSM8K, BeyondAIME, the synthetic tasks) are compared in-process with exact
    rational arithmetic and never reach a worker, so the common RL case costs microseconds.

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
import atexit
import json
import logging
import os
import queue
import re
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

AnswerStyle = Literal["boxed", "hashes", "auto"]
"""Where the final answer sits: the last ``\\boxed{}``, after the last ``####``, or whichever comes last."""

MAX_ANSWER_CHARS = 2000
"""Longest extracted answer or reference handed to math-verify (characters); longer text is cut."""

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUMBER_THEN_WORDS_RE = re.compile(r"([+-]?[\d,]*\.?\d+)\s+[A-Za-z][A-Za-z ]*")
_LATEX_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]+")
_MATH_WORDS = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp sqrt max min gcd lcm "
    "mod floor ceil det deg dim ker arg sup inf lim infty pi".split()
)
_PROSE_WORDS = frozenset(
    "is of or no if and all for odd the are any not with even some where which when only none "
    "each every such that otherwise than there".split()
)


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


class VerifierError(RuntimeError):
    """The verifier worker process could not be started (a broken installation, not bad input)."""


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------


def _last_boxed(text: str) -> tuple[str, int] | None:
    r"""Content and start offset of the last ``\boxed{...}`` whose braces balance.

    One pass matches every brace (escaped ``\{``/``\}`` are skipped), so the cost is linear in
    the text even when it holds thousands of unclosed boxes.
    """
    opens = [m for m in _BOXED_RE.finditer(text)]
    if not opens:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    i, n = opens[0].end() - 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    for m in reversed(opens):
        end = closing.get(m.end() - 1)
        if end is not None:
            return text[m.end() : end].strip(), m.start()
    return None


def _last_hashes(text: str) -> tuple[str, int] | None:
    """Text after the last ``####`` up to the end of that line, and the marker's offset."""
    pos = text.rfind("####")
    if pos < 0:
        return None
    rest = text[pos + 4 :].split("\n", 1)[0].strip()
    return (rest, pos) if rest else None


def _extract(response: str, style: AnswerStyle) -> tuple[str, str] | None:
    """``(answer, marker)`` with marker ``boxed`` or ``hashes``, or ``None``."""
    boxed = _last_boxed(response) if style in ("boxed", "auto") else None
    hashes = _last_hashes(response) if style in ("hashes", "auto") else None
    if boxed and boxed[0] and (hashes is None or boxed[1] > hashes[1]):
        return boxed[0], "boxed"
    if hashes:
        return hashes[0], "hashes"
    return None


def extract_answer(response: str, style: AnswerStyle = "auto") -> str | None:
    r"""Find the final answer in a model response.

    Args:
        response: The assistant's text.
        style: ``boxed``: content of the last ``\boxed{...}`` (or ``\fbox{...}``) whose braces
            balance (escaped ``\{``/``\}`` do not count); ``hashes``: the rest of the line after
            the last ``####``; ``auto``: whichever of the two markers occurs last.

    Returns:
        The stripped answer text, or ``None`` when no non-empty answer is marked.

    Raises:
        TypeError: ``response`` is not a string.
        ValueError: unknown ``style``.

    Example:
        >>> extract_answer(r"so \boxed{\frac{1}{2}}.", "boxed")
        '\\frac{1}{2}'
    """
    if not isinstance(response, str):
        raise TypeError(f"response: expected str, got {type(response).__name__}")
    if style not in ("boxed", "hashes", "auto"):
        raise ValueError(f"style: expected boxed, hashes or auto, got {style!r}")
    found = _extract(response, style)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# Normalisation and the in-process fast paths
# ---------------------------------------------------------------------------------------------


def _normalise(text: str) -> str:
    """Remove dollar signs (math delimiters or currency), outer whitespace and a final period."""
    t = text.replace("\\$", "").replace("$", "").strip()
    t = t.rstrip(".").strip()
    return t[:MAX_ANSWER_CHARS]


def _as_number(text: str, *, allow_unit_words: bool = False) -> Fraction | None:
    r"""Exact value of a plain decimal number (``1,000``, ``-3.5``, ``\$18``), else ``None``."""
    t = _normalise(text)
    for thin in ("\\,", "\\!", "\\;", "~"):
        t = t.replace(thin, "")
    t = t.strip()
    if allow_unit_words:
        m = _NUMBER_THEN_WORDS_RE.fullmatch(t)
        if m:
            t = m.group(1)
    if _THOUSANDS_RE.fullmatch(t):
        t = t.replace(",", "")
    if not _NUMBER_RE.fullmatch(t):
        return None
    try:
        return Fraction(Decimal(t))
    except (InvalidOperation, ValueError):
        return None


def reference_is_prose(reference: str) -> bool:
    r"""Whether a reference answer is prose that math-verify cannot grade ("all odd $n$").

    The heuristic drops LaTeX commands (``\frac``, ``\text``...), then looks for an English
    connective (``is``, ``for``, ``all``, ``odd``...) or any word of four or more letters that is
    not a math function name. Products of symbols (``pq``, ``abc``) are not prose.

    Raises:
        TypeError: ``reference`` is not a string.
    """
    if not isinstance(reference, str):
        raise TypeError(f"reference: expected str, got {type(reference).__name__}")
    words = _WORD_RE.findall(_LATEX_COMMAND_RE.sub(" ", reference))
    for word in words:
        low = word.lower()
        if low in _PROSE_WORDS or (len(low) >= 4 and low not in _MATH_WORDS):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Worker subprocesses
# ---------------------------------------------------------------------------------------------


def _worker_main() -> int:
    """Serve verification requests on stdin/stdout, one JSON object per line (child process).

    Request: ``{"gold": str, "pred": str | null}``. Reply: ``{"gold_ok": bool, "pred_ok": bool,
    "correct": bool, "error": str | null}``. The first line written is ``{"ready": true}``.
    math-verify's log warnings about its disabled timeouts are silenced: the parent enforces time.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol stream
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse, verify

    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        reply: dict[str, Any] = {"gold_ok": False, "pred_ok": False, "correct": False, "error": None}
        try:
            req = json.loads(line)
            gold = parse("\\boxed{" + str(req["gold"]) + "}", parsing_timeout=None)
            # A string-only parse is math-verify's text fallback: nothing it can compare mathematically.
            reply["gold_ok"] = any(not isinstance(item, str) for item in gold)
            if req.get("pred") is not None:
                pred = parse("\\boxed{" + str(req["pred"]) + "}", parsing_timeout=None)
                reply["pred_ok"] = bool(pred)
                if gold and pred:
                    reply["correct"] = bool(verify(gold, pred, timeout_seconds=None))
        except Exception as exc:  # any library failure becomes an "error" reply, never a crash
            reply["error"] = f"{type(exc).__name__}: {exc}"[:500]
        proto.write(json.dumps(reply) + "\n")
    return 0


class _Worker:
    """One child process running ``_worker_main``; not thread-safe (the pool hands it out)."""

    def __init__(self, startup_timeout_s: float) -> None:
        src_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = src_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "posttrain.envs.math.verify", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._buf = b""
        ready = self._read_line(startup_timeout_s)
        if ready is None or not ready.get("ready"):
            code = self.proc.poll()
            self.kill()
            raise VerifierError(
                f"math-verify worker did not start within {startup_timeout_s:.0f} s (exit code {code}); "
                "check that math-verify[antlr4_13_2]==0.9.0 is installed"
            )

    def _read_line(self, timeout_s: float) -> dict[str, Any] | None:
        """Next JSON line from the child, or ``None`` on timeout or end of stream."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            parsed: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            log.warning("math-verify worker sent an invalid reply %.200r; treating it as failed", line)
            return None
        return parsed

    def ask(self, gold: str, pred: str | None, timeout_s: float) -> dict[str, Any] | None:
        """Send one request; the reply, or ``None`` if the child overran ``timeout_s`` or died."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._read_line(timeout_s)

    def alive(self) -> bool:
        """Whether the child process is still running."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the child and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class MathVerifier:
    """A bounded pool of math-verify worker processes with per-call deadlines.

    Thread-safe: each call borrows one worker; callers beyond ``num_workers`` wait for one.
    Workers start lazily. A worker that overruns its deadline is killed and replaced.

    Args:
        num_workers: Worker processes at most (each ~100 MB resident after importing sympy).
        startup_timeout_s: How long a new worker may take to import math-verify (seconds).
    """

    def __init__(self, num_workers: int = 1, startup_timeout_s: float = 120.0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers: must be >= 1, got {num_workers}")
        self.startup_timeout_s = startup_timeout_s
        self._slots: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(num_workers):
            self._slots.put(None)
        self._reference_ok: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._all: list[_Worker] = []

    def ask(self, gold: str, pred: str | None, timeout_s: float) -> dict[str, Any] | None:
        """Run one request on a worker; ``None`` when it timed out (the worker is then replaced).

        Raises:
            VerifierError: a worker could not be started.
        """
        worker = self._slots.get()
        try:
            if worker is None or not worker.alive():
                worker = _Worker(self.startup_timeout_s)
                with self._lock:
                    self._all.append(worker)
            reply = worker.ask(gold, pred, timeout_s)
            if reply is None:
                log.warning("math-verify worker overran %.1f s on reference %.80r; restarting it", timeout_s, gold)
                worker.kill()
                worker = None
            return reply
        finally:
            self._slots.put(worker)

    def reference_parses(self, reference: str, timeout_s: float) -> bool | None:
        """Whether math-verify parses ``reference`` (cached); ``None`` on timeout."""
        with self._lock:
            cached = self._reference_ok.get(reference)
        if cached is not None:
            return cached
        reply = self.ask(reference, None, timeout_s)
        if reply is None:
            return None
        ok = bool(reply["gold_ok"])
        with self._lock:
            if len(self._reference_ok) > 100_000:
                self._reference_ok.clear()
            self._reference_ok[reference] = ok
        return ok

    def remember_reference(self, reference: str, ok: bool) -> None:
        """Cache whether ``reference`` parses (learned from a combined request)."""
        with self._lock:
            self._reference_ok[reference] = ok

    def close(self) -> None:
        """Kill every worker this pool started."""
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.kill()


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """The process-wide pool (``POSTTRAIN_VERIFY_WORKERS`` workers, default 1), created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            raw = os.environ.get("POSTTRAIN_VERIFY_WORKERS", "1")
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"POSTTRAIN_VERIFY_WORKERS: expected a positive integer, got {raw!r}")
            _default = MathVerifier(num_workers=int(raw))
            atexit.register(_default.close)
        return _default


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


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
    found = _extract(response, style)
    extracted, marker = found if found else (None, "")
    ref = _normalise(reference)
    pred = _normalise(extracted) if extracted is not None else None

    ref_number = _as_number(ref)
    if ref_number is not None:
        if pred is None:
            return VerifyResult(False, None, False, "no_answer")
        pred_number = _as_number(pred, allow_unit_words=marker == "hashes")
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
    """Command line: ``--worker`` serves requests; ``RESPONSE REFERENCE`` prints one result."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--worker"]:
        return _worker_main()
    if len(args) != 2:
        print("usage: python -m posttrain.envs.math.verify RESPONSE REFERENCE", file=sys.stderr)
        return 2
    print(verify_answer(args[0], args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
