r"""A pool of math-verify worker subprocesses with per-call deadlines (``MathVerifier``).

math-verify's own timeouts use ``signal.alarm``, which only works in the main thread; called
from any other thread ``parse`` raises. math-verify therefore runs here with its timeouts
disabled (``parsing_timeout=None``, ``timeout_seconds=None``) inside a small pool of long-lived
worker subprocesses (``python -m posttrain.envs.math.verifier_pool``) that speak one JSON object
per line over stdin/stdout (no pickle). The caller waits for the reply with a deadline
(``selectors`` on the pipe); a worker that overruns is killed and replaced on the next call.
This works identically from the main thread, a worker thread or an asyncio loop, and a
pathological expression can never hang or crash the calling process. The Guarantees of answer
checking as a whole are listed in ``posttrain.envs.math.verify``.

Protocol: request ``{"gold": str, "pred": str | null}``; reply ``{"gold_ok": bool, "pred_ok": bool,
"correct": bool, "error": str | null}``; the worker's first line is ``{"ready": true}``.

Example: ``MathVerifier(num_workers=2).ask(r"\frac{1}{2}", "0.5", timeout_s=5.0)["correct"]`` is True.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from posttrain.envs.base import InfraError

log = logging.getLogger(__name__)


class VerifierError(InfraError):
    """The verifier worker could not be started, or was killed from outside mid-call (not bad input).

    An infrastructure failure (``posttrain.envs.base.InfraError``): the answer checker of the math
    environments could not run, so an episode it ends is not trained (cause ``grader_not_started``,
    or ``grader_killed`` for a worker SIGKILLed by something else than this pool).
    """

    cause = "grader_not_started"


def serve_requests() -> int:
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
    """One child process running ``serve_requests``; not thread-safe (the pool hands it out)."""

    def __init__(self, startup_timeout_s: float) -> None:
        src_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = src_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "posttrain.envs.math.verifier_pool"],
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


def _exit_code(worker: _Worker, wait_s: float) -> int | None:
    """The worker's exit status (negative: killed by that signal), waiting up to ``wait_s`` seconds; None if it runs."""
    try:
        return worker.proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None


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
            VerifierError: a worker could not be started, or was SIGKILLed from outside during the call.
        """
        worker = self._slots.get()
        try:
            if worker is None or not worker.alive():
                worker = _Worker(self.startup_timeout_s)
                with self._lock:
                    self._all.append(worker)
            reply = worker.ask(gold, pred, timeout_s)
            if reply is None and _exit_code(worker, 0.2) == -signal.SIGKILL:  # not ours: we kill only after an overrun
                worker.kill()
                worker = None
                raise VerifierError("math-verify worker was killed from outside (SIGKILL) while checking an answer",
                                    "grader_killed")
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



if __name__ == "__main__":
    raise SystemExit(serve_requests())
