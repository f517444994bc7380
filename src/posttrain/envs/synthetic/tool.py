r"""``synthetic_tool``: multi-turn arithmetic with a calculator tool, small enough for a tiny CPU model.

A task reads ``Compute 7 * 8 + 5 using the calculator.`` The ideal episode (``reference_episode``):

* turn 1: ``<tool_call>{"name": "calculator", "arguments": {"expression": "7*8+5"}}</tool_call>``
* observation: ``<tool_result name="calculator">\n61\n</tool_result>``
* turn 2: ``#### 61``

Rules of an episode:

* An action with tool calls runs each call and returns their results as one observation (the
  episode goes on). Every well-formed ``calculator`` call counts in ``tool_calls``, also when
  the expression itself is invalid (the observation then says ``error: ...``).
* Malformed-call rule: an action whose tool call does not parse, names an unknown tool, or lacks a
  string ``expression`` argument gets an error observation; ``max_malformed_actions`` such actions
  in a row (default 2) end the episode with ``finish_reason="tool_error"`` and reward 0.0. A
  well-formed action resets the count.
* An action without tool calls is the final answer: the integer after the last ``####``.
  Reward 1.0 if it equals the reference, minus ``no_tool_penalty`` (default 0.1) when the
  episode never called the calculator; 0.0 if wrong.

Every step reports ``correct``, ``tool_calls``, ``malformed_actions`` and ``tool_wait_s`` (seconds
of tool latency so far).

Tool latency (wall time, no accelerator time), as in ``synthetic_longtail`` and with the same four
arguments: with ``tool_latency_median_s > 0`` each well-formed ``calculator`` call (also one whose
expression is invalid) waits a log-normal delay (``posttrain.envs.synthetic.latency.ToolLatency``)
with ``asyncio.sleep`` inside the async ``step``::

    latency(task, i) = min(tool_latency_max_s, tool_latency_median_s * exp(tool_latency_sigma * z)),
    z ~ N(0, 1) drawn from a generator seeded by (tool_latency_seed, task id, i)

for the ``i``-th well-formed call (0-based) of an episode, so every method, generator and replay
sees the same latencies for the same task. Several calls in one action wait in order (each
well-formed one, also in an action that holds a malformed call and so counts as malformed); a
malformed call runs no tool and waits nothing, and a final answer waits nothing. The default
``tool_latency_median_s = 0`` makes every call instantaneous; ``call_latency_s(task, i)`` gives
the delay without waiting.

``unmarked_fraction`` (default 0.0) makes the warm start imperfect on purpose, like
``synthetic_arith``'s argument of the same name: that share of training tasks (chosen by hashing
the expression, so the same for every seed) carries a reference episode whose final turn reads
``= 61`` instead of ``#### 61``. The episode still calls the calculator and reads its result, so
the SFT data stays multi-turn with observation tokens; only the answer marker the verifier needs
is missing. A warm-started policy then answers in both styles, and RL has a reward signal to
learn the verified style from. The held-out tasks are unaffected.

Run ``python -m posttrain.envs.synthetic.tool "7*8+5"`` to evaluate an expression with the calculator.
"""

from __future__ import annotations

import ast
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

from posttrain.envs.base import StepResult
from posttrain.envs.synthetic.arith import Split, is_heldout, parse_integer_answer, sample_from_pool
from posttrain.envs.synthetic.latency import ToolLatency
from posttrain.envs.tool_calls import (
    ToolCall,
    ToolCallError,
    format_tool_call,
    format_tool_result,
    parse_tool_calls,
)
from posttrain.records import Task

ENV_NAME = "synthetic_tool"
"""Registry name of this environment."""

TOOL_NAME = "calculator"
"""The one tool of this environment."""

MAX_EXPRESSION_CHARS = 200
"""Longest expression the calculator accepts (characters)."""

MAX_EXPONENT = 64
"""Largest absolute exponent ``**`` accepts."""

MAX_MAGNITUDE = 10**30
"""Largest absolute value of any intermediate result."""

