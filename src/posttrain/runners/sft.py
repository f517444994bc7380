"""Supervised fine-tuning (``technique: sft``) and continued pre-training (``cpt``) runners.

On N ranks (``torchrun --nproc_per_node N -m posttrain.cli run CONFIG``) every rank reads and packs
the same rows, draws the same batches and trains its share of each (``learner.packing``); rank 0
tracks, evaluates and registers (``runners.common``).
"""

from __future__ import annotations

from typing import Any, Literal

from posttrain.config import RunConfig
from posttrain.data.formats import LoadedRows, RowPolicy
from posttrain.data.tasks import DatasetError
from posttrain.learner.export import save_final_model
from posttrain.learner.resume import resume_policy
from posttrain.runners.common import (
    RunSummary,
    data_file,
    evaluate_and_log,
    load_training_rows,
    step_callback,
    tracked_run,
)
from posttrain.tracking import HELDOUT_METRIC


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
    from posttrain.chat.format import ChatFormat, render_sft_example
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
    from posttrain.learner.packing import pack_examples, train_sft_packed
    from posttrain.models.hf import load_tokenizer

    section = config.sft
    path = data_file(section.data_path, "sft.data_path")
    with tracked_run(config) as run:
        world = run.world
        if world.is_main:
            print(f"[2/4] data: {path} ({fmt})", flush=True)

        def read() -> tuple[Any, list[Any], int]:
            loaded, bad_rows = load_training_rows(run, path, fmt, section.max_examples)
            tokenizer = load_tokenizer(run.ctx.tokenizer_dir)
            examples = tokenize_supervised(loaded, tokenizer, fmt, section.max_seq_len, bad_rows)
            return tokenizer, examples, loaded.num_quarantined + bad_rows.count

        tokenizer, examples, quarantined = run.main_first(read)
        rows = pack_examples(examples, section.max_seq_len, packing=section.packing)
        resumed = resume_policy(run.ctx.checkpoints_dir, run.ctx.base_model_dir, section.optim, section.steps,
                                world=world, learner=config.learner)
        model, optimizer, scheduler = resumed.policy.model, resumed.policy.optimizer, resumed.policy.scheduler
        start = resumed.state.iteration
        run.sink({"data/examples": float(len(examples)), "data/rows": float(len(rows)),
                  "data/quarantined_rows": float(quarantined)}, start)
        on_step, losses = step_callback(run, resumed, tokenizer, section.checkpoint_every, section.steps, "loss/sft")
        if world.is_main:
            print(f"[3/4] {fmt}: {section.steps} steps, {len(examples)} examples in {len(rows)} rows"
                  f"{f' on {world.size} ranks' if world.distributed else ''}", flush=True)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        with run.timer("training"):
            train_sft_packed(model, rows, section, pad_token_id=pad, seed=config.seed, start_step=start,
                             optimizers=(optimizer, scheduler), on_step=on_step, world=world)
        run.trained_nothing = not losses  # resumed at the final step: a re-run keeps the run's summary.md
        final = save_final_model(run.ctx, model, tokenizer, world)
        if not world.is_main:
            return run.summary([])  # rank 0 evaluates, registers and reports
        print("[4/4] held-out eval, registration", flush=True)
        scores = evaluate_and_log(run, final, fmt)
        version = run.register(final, [path], {HELDOUT_METRIC: scores["accuracy"],
                                               f"{config.data.env}.accuracy": scores["accuracy"]})
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
