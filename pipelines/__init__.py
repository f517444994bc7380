"""posttrain's Kubeflow pipelines and their compiler.

* ``post_training``: the pipeline a team runs from the Kubeflow UI; its ``technique`` parameter
  (``sft``, ``dpo``, ``grpo``, ``sao``, ``gkd``) picks the training branch.
* ``sft``, ``dpo``, ``grpo``, ``sao``, ``gkd``: one pipeline per technique (same steps, no branching).

All of them: ``prepare_dataset`` -> ``train_<technique>`` -> ``evaluate`` -> ``register_model``.
``python -m pipelines.compile`` writes ``pipelines/compiled/<name>.yaml`` (committed; a test fails
when it drifts from the source).
"""

import importlib
from typing import Any

__all__ = ["PIPELINES", "dpo", "gkd", "grpo", "post_training", "sao", "sft"]


def __getattr__(name: str) -> Any:
    """Import the pipelines on first use (PEP 562).

    Defining them compiles each one: seconds that ``pipelines.compile --help`` and a test collection that never runs
    a pipeline should not pay. Binds every name of ``__all__`` as the eager import did (``pipelines.post_training`` is
    then the pipeline function, not its module).
    """
    if name not in __all__:
        raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
    module = importlib.import_module("pipelines.post_training")
    globals().update({n: getattr(module, n) for n in __all__})
    return globals()[name]
