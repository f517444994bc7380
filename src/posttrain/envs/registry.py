"""Environment registry: a plain dict from name to factory, default task splits and SFT references.

* ``make_environment(name, **kwargs)`` builds an environment (kwargs go to its constructor);
  ``environment_arguments(name)`` lists the keyword arguments that constructor accepts, and
  ``unknown_environment_arguments(name, env_args)`` the ones it would reject (the run config's
  ``data.env_args`` check uses it at validation time).
* ``default_tasks(name, split, n, seed)`` returns ``n`` training (``train``) or held-out
  (``eval``) tasks from the environment's built-in source:

  ==================  ==========================================  =============================
  environment         train                                       eval (held out)
  ==================  ==========================================  =============================
  synthetic_arith     generated, hash split                       generated, disjoint hash split
  synthetic_tool      generated, hash split                       generated, disjoint hash split
  synthetic_longtail  generated, hash split                       generated, disjoint hash split
  gsm8k               ``data/gsm8k/train.jsonl``                  ``data/gsm8k/test.jsonl``
  math_tool           DAPO-Math-17k (parquet)                     BeyondAIME (JSONL)
  swe                 shipped repair tasks, 3 of every 4             the other repair tasks
  ==================  ==========================================  =============================

  File-backed splits are shuffled with ``seed`` and cut to ``n`` (all of them when ``n`` is
  larger); generated splits cycle when ``n`` exceeds the pool.
* ``reference_actions(name, task)`` gives the assistant turns of an ideal episode (SFT warm start).

Factories import their module on first use, so importing the registry is cheap and never pulls in
vllm. Run ``python -m posttrain.envs.registry`` to list the environments.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping
from typing import Any

from posttrain.envs.base import Environment
from posttrain.records import Task


def _synthetic_arith_class() -> type:
    from posttrain.envs.synthetic.arith import SyntheticArithEnv

    return SyntheticArithEnv


def _synthetic_tool_class() -> type:
    from posttrain.envs.synthetic.tool import SyntheticToolEnv

    return SyntheticToolEnv


def _synthetic_longtail_class() -> type:
    from posttrain.envs.synthetic.longtail import SyntheticLongTailEnv

    return SyntheticLongTailEnv


def _gsm8k_class() -> type:
    from posttrain.envs.math.gsm8k import GSM8KEnv

    return GSM8KEnv


def _math_tool_class() -> type:
    from posttrain.envs.math.math_tool import MathToolEnv

    return MathToolEnv


def _swe_class() -> type:
    from posttrain.envs.swe.env import SWEEnvironment

    return SWEEnvironment


ENVIRONMENT_CLASSES: dict[str, Callable[[], type]] = {
    "synthetic_arith": _synthetic_arith_class,
    "synthetic_tool": _synthetic_tool_class,
    "synthetic_longtail": _synthetic_longtail_class,
    "gsm8k": _gsm8k_class,
    "math_tool": _math_tool_class,
    "swe": _swe_class,
}
"""Environment name → function importing and returning its class (modules load on first use)."""


def _factory(name: str) -> Callable[..., Environment]:
    def build(**kwargs: Any) -> Environment:
        env: Environment = ENVIRONMENT_CLASSES[name]()(**kwargs)
        return env

    build.__name__ = f"_{name}"
    build.__doc__ = f"Build the {name!r} environment from its constructor keyword arguments."
    return build


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {name: _factory(name) for name in ENVIRONMENT_CLASSES}
"""Environment name → factory taking the environment's constructor keyword arguments."""


def make_environment(name: str, **kwargs: Any) -> Environment:
    """Build the environment ``name`` with constructor arguments ``kwargs``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
        ValueError / TypeError: bad constructor arguments.
    """
    if name not in ENVIRONMENTS:
        raise KeyError(f"environment {name!r} is not registered; known: {sorted(ENVIRONMENTS)}")
    return ENVIRONMENTS[name](**kwargs)


