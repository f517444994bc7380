"""Episode runners: one task to one rollout (``runner``), or to a GRPO group (``group``), given an engine and an environment."""
