"""Publishing a policy version: weights to the weight store, then the version key, then the doorbell.

The order is the contract generators rely on: a version number is visible (the key, and the
announcement on ``StreamKeys.weights``) only after its weights are complete in the store, and
setting the key is what refills the generators' admission capacity (``posttrain.rollout.admission``).
With several learner ranks, only rank 0 publishes, the complete weights gathered from every shard.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from posttrain.rollout.queue import PolicyVersionStore
from posttrain.weight_sync.store import WeightStore


class WeightPublisher:
    """Publishes the learner's policy versions (module docstring).

    Args:
        store: The run's weight store.
        versions: The shared policy-version key.
        announce: Tells generators a version is ready (Redis pub/sub; a no-op in-process).
        config_dir: A model directory whose ``config.json`` and tokenizer files go beside the weights.
        overwrite: Replace versions already in the store (a restarted learner re-publishes the
            versions its predecessor published after its last checkpoint).
    """

    def __init__(self, store: WeightStore, versions: PolicyVersionStore, announce: Callable[[int], object],
                 config_dir: Path, *, overwrite: bool) -> None:
        self.store, self.versions, self.announce = store, versions, announce
        self.config_dir, self.overwrite = config_dir, overwrite

    def publish(self, weights: dict[str, torch.Tensor], policy_version: int, *, write_weights: bool = True) -> None:
        """Make ``policy_version`` current: write its weights (unless already there), set the key, announce.

        Args:
            weights: The complete policy state dict (name -> tensor, CPU), gathered from the shards
                by ``posttrain.parallel.placement.full_state_dict`` on rank 0; ignored without
                ``write_weights``.
            policy_version: The version to publish.
            write_weights: False when the store already holds this version's weights.

        Raises:
            ValueError: ``policy_version`` out of order in the store, or negative.
            OSError / posttrain.storage.StorageError: the store could not be written.
        """
        if write_weights:
            self.store.publish(weights, policy_version, self.config_dir, overwrite=self.overwrite)
        self.versions.set(policy_version)
        self.announce(policy_version)
