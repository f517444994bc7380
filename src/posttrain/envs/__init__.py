"""Environments: what a task looks like to the policy, which tools it may call, and its reward."""
