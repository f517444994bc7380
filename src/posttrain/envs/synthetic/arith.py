"""``synthetic_arith``: single-turn integer arithmetic that a tiny model can learn on a CPU in minutes.

A task reads ``Compute 23 + 48.``; the ideal answer is ``#### 71`` (``reference_solution``), which
is also the SFT warm-start target. The reward is 1.0 when the integer after the last ``####``
equals the reference, else 0.0.

``unmarked_fraction`` makes the warm start imperfect on purpose, the way real SFT data often is:
that share of training tasks carries a reference written ``= 71`` without the ``####`` marker the
verifier needs. A warm-started policy then answers in both styles, and RL has a reward signal to
learn the verified style from (besides the arithmetic itself). The held-out tasks are unaffected.

Tasks are generated deterministically. The train/held-out split is decided by hashing the
problem itself (operands and operator, SHA-256), independent of the seed, so the two splits are
disjoint for every seed and every ``n``; the seed only decides which problems are drawn and in
what order.

Run ``python -m posttrain.envs.synthetic.arith`` to print a few train and held-out tasks.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Literal

from posttrain.envs.base import StepResult
from posttrain.envs.math.answers import extract_answer
from posttrain.records import Task

ENV_NAME = "synthetic_arith"
"""Registry name of this environment."""

Split = Literal["train", "eval"]
"""``train`` or ``eval`` (held-out)."""

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_INT_RE = re.compile(r"[+-]?\d+")


def is_heldout(key: str, heldout_fraction: float) -> bool:
    """Whether a problem (identified by ``key``) belongs to the held-out split.

    The first 8 bytes of SHA-256(``key``) as a number in [0, 1) fall below ``heldout_fraction``.
    """
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction


def sample_from_pool(pool: Sequence[tuple[str, dict[str, str]]], n: int, seed: int) -> list[tuple[str, dict[str, str]]]:
    """``n`` items of ``pool`` in seeded order; when ``n`` exceeds the pool it is cycled, reshuffled each pass.

    Raises:
        ValueError: an empty pool or ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    if not pool:
        raise ValueError("pool: empty; widen the operand range or lower heldout_fraction")
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, str]]] = []
    while len(out) < n:
        order = list(pool)
        rng.shuffle(order)
        out.extend(order[: n - len(out)])
    return out


def parse_integer_answer(action_text: str) -> int | None:
    """The integer after the last ``####`` (``#### -12`` → -12), or ``None``."""
    answer = extract_answer(action_text, "hashes")
    if answer is None or not _INT_RE.fullmatch(answer.replace(",", "")):
        return None
    return int(answer.replace(",", ""))


class SyntheticArithEnv:
    """Single-turn arithmetic ``Compute A op B.`` → ``#### result``.

    Args:
        low: Smallest operand (inclusive).
        high: Operand bound (exclusive), > ``low``.
        operators: Operators to draw from, a subset of ``+``, ``-``, ``*``.
        heldout_fraction: Share of problems in the held-out split, in (0, 1).
        unmarked_fraction: Share of training tasks whose SFT reference omits the ``####`` marker,
            in [0, 1) (chosen by hashing the problem, so it is the same for every seed).

    Raises:
        ValueError: an empty range, an unknown operator, or a fraction outside its range.
    """

    name = ENV_NAME

    def __init__(
        self,
        low: int = 0,
        high: int = 50,
        operators: Sequence[str] = ("+",),
        heldout_fraction: float = 0.1,
        unmarked_fraction: float = 0.0,
    ) -> None:
        if high <= low:
            raise ValueError(f"high: must exceed low={low}, got {high}")
        bad = [op for op in operators if op not in _OPS]
        if bad or not operators:
            raise ValueError(f"operators: expected a non-empty subset of {sorted(_OPS)}, got {list(operators)}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction: must lie in (0, 1), got {heldout_fraction}")
        if not 0.0 <= unmarked_fraction < 1.0:
            raise ValueError(f"unmarked_fraction: must lie in [0, 1), got {unmarked_fraction}")
        self.unmarked_fraction = unmarked_fraction
        self.low, self.high = low, high
        self.operators = tuple(operators)
        self.heldout_fraction = heldout_fraction
        self._pools: dict[str, list[tuple[str, dict[str, str]]]] = {}

    def _pool(self, split: Split) -> list[tuple[str, dict[str, str]]]:
        """All ``(prompt, fields)`` of a split, in a fixed order (computed once per split)."""
        if split in self._pools:
            return self._pools[split]
        pool: list[tuple[str, dict[str, str]]] = []
        for op in self.operators:
            for a in range(self.low, self.high):
                for b in range(self.low, self.high):
                    key = f"{a} {op} {b}"
                    if is_heldout(key, self.heldout_fraction) == (split == "eval"):
                        fields = {"a": str(a), "b": str(b), "op": op, "reference": str(_OPS[op](a, b))}
                        if split == "train" and is_heldout("sft-style " + key, self.unmarked_fraction):
                            fields["sft_style"] = "unmarked"
                        pool.append((f"Compute {key}.", fields))
        self._pools[split] = pool
        return pool

    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        """``n`` tasks of a split, drawn with ``seed`` (the pool is cycled when ``n`` exceeds it).

        Task ids are ``synthetic_arith-<split>-<index, 6 digits>``.

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

    def start(self, task: Task) -> ArithEpisode:
        """Begin an episode for ``task``."""
        return ArithEpisode(task)


class ArithEpisode:
    """One ``synthetic_arith`` episode: one user message, one answer."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def messages(self) -> list[dict[str, str]]:
        """The user message only (short prompts suit tiny models)."""
        return [{"role": "user", "content": self.task.prompt}]

    async def step(self, action_text: str) -> StepResult:
        """Grade the answer: reward 1.0 if the integer after ``####`` equals the reference."""
        answer = parse_integer_answer(action_text)
        correct = answer is not None and str(answer) == self.task.reference.strip()
        return StepResult(
            done=True,
            reward=1.0 if correct else 0.0,
            finish_reason="stop",
            metrics={"correct": float(correct), "has_answer": float(answer is not None)},
        )

    def close(self) -> None:
        """Nothing to release."""


def reference_solution(task: Task) -> str:
    """The SFT warm-start target for ``task``: ``#### 71``, or ``= 71`` for an unmarked task."""
    if task.metadata.get("sft_style") == "unmarked":
        return f"= {task.reference}"
    return f"#### {task.reference}"


if __name__ == "__main__":
    env = SyntheticArithEnv()
    for split in ("train", "eval"):
        for t in env.tasks(split, 3, seed=0):
            print(split, t.task_id, repr(t.prompt), "->", reference_solution(t))
