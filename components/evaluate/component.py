"""KFP component ``evaluate``: score a trained checkpoint on the run's held-out tasks.

avg@k over the prepared ``eval.jsonl`` tasks, graded by the environment's verifier
(``posttrain.kfp.evaluate.evaluate`` over ``posttrain.eval.heldout.evaluate_policy``); writes Metrics and an
HTML report. Runs in the ``trainer`` image.
"""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate(
    prepared: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
) -> float:
    """Held-out evaluation of ``model``; returns ``heldout_accuracy``.

    Args:
        prepared: Dataset artifact of ``prepare_dataset`` (config and eval.jsonl).
        model: Checkpoint from a ``train_*`` step.
        metrics: ``heldout_accuracy``, ``heldout_reward_mean``, ``heldout_action_tokens_mean``, ``heldout_num_rollouts``.
        report: HTML table of the run, checkpoint and scores.
    """
    from posttrain.kfp.artifacts import write_outputs
    from posttrain.kfp.evaluate import evaluate, model_location

    where = model_location(model.uri, model.path, model.metadata)
    result = evaluate(prepared.path, where, local_model_dir=model.path)
    write_outputs(result, metrics=metrics, html_report=report)
    return result.metrics["heldout_accuracy"]
