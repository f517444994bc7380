r"""``synthetic_longtail``: a multi-turn code fetch whose number of turns per task is long-tailed.

Built for the asynchronous-vs-synchronous benchmark (``bench/async_vs_sync.py``): agentic
rollouts have jagged lengths (3 turns next to 40), and this environment reproduces that with real
turns a tiny CPU model can learn. A task reads ``Fetch the codes of box 7. Call next until left
0, then answer the last code.``; each task hides a list of ``k`` one-digit codes, and ``k`` (the
number of tool calls the task *requires* before an answer is accepted) is drawn per task from a
clipped log-normal distribution::

    k = clip(round(calls_median * exp(calls_sigma * z)), min_calls, max_calls),   z ~ N(0, 1)

(``calls_median`` is the median of the unclipped distribution; with the defaults 3, 0.8, 1, 16,
2,000 training tasks have mean 4.1 calls, median 3, 90th percentile 9 and 99th percentile 16.)

The ideal episode (``reference_episode``) for codes ``3 1``:

* turn 1: ``<tool_call>{"name": "next"}</tool_call>``
* observation: ``code 3, left 1``
* turn 2: the same call; observation ``code 1, left 0``
* turn 3: ``#### 1``

The answer is one digit copied from the last observation, so a 2-layer model learns it from a
short SFT warm start; what it has to get right is the control flow (keep calling until ``left
0``, then answer) over many turns.

Rules of an episode:

* Each well-formed ``next`` call (no arguments, or ``{}``) returns the next code, ``code <c>, left
  <k - calls>`` (``left <k - calls>, code <c>`` with ``left_first``); calls past the end return the last code again with ``left 0`` and are counted in
  ``extra_calls``. Several calls in one action run in order, one
  observation line each. Observations are plain text without ``<tool_result>`` tags, to keep a
  turn short (about 30 tokens with the tiny models' tokenizer: the call, the turn delimiters and
  the observation).
* Malformed-call rule: an action whose tool call does not parse, names another tool or passes
  arguments gets an error observation; ``max_malformed_actions`` such actions in a row (default 2)
  end the episode with ``finish_reason="tool_error"`` and reward 0.0.
* An action without tool calls is the final answer: the integer after the last ``####``. Reward
  1.0 only when all ``k`` calls were made *and* the answer equals the last code; an answer given
  before ``left 0`` earns 0.0 (``early_answer`` = 1), whatever its value.

Tool latency (wall time, no accelerator time): real agentic tools (a sandbox starting, a test
suite running, a web request) take seconds of wall time while the model waits, and that latency,
more than the token count, is what makes agentic rollouts long-tailed in wall time. With
``tool_latency_median_s > 0`` each well-formed ``next`` call costs a wall-time delay
(``posttrain.envs.synthetic.latency.ToolLatency``, shared with ``synthetic_tool``) spent with
``asyncio.sleep`` inside the async ``step`` (the event loop, and so the generator's other
episodes and its engine, keep running)::

    latency(task, i) = min(tool_latency_max_s, tool_latency_median_s * exp(tool_latency_sigma * z)),
    z ~ N(0, 1) drawn from a generator seeded by (tool_latency_seed, task id, box, codes, i)

for the ``i``-th call (0-based) of an episode of that task, so every method, generator and
replay sees the same latencies for the same task (several calls in one action wait in order;
malformed actions and final answers run no tool and wait nothing). The default
``tool_latency_median_s = 0`` makes every call instantaneous.
``call_latency_s(task, i)`` gives the delay without waiting.

Every step reports ``correct``, ``tool_calls``, ``required_calls``, ``extra_calls``,
``early_answer``, ``malformed_actions`` and ``tool_wait_s`` (seconds of tool latency so far).

Tasks carry everything an episode needs in ``Task.metadata`` (``box``, and ``codes`` as
space-separated digits), so task files written by ``SyntheticLongTailEnv.tasks`` replay exactly.
The train/held-out split hashes the box and its codes (SHA-256, as in ``synthetic_arith``).

Run ``python -m posttrain.envs.synthetic.longtail [calls_median calls_sigma]`` to print the
distribution of required calls and a few tasks.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from typing import Any

from posttrain.envs.base import StepResult
from posttrain.envs.synthetic.arith import Split, is_heldout, parse_integer_answer
from posttrain.envs.synthetic.latency import ToolLatency
from posttrain.envs.tool_calls import CLOSE_TAG, OPEN_TAG, ToolCallError, parse_tool_calls
from posttrain.records import Task

ENV_NAME = "synthetic_longtail"
"""Registry name of this environment."""

TOOL_NAME = "next"
"""The one tool: return the next code."""

SYSTEM_PROMPT = (
    'Call <tool_call>{"name": "next"}</tool_call> until the result says left 0, '
    "then answer #### <last code>."
)
"""Short system prompt describing the tool (kept short for tiny models)."""

MAX_CANDIDATES_PER_TASK = 10_000
"""Task generation gives up (ValueError) after this many rejected candidates per requested task."""


def required_calls(rng: random.Random, calls_median: float, calls_sigma: float, min_calls: int, max_calls: int) -> int:
    """Draw one task's number of required calls: ``clip(round(median * exp(sigma * z)), min, max)``.

    Args:
        rng: Source of the standard normal draw ``z``.
        calls_median: Median of the unclipped log-normal (calls), > 0.
        calls_sigma: Standard deviation of ``log k`` (0 gives every task ``round(median)`` calls).
        min_calls: Smallest count (calls, >= 1).
        max_calls: Largest count (calls, >= ``min_calls``).

    Returns:
        The count k (calls).
    """
    z = rng.gauss(0.0, 1.0)
    return max(min_calls, min(max_calls, round(calls_median * math.exp(calls_sigma * z))))


class SyntheticLongTailEnv:
    """Code fetches with log-normally distributed numbers of required tool calls (see the module docstring).

    Args:
        calls_median: Median of the unclipped log-normal number of required calls (> 0).
        calls_sigma: Standard deviation of its logarithm (>= 0; larger means a longer tail).
        min_calls: Fewest required calls (>= 1).
        max_calls: Most required calls (>= ``min_calls``); the episode needs ``max_calls + 1``
            turns, so ``generator.max_turns`` must be at least that for every task to be solvable.
        boxes: Box numbers in prompts are drawn from ``0 .. boxes - 1`` (>= 1); they only vary
            the prompt text.
        heldout_fraction: Share of (box, codes) pairs in the held-out split, in (0, 1).
        max_malformed_actions: Malformed actions in a row that end the episode with ``tool_error`` (>= 1).
        system_prompt: System message describing the tool, or ``None`` for none.
        tool_latency_median_s: Median wall-time latency of one tool call (seconds, >= 0; 0
            disables latency). See the module docstring.
        tool_latency_sigma: Standard deviation of the latency's logarithm (>= 0; larger means a
            longer tail; 0 gives every call the median).
        tool_latency_max_s: Cap on one call's latency (seconds, > 0).
        tool_latency_seed: Seed of the per-task latency draws.
        left_first: Observations read ``left <k - calls>, code <c>`` (the code last, next to the
            answer) instead of ``code <c>, left <k - calls>``. The tiny model copies the code more
            easily from the end of the observation (issue 29: a warm start that solves short tasks).

    Raises:
        ValueError: a bad count, fraction or distribution parameter; the message names it.
    """

    name = ENV_NAME

    def __init__(
        self,
        calls_median: float = 3.0,
        calls_sigma: float = 0.8,
        min_calls: int = 1,
        max_calls: int = 16,
        boxes: int = 100,
        heldout_fraction: float = 0.1,
        max_malformed_actions: int = 2,
        system_prompt: str | None = SYSTEM_PROMPT,
        tool_latency_median_s: float = 0.0,
        tool_latency_sigma: float = 1.0,
        tool_latency_max_s: float = 60.0,
        tool_latency_seed: int = 0,
        left_first: bool = False,
    ) -> None:
        if not calls_median > 0:
            raise ValueError(f"calls_median: must be > 0, got {calls_median}")
        if not calls_sigma >= 0:
            raise ValueError(f"calls_sigma: must be >= 0, got {calls_sigma}")
        if min_calls < 1:
            raise ValueError(f"min_calls: must be >= 1, got {min_calls}")
        if max_calls < min_calls:
            raise ValueError(f"max_calls: must be >= min_calls={min_calls}, got {max_calls}")
        if boxes < 1:
            raise ValueError(f"boxes: must be >= 1, got {boxes}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction: must lie in (0, 1), got {heldout_fraction}")
        if max_malformed_actions < 1:
            raise ValueError(f"max_malformed_actions: must be >= 1, got {max_malformed_actions}")
        self.tool_latency = ToolLatency(tool_latency_median_s, tool_latency_sigma, tool_latency_max_s,
                                        tool_latency_seed, namespace=ENV_NAME)
        self.calls_median, self.calls_sigma = float(calls_median), float(calls_sigma)
        self.min_calls, self.max_calls = min_calls, max_calls
        self.boxes = boxes
        self.heldout_fraction = heldout_fraction
        self.max_malformed_actions = max_malformed_actions
        self.system_prompt = system_prompt
        self.left_first = bool(left_first)

    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        """``n`` tasks of a split, generated with ``seed``; ids ``synthetic_longtail-<split>-<index>``.

        Candidates are drawn from one seeded stream (box, k, then k codes) and kept when the hash
        of ``box:codes`` puts them in ``split``, so the two splits never share a task.

        Raises:
            ValueError: unknown ``split``, ``n < 0``, or too few candidates land in the split
                (more than ``MAX_CANDIDATES_PER_TASK`` rejections per task).
        """
        if split not in ("train", "eval"):
            raise ValueError(f"split: expected 'train' or 'eval', got {split!r}")
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        rng = random.Random(f"{ENV_NAME}:{seed}")
        out: list[Task] = []
        budget = MAX_CANDIDATES_PER_TASK * max(n, 1)
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise ValueError(f"split {split!r}: fewer than {n} tasks after {MAX_CANDIDATES_PER_TASK} draws per task")
            box = rng.randrange(self.boxes)
            k = required_calls(rng, self.calls_median, self.calls_sigma, self.min_calls, self.max_calls)
            codes = " ".join(str(rng.randrange(10)) for _ in range(k))
            if is_heldout(f"{box}:{codes}", self.heldout_fraction) != (split == "eval"):
                continue
            out.append(
                Task(
                    task_id=f"{ENV_NAME}-{split}-{len(out):06d}",
                    env_name=ENV_NAME,
                    prompt=f"Fetch the codes of box {box}. Call next until left 0, then answer the last code.",
                    reference=codes.split()[-1],
                    data_source=ENV_NAME,
                    metadata={"box": str(box), "codes": codes},
                )
            )
        return out

    def call_latency_s(self, task: Task, call_index: int) -> float:
        """Wall-time latency (seconds) of the ``call_index``-th tool call (0-based) in an episode of ``task``.

        Deterministic in (``tool_latency_seed``, task id, box, codes, ``call_index``); 0.0 when
        ``tool_latency_median_s`` is 0. Formula in the module docstring.

        Raises:
            ValueError: ``call_index < 0``.
        """
        return self.tool_latency.delay_s(self.latency_key(task, call_index))

    @staticmethod
    def latency_key(task: Task, call_index: int) -> str:
        """The ``ToolLatency`` key of the ``call_index``-th call (0-based) of an episode of ``task``.

        Raises:
            ValueError: ``call_index < 0``.
        """
        if call_index < 0:
            raise ValueError(f"call_index: must be >= 0, got {call_index}")
        meta = task.metadata
        return f"{task.task_id}:{meta.get('box')}:{meta.get('codes')}:{call_index}"

    def start(self, task: Task) -> CodeEpisode:
        """Begin an episode for ``task``.

        Raises:
            KeyError / ValueError: the task lacks valid ``codes`` metadata (see ``codes_of``).
        """
        return CodeEpisode(self, task)


def codes_of(task: Task) -> list[int]:
    """The codes (one digit each) a task's ``next`` calls return, in order, from ``task.metadata["codes"]``.

    Raises:
        KeyError: ``codes`` missing from ``task.metadata`` (the message names the task).
        ValueError: a code that is not one digit, or no code at all.
    """
    try:
        raw = task.metadata["codes"].split()
    except KeyError as exc:
        raise KeyError(f"task {task.task_id}: metadata lacks 'codes' (not a {ENV_NAME} task)") from exc
    if not raw:
        raise ValueError(f"task {task.task_id}: metadata codes is empty (at least one call is required)")
    bad = [c for c in raw if len(c) != 1 or not c.isdigit()]
    if bad:
        raise ValueError(f"task {task.task_id}: metadata codes must be single digits, got {bad[:3]}")
    return [int(c) for c in raw]


class CodeEpisode:
    """One ``synthetic_longtail`` episode (see the module docstring for the rules)."""

    def __init__(self, env: SyntheticLongTailEnv, task: Task) -> None:
        self.env, self.task = env, task
        self.codes = codes_of(task)
        self.tool_calls = 0
        self.malformed_actions = 0
        self.tool_wait_s = 0.0
        self._malformed_in_a_row = 0

    @property
    def left(self) -> int:
        """Required calls not yet made."""
        return max(0, len(self.codes) - self.tool_calls)

    def messages(self) -> list[dict[str, str]]:
        """Optional system message, then the user's problem."""
        head = [{"role": "system", "content": self.env.system_prompt}] if self.env.system_prompt else []
        return head + [{"role": "user", "content": self.task.prompt}]

    def _metrics(self, correct: bool = False, early: bool = False) -> dict[str, float]:
        return {
            "correct": float(correct),
            "tool_calls": float(self.tool_calls),
            "required_calls": float(len(self.codes)),
            "extra_calls": float(max(0, self.tool_calls - len(self.codes))),
            "early_answer": float(early),
            "malformed_actions": float(self.malformed_actions),
            "tool_wait_s": self.tool_wait_s,
        }

    async def step(self, action_text: str) -> StepResult:
        """Return the next code for each ``next`` call (after its tool latency), or grade the final answer."""
        try:
            calls = parse_tool_calls(action_text)
        except ToolCallError as exc:
            return self._malformed(f"error: malformed tool call: {exc}")
        if not calls:
            early = self.left > 0
            answer = parse_integer_answer(action_text)
            correct = not early and answer is not None and str(answer) == self.task.reference.strip()
            return StepResult(
                done=True, reward=1.0 if correct else 0.0, finish_reason="stop", metrics=self._metrics(correct, early)
            )
        if any(c.name != TOOL_NAME or c.arguments for c in calls):
            return self._malformed(f"error: the only tool is {TOOL_NAME!r} and it takes no arguments")
        lines = []
        for _ in calls:
            self.tool_wait_s += await self.env.tool_latency.wait(self.env.latency_key(self.task, self.tool_calls))
            self.tool_calls += 1
            code = self.codes[min(self.tool_calls, len(self.codes)) - 1]
            lines.append(f"left {self.left}, code {code}" if self.env.left_first else f"code {code}, left {self.left}")
        self._malformed_in_a_row = 0
        return StepResult(observation="\n".join(lines), metrics=self._metrics())

    def _malformed(self, observation: str) -> StepResult:
        """Count a malformed action; end with ``tool_error`` after too many in a row."""
        self.malformed_actions += 1
        self._malformed_in_a_row += 1
        if self._malformed_in_a_row >= self.env.max_malformed_actions:
            return StepResult(done=True, reward=0.0, finish_reason="tool_error", metrics=self._metrics())
        return StepResult(observation=observation, metrics=self._metrics())

    def close(self) -> None:
        """Nothing to release."""


