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
        "system_prompt", "unmarked_fraction",
    ),
    "synthetic_longtail": (
        "calls_median", "calls_sigma", "min_calls", "max_calls", "boxes", "heldout_fraction",
        "max_malformed_actions", "system_prompt", "tool_latency_median_s", "tool_latency_sigma",
        "tool_latency_max_s", "tool_latency_seed",
    ),
    "gsm8k": ("system_prompt", "verify_timeout_s"),
    "math_tool": (
        "system_prompt", "sandbox_limits", "max_observation_chars", "max_malformed_actions",
        "max_calls_per_action", "verify_timeout_s",
    ),
    "swe": ("tasks_root", "backend", "limits"),
}
"""Environment name (``data.env``) -> keyword arguments of its constructor, in signature order."""


def unknown_env_args(env: str, env_args: dict[str, object]) -> list[str]:
    """Keys of ``env_args`` that environment ``env`` does not accept, in their given order.

    Raises:
        KeyError: ``env`` is not a known environment (the message lists the known ones).
    """
    if env not in ENVIRONMENT_ARGUMENTS:
        raise KeyError(f"environment {env!r} is not known; known: {sorted(ENVIRONMENT_ARGUMENTS)}")
    accepted = set(ENVIRONMENT_ARGUMENTS[env])
    return [key for key in env_args if key not in accepted]
