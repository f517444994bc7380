"""KFP component ``register_model``: the last step of every posttrain pipeline.

Logs the checkpoint as an MLflow model (transformers flavour) in the run that trained it and
registers it as a new version of the tenant's registered model with its lineage (pipeline run,
technique, dataset and config hashes, base model) and every evaluate score, gives it the
``challenger`` alias and moves ``champion`` to it only if it beats the current champion on
``promote_on`` (``posttrain.kfp.register.register_model`` over ``posttrain.tracking``).
``mlflow.transformers.load_model("models:/<name>@champion")`` loads the result. Runs in the
``trainer`` image (logging a transformers model loads it).
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def register_model(
    prepared: Input[Dataset],
    model: Input[Model],
    eval_metrics: Input[Metrics],
    run_id: str,
    report: Output[Markdown],
    promote_on: str = "heldout.accuracy",
) -> str:
    """Register ``model`` in MLflow and promote it if it is better; returns ``"<name> v<N> <alias>: <reason>"``.

    Args:
        prepared: Dataset artifact of ``prepare_dataset`` (lineage, registered model name).
        model: Checkpoint from a ``train_*`` step.
        eval_metrics: Metrics of ``evaluate`` (``<benchmark>_<metric>``).
        run_id: Pipeline run id (lineage tag ``posttrain.run``).
        report: The registration, the model URI to load and the promotion decision.
        promote_on: ``<benchmark>.<metric>`` that decides promotion (``heldout.accuracy``, ``beyond_aime.accuracy``...).
    """
    from posttrain.kfp.artifacts import write_outputs
    from posttrain.kfp.evaluate import model_location
    from posttrain.kfp.register import register_model

    where = model_location(model.uri, model.path, model.metadata)
    result = register_model(prepared.path, where, model.metadata, eval_metrics.metadata, run_id,
                            promote_on=promote_on, local_model_dir=model.path)
    write_outputs(result, markdown=report)
    return result.text
