"""The posttrain pipelines: prepare the data, train with one technique, evaluate, register.

``post_training`` is what a team starts from the Kubeflow UI: its ``technique`` parameter
(``sft|dpo|grpo|sao|gkd``) selects one branch (``dsl.If`` / ``dsl.Elif``); ``prepare_dataset`` runs
first and rejects any other value, so a typo fails the run instead of silently training nothing.
``sft``, ``dpo``, ``grpo``, ``sao`` and ``gkd`` are the same steps for one technique each. GKD's
teacher is the config's ``gkd.teacher.path`` (a path, an ``s3://`` URI or ``models:/<name>@champion``,
resolved when the run starts), or one the run builds.

Only per-run knobs are pipeline parameters: ``config`` (which run config file), ``model``,
``dataset``, ``technique``, ``steps``, ``queue``, for SAO where it runs (``mode``) and its Kueue
``priority_class`` (``posttrain schedule`` sets ``posttrain-scheduled`` for recurring runs), and in
``post_training`` what the evaluate step scores and promotion compares (``benchmarks``,
``benchmark_limit``, ``promote_on``; the single-technique pipelines use the defaults). Everything
else (learning rates, batch shapes, environment, samples per task, registered model name) comes
from the config file. Empty strings and 0 keep the config's values.

Kubernetes settings come from ``components/k8s.py``: model-loading steps of sft/dpo/grpo/gkd and
``evaluate`` get a GPU, the Kueue queue label and (training) a workspace volume; every step gets
the tenant's ConfigMap and S3 credentials. ``train_sao`` in ``cluster`` mode needs neither GPU nor
queue label itself: the JobSet it creates carries them. Caching is off for every step: a scheduled
retrain with unchanged parameters must train again (``models:/...@champion`` resolves at run time).

Run locally (CPU, embedded services): ``kfp.local.init(runner=kfp.local.SubprocessRunner(
use_venv=False))`` then ``post_training(technique="sao", config=..., sao_mode="local")``; compile
with ``python -m pipelines.compile``.
"""

from collections.abc import Callable
from typing import Any

from components import k8s
from components.evaluate.component import evaluate
from components.images import GENERATOR_IMAGE, TRAINER_IMAGE
from components.prepare_dataset.component import prepare_dataset
from components.register_model.component import register_model
from components.train_dpo.component import train_dpo
from components.train_gkd.component import train_gkd
from components.train_grpo.component import train_grpo
from components.train_sao.component import train_sao
from components.train_sft.component import train_sft
from kfp import dsl

from posttrain.cluster.tenant import INTERACTIVE_PRIORITY, LOCAL_QUEUE

DEFAULT_CONFIGS = {
    "sft": "configs/sft_cpu.yaml",
    "dpo": "configs/dpo_cpu.yaml",
    "grpo": "configs/grpo_cpu.yaml",
    "sao": "configs/sao_demo_cpu.yaml",
    "gkd": "configs/gkd_cpu.yaml",
}
"""Default run config of each technique's pipeline (looked up in the step's working directory, then
under ``/opt/posttrain``); ``post_training`` defaults to the SAO one."""
DEFAULT_BENCHMARKS = "heldout"
"""Benchmarks the evaluate step runs unless the run names others (comma-separated: heldout,
beyond_aime, imo_answerbench, swe_bench_verified)."""
DEFAULT_PROMOTE_ON = "heldout.accuracy"
"""The ``<benchmark>.<metric>`` a new version must beat the champion on to be promoted."""
TRAINERS = {"sft": train_sft, "dpo": train_dpo, "grpo": train_grpo, "gkd": train_gkd}
"""Training component of each technique trained inside its step's pod."""
RETRY = {"num_retries": 2, "backoff_duration": "60s", "backoff_factor": 2.0, "backoff_max_duration": "600s"}
"""``set_retry`` of the steps that are safe and worth running again (1 min, then 2 min between attempts):

* ``evaluate``: reads the checkpoint, writes only its own reports; its single GPU pod is admitted by
  Kueue's pod integration, so a preemption (or a lost node) fails the attempt and a retry queues again.
* ``train_sao``: the launcher re-attaches to the JobSet of the same run id (``jobset_name``), so a
  retried step resumes following the training instead of starting a second one. The JobSet is
  owned by the run's Workflow, not by the launcher pod, and an evicted or drained launcher leaves
  it running (``posttrain.cluster.launcher.termination_cause``). Argo retries only a step whose
  container failed (KFP compiles ``set_retry`` to Argo's default policy, ``OnFailure``); a pod that
  was deleted (eviction, drain, lost node) is an Argo ``Error`` and fails the run: KFP's "Retry"
  of the run then starts the step again and it re-attaches. A JobSet that really failed is replaced
  by a fresh one on retry (the learner resumes from the run's checkpoints).

Not retried:

* ``prepare_dataset``, though idempotent (it writes only its own Dataset artifact): its failures
  are bad input (unknown technique, a config or row that does not validate), which a retry would
  report 3 minutes later instead of at once; transient S3 and MLflow errors are already retried,
  bounded, by their clients (botocore standard mode, 5 attempts).
* ``train_sft/dpo/grpo/gkd``: their checkpoints live on an ephemeral ``/workspace`` deleted with the
  pod, so every attempt would train from step 0 and a deterministic failure (out of memory, a bad
  row) would burn the GPU hours again; with ``k8s.mount_workspace(claim=...)`` a retry resumes from
  the last checkpoint and becomes worth adding.
* ``register_model``: a retry after a registration that succeeded, in a step that failed later,
  would register a second version.
"""


