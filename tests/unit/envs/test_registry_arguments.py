"""The registry's view of each environment's constructor arguments (``data.env_args`` checks) and the
run context passing ``data.env_args`` to ``synthetic_longtail``'s built-in tasks.

Run: ``python -m pytest -q tests/unit/envs/test_registry_arguments.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from posttrain.config import load_config
from posttrain.config.environments import ENVIRONMENT_ARGUMENTS
from posttrain.envs.registry import ENVIRONMENTS, environment_arguments, unknown_environment_arguments
from posttrain.envs.synthetic.longtail import codes_of
from posttrain.runtime import RunContext


def test_every_environment_lists_its_constructor_arguments() -> None:
    assert environment_arguments("gsm8k") == ("system_prompt", "verify_timeout_s")
    assert {"low", "high", "operators"} <= set(environment_arguments("synthetic_arith"))
    assert {"calls_median", "max_calls"} <= set(environment_arguments("synthetic_longtail"))
    for name in ENVIRONMENTS:
        assert "self" not in environment_arguments(name)


def test_the_config_table_of_arguments_matches_every_environment_constructor() -> None:
    """``posttrain.config.environments`` keeps its own copy (config sits below envs); it must not drift."""
    assert set(ENVIRONMENT_ARGUMENTS) == set(ENVIRONMENTS)
    for name in ENVIRONMENTS:
        assert ENVIRONMENT_ARGUMENTS[name] == environment_arguments(name), name


def test_unknown_arguments_are_listed_in_the_given_order_and_unknown_envs_raise() -> None:
    assert unknown_environment_arguments("gsm8k", {"high": 1, "system_prompt": None, "low": 0}) == ["high", "low"]
    assert unknown_environment_arguments("synthetic_arith", {"low": 0, "high": 5}) == []
    with pytest.raises(KeyError, match="chess"):
        environment_arguments("chess")


def test_checking_env_args_imports_neither_torch_nor_vllm() -> None:
    """Validation stays cheap: a fresh interpreter validating a gsm8k config loads no torch or vllm."""
    code = (
        "import sys; from posttrain.config import load_config; "
        "load_config(None, ['data.env=gsm8k', 'data.env_args={verify_timeout_s: 2.0}']); "
        "print('torch' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


def test_run_context_passes_env_args_to_synthetic_longtail_tasks(tmp_path) -> None:
    """max_calls=2 with min_calls=1: every generated task needs 1 or 2 tool calls (codes)."""
    cfg = load_config(None, [
        f"output_dir={tmp_path}", "data.env=synthetic_longtail",
        "data.env_args={min_calls: 1, max_calls: 2, calls_median: 5.0}", "data.num_train_tasks=40",
    ])
    tasks = RunContext(cfg).tasks("train")
    assert len(tasks) == 40
    assert {len(codes_of(t)) for t in tasks} <= {1, 2}
    assert max(len(codes_of(t)) for t in tasks) == 2
