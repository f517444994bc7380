"""Build the example training files in ``data/examples/`` from the GSM8K files in ``data/gsm8k/``.

One file per user data format (documented in ``docs/data.md``):

* ``sft.jsonl``  chat rows: the question as the user turn, the worked solution as the assistant turn;
* ``cpt.jsonl``  raw-text rows: question and solution as one document;
* ``dpo.jsonl``  preference rows: the correct solution (chosen) against a corrupted copy (rejected)
  whose final answer and last computed result are changed, so it reaches a wrong answer;
* ``rl.jsonl``   RL task rows: the question and the final number the verifier checks against.

Calculator annotations (``<<48/2=24>>``) are removed from solutions; the final line keeps
GSM8K's ``#### <answer>`` form, which the math verifier reads. Output is deterministic (``--seed``).

Run: ``python scripts/build_example_data.py [--rows 200] [--seed 0] [--out data/examples]``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GSM8K_TRAIN = REPO / "data" / "gsm8k" / "train.jsonl"
GSM8K_TEST = REPO / "data" / "gsm8k" / "test.jsonl"
ANNOTATION = re.compile(r"<<[^>]*>>")
FINAL = re.compile(r"####\s*(.+?)\s*$")


def clean_solution(answer: str) -> tuple[str, str]:
    """Strip calculator annotations; return ``(solution text, final answer)``.

    Raises:
        ValueError: the solution has no ``#### <answer>`` line.
    """
    text = ANNOTATION.sub("", answer).strip()
    match = FINAL.search(text)
    if match is None:
        raise ValueError(f"no '#### <answer>' line in {answer[-80:]!r}")
    return text, match.group(1).replace(",", "")


def corrupt_solution(solution: str, final: str, rng: random.Random) -> str:
    """A wrong copy of ``solution``: the final answer and its last whole-number mention in the text are replaced.

    The wrong number is ``final + d`` for a non-zero ``d`` drawn from ``rng`` (or a doubled value),
    so the rejected solution reaches a different answer by a plausible-looking slip.

    Raises:
        ValueError: ``final`` is not a number.
    """
    value = float(final)
    wrong = value
    while wrong == value:
        wrong = rng.choice([value + rng.choice([-10, -2, -1, 1, 2, 10]), value * 2, value + 5])
    wrong_text = str(int(wrong)) if wrong == int(wrong) else f"{wrong:g}"
    body, _, _ = solution.rpartition("####")
    body = body.rstrip()
    mentions = list(re.finditer(rf"(?<![\d.]){re.escape(final)}(?![\d])", body))
    if mentions:
        last = mentions[-1]
        body = body[: last.start()] + wrong_text + body[last.end() :]
    return f"{body}\n#### {wrong_text}"


def read_jsonl(path: Path, limit: int, skip: int = 0) -> list[dict[str, str]]:
    """Rows ``skip .. skip + limit`` of a GSM8K file."""
    rows = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < skip:
                continue
            if len(rows) >= limit:
                break
            rows.append(json.loads(line))
    return rows


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    """Write one JSON object per line (UTF-8, no ASCII escaping)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def build(out: Path, rows: int, seed: int) -> dict[str, int]:
    """Write the four example files into ``out``; return rows written per file."""
    rng = random.Random(seed)
    sft, cpt, dpo = [], [], []
    for i, row in enumerate(read_jsonl(GSM8K_TRAIN, 3 * rows)):
        solution, final = clean_solution(row["answer"])
        part, ident = i % 3, f"gsm8k-train-{i + 1:05d}"
        if part == 0:
            sft.append({"id": ident, "messages": [
                {"role": "user", "content": row["question"]},
                {"role": "assistant", "content": solution},
            ]})
        elif part == 1:
            cpt.append({"id": ident, "text": f"Question: {row['question']}\nAnswer: {solution}"})
        else:
            dpo.append({"id": ident, "prompt": row["question"], "chosen": solution,
                        "rejected": corrupt_solution(solution, final, rng)})
    rl = []
    for i, row in enumerate(read_jsonl(GSM8K_TEST, rows)):
        _, final = clean_solution(row["answer"])
        rl.append({"task_id": f"gsm8k-test-{i + 1:05d}", "prompt": row["question"], "reference": final})
    files = {"sft.jsonl": sft, "cpt.jsonl": cpt, "dpo.jsonl": dpo, "rl.jsonl": rl}
    for name, content in files.items():
        write_jsonl(out / name, content)
    return {name: len(content) for name, content in files.items()}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200, help="rows per file (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="corruption seed (default 0)")
    parser.add_argument("--out", type=Path, default=REPO / "data" / "examples", help="output directory")
    args = parser.parse_args(argv)
    for name, count in build(args.out, args.rows, args.seed).items():
        print(f"{args.out / name}: {count} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
