"""Learner role: model loading, batching, critic, train steps, checkpoints, RL and offline loops."""
