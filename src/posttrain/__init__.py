"""posttrain: LLM post-training (SFT, DPO, GRPO, SAO) on Kubeflow, runnable on one machine.

Entry point: the ``posttrain`` command (``posttrain --help``). Library layout: ``config`` (pydantic
models), ``records`` (wire records), ``losses`` and ``advantages`` (pure tensor maths),
``rollout`` (stream and admission), ``generator``, ``learner``, ``envs``, ``eval``.
"""

__version__ = "0.1.0"
