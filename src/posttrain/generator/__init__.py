"""Generator role: inference engines, the token-in/token-out agent loop, and the worker that streams rollouts."""
