"""DPO runner (``technique: dpo``): preference pairs against a frozen reference.

On N ranks (``torchrun --nproc_per_node N -m posttrain.cli run CONFIG``) the reference is placed
and sharded like the policy (``prepare_model(..., trainable=False)``); every rank tokenises the
same pairs, computes its share of the reference log-probabilities (summed over ranks, so all hold
all of them) and trains its share of each batch (``learner.dpo``); rank 0 tracks, evaluates and
registers (``runners.common``).
"""

from __future__ import annotations

import random
from typing import Any

from posttrain.config import RunConfig
from posttrain.data.tasks import DatasetError
from posttrain.learner.export import save_final_model
from posttrain.learner.resume import resume_policy
from posttrain.parallel.placement import prepare_model
from posttrain.runners.common import (
    RunSummary,
    data_file,
    evaluate_and_log,
    load_training_rows,
    start_model,
    step_callback,
    tracked_run,
)
from posttrain.tracking import HELDOUT_METRIC


def _before_text(before: dict[str, float]) -> str:
    """The held-out preference accuracy before training, as the summary shows it.

    DPO's implicit reward is ``beta * (log pi - log pi_ref)``: before the first step the policy is the
    reference, every margin is exactly 0 and the accuracy (margin > 0) is 0 by construction, which the
    text says. A resumed run starts from a trained checkpoint and shows its number alone.
    """
    accuracy = before.get("dpo/accuracy", 0.0)
    if before and accuracy == 0.0 and abs(before.get("dpo/margin", 0.0)) < 1e-6:
        return "0.000 (policy = reference: every margin is 0)"
    return f"{accuracy:.3f}"


def run_dpo(config: RunConfig) -> RunSummary:
    """Sigmoid DPO on preference pairs (``dpo`` section) against a frozen reference (the start model)."""
    from posttrain.chat.format import ChatFormat
    from posttrain.learner.dpo import preference_metrics, reference_logprobs, tokenize_pair, train_dpo
    from posttrain.models.hf import load_policy, load_tokenizer

    section = config.dpo
    path = data_file(section.data_path, "dpo.data_path")
    with tracked_run(config) as run:
        world = run.world
        if world.is_main:
            print(f"[2/4] data: {path} (dpo)", flush=True)

        def read() -> tuple[Any, list[Any], int]:
            loaded, bad_rows = load_training_rows(run, path, "dpo", section.max_examples)
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
            return tokenizer, pairs, loaded.num_quarantined + bad_rows.count

        tokenizer, pairs, quarantined = run.main_first(read)
        order = list(range(len(pairs)))
        random.Random(config.seed).shuffle(order)
        n_held = int(len(pairs) * section.heldout_fraction)
        held = [pairs[i] for i in order[:n_held]]
        train = [pairs[i] for i in order[n_held:]]
        if not train:
            raise DatasetError(path, 0, "<file>", f"no training pair left ({len(pairs)} pairs, {n_held} held out)")
        start_dir = start_model(run)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        reference = prepare_model(load_policy(start_dir), world, config.learner, trainable=False)
        mbs = section.micro_batch_size
        ref_held = reference_logprobs(reference, held, pad_token_id=pad, micro_batch_size=mbs, world=world)
        ref_train = reference_logprobs(reference, train, pad_token_id=pad, micro_batch_size=mbs, world=world) \
            if section.reference == "precompute" else ref_held.new_zeros((0, 2))
        per_batch_reference = reference if section.reference == "per_batch" else None
        if per_batch_reference is None:
            del reference
        resumed = resume_policy(run.ctx.checkpoints_dir, start_dir, section.optim, section.steps,
                                world=world, learner=config.learner)
        model, optimizer, scheduler = resumed.policy.model, resumed.policy.optimizer, resumed.policy.scheduler
        start = resumed.state.iteration
        before = preference_metrics(model, held, ref_held, section, pad_token_id=pad, world=world)
        run.sink({"data/pairs": float(len(train)), "data/heldout_pairs": float(len(held)),
                  "data/quarantined_rows": float(quarantined), **{f"heldout/{k}": v for k, v in before.items()}}, start)
        on_step, accuracy = step_callback(run, resumed, tokenizer, section.checkpoint_every, section.steps,
                                          "dpo/accuracy")
        if world.is_main:
            print(f"[3/4] dpo: {section.steps} steps on {len(train)} pairs ({len(held)} held out)"
                  f"{f' on {world.size} ranks' if world.distributed else ''}", flush=True)
        with run.timer("training"):
            train_dpo(model, train, ref_train, section, pad_token_id=pad, reference=per_batch_reference,
                      seed=config.seed, start_step=start, optimizers=(optimizer, scheduler), on_step=on_step,
                      world=world)
        # Trained tokens (the time account's cost per token): the pairs' response tokens, chosen and rejected,
        # times the pairs the steps drew (an estimate from the mean pair: DPO's steps report pairs, not tokens).
        per_pair = sum(sum(p.chosen_mask) + sum(p.rejected_mask) for p in train) / len(train)
        run.trained_tokens = per_pair * section.batch_size * len(accuracy)
        run.trained_nothing = not accuracy  # resumed at the final step: a re-run keeps the run's summary.md
        after = preference_metrics(model, held, ref_held, section, pad_token_id=pad, world=world)
        run.sink({f"heldout/{k}": v for k, v in after.items()}, section.steps)
        final = save_final_model(run.ctx, model, tokenizer, world)
        if not world.is_main:
            return run.summary([])  # rank 0 evaluates, registers and reports
        print("[4/4] held-out eval, registration", flush=True)
        scores = evaluate_and_log(run, final, "dpo")
        held_acc = after.get("dpo/accuracy", 0.0)
        version = run.register(final, [path], {HELDOUT_METRIC: scores["accuracy"],
                                               f"{config.data.env}.accuracy": scores["accuracy"],
                                               "dpo.heldout_accuracy": held_acc})
        k = max(1, len(accuracy) // 4)
        early = sum(accuracy[:k]) / k if accuracy else 0.0
        late = sum(accuracy[-k:]) / k if accuracy else 0.0
        return run.summary([
            ("training pairs", str(len(train))),
            ("quarantined rows", str(quarantined)),
            ("train preference accuracy, first -> last quarter", f"{early:.3f} -> {late:.3f}"),
            ("held-out preference accuracy (reward margin > 0) before -> after",
             f"{_before_text(before)} -> {held_acc:.3f}"),
            ("held-out reward margin after", f"{after.get('dpo/margin', 0.0):.3f}"),
            (f"held-out accuracy ({config.data.env})", f"{scores['accuracy']:.3f}"),
            ("registered model version", version),
        ])
