"""KFP component ``prepare_dataset``: the first step of every posttrain pipeline.

Resolves the run config with the per-run knobs (technique, model, dataset, steps), validates the
training data and writes the Dataset artifact (resolved ``config.yaml``, ``manifest.json``,
``train.jsonl``, ``eval.jsonl``) that every later step reads. A wrapper over
``posttrain.kfp.prepare.prepare_dataset``; runs in the torch-free ``base`` image.

Run alone: ``kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False))`` then
``prepare_dataset(config="configs/sao_demo_cpu.yaml", technique="sao", model="", dataset="", steps=2,
run_id="try")``.
"""

from kfp import dsl
from kfp.dsl import Dataset, Metrics, Output

from components.images import BASE_IMAGE


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def prepare_dataset(
    config: str,
    technique: str,
    model: str,
    dataset: str,
    steps: int,
    run_id: str,
    prepared: Output[Dataset],
    summary: Output[Metrics],
):
    """Resolve the run config and validate the data into the ``prepared`` Dataset artifact.

    Args:
        config: Run config YAML (path in the image or ``s3://`` URI).
        technique: ``sft``, ``dpo``, ``grpo`` or ``sao``.
        model: "" (the config's), a path, ``s3://`` URI or ``models:/<name>@<alias>``.
        dataset: "" (the config's) or the training file (path or ``s3://`` URI).
        steps: 0 (the config's) or the technique's optimizer steps.
        run_id: Pipeline run id (suffixes the run name).
        prepared: Directory with config.yaml, manifest.json, train.jsonl, eval.jsonl.
        summary: ``train_rows``, ``eval_rows``.
    """
    from posttrain.kfp.artifacts import write_outputs
    from posttrain.kfp.prepare import prepare_dataset

    result = prepare_dataset(config, technique, model, dataset, steps, run_id, prepared.path)
    write_outputs(result, metrics=summary, artifact=prepared)