def environment_arguments(name: str) -> tuple[str, ...]:
    """Keyword arguments the constructor of environment ``name`` accepts (what ``data.env_args`` may hold).

    Imports the environment's module (a few hundred ms; no torch, no vllm) and reads the
    constructor's signature.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    if name not in ENVIRONMENT_CLASSES:
        raise KeyError(f"environment {name!r} is not registered; known: {sorted(ENVIRONMENT_CLASSES)}")
    params = inspect.signature(ENVIRONMENT_CLASSES[name]()).parameters.values()
    return tuple(
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )


def unknown_environment_arguments(name: str, env_args: Mapping[str, Any]) -> list[str]:
    """Keys of ``env_args`` that environment ``name``'s constructor does not accept, in their given order.

    An empty list means ``make_environment(name, **env_args)`` will not fail with a TypeError for
    an unexpected keyword (values are still checked by the constructor itself).

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    accepted = set(environment_arguments(name))
    return [key for key in env_args if key not in accepted]


def _normalise_split(split: str) -> str:
    if split in ("train",):
        return "train"
    if split in ("eval", "heldout", "test"):
        return "eval"
    raise ValueError(f"split: expected 'train' or 'eval' (aliases: heldout, test), got {split!r}")


def _shuffled(tasks: list[Task], n: int, seed: int) -> list[Task]:
    order = list(tasks)
    random.Random(seed).shuffle(order)
    return order[:n]


def default_tasks(name: str, split: str, n: int, seed: int = 0, **env_kwargs: Any) -> list[Task]:
    """``n`` tasks of the environment's built-in train or held-out split (see the module table).

    Args:
        name: Environment name.
        split: ``train`` or ``eval`` (``heldout`` and ``test`` are accepted for ``eval``).
        n: How many tasks (>= 0).
        seed: Sampling / shuffling seed.
        **env_kwargs: Constructor arguments of a synthetic environment (operand range...).

    Raises:
        KeyError: unknown environment.
        ValueError: bad split or ``n``.
        FileNotFoundError / posttrain.data.tasks.DatasetError: a missing or malformed data file.
    """
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    which = _normalise_split(split)
    if name in ("synthetic_arith", "synthetic_tool", "synthetic_longtail"):
        env: Any = make_environment(name, **env_kwargs)
        return list(env.tasks(which, n, seed))
    from posttrain.data import tasks as loaders

    if name == "gsm8k":
        loaded = loaders.load_gsm8k("train" if which == "train" else "test", env_name=name).tasks
    elif name == "math_tool":
        loaded = (loaders.load_dapo_math(env_name=name) if which == "train" else loaders.load_beyond_aime(env_name=name)).tasks
    elif name == "swe":
        from posttrain.envs.swe.tasks import load_swe_tasks

        # A stable split of the shipped repair tasks: every 4th task (by sorted id) is held out.
        ordered = sorted(load_swe_tasks(), key=lambda t: t.task_id)
        loaded = [t for i, t in enumerate(ordered) if (i % 4 == 3) == (which == "eval")]
    elif name in ENVIRONMENTS:
        raise ValueError(f"environment {name!r} has no built-in task source; pass a task file")
    else:
        raise KeyError(f"environment {name!r} is not registered; known: {sorted(ENVIRONMENTS)}")
    return _shuffled(loaded, n, seed)


def reference_actions(name: str, task: Task) -> list[str]:
    """Assistant turns of an ideal episode of ``task`` (the SFT warm-start target).

    Raises:
        ValueError: the environment has no reference solutions (``math_tool``).
        KeyError: unknown environment, or a task lacking the metadata its environment needs.
    """
    if name == "synthetic_arith":
        from posttrain.envs.synthetic.arith import reference_solution

        return [reference_solution(task)]
    if name == "synthetic_tool":
        from posttrain.envs.synthetic.tool import reference_episode

        return reference_episode(task)
    if name == "synthetic_longtail":
        from posttrain.envs.synthetic.longtail import reference_episode as chain_episode

        return chain_episode(task)
    if name == "gsm8k":
        from posttrain.envs.math.gsm8k import reference_solution as gsm8k_solution

        return [gsm8k_solution(task)]
    if name in ENVIRONMENTS:
        raise ValueError(f"environment {name!r} has no reference solutions for SFT")
    raise KeyError(f"environment {name!r} is not registered; known: {sorted(ENVIRONMENTS)}")


if __name__ == "__main__":
    for env_name in ENVIRONMENTS:
        print(env_name)
