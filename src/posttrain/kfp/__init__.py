"""What the Kubeflow pipeline steps run: one function per component of ``components/``.

Each KFP component is a few lines that call one step function here with local paths (the artifact
directories KFP hands it) and copy the returned ``StepOutputs`` into its output artifacts with
``artifacts.write_outputs``. Nothing here imports ``kfp``, so every step is also callable (and
tested) without a pipeline.

The steps, in pipeline order:

* ``prepare.prepare_dataset``: resolves the run config (file path or ``s3://`` URI) with the
  per-run knobs applied, resolves the model (a path, an ``s3://`` URI or ``models:/...`` in the
  MLflow registry), validates the training data and writes the Dataset artifact directory.
* ``train.train_sao`` (``mode="local"``: generator processes, learner and embedded Redis inside the
  step; ``mode="cluster"``: one JobSet through ``posttrain.kfp.train_cluster``) and
  ``train.train_technique`` (sft, dpo, grpo) write a transformers checkpoint into the Model
  artifact directory, with ``posttrain_model.json`` beside it.
* ``evaluate.evaluate`` scores the checkpoint on the held-out tasks (avg@k of the environment's
  verifier) and renders Markdown and HTML reports.
* ``register.register_model`` registers the checkpoint in MLflow with its lineage and eval scores
  (alias ``challenger``) and moves ``champion`` to it only if it beats the current champion.

Training steps work in ``$POSTTRAIN_WORKSPACE/<run_name>`` when that directory exists (a volume mounted by
``components/k8s.py::mount_workspace``; a retried step resumes from its checkpoints), otherwise in a
temporary directory removed on success and kept (path logged) on failure.

Files:

* ``artifacts.py``: ``StepOutputs``, ``PipelineStepError``, ``write_outputs``, the Dataset artifact's
  file names and ``load_prepared``, ``workspace``, ``export_model``, the report tables.
* ``config_fields.py``: the config fields the pipeline parameters set (``DATA_FIELD``,
  ``STEPS_FIELD``), ``overrides``, ``get_field``, ``with_fields``.
* ``locations.py``: ``resolve_location``, ``local_file``, ``resolve_model``, ``check_checkpoint``,
  ``local_model``, ``run_name_for``.
* ``prepare.py``: ``prepare_dataset``.
* ``train.py``: ``train_sao`` (local mode), ``train_technique``.
* ``train_cluster.py``: ``train_sao_cluster``, the cluster branch of ``train_sao``: stages the run's
  files, launches or re-attaches to the SAO JobSet (``posttrain.cluster``) and follows it.
* ``kube.py``: ``kube_clients`` (the API of wherever a step runs), ``runs_uri`` (where cluster-mode
  runs keep their files).
* ``evaluate.py``: ``model_location``, ``evaluate``.
* ``register.py``: ``register_model``.

Try a step by hand: ``python -c "from posttrain.kfp.prepare import prepare_dataset;
print(prepare_dataset('configs/sao_demo_cpu.yaml', 'sao', '', '', 2, 'try', '/tmp/ds').metrics)"``.
"""