SYSTEM_PROMPT = (
    "You can use a calculator. Call it as "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call> '
    "and then give the final answer as #### <number>."
)
"""Short system prompt describing the tool (kept short for tiny models)."""

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value is out of bounds."""


def _eval_node(node: ast.AST) -> int | float:
    """Evaluate one AST node of the allowed grammar."""
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    value: int | float
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        value = node.value
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_eval_node(node.operand))
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} exceeds {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise CalculatorError("division by zero") from exc
        except OverflowError as exc:
            raise CalculatorError("result too large") from exc
    else:
        raise CalculatorError(f"unsupported syntax: {type(node).__name__}; use numbers, + - * / // % ** and ()")
    if isinstance(value, complex):
        raise CalculatorError("complex result")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"result exceeds {MAX_MAGNITUDE:.0e} in magnitude")
    return value


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression safely and return its value as text.

    Grammar: integer and decimal literals, unary ``+``/``-``, binary ``+ - * / // % **`` and
    parentheses. Integers stay exact; a float result that is whole prints as an integer, others
    with up to 12 significant digits.

    Guarantees:
        * No code runs: the text is parsed with ``ast.parse(mode="eval")`` and only the node types
          above are interpreted; names, calls, attributes, subscripts, comprehensions and
          lambdas are rejected with ``CalculatorError``.
        * Bounded work: at most ``MAX_EXPRESSION_CHARS`` characters, exponents at most
          ``MAX_EXPONENT`` in absolute value and every intermediate value at most
          ``MAX_MAGNITUDE`` in absolute value.

    Not guaranteed:
        * Exact decimal arithmetic for non-integers (Python floats are used).

    Raises:
        CalculatorError: anything that is not bounded plain arithmetic, division by zero.

    Example:
        >>> calculate("7*8+5")
        '61'
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression: expected a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"not a valid expression: {type(exc).__name__}") from exc
    value = _eval_node(tree)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.12g}"
    return str(value)


class SyntheticToolEnv:
    """Multi-turn ``Compute A op B op C using the calculator.`` with a calculator tool.

    Args:
        low: Smallest operand (inclusive).
        high: Operand bound (exclusive), > ``low``.
        operators: Operators drawn for both positions, a subset of ``+``, ``-``, ``*``.
        heldout_fraction: Share of expressions in the held-out split, in (0, 1).
        no_tool_penalty: Subtracted from the reward of a correct answer given without calling the
            calculator (0 <= penalty <= 1).
        max_malformed_actions: Malformed tool-call actions in a row that end the episode with
            ``tool_error`` (>= 1).
        system_prompt: System message describing the tool, or ``None`` for none.
        unmarked_fraction: Share of training tasks whose SFT reference answers ``= <value>``
            without the ``####`` marker, in [0, 1) (chosen by hashing the expression, so the same
            for every seed; held-out tasks are never marked this way).
        tool_latency_median_s: Median wall-time latency of one calculator call (seconds, >= 0; 0
            disables latency). See the module docstring.
        tool_latency_sigma: Standard deviation of the latency's logarithm (>= 0; 0 gives every
            call the median).
        tool_latency_max_s: Cap on one call's latency (seconds, > 0).
        tool_latency_seed: Seed of the per-task latency draws.

    Raises:
        ValueError: a bad range, operator, fraction, penalty or count; the message names it.
    """

    name = ENV_NAME

    def __init__(
        self,
        low: int = 0,
        high: int = 10,
        operators: Sequence[str] = ("+", "*"),
        heldout_fraction: float = 0.1,
        no_tool_penalty: float = 0.1,
        max_malformed_actions: int = 2,
        system_prompt: str | None = SYSTEM_PROMPT,
        unmarked_fraction: float = 0.0,
        tool_latency_median_s: float = 0.0,
        tool_latency_sigma: float = 1.0,
        tool_latency_max_s: float = 60.0,
        tool_latency_seed: int = 0,
    ) -> None:
        if high <= low:
            raise ValueError(f"high: must exceed low={low}, got {high}")
        bad = [op for op in operators if op not in _OPS]
        if bad or not operators:
            raise ValueError(f"operators: expected a non-empty subset of {sorted(_OPS)}, got {list(operators)}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction: must lie in (0, 1), got {heldout_fraction}")
        if not 0.0 <= no_tool_penalty <= 1.0:
            raise ValueError(f"no_tool_penalty: must lie in [0, 1], got {no_tool_penalty}")
        if max_malformed_actions < 1:
            raise ValueError(f"max_malformed_actions: must be >= 1, got {max_malformed_actions}")
        if not 0.0 <= unmarked_fraction < 1.0:
            raise ValueError(f"unmarked_fraction: must lie in [0, 1), got {unmarked_fraction}")
        self.tool_latency = ToolLatency(tool_latency_median_s, tool_latency_sigma, tool_latency_max_s,
                                        tool_latency_seed, namespace=ENV_NAME)
        self.unmarked_fraction = unmarked_fraction
        self.low, self.high, self.operators = low, high, tuple(operators)
        self.heldout_fraction = heldout_fraction
        self._pools: dict[str, list[tuple[str, dict[str, str]]]] = {}
        self.no_tool_penalty = no_tool_penalty
        self.max_malformed_actions = max_malformed_actions
        self.system_prompt = system_prompt

    def _pool(self, split: Split) -> list[tuple[str, dict[str, str]]]:
        """All ``(prompt, fields)`` of a split, in a fixed order (computed once per split)."""
        if split in self._pools:
            return self._pools[split]
        pool: list[tuple[str, dict[str, str]]] = []
        span = range(self.low, self.high)
        for op1 in self.operators:
            for op2 in self.operators:
                for a in span:
                    for b in span:
                        for c in span:
                            expr = f"{a} {op1} {b} {op2} {c}"
                            if is_heldout(expr, self.heldout_fraction) == (split == "eval"):
                                fields = {"expression": expr, "reference": calculate(expr)}
                                if split == "train" and is_heldout("sft-style " + expr, self.unmarked_fraction):
                                    fields["sft_style"] = "unmarked"
                                pool.append((f"Compute {expr} using the calculator.", fields))
        self._pools[split] = pool
        return pool

    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        """``n`` tasks of a split, drawn with ``seed``; ids ``synthetic_tool-<split>-<index>``.

        Raises:
            ValueError: unknown ``split``, ``n < 0`` or an empty split.
        """
        if split not in ("train", "eval"):
            raise ValueError(f"split: expected 'train' or 'eval', got {split!r}")
        return [
            Task(
                task_id=f"{ENV_NAME}-{split}-{i:06d}",
                env_name=ENV_NAME,
                prompt=prompt,
                reference=fields["reference"],
                data_source=ENV_NAME,
                metadata={k: v for k, v in fields.items() if k != "reference"},
            )
            for i, (prompt, fields) in enumerate(sample_from_pool(self._pool(split), n, seed))
        ]

    def call_latency_s(self, task: Task, call_index: int) -> float:
        """Wall-time latency (seconds) of the ``call_index``-th well-formed call (0-based) in an episode of ``task``.

        Deterministic in (``tool_latency_seed``, task id, ``call_index``); 0.0 when
        ``tool_latency_median_s`` is 0. Formula in the module docstring.

        Raises:
            ValueError: ``call_index < 0``.
        """
        return self.tool_latency.delay_s(self.latency_key(task, call_index))

    @staticmethod
    def latency_key(task: Task, call_index: int) -> str:
        """The ``ToolLatency`` key of the ``call_index``-th well-formed call (0-based) of an episode of ``task``.

        Raises:
            ValueError: ``call_index < 0``.
        """
        if call_index < 0:
            raise ValueError(f"call_index: must be >= 0, got {call_index}")
        return f"{task.task_id}:{call_index}"

    def start(self, task: Task) -> ToolEpisode:
        """Begin an episode for ``task``."""
        return ToolEpisode(self, task)


class ToolEpisode:
    """One ``synthetic_tool`` episode (see the module docstring for the rules)."""

    def __init__(self, env: SyntheticToolEnv, task: Task) -> None:
        self.env, self.task = env, task
        self.tool_calls = 0
        self.malformed_actions = 0
        self.tool_wait_s = 0.0
        self._malformed_in_a_row = 0

    def messages(self) -> list[dict[str, str]]:
        """Optional system message, then the user's problem."""
        head = [{"role": "system", "content": self.env.system_prompt}] if self.env.system_prompt else []
        return head + [{"role": "user", "content": self.task.prompt}]

    def _metrics(self, correct: bool = False) -> dict[str, float]:
        return {
            "correct": float(correct),
            "tool_calls": float(self.tool_calls),
            "malformed_actions": float(self.malformed_actions),
            "tool_wait_s": self.tool_wait_s,
        }

    async def _run(self, call: ToolCall) -> tuple[str, bool]:
        """Observation text for one call and whether the call was well formed (a well-formed one waits its latency)."""
        if call.name != TOOL_NAME:
            return format_tool_result(call.name, f"error: unknown tool {call.name!r}; the only tool is {TOOL_NAME!r}"), False
        expression = call.arguments.get("expression")
        if not isinstance(expression, str) or set(call.arguments) != {"expression"}:
            return format_tool_result(TOOL_NAME, "error: arguments must be {\"expression\": \"<arithmetic>\"}"), False
        self.tool_wait_s += await self.env.tool_latency.wait(self.env.latency_key(self.task, self.tool_calls))
        self.tool_calls += 1
        try:
            return format_tool_result(TOOL_NAME, calculate(expression)), True
        except CalculatorError as exc:
            return format_tool_result(TOOL_NAME, f"error: {exc}"), True

    async def step(self, action_text: str) -> StepResult:
        """Run the action's calculator calls, or grade its final answer."""
        try:
            calls = parse_tool_calls(action_text)
        except ToolCallError as exc:
            return self._malformed(format_tool_result("tool_call", f"error: malformed tool call: {exc}"))
        if not calls:
            answer = parse_integer_answer(action_text)
            correct = answer is not None and str(answer) == self.task.reference.strip()
            reward = (1.0 - (self.env.no_tool_penalty if self.tool_calls == 0 else 0.0)) if correct else 0.0
            return StepResult(done=True, reward=reward, finish_reason="stop", metrics=self._metrics(correct))
        results = [await self._run(call) for call in calls]  # in order: each call waits its latency
        observation = "\n".join(text for text, _ in results)
        if not all(ok for _, ok in results):
            return self._malformed(observation)
        self._malformed_in_a_row = 0
        return StepResult(observation=observation, metrics=self._metrics())

    def _malformed(self, observation: str) -> StepResult:
        """Count a malformed action; end with ``tool_error`` after too many in a row."""
        self.malformed_actions += 1
        self._malformed_in_a_row += 1
        if self._malformed_in_a_row >= self.env.max_malformed_actions:
            return StepResult(done=True, reward=0.0, finish_reason="tool_error", metrics=self._metrics())
        return StepResult(observation=observation, metrics=self._metrics())

    def close(self) -> None:
        """Nothing to release."""


def reference_episode(task: Task) -> list[str]:
    """Assistant turns of the SFT warm-start episode: one calculator call, then ``#### <value>``.

    A task marked ``sft_style="unmarked"`` (see ``unmarked_fraction``) ends with ``= <value>``
    instead, an answer the verifier does not accept.

    Raises:
        KeyError: the task has no ``expression`` in its metadata (not a ``synthetic_tool`` task).
    """
    expression = task.metadata["expression"].replace(" ", "")
    call = format_tool_call(ToolCall(name=TOOL_NAME, arguments={"expression": expression}))
    marker = "=" if task.metadata.get("sft_style") == "unmarked" else "####"
    return [call, f"{marker} {task.reference}"]


if __name__ == "__main__":
    for text in sys.argv[1:] or ["7*8+5"]:
        try:
            print(text, "=", calculate(text))
        except CalculatorError as err:
            print(text, "error:", err)
