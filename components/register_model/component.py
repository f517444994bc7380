"""KFP component ``register_model``: the last step of every posttrain pipeline.

Registers the checkpoint as a new version of the tenant's registered model with its lineage
(pipeline run, technique, dataset and config hashes, base model) and held-out scores, gives it the
``challenger`` alias and moves ``champion`` to it only if it beats the current champion on
held-out accuracy (``posttrain.kfp.register.register_model`` over ``posttrain.tracking``). The
weights are not copied: the version's source is the checkpoint's location. Runs in the ``base`` image.
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from components.images import BASE_IMAGE


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def register_model(
    prepared: Input[Dataset],
    model: Input[Model],
    eval_metrics: Input[Metrics],
    run_id: str,
    report: Output[Markdown],
) -> str:
    """Register ``model`` in MLflow and promote it if it is better; returns ``"<name> v<N> <alias>: <reason>"``.

    Args:
        prepared: Dataset artifact of ``prepare_dataset`` (lineage, registered model name).
        model: Checkpoint from a ``train_*`` step.
        eval_metrics: Metrics of ``evaluate`` (``heldout_accuracy`` decides promotion).
        run_id: Pipeline run id (lineage tag ``posttrain.run``).
        report: The registration and the promotion decision.
    """
    from posttrain.kfp.artifacts import write_outputs
    from posttrain.kfp.evaluate import model_location
    from posttrain.kfp.register import register_model

    where = model_location(model.uri, model.path, model.metadata)
    result = register_model(prepared.path, where, model.metadata, eval_metrics.metadata, run_id)
    write_outputs(result, markdown=report)
    return result.text
