"""The run config's dotted fields that pipeline parameters set, read and replace.

The pipeline's ``dataset`` and ``steps`` parameters land in a different config field per technique
(``DATA_FIELD``, ``STEPS_FIELD``); ``overrides`` turns the per-run knobs into ``load_config``
overrides, ``get_field`` reads a dotted field and ``with_fields`` returns a validated copy with
dotted fields replaced. Nothing here reads files or imports ``kfp``.

Try it: ``python -c "from posttrain.kfp.config_fields import overrides;
print(overrides('sao', '', '', 3, 'try'))"``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from posttrain.config import RunConfig

STEPS_FIELD = {"sft": "sft.steps", "dpo": "dpo.steps", "grpo": "grpo.steps", "sao": "sao.steps", "gkd": "gkd.steps"}
"""Config field the pipeline's ``steps`` parameter sets (optimizer steps / policy versions)."""
DATA_FIELD = {"sft": "sft.data_path", "dpo": "dpo.data_path", "grpo": "data.train_path", "sao": "data.train_path",
              "gkd": "data.train_path"}
"""Config field the pipeline's ``dataset`` parameter sets."""


def overrides(technique: str, model_path: str, dataset: str, steps: int, run_name: str) -> list[str]:
    """The ``load_config`` overrides (dotted ``key=value``) of one pipeline run's knobs.

    Values are JSON-quoted so YAML parses them as strings ("yes", "1e3" and ":" stay text).

    Args:
        technique: A key of ``DATA_FIELD`` / ``STEPS_FIELD``.
        model_path: "" keeps the config's ``model.path``.
        dataset: "" keeps the config's data; else the file for ``DATA_FIELD[technique]``.
        steps: 0 keeps the config's; else the value of ``STEPS_FIELD[technique]``.
        run_name: The run's name.
    """
    items = [f"technique={json.dumps(technique)}", f"run_name={json.dumps(run_name)}"]
    if model_path:
        items.append(f"model.path={json.dumps(model_path)}")
    if dataset:
        items.append(f"{DATA_FIELD[technique]}={json.dumps(dataset)}")
    if steps:
        items.append(f"{STEPS_FIELD[technique]}={int(steps)}")
    return items


def get_field(cfg: RunConfig, dotted: str) -> Any:
    """The value of the dotted field ``dotted`` of ``cfg`` (None when it or a parent is None or absent)."""
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def with_fields(cfg: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with dotted fields replaced (validated again).

    Raises:
        pydantic.ValidationError: the replaced values do not validate.
    """
    data = cfg.model_dump(mode="json", by_alias=True)
    for dotted, value in values.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return RunConfig.model_validate(data)
