"""Weight sync: the learner publishes versioned weights, generators poll and reload them.

``store.FilesystemWeightStore`` (a local directory or shared volume) implements the
``store.WeightStore`` Protocol; an S3 store or an NCCL broadcast can sit behind the same methods.
Versions count weight publications (v0 = the initial weights).
"""

from posttrain.weight_sync.store import FilesystemWeightStore, WeightStore, publish_model

__all__ = ["FilesystemWeightStore", "WeightStore", "publish_model"]
