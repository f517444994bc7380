"""The environments a run config may name, and the constructor arguments each accepts in ``data.env_args``.

The config layer sits below the environments, so it keeps this table itself instead of importing
them; ``tests/unit/envs/test_registry_arguments.py`` checks that every entry equals the
constructor signature of the registered environment (``posttrain.envs.registry``), so the two
cannot drift apart.
"""

from __future__ import annotations

ENVIRONMENT_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "synthetic_arith": ("low", "high", "operators", "heldout_fraction", "unmarked_fraction"),
    "synthetic_tool": (
        "low", "high", "operators", "heldout_fraction", "no_tool_penalty", "max_malformed_actions",
        "system_prompt", "unmarked_fraction", "tool_latency_median_s", "tool_latency_sigma", "tool_latency_max_s",
        "tool_latency_seed",
    ),
    "synthetic_longtail": (
        "calls_median", "calls_sigma", "min_calls", "max_calls", "boxes", "heldout_fraction",
        "max_malformed_actions", "system_prompt", "tool_latency_median_s", "tool_latency_sigma",
        "tool_latency_max_s", "tool_latency_seed", "left_first",
    ),
    "gsm8k": ("system_prompt", "verify_timeout_s"),
    "math_tool": (
        "system_prompt", "sandbox_limits", "max_observation_chars", "max_malformed_actions",
        "max_calls_per_action", "verify_timeout_s",
    ),
    "swe": ("tasks_root", "backend", "limits"),
}
"""Environment name (``data.env``) -> keyword arguments of its constructor, in signature order."""


_KINDS = {"int": "an integer", "float": "a number", "str": "a string", "str?": "a string or null",
          "list[str]": "a list of strings"}

ENVIRONMENT_ARGUMENT_KINDS: dict[str, dict[str, str]] = {
    "synthetic_arith": {"low": "int", "high": "int", "operators": "list[str]", "heldout_fraction": "float",
                        "unmarked_fraction": "float"},
    "synthetic_tool": {"low": "int", "high": "int", "operators": "list[str]", "heldout_fraction": "float",
                       "no_tool_penalty": "float", "max_malformed_actions": "int", "system_prompt": "str?",
                       "unmarked_fraction": "float", "tool_latency_median_s": "float",
                       "tool_latency_sigma": "float", "tool_latency_max_s": "float", "tool_latency_seed": "int"},
    "synthetic_longtail": {"calls_median": "float", "calls_sigma": "float", "min_calls": "int", "max_calls": "int",
                           "boxes": "int", "heldout_fraction": "float", "max_malformed_actions": "int",
                           "system_prompt": "str?", "tool_latency_median_s": "float", "tool_latency_sigma": "float",
                           "tool_latency_max_s": "float", "tool_latency_seed": "int"},
    "gsm8k": {"system_prompt": "str?", "verify_timeout_s": "float"},
    "math_tool": {"system_prompt": "str", "max_observation_chars": "int", "max_malformed_actions": "int",
                  "max_calls_per_action": "int", "verify_timeout_s": "float"},
    "swe": {},
}
"""Environment -> argument -> kind of value (``int``, ``float``, ``str``, ``str?`` = string or null,
``list[str]``) for every argument with a plain type; the others (``sandbox_limits``, SWE's ``limits``...)
are checked by their constructor. ``tests/unit/envs/test_registry_arguments.py`` checks it against the
constructors' annotations."""

MAX_ENV_ARGS_NODES = 10_000
"""Most values (scalars, list items, mapping entries) ``data.env_args`` may hold; a YAML alias bomb
expands past it and is refused at validation instead of exhausting memory at run time."""
MAX_ENV_ARGS_DEPTH = 16
"""Deepest nesting of lists/mappings inside one ``data.env_args`` value."""


def _fits(kind: str, value: object) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "str?":
        return value is None or isinstance(value, str)
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def env_args_problem(env: str, env_args: dict[str, object]) -> str | None:
    """The first problem of ``env_args`` for environment ``env`` (size, depth or type), or None.

    Walks at most ``MAX_ENV_ARGS_NODES`` values (an alias bomb shares its objects, so the walk, not
    the parsed YAML, is what would blow up) and ``MAX_ENV_ARGS_DEPTH`` levels.

    Returns:
        ``"data.env_args.low: expected an integer, got 'abc'"`` style text, or None.
    """
    budget = MAX_ENV_ARGS_NODES
    stack: list[tuple[str, object, int]] = [(f"data.env_args.{k}", v, 1) for k, v in env_args.items()]
    while stack:
        where, value, depth = stack.pop()
        budget -= 1
        if budget < 0:
            return (f"data.env_args: more than {MAX_ENV_ARGS_NODES} values (a YAML alias bomb?); "
                    "environment arguments are small settings")
        if isinstance(value, dict | list | tuple):
            if depth > MAX_ENV_ARGS_DEPTH:
                return f"{where}: nested deeper than {MAX_ENV_ARGS_DEPTH} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((f"{where}.{k}" if isinstance(value, dict) else f"{where}[{k}]", v, depth + 1)
                         for k, v in items)
    kinds = ENVIRONMENT_ARGUMENT_KINDS.get(env, {})
    for key, value in env_args.items():
        kind = kinds.get(key)
        if kind is not None and not _fits(kind, value):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            return f"data.env_args.{key}: expected {_KINDS[kind]} for data.env='{env}', got {shown}"
    return None


def unknown_env_args(env: str, env_args: dict[str, object]) -> list[str]:
    """Keys of ``env_args`` that environment ``env`` does not accept, in their given order.

    Raises:
        KeyError: ``env`` is not a known environment (the message lists the known ones).
    """
    if env not in ENVIRONMENT_ARGUMENTS:
        raise KeyError(f"environment {env!r} is not known; known: {sorted(ENVIRONMENT_ARGUMENTS)}")
    accepted = set(ENVIRONMENT_ARGUMENTS[env])
    return [key for key in env_args if key not in accepted]