REFERENCE_CALL = OPEN_TAG + '{"name": "next"}' + CLOSE_TAG
"""The shortest well-formed call (``arguments`` omitted), used by ``reference_episode``."""


def reference_episode(task: Task) -> list[str]:
    """Assistant turns of the ideal episode: one ``REFERENCE_CALL`` per code, then ``#### <last code>``.

    Raises:
        KeyError / ValueError: the task lacks valid ``codes`` metadata.
    """
    return [REFERENCE_CALL] * len(codes_of(task)) + [f"#### {task.reference}"]


def summarise_calls(tasks: list[Task]) -> dict[str, float]:
    """Distribution of required calls over ``tasks``: mean, median, p90, p99, max (calls).

    Raises:
        ValueError: ``tasks`` is empty.
    """
    if not tasks:
        raise ValueError("tasks: empty")
    ks = sorted(len(codes_of(t)) for t in tasks)

    def q(p: float) -> float:
        return float(ks[min(len(ks) - 1, int(p * len(ks)))])

    return {"mean": statistics.fmean(ks), "median": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": float(ks[-1])}


def _main(argv: list[str]) -> int:
    kwargs: dict[str, Any] = {}
    if len(argv) >= 2:
        kwargs["calls_median"] = float(argv[1])
    if len(argv) >= 3:
        kwargs["calls_sigma"] = float(argv[2])
    env = SyntheticLongTailEnv(**kwargs)
    tasks = env.tasks("train", 2000, seed=0)
    print("required calls over 2000 train tasks:", {k: round(v, 2) for k, v in summarise_calls(tasks).items()})
    for t in tasks[:3]:
        print(t.task_id, repr(t.prompt), "codes", t.metadata["codes"], "->", t.reference)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
