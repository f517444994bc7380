"""``evaluate`` end to end: sampling through the agent loop, grading, the report; and ``posttrain eval``.

Most tests use an oracle *engine* (a test double of the inference engine that answers each
task with a scripted response), so the numbers are exact; one test runs the real ``hf`` engine
on the tiny random model.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fakes.fake_openai_judge import FakeJudge
from fixtures_models import TinyModel
from posttrain.eval.benchmarks import load_tasks
from posttrain.eval.cli import eval_cli
from posttrain.eval.grading import JudgeClient
from posttrain.eval.runner import EvalError, evaluate
from posttrain.eval.swe.instances import SweInfraError
from posttrain.eval.swe.local_backend import LocalSweBackend
from posttrain.inference.base import GenerationRequest, GenerationResult
from posttrain.models.hf import load_tokenizer


@dataclass
class OracleEngine:
    """Answers a prompt containing ``key`` with the next of ``replies[key]`` (test double of the engine)."""

    tokenizer: Any
    replies: dict[str, list[str]]
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    policy_version: int = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(request.prompt_token_ids)
        key = next(k for k in self.replies if k in prompt)
        text = self.replies[key][self.calls[key] % len(self.replies[key])]
        self.calls[key] += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: request.max_new_tokens - 1]
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        return GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", policy_version=0)

    async def update_weights(self, weights_dir: Path, policy_version: int) -> None:
        return None

    def close(self) -> None:
        return None


def test_gsm8k_avg_and_pass_at_k_from_scripted_answers(tiny_model: TinyModel, tmp_path: Path) -> None:
    """Task 0: [right, right], task 1: [right, wrong], task 2: [wrong, wrong].
    avg@2 = (1 + 0.5 + 0) / 3 = 0.5; pass@1 = 0.5; pass@2 = (1 + 1 + 0) / 3 = 2/3.
    """
    tok = load_tokenizer(tiny_model.path)
    tasks = load_tasks("gsm8k", limit=3)
    right = [f"So the answer is \\boxed{{{t.reference}}}." for t in tasks]
    wrong = [f"So the answer is \\boxed{{{int(t.reference) + 1}}}." for t in tasks]
    replies = {
        tasks[0].metadata["problem"]: [right[0], right[0]],
        tasks[1].metadata["problem"]: [right[1], wrong[1]],
        tasks[2].metadata["problem"]: [wrong[2], wrong[2]],
    }
    report = evaluate(tiny_model.path, "gsm8k", limit=3, samples_per_task=2, out_dir=tmp_path, max_model_len=2048,
                      engine=OracleEngine(tok, replies), tokenizer=tok, label="trained")
    assert report.scores is not None
    assert report.scores.avg_at_k == pytest.approx(0.5)
    assert report.scores.pass_at_k == pytest.approx({1: 0.5, 2: 2 / 3})
    assert report.temperature == 0.6 and report.num_tasks == 3 and report.label == "trained"
    lines = (tmp_path / "gsm8k.samples.jsonl").read_text().splitlines()
    assert len(lines) == 6 and {json.loads(x)["method"] for x in lines} == {"exact_number"}
    assert report.response_tokens is not None and report.response_tokens.min > 0


def test_imo_prose_reference_is_needs_judge_then_graded_by_the_judge(tiny_model: TinyModel) -> None:
    """The first 30 IMO tasks include imo-bench-algebra-029, whose reference is a function family
    "for some a>0": a paraphrased answer is reported as needs judge, the rest score 29/29.
    With a judge (loopback fake answering CORRECT) all 30 are graded: 30/30."""
    tok = load_tokenizer(tiny_model.path)
    tasks = load_tasks("imo_answerbench", limit=30)
    replies = {t.metadata["problem"]: [f"Hence $\\boxed{{{t.reference}}}$."] for t in tasks}
    prose = next(t for t in tasks if t.task_id == "imo-bench-algebra-029")
    replies[prose.metadata["problem"]] = ["\\boxed{g(x) = \\frac{(2x)^a + (2x)^{-a}}{3} \\text{ with any } a > 0}"]
    report = evaluate(tiny_model.path, "imo_answerbench", limit=30, max_model_len=8192,
                      engine=OracleEngine(tok, replies), tokenizer=tok)
    assert report.num_needs_judge == 1 and report.needs_judge_task_ids == ["imo-bench-algebra-029"]
    assert report.scores is not None and report.scores.num_tasks == 29 and report.scores.avg_at_k == 1.0
    assert report.avg_at_k_bounds == pytest.approx((29 / 30, 1.0))
    assert set(report.categories) <= {"Algebra", "Combinatorics", "Geometry", "Number theory"}
    with FakeJudge() as judge:
        judge.script = [(200, "Same family of functions.\nVERDICT: CORRECT")]
        judged = evaluate(tiny_model.path, "imo_answerbench", limit=30, max_model_len=8192,
                          engine=OracleEngine(tok, replies), tokenizer=tok, judge=JudgeClient(judge.url, "judge-m"))
        assert len(judge.requests) == 1 and "for some $a>0$" in judge.requests[0][1]["messages"][0]["content"]
    assert judged.num_needs_judge == 0 and judged.scores.avg_at_k == 1.0
    assert judged.grading_methods["judge"] == 1 and judged.details["judge_model"] == "judge-m"


def test_swe_repair_tasks_graded_by_the_local_backend(tiny_model: TinyModel) -> None:
    """Task 0 answered with its reference fix (resolved), task 1 with prose (no diff): avg@1 = 0.5."""
    tok = load_tokenizer(tiny_model.path)
    tasks = load_tasks("swe_repair", limit=2)
    fix = (Path(tasks[0].reference) / "fix.patch").read_text()
    key0 = tasks[0].prompt.split("\n")[1][:60]
    key1 = tasks[1].prompt.split("\n")[1][:60]
    replies = {key0: [f"Here is the fix:\n```diff\n{fix}```\n"], key1: ["I would rewrite the module."]}
    report = evaluate(tiny_model.path, "swe_repair", limit=2, max_model_len=8192,
                      engine=OracleEngine(tok, replies), tokenizer=tok)
    assert report.scores is not None and report.scores.avg_at_k == 0.5
    assert report.grading_methods == {"tests": 1, "no_answer": 1}
    assert report.details["swe_backend"] == "local"


def test_wrong_backend_and_unknown_benchmark_are_eval_errors(tiny_model: TinyModel) -> None:
    with pytest.raises(EvalError, match="--backend kubernetes"):
        evaluate(tiny_model.path, "swe_bench_verified", swe_backend="local", limit=1)
    with pytest.raises(EvalError, match="not registered"):
        evaluate(tiny_model.path, "aime2030")


def test_real_hf_engine_on_tiny_model_and_cli_reports(tiny_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--benchmark", "gsm8k", "--model", str(tiny_model.path), "--limit", "2", "--engine", "hf",
            "--max-new-tokens", "8"]
    assert eval_cli(base + ["--out", str(tmp_path / "base")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gsm8k: avg@1 = ")
    base_json = tmp_path / "base" / "gsm8k.json"
    report = json.loads(base_json.read_text())
    assert report["engine"] == "HFEngine" and report["num_tasks"] == 2
    assert report["response_tokens"]["max"] <= 8
    assert eval_cli(base + ["--out", str(tmp_path / "trained"), "--baseline", str(base_json)]) == 0
    for name in ("gsm8k.json", "report.md", "report.html", "comparison.png", "gsm8k.samples.jsonl"):
        assert (tmp_path / "trained" / name).is_file(), name


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert eval_cli(["--benchmark", "gsm8k", "--model", str(tmp_path / "nope"), "--engine", "hf"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert eval_cli(["--benchmark", "nope", "--model", "x"]) == 2
    assert eval_cli(["--benchmark", "gsm8k", "--model", "x", "--k", "0"]) == 1


def test_posttrain_eval_refuses_a_missing_model_before_creating_any_output(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A new user's ``posttrain eval --model runs/nope`` refused the model only after creating ``eval_out/logs/``
    (its log file too). The command's own path (``posttrain.cli``, which routes library output to ``--out``)."""
    import os
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[3] / "src"
    for model, out in (("runs/nope", None), (str(tmp_path), "elsewhere")):  # missing; a directory with no model
        done = subprocess.run(
            [sys.executable, "-m", "posttrain.cli", "eval", "--benchmark", "gsm8k", "--model", model,
             *(["--out", out] if out else [])],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"})
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith("error: --model: ") and done.stderr.count("\n") == 1, done.stderr
        assert model in done.stderr and done.stdout == ""
        assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    assert eval_cli(["--benchmark", "gsm8k", "--model", "s3://bucket/m", "--out", str(tmp_path / "a-file")]) == 1
    assert capsys.readouterr().err == f"error: --out {tmp_path / 'a-file'}: exists and is not a directory\n"


@pytest.mark.slow
@pytest.mark.integration
def test_default_vllm_engine_samples_the_benchmark(tiny_model: TinyModel, tmp_path: Path) -> None:
    """The default engine path (vLLM on CPU here): 2 tasks x 2 samples of at most 16 tokens each."""
    from posttrain.inference.factory import vllm_available

    if not vllm_available():
        pytest.skip("vllm does not import here")
    report = evaluate(tiny_model.path, "gsm8k", engine_kind="vllm", limit=2, samples_per_task=2, max_new_tokens=16,
                      out_dir=tmp_path)
    assert report.engine == "VLLMEngine" and report.num_tasks == 2
    assert report.response_tokens is not None and report.response_tokens.count == 4 and report.response_tokens.max <= 16
    assert len((tmp_path / "gsm8k.samples.jsonl").read_text().splitlines()) == 4


def test_prompt_longer_than_the_context_is_its_own_finish_reason_not_truncation(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    """3 GSM8K tasks; the context is set one token above the shortest chat prompt, so the two longer
    prompts cannot be answered. They are recorded wrong with finish reason and method
    prompt_too_long (never sampled), not as "truncated at max tokens"; the short one is sampled (its
    one-token budget holds only the stop token from the scripted engine: finish reason stop)."""
    from posttrain.chat.format import ChatFormat

    tok = load_tokenizer(tiny_model.path)
    tasks = load_tasks("gsm8k", limit=3)
    lengths = [len(ChatFormat(tok).prompt_ids([{"role": "user", "content": t.prompt}])) for t in tasks]
    assert len(set(lengths)) == 3
    context = min(lengths) + 1
    replies = {t.metadata["problem"]: [f"So the answer is \\boxed{{{t.reference}}}."] for t in tasks}
    engine = OracleEngine(tok, replies)
    report = evaluate(tiny_model.path, "gsm8k", limit=3, out_dir=tmp_path, max_model_len=context,
                      engine=engine, tokenizer=tok)
    assert report.finish_reasons == {"prompt_too_long": 2, "stop": 1}
    assert report.grading_methods.get("prompt_too_long") == 2
    assert sum(engine.calls.values()) == 1
    rows = [json.loads(x) for x in (tmp_path / "gsm8k.samples.jsonl").read_text().splitlines()]
    too_long = [r for r in rows if r["finish_reason"] == "prompt_too_long"]
    assert len(too_long) == 2 and all(r["status"] == "wrong" and "tokens; the context is" in r["reason"] for r in too_long)
    assert report.response_tokens is not None and report.response_tokens.count == 1


@dataclass
class FailingSandbox:
    """The real local SWE backend behind a grading sandbox that fails (issue 32): the sandbox of an
    instance's grading run cannot start ``fails[instance_id]`` times (or every time, -1), as the backend
    reports it (``SweInfraError``, cause ``sandbox_error``); the other runs grade for real."""

    fails: dict[str, int]
    inner: LocalSweBackend = field(default_factory=LocalSweBackend)
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def run(self, instance: Any, patch: str) -> Any:
        self.calls[instance.instance_id] += 1
        left = self.fails.get(instance.instance_id, 0)
        if left == -1 or self.calls[instance.instance_id] <= left:
            raise SweInfraError(f"sandbox failed: {instance.instance_id}: bubblewrap could not set up the mount",
                                "sandbox_error")
        return self.inner.run(instance, patch)


def test_a_sample_whose_grading_infrastructure_fails_is_retried_then_left_out_with_its_cause_and_a_bound_refuses_the_accuracy(
        tiny_model: TinyModel, tmp_path: Path) -> None:
    """3 SWE repair tasks, each answered with its reference fix (all resolvable). Task 0 grades; task 1's grading
    sandbox fails once, then grades on the retry; task 2's fails on every run (1 + 2 retries) and is left out,
    not scored unresolved: avg@1 = 2/2 over the 2 graded tasks, 1 sample left out (sandbox_error), 3 retries.
    At eval.max_infra_error_share 0.2 the same samples (1 of 3 left out, 33%) give no accuracy: one line
    saying why. Before, the first sandbox failure ended the evaluation with the grading error."""
    from posttrain.eval.report import SampleRecord, build_report
    from posttrain.eval.report_render import render_markdown

    tok = load_tokenizer(tiny_model.path)
    tasks = load_tasks("swe_repair", limit=3)
    replies = {t.prompt.split("\n")[1][:60]: [f"Here is the fix:\n```diff\n{(Path(t.reference) / 'fix.patch').read_text()}```\n"]
               for t in tasks}
    ids = [Path(t.reference).name for t in tasks]
    sandbox = FailingSandbox({ids[1]: 1, ids[2]: -1})
    report = evaluate(tiny_model.path, "swe_repair", limit=3, max_model_len=8192, engine=OracleEngine(tok, replies),
                      tokenizer=tok, swe_backend_obj=sandbox, out_dir=tmp_path, max_infra_error_share=0.5)

    assert dict(sandbox.calls) == {ids[0]: 1, ids[1]: 2, ids[2]: 3}
    assert report.scores is not None and (report.scores.avg_at_k, report.scores.num_tasks) == (1.0, 2)
    assert report.infra_errors == {"sandbox_error": 1} and report.infra_task_ids == [tasks[2].task_id]
    assert report.infra_retried == 3 and report.accuracy_refused == ""
    assert report.grading_methods == {"tests": 2, "infra_error": 1} and report.avg_at_k_bounds == (1.0, 1.0)
    note = "swe_repair: 1 samples on 1 tasks failed for the infrastructure (sandbox_error 1)"
    assert note in render_markdown([report])

    records = [msgspec.json.decode(line, type=SampleRecord)
               for line in (tmp_path / "swe_repair.samples.jsonl").read_bytes().splitlines()]
    left_out = [r for r in records if r.status == "infra_error"]
    assert len(left_out) == 1 and left_out[0].infra_cause == "sandbox_error"
    refused = build_report(records, benchmark="swe_repair", model="m", samples_per_task=1, temperature=0.0,
                           max_new_tokens=8, infra_retried=3, max_infra_error_share=0.2)
    assert refused.scores is None and refused.categories == {}
    assert refused.accuracy_refused == (
        "swe_repair: 1 of 3 samples failed for the infrastructure (sandbox_error 1): 33% > "
        "eval.max_infra_error_share=0.2; no accuracy reported (the samples that ran may not stand for the set; fix "
        "the sandbox or grader and evaluate again)")
    assert refused.accuracy_refused in render_markdown([refused])