def _prepare(config: Any, technique: Any, model: Any, dataset: Any, steps: Any) -> dsl.PipelineTask:
    task = prepare_dataset(config=config, technique=technique, model=model, dataset=dataset, steps=steps,
                           run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    task.set_display_name("prepare dataset").set_caching_options(False)
    return k8s.use_tenant_config(task)


def _train(technique: str, prepared: dsl.PipelineTask, queue: Any = LOCAL_QUEUE, mode: Any = "cluster",
           priority_class: Any = INTERACTIVE_PRIORITY) -> dsl.PipelineTask:
    dataset = prepared.outputs["prepared"]
    if technique == "sao":
        task = train_sao(prepared=dataset, mode=mode, queue=queue, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                         learner_image=TRAINER_IMAGE, generator_image=GENERATOR_IMAGE, priority_class=priority_class)
        k8s.use_pod_identity(task)  # the launcher finds the run's Workflow (the JobSet's owner) through its pod
        task.set_retry(**RETRY)  # a retried launcher re-attaches to the same JobSet
    else:
        task = TRAINERS[technique](prepared=dataset, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        k8s.use_kueue_queue(task)
        k8s.request_gpus(task, 1)
        k8s.mount_workspace(task)
    task.set_display_name(f"train ({technique})").set_caching_options(False)
    return k8s.use_tenant_config(task)


def _evaluate_and_register(prepared: dsl.PipelineTask, trained: dsl.PipelineTask, benchmarks: Any = DEFAULT_BENCHMARKS,
                           benchmark_limit: Any = 0, promote_on: Any = DEFAULT_PROMOTE_ON) -> dsl.PipelineTask:
    scored = evaluate(prepared=prepared.outputs["prepared"], model=trained.outputs["model"], benchmarks=benchmarks,
                      limit=benchmark_limit)
    scored.set_display_name("evaluate").set_caching_options(False).set_retry(**RETRY)
    k8s.use_kueue_queue(scored)
    k8s.request_gpus(scored, 1, cpu="4", memory="32Gi")
    k8s.use_tenant_config(scored)
    registered = register_model(prepared=prepared.outputs["prepared"], model=trained.outputs["model"],
                                eval_metrics=scored.outputs["metrics"], run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                                promote_on=promote_on)
    registered.set_display_name("register model").set_caching_options(False)
    return k8s.use_tenant_config(registered)


@dsl.pipeline(name="post-training", description="posttrain: prepare, train with the chosen technique "
              "(sft, dpo, grpo, sao or gkd), evaluate on the chosen benchmarks, register in MLflow.")
def post_training(
    technique: str = "sao",
    config: str = DEFAULT_CONFIGS["sao"],
    model: str = "",
    dataset: str = "",
    steps: int = 0,
    queue: str = LOCAL_QUEUE,
    sao_mode: str = "cluster",
    priority_class: str = INTERACTIVE_PRIORITY,
    benchmarks: str = DEFAULT_BENCHMARKS,
    benchmark_limit: int = 0,
    promote_on: str = DEFAULT_PROMOTE_ON,
):
    """Post-train a model with one technique, chosen per run.

    Args:
        technique: sft, dpo, grpo, sao or gkd (on-policy distillation from the config's gkd.teacher).
        config: Run config YAML (path in the image or s3:// URI); everything not listed here comes from it.
        model: Base model: "" (the config's), a path, an s3:// URI or models:/<name>@champion.
        dataset: Training file: "" (the config's) or a path / s3:// URI (RL tasks, sft rows or dpo pairs).
        steps: Optimizer steps (policy versions for sao and gkd); 0 keeps the config's.
        queue: Kueue LocalQueue of the SAO JobSet.
        sao_mode: Where SAO runs: cluster (one JobSet admitted by Kueue) or local (processes in the step).
        priority_class: Kueue priority of the SAO JobSet: posttrain-interactive, or posttrain-scheduled (recurring runs).
        benchmarks: Comma-separated benchmarks to evaluate on: heldout, beyond_aime, imo_answerbench, swe_bench_verified.
        benchmark_limit: Tasks per benchmark; 0 = heldout's eval.num_tasks and every task of the others.
        promote_on: <benchmark>.<metric> the new version must beat the champion on (e.g. beyond_aime.accuracy).
    """
    prepared = _prepare(config, technique, model, dataset, steps)
    scoring = {"benchmarks": benchmarks, "benchmark_limit": benchmark_limit, "promote_on": promote_on}
    with dsl.If(technique == "sft", name="technique-sft"):
        _evaluate_and_register(prepared, _train("sft", prepared), **scoring)
    with dsl.Elif(technique == "dpo", name="technique-dpo"):
        _evaluate_and_register(prepared, _train("dpo", prepared), **scoring)
    with dsl.Elif(technique == "grpo", name="technique-grpo"):
        _evaluate_and_register(prepared, _train("grpo", prepared), **scoring)
    with dsl.Elif(technique == "sao", name="technique-sao"):
        _evaluate_and_register(prepared, _train("sao", prepared, queue=queue, mode=sao_mode, priority_class=priority_class),
                               **scoring)
    with dsl.Elif(technique == "gkd", name="technique-gkd"):
        _evaluate_and_register(prepared, _train("gkd", prepared), **scoring)


@dsl.pipeline(name="sft", description="posttrain SFT: prepare chat rows, train, evaluate, register.")
def sft(config: str = DEFAULT_CONFIGS["sft"], model: str = "", dataset: str = "", steps: int = 0):
    """Supervised fine-tuning on chat rows (``sft.data_path`` or ``dataset``)."""
    prepared = _prepare(config, "sft", model, dataset, steps)
    _evaluate_and_register(prepared, _train("sft", prepared))


@dsl.pipeline(name="dpo", description="posttrain DPO: prepare preference pairs, train, evaluate, register.")
def dpo(config: str = DEFAULT_CONFIGS["dpo"], model: str = "", dataset: str = "", steps: int = 0):
    """Direct preference optimisation on prompt/chosen/rejected pairs (``dpo.data_path`` or ``dataset``)."""
    prepared = _prepare(config, "dpo", model, dataset, steps)
    _evaluate_and_register(prepared, _train("dpo", prepared))


@dsl.pipeline(name="grpo", description="posttrain GRPO: prepare tasks, train with group baselines, evaluate, register.")
def grpo(config: str = DEFAULT_CONFIGS["grpo"], model: str = "", dataset: str = "", steps: int = 0):
    """GRPO on environment tasks (``data.train_path`` or ``dataset``)."""
    prepared = _prepare(config, "grpo", model, dataset, steps)
    _evaluate_and_register(prepared, _train("grpo", prepared))


@dsl.pipeline(name="sao", description="posttrain SAO: prepare tasks, train with single-rollout asynchronous "
              "optimization (one JobSet), evaluate, register.")
def sao(
    config: str = DEFAULT_CONFIGS["sao"],
    model: str = "",
    dataset: str = "",
    steps: int = 0,
    queue: str = LOCAL_QUEUE,
    mode: str = "cluster",
    priority_class: str = INTERACTIVE_PRIORITY,
):
    """SAO (arXiv 2607.07508) on environment tasks; ``mode`` cluster runs one JobSet in ``queue`` at ``priority_class``."""
    prepared = _prepare(config, "sao", model, dataset, steps)
    _evaluate_and_register(prepared, _train("sao", prepared, queue=queue, mode=mode, priority_class=priority_class))


@dsl.pipeline(name="gkd", description="posttrain GKD: prepare tasks, distil the teacher into the student on its "
              "own samples (on-policy), evaluate, register.")
def gkd(config: str = DEFAULT_CONFIGS["gkd"], model: str = "", dataset: str = "", steps: int = 0):
    """GKD (arXiv 2306.13649) on environment tasks (``data.train_path`` or ``dataset``), teacher ``gkd.teacher.path``."""
    prepared = _prepare(config, "gkd", model, dataset, steps)
    _evaluate_and_register(prepared, _train("gkd", prepared))


PIPELINES: dict[str, Callable[..., Any]] = {
    "post_training": post_training,
    "sft": sft,
    "dpo": dpo,
    "grpo": grpo,
    "sao": sao,
    "gkd": gkd,
}
"""Compiled file stem -> pipeline (``pipelines/compiled/<stem>.yaml``)."""
