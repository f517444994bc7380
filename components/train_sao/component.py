"""KFP component ``train_sao``: Single-Rollout Asynchronous Optimization (arXiv 2607.07508).

``mode="local"`` runs the SFT warm start, then generator processes, the learner and an embedded
Redis inside this step (``kfp.local`` and small CPU runs). ``mode="cluster"`` builds one JobSet
(learner, N generators, Redis) labelled with the tenant's Kueue ``queue``
(``posttrain.cluster.jobset.build_sao_jobset``), creates it or re-attaches to it after a retry
(``posttrain.cluster.launcher.launch_or_attach``) and follows it to the end (``wait_for_jobset``);
the step's pod itself needs no GPU. A wrapper over ``posttrain.kfp.train.train_sao``; runs in the
``trainer`` image.
"""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def train_sao(
    prepared: Input[Dataset],
    mode: str,
    queue: str,
    run_id: str,
    learner_image: str,
    generator_image: str,
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    curves: Output[HTML],
    time_account: Output[Markdown],
    time_account_plot: Output[Artifact],
    priority_class: str = "",
):
    """SAO training from ``prepared`` into the ``model`` checkpoint.

    Args:
        prepared: Dataset artifact of ``prepare_dataset`` (technique sao).
        mode: ``local`` (processes here) or ``cluster`` (one JobSet through Kueue).
        queue: Kueue LocalQueue of the JobSet (cluster mode).
        run_id: Pipeline run id; the JobSet name derives from it, so a retry re-attaches.
        learner_image: Learner image of the JobSet (cluster mode).
        generator_image: Generator image of the JobSet (cluster mode).
        priority_class: Kueue WorkloadPriorityClass of the JobSet and its pods (cluster mode); "": none.
        model: Final checkpoint (local mode) or a pointer to it in ``metadata.checkpoint_uri``.
        metrics: Policy versions, rollouts trained/dropped, generator busy fraction; JobSet restarts.
        report: Summary table.
        curves: Reward curve (mean reward per policy version, from the MLflow run) and the run's link.
        time_account: The run's time account by role and share, with its stacked-bar plot (local mode).
        time_account_plot: The time account's stacked-bar PNG (empty in cluster mode).
    """
    from posttrain.kfp.artifacts import write_outputs
    from posttrain.kfp.train import train_sao

    result = train_sao(prepared.path, model.path, mode=mode, queue=queue, run_id=run_id,
                       learner_image=learner_image, generator_image=generator_image, priority_class=priority_class)
    write_outputs(result, metrics=metrics, artifact=model, markdown=report, html_report=curves,
                  account=time_account, account_plot=time_account_plot)
