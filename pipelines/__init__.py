"""posttrain's Kubeflow pipelines and their compiler.

* ``post_training``: the pipeline a team runs from the Kubeflow UI; its ``technique`` parameter
  (``sft``, ``dpo``, ``grpo``, ``sao``, ``gkd``) picks the training branch.
* ``sft``, ``dpo``, ``grpo``, ``sao``, ``gkd``: one pipeline per technique (same steps, no branching).

All of them: ``prepare_dataset`` -> ``train_<technique>`` -> ``evaluate`` -> ``register_model``.
``python -m pipelines.compile`` writes ``pipelines/compiled/<name>.yaml`` (committed; a test fails
when it drifts from the source).
"""

from pipelines.post_training import PIPELINES, dpo, gkd, grpo, post_training, sao, sft

__all__ = ["PIPELINES", "dpo", "gkd", "grpo", "post_training", "sao", "sft"]
