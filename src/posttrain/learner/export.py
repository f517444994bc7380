"""The final model of a run: one HF safetensors directory with its tokenizer and config, uploaded if asked.

Every technique ends here (SAO and asynchronous GRPO in ``learner.loop``; SFT, CPT, DPO and
synchronous GRPO in ``posttrain.runners``): ``<run>/final_model`` holds ``config.json``,
``model.safetensors``, the tokenizer files and ``resolved_config.yaml``, so MLflow registration
and the evaluators load it like any transformers model. With ``final_model_uri`` set the
directory is also copied there (cluster runs, whose pod disk goes away).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from posttrain.parallel.placement import full_state_dict
from posttrain.parallel.world import World
from posttrain.runtime import RunContext
from posttrain.weight_sync.factory import upload_final_model

log = logging.getLogger("posttrain.learner")


def save_final_model(ctx: RunContext, model: Any, tokenizer: Any, world: World | None = None) -> Path:
    """Write ``ctx.final_model_dir`` (module docstring) and upload it to ``final_model_uri`` when set.

    With several ranks every rank must call this: the weights are gathered from the FSDP2 shards
    and rank 0 writes them (HF safetensors) with the model's config.

    Args:
        ctx: The run (paths, resolved config).
        model: A transformers ``PreTrainedModel`` (``save_pretrained``), sharded or not.
        tokenizer: Its tokenizer.
        world: The learner's ranks (one process when None).

    Returns:
        The final model directory.

    Raises:
        OSError: the directory could not be written.
        posttrain.storage.StorageError: the upload failed.
    """
    world = world or World()
    out = ctx.final_model_dir
    weights = full_state_dict(model, world)
    if not world.is_main:
        return out
    model.save_pretrained(str(out), state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / "resolved_config.yaml").write_text(ctx.resolved_config_yaml(), encoding="utf-8")
    uploaded = upload_final_model(ctx.config, out)
    if uploaded:
        log.info("final model uploaded to %s", uploaded)
    return out
