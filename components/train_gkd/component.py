"""KFP component ``train_gkd``: GKD, on-policy distillation of a teacher into the student (arXiv 2306.13649).

Trains from the prepared Dataset artifact with ``posttrain.runners.run`` (through
``posttrain.kfp.train.train_technique``): generator processes sample the student, the learner scores
their tokens with the frozen teacher (``gkd.teacher.path``, resolved by ``prepare_dataset``; or one
the run builds) and trains on the divergence, over an embedded Redis inside the step. Writes the
final transformers checkpoint into the Model artifact. Runs in the ``trainer`` image; the pipelines
give it a GPU, the Kueue queue label and a workspace volume through ``components/k8s.py``.
"""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def train_gkd(
    prepared: Input[Dataset],
    run_id: str,
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    time_account: Output[Markdown],
    time_account_plot: Output[Artifact],
):
    """GKD training from ``prepared`` into the ``model`` checkpoint.

    Args:
        prepared: Dataset artifact of ``prepare_dataset`` (technique gkd).
        run_id: Pipeline run id (MLflow tag).
        model: Final checkpoint (transformers directory + posttrain_model.json).
        metrics: Numeric rows of the training summary (teacher and student accuracy, gap closed).
        report: The training summary table.
        time_account: The run's time account by role and share (``posttrain.runners.accounting``), with its
            stacked-bar plot.
        time_account_plot: The time account's stacked-bar PNG.
    """
    from posttrain.kfp.artifacts import write_outputs
    from posttrain.kfp.train import train_technique

    result = train_technique(prepared.path, model.path, "gkd", run_id=run_id)
    write_outputs(result, metrics=metrics, artifact=model, markdown=report, account=time_account,
                  account_plot=time_account_plot)
