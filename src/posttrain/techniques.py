"""``posttrain run`` for the techniques beside SAO: ``sft``, ``cpt``, ``dpo`` and ``grpo`` (sync or async).

``TECHNIQUES`` is a plain dict from the config's ``technique`` to its runner; ``flow.run`` calls
``run_technique(config)`` for every technique but ``sao``. Every runner shares the same frame:

1. **prepare** the tokenizer and base model (``flow.prepare``);
2. **data**: the technique's own file (``sft.data_path`` / ``dpo.data_path``, formats in
   ``docs/data.md``), validated row by row; with ``data.on_bad_row: quarantine`` bad rows go to
   ``<run>/quarantine-<technique>.jsonl`` with the reason; GRPO uses the environment's tasks;
3. **train** with the shared learner pieces (micro-batches with gradient accumulation normalised
   by the step's global count, ``OptimConfig`` AdamW + schedule, metric names ``loss/<...>``,
   ``policy/grad_norm``, ``policy/lr``), checkpointing to ``<run>/checkpoints`` (a re-run resumes);
4. **final model**: ``<run>/final_model``, an HF safetensors directory with the tokenizer and
   ``resolved_config.yaml``;
5. **evaluate** held-out accuracy on ``data.env`` (``flow.evaluate_policy``), log everything to
   MLflow and **register** the final model as a version of ``tracking.registered_model``.

SFT and CPT train from the base model; DPO and GRPO from the SFT warm start when
``warm_start.steps > 0`` (the base model otherwise), which is also their reference policy.

Run: ``posttrain run configs/sft_cpu.yaml`` (or ``cpt``, ``dpo``, ``grpo``, ``grpo_async``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from posttrain.config import RunConfig
from posttrain.config.load import ConfigError
from posttrain.data.formats import LoadedRows, RowPolicy, load_rows
from posttrain.data.tasks import DatasetError
from posttrain.flow import RunSummary
from posttrain.runtime import RunContext

log = logging.getLogger("posttrain.techniques")

Sink = Callable[[dict[str, float], int], None]


class TechniqueConfigError(ConfigError):
    """A technique's config section misses something the run needs; the message names the field.

    A ``ConfigError`` (a ``ValueError``), so the command line reports it in one line with exit 2.
    """


@dataclass
class _Run:
    """What every runner shares: paths, the MLflow run, the metrics sink, the start time."""

    config: RunConfig
    ctx: RunContext
    tracker: Any
    sink: Sink
    started: float

    def register(self, model_dir: Path, data_paths: list[Path], scores: dict[str, float]) -> str:
        """Register ``model_dir`` as a new version of ``tracking.registered_model``; return the version.

        Returns ``"not registered"`` when ``tracking.register_final`` is false.
        """
        from posttrain.tracking import Lineage, config_hash, dataset_hash, register_checkpoint

        cfg = self.config
        if not cfg.tracking.register_final:
            return "not registered"
        info = register_checkpoint(
            str(model_dir),
            registered_model=cfg.tracking.registered_model,
            lineage=Lineage(
                run=cfg.run_name,
                technique=cfg.technique,
                dataset_hash=dataset_hash(data_paths) if data_paths else "",
                config_hash=config_hash(cfg.model_dump(mode="json")),
                base_model=cfg.model.path or "tiny",
                mlflow_run_id=self.tracker.run_id,
            ),
            eval_scores=scores,
            tracking_uri=self.tracker.tracking_uri,
        )
        return str(info.version)

    def summary(self, rows: list[tuple[str, str]]) -> RunSummary:
        """A ``RunSummary`` with the common rows appended; also written to ``<run>/summary.md``."""
        result = RunSummary(self.ctx.run_dir)
        result.rows = [("technique", self.config.technique), *rows,
                       ("final model", str(self.ctx.final_model_dir)),
                       ("wall time (s)", f"{time.monotonic() - self.started:.0f}")]
        (self.ctx.run_dir / "summary.md").write_text(result.table() + "\n", encoding="utf-8")
        return result


@contextmanager
def _tracked(config: RunConfig) -> Iterator[_Run]:
    """Open the run directory and its MLflow run (FAILED on an exception), log the resolved config."""
    from posttrain.flow import metrics_sink, prepare
    from posttrain.tracking import Tracker, default_tracking_uri

    ctx = RunContext(config)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(
        config.tracking.tracking_uri or default_tracking_uri(config.output_dir),
        config.tracking.experiment,
        run_name=config.run_name,
        tags={"posttrain.technique": config.technique},
    )
    with tracker:
        resolved = config.model_dump(mode="json")
        tracker.log_params(resolved)
        tracker.log_dict(resolved, "resolved_config.json")
        print(f"[1/4] prepare: tokenizer + base model in {ctx.run_dir}", flush=True)
        prepare(ctx)
        yield _Run(config, ctx, tracker, metrics_sink(ctx, tracker), time.monotonic())


def _save_final(run: _Run, model: Any, tokenizer: Any) -> Path:
    """Write the final model directory: HF safetensors, tokenizer, ``resolved_config.yaml``."""
    out = run.ctx.final_model_dir
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / "resolved_config.yaml").write_text(run.ctx.resolved_config_yaml(), encoding="utf-8")
    return out


def _checkpointer(
    run: _Run, model: Any, tokenizer: Any, optimizers: dict[str, Any], every: int, total: int
) -> Callable[[int], None]:
    """``save(step)``: a learner checkpoint every ``every`` optimizer steps and at step ``total``."""
    from posttrain.learner.checkpoint import LearnerState, save_checkpoint

    def save(step: int) -> None:
        if step % every == 0 or step >= total:
            save_checkpoint(run.ctx.checkpoints_dir, state=LearnerState(iteration=step, policy_version=step),
                            policy=model, tokenizer=tokenizer, critic=None, optimizers=optimizers,
                            resolved_config_yaml=run.ctx.resolved_config_yaml())

    return save


def _resume(run: _Run, start_dir: Path, optim_config: Any, total_steps: int) -> tuple[Any, Any, Any, int]:
    """Load the policy (from the newest checkpoint if any) and its optimizer; return them and the start step."""
    from posttrain.learner.checkpoint import latest_checkpoint, load_checkpoint_state
    from posttrain.learner.model import load_policy
    from posttrain.learner.optim import build_optimizer

    ckpt = latest_checkpoint(run.ctx.checkpoints_dir)
    model = load_policy(ckpt / "policy" if ckpt else start_dir)
    optimizer, scheduler = build_optimizer(model, optim_config, total_steps)
    start = 0
    if ckpt is not None:
        state = load_checkpoint_state(ckpt, critic=None, optimizers={"policy_opt": optimizer, "policy_sched": scheduler})
        start = state.iteration
        log.info("resuming %s from %s at step %d", run.config.technique, ckpt.name, start)
    return model, optimizer, scheduler, start


def _data_path(value: str | None, field: str) -> Path:
    if not value:
        raise TechniqueConfigError(f"{field}: required (a JSONL file; formats in docs/data.md)")
    path = Path(value)
    if not path.is_file():
        raise TechniqueConfigError(f"{field}: {path} is not a file")
    return path


def _load(run: _Run, path: Path, fmt: Literal["sft", "cpt", "dpo"], limit: int | None) -> tuple[LoadedRows[Any], RowPolicy]:
    """Validate the training file under ``data.on_bad_row``; return its rows and the policy for later bad rows."""
    quarantine = run.ctx.run_dir / f"quarantine-{run.config.technique}.jsonl"
    quarantine.unlink(missing_ok=True)
    loaded = load_rows(path, fmt, on_bad_row=run.config.data.on_bad_row, quarantine_path=quarantine, limit=limit)
    return loaded, RowPolicy(path, run.config.data.on_bad_row, quarantine)


def _evaluate(run: _Run, model_dir: Path, label: str) -> dict[str, float]:
    from posttrain.flow import evaluate_policy

    scores = evaluate_policy(run.ctx, model_dir)
    run.tracker.log_metrics({f"eval_{label}/{k}": v for k, v in scores.items()}, step=0)
    return scores


# ------------------------------------------------------------------------------------ SFT / CPT
def tokenize_supervised(
    loaded: LoadedRows[Any], tokenizer: Any, fmt: Literal["sft", "cpt"], max_seq_len: int, bad_rows: RowPolicy
) -> list[Any]:
    """Turn SFT/CPT records into ``TokenExample`` s.

    SFT: ``render_sft_example`` (loss on assistant tokens), truncated to ``max_seq_len``; a row
    with no assistant token left is a bad row (field ``messages``). CPT: the text's tokens plus
    the end-of-text token, cut into windows of ``max_seq_len`` tokens (loss on every token but
    each window's first).

    Raises:
        DatasetError: a bad row under ``on_bad_row: stop``.
    """
    from posttrain.generator.agent_loop import ChatFormat, render_sft_example
    from posttrain.learner.sft import TokenExample

    out: list[TokenExample] = []
    if fmt == "sft":
        chat = ChatFormat(tokenizer)
        for record, line in zip(loaded.records, loaded.lines, strict=True):
            ids, mask = render_sft_example(tokenizer, record.messages, chat)
            if not any(mask[:max_seq_len]):
                bad_rows.bad(DatasetError(loaded.path, line, "messages",
                                          f"no assistant token within sft.max_seq_len={max_seq_len}"),
                             {"id": record.example_id, "messages": record.messages})
                continue
            out.append(TokenExample(list(ids[:max_seq_len]), list(mask[:max_seq_len])))
        return out
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for record in loaded.records:
        ids = list(tokenizer.encode(record.text, add_special_tokens=False)) + eos
        for lo in range(0, len(ids), max_seq_len):
            window = ids[lo : lo + max_seq_len]
            if len(window) >= 2:
                out.append(TokenExample(window, [False] + [True] * (len(window) - 1)))
    return out


def _run_supervised(config: RunConfig, fmt: Literal["sft", "cpt"]) -> RunSummary:
    from posttrain.learner.model import load_tokenizer
    from posttrain.learner.packing import pack_examples, train_sft_packed

    section = config.sft
    path = _data_path(section.data_path, "sft.data_path")
    with _tracked(config) as run:
        print(f"[2/4] data: {path} ({fmt})", flush=True)
        loaded, bad_rows = _load(run, path, fmt, section.max_examples)
        tokenizer = load_tokenizer(run.ctx.tokenizer_dir)
        examples = tokenize_supervised(loaded, tokenizer, fmt, section.max_seq_len, bad_rows)
        rows = pack_examples(examples, section.max_seq_len, packing=section.packing)
        quarantined = loaded.num_quarantined + bad_rows.count
        model, optimizer, scheduler, start = _resume(run, run.ctx.base_model_dir, section.optim, section.steps)
        run.sink({"data/examples": float(len(examples)), "data/rows": float(len(rows)),
                  "data/quarantined_rows": float(quarantined)}, start)
        optimizers = {"policy_opt": optimizer, "policy_sched": scheduler}
        save = _checkpointer(run, model, tokenizer, optimizers, section.checkpoint_every, section.steps)
        losses: list[float] = []

        def on_step(step: int, metrics: dict[str, float]) -> None:
            losses.append(metrics["loss/sft"])
            run.sink(metrics, step)
            save(step)

        print(f"[3/4] {fmt}: {section.steps} steps, {len(examples)} examples in {len(rows)} rows", flush=True)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        train_sft_packed(model, rows, section, pad_token_id=pad, seed=config.seed, start_step=start,
                         optimizers=(optimizer, scheduler), on_step=on_step)
        final = _save_final(run, model, tokenizer)
        print("[4/4] held-out eval, registration", flush=True)
        scores = _evaluate(run, final, fmt)
        version = run.register(final, [path], {f"{config.data.env}.accuracy": scores["accuracy"]})
        first = f"{losses[0]:.3f}" if losses else "-"
        last = f"{losses[-1]:.3f}" if losses else "-"
        return run.summary([
            ("training examples", str(len(examples))),
            ("quarantined rows", str(quarantined)),
            ("packed rows", str(len(rows))),
            ("loss first -> last step", f"{first} -> {last}"),
            (f"held-out accuracy ({config.data.env})", f"{scores['accuracy']:.3f}"),
            ("registered model version", version),
        ])


def run_sft(config: RunConfig) -> RunSummary:
    """Supervised fine-tuning on chat rows (``sft`` section); see the module docstring."""
    return _run_supervised(config, "sft")


def run_cpt(config: RunConfig) -> RunSummary:
    """Continued pre-training on raw-text rows (``sft`` section, every token trained)."""
    return _run_supervised(config, "cpt")


# ------------------------------------------------------------------------------------------ DPO
def _start_model(run: _Run) -> Path:
    """The SFT warm start when ``warm_start.steps > 0``, else the base model."""
    if run.config.warm_start.steps > 0:
        from posttrain.flow import warm_start

        print(f"      SFT warm start ({run.config.warm_start.steps} steps)", flush=True)
        return warm_start(run.ctx, run.sink)
    return run.ctx.base_model_dir


def run_dpo(config: RunConfig) -> RunSummary:
    """Sigmoid DPO on preference pairs (``dpo`` section) against a frozen reference (the start model)."""
    from posttrain.generator.agent_loop import ChatFormat
    from posttrain.learner.dpo import preference_metrics, reference_logprobs, tokenize_pair, train_dpo
    from posttrain.learner.model import load_policy, load_tokenizer

    section = config.dpo
    path = _data_path(section.data_path, "dpo.data_path")
    with _tracked(config) as run:
        print(f"[2/4] data: {path} (dpo)", flush=True)
        loaded, bad_rows = _load(run, path, "dpo", section.max_examples)
        tokenizer = load_tokenizer(run.ctx.tokenizer_dir)
        chat = ChatFormat(tokenizer)
        pairs = []
        for record, line in zip(loaded.records, loaded.lines, strict=True):
            try:
                pairs.append(tokenize_pair(tokenizer, record, section.max_seq_len, chat))
            except ValueError as exc:
                field, _, reason = str(exc).partition(": ")
                bad_rows.bad(DatasetError(path, line, field, reason),
                             {"id": record.pair_id, "prompt": record.prompt, "chosen": record.chosen,
                              "rejected": record.rejected})
        order = list(range(len(pairs)))
        random.Random(config.seed).shuffle(order)
        n_held = int(len(pairs) * section.heldout_fraction)
        held = [pairs[i] for i in order[:n_held]]
        train = [pairs[i] for i in order[n_held:]]
        if not train:
            raise DatasetError(path, 0, "<file>", f"no training pair left ({len(pairs)} pairs, {n_held} held out)")
        quarantined = loaded.num_quarantined + bad_rows.count
        start_dir = _start_model(run)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        reference = load_policy(start_dir).eval()
        mbs = section.micro_batch_size
        ref_held = reference_logprobs(reference, held, pad_token_id=pad, micro_batch_size=mbs)
        ref_train = reference_logprobs(reference, train, pad_token_id=pad, micro_batch_size=mbs) \
            if section.reference == "precompute" else ref_held.new_zeros((0, 2))
        per_batch_reference = reference if section.reference == "per_batch" else None
        if per_batch_reference is None:
            del reference
        model, optimizer, scheduler, start = _resume(run, start_dir, section.optim, section.steps)
        before = preference_metrics(model, held, ref_held, section, pad_token_id=pad)
        run.sink({"data/pairs": float(len(train)), "data/heldout_pairs": float(len(held)),
                  "data/quarantined_rows": float(quarantined), **{f"heldout/{k}": v for k, v in before.items()}}, start)
        optimizers = {"policy_opt": optimizer, "policy_sched": scheduler}
        save = _checkpointer(run, model, tokenizer, optimizers, section.checkpoint_every, section.steps)
        accuracy: list[float] = []

        def on_step(step: int, metrics: dict[str, float]) -> None:
            accuracy.append(metrics["dpo/accuracy"])
            run.sink(metrics, step)
            save(step)

        print(f"[3/4] dpo: {section.steps} steps on {len(train)} pairs ({len(held)} held out)", flush=True)
        train_dpo(model, train, ref_train, section, pad_token_id=pad, reference=per_batch_reference,
                  seed=config.seed, start_step=start, optimizers=(optimizer, scheduler), on_step=on_step)
        after = preference_metrics(model, held, ref_held, section, pad_token_id=pad)
        run.sink({f"heldout/{k}": v for k, v in after.items()}, section.steps)
        final = _save_final(run, model, tokenizer)
        print("[4/4] held-out eval, registration", flush=True)
        scores = _evaluate(run, final, "dpo")
        held_acc = after.get("dpo/accuracy", 0.0)
        version = run.register(final, [path], {f"{config.data.env}.accuracy": scores["accuracy"],
                                               "dpo.heldout_accuracy": held_acc})
        k = max(1, len(accuracy) // 4)
        early = sum(accuracy[:k]) / k if accuracy else 0.0
        late = sum(accuracy[-k:]) / k if accuracy else 0.0
        return run.summary([
            ("training pairs", str(len(train))),
            ("quarantined rows", str(quarantined)),
            ("train preference accuracy, first -> last quarter", f"{early:.3f} -> {late:.3f}"),
            ("held-out preference accuracy before -> after", f"{before.get('dpo/accuracy', 0.0):.3f} -> {held_acc:.3f}"),
            ("held-out reward margin after", f"{after.get('dpo/margin', 0.0):.3f}"),
            (f"held-out accuracy ({config.data.env})", f"{scores['accuracy']:.3f}"),
            ("registered model version", version),
        ])


# ----------------------------------------------------------------------------------------- GRPO
def run_grpo(config: RunConfig) -> RunSummary:
    """GRPO on the environment's tasks: synchronous in this process, or over the asynchronous runtime."""
    from posttrain.flow import train_sao
    from posttrain.learner.grpo import async_runtime_config, run_grpo_sync

    grpo = config.grpo
    mode = "async (runtime + DIS)" if grpo.async_ else "sync"
    with _tracked(config) as run:
        print("[2/4] SFT warm start", flush=True)
        start_dir = _start_model(run)
        before = _evaluate(run, start_dir, "start")
        print(f"[3/4] grpo {mode}: {grpo.steps} steps of {grpo.prompts_per_step} x {grpo.group_size} rollouts",
              flush=True)
        if grpo.async_:
            summary = train_sao(RunContext(async_runtime_config(config)), start_dir, run.sink)
        else:
            summary = run_grpo_sync(config, start_model_dir=start_dir, sink=run.sink)
        print("[4/4] held-out eval, registration", flush=True)
        after = _evaluate(run, summary.final_model_dir, "grpo")
        version = run.register(summary.final_model_dir, [], {f"{config.data.env}.accuracy": after["accuracy"]})
        quarantined = run.ctx.quarantined_rows()
        run.sink({"data/quarantined_rows": float(quarantined)}, summary.policy_version)
        rewards = _reward_curve(run.ctx.run_dir / "metrics.jsonl")
        k = max(1, len(rewards) // 4)
        early = sum(rewards[:k]) / k if rewards else 0.0
        late = sum(rewards[-k:]) / k if rewards else 0.0
        c = summary.counters
        return run.summary([
            ("mode", mode),
            ("environment", config.data.env),
            ("policy versions", str(summary.policy_version)),
            ("rollouts trained", f"{c.get('rollouts_trained', 0.0):.0f}"),
            ("train reward, first -> last quarter", f"{early:.3f} -> {late:.3f}"),
            ("generator busy fraction", f"{c.get('generator_busy_fraction', 0.0):.2f}"),
            ("quarantined rows", str(quarantined)),
            ("held-out accuracy before -> after", f"{before['accuracy']:.3f} -> {after['accuracy']:.3f}"),
            ("registered model version", version),
        ])


def _reward_curve(metrics_path: Path) -> list[float]:
    """``reward/mean`` of every learner step in ``metrics.jsonl`` (in order)."""
    import json

    if not metrics_path.exists():
        return []
    out = []
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "reward/mean" in row:
            out.append(float(row["reward/mean"]))
    return out


TECHNIQUES: dict[str, Callable[[RunConfig], RunSummary]] = {
    "sft": run_sft,
    "cpt": run_cpt,
    "dpo": run_dpo,
    "grpo": run_grpo,
}
"""Technique name -> runner. ``sao`` is run by ``posttrain.flow.run`` itself."""


def run_technique(config: RunConfig) -> RunSummary:
    """Run ``config.technique`` end to end (see the module docstring) and return its summary.

    Raises:
        ValueError: a technique without a runner here (``sao`` belongs to ``flow.run``).
        TechniqueConfigError: a required field of the technique's section is missing.
        posttrain.data.tasks.DatasetError: a bad data row under ``data.on_bad_row: stop``.
    """
    if config.technique not in TECHNIQUES:
        raise ValueError(f"technique: no runner for {config.technique!r} here; known: {sorted(TECHNIQUES)}")
    return TECHNIQUES[config.technique](config)
