"""Weight sync: the learner publishes versioned weights, generators poll and reload them.

``store.FilesystemWeightStore`` (a local directory or shared volume) and
``s3_store.S3WeightStore`` (an ``s3://`` prefix, for pods that share no volume) implement the
``store.WeightStore`` Protocol; ``factory.open_weight_store`` picks one from the run config's
``weights_uri``. An NCCL broadcast can sit behind the same methods. Versions count weight
publications (v0 = the initial weights).
"""

from posttrain.weight_sync.factory import open_weight_store, upload_final_model
from posttrain.weight_sync.s3_store import S3WeightStore
from posttrain.weight_sync.store import FilesystemWeightStore, WeightStore, publish_model

__all__ = ["FilesystemWeightStore", "S3WeightStore", "WeightStore", "open_weight_store", "publish_model",
           "upload_final_model"]
