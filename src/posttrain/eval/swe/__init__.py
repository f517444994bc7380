"""SWE grading: apply the model's patch, run FAIL_TO_PASS and PASS_TO_PASS tests, grade the test log.

Two backends run the tests, both ending in ``log_grading.grade_test_log``:

* ``k8s_backend.KubernetesSweBackend`` (SWE-bench Verified): one pod per instance from the
  instance's SWE-bench evaluation image, no network, no API token, a deadline;
* ``local_backend.LocalSweBackend`` (the self-made repair tasks): copies the task's repository,
  applies the patch and runs the test command inside ``posttrain.envs.sandbox``.

Modules: ``instances`` (SWE-bench Verified data, ``SweGradingError``), ``patches`` (the diff in a
response, the paths a diff touches), ``eval_script`` (the script an evaluation pod runs, per
repository test commands), ``log_grading`` (markers, log parsers, ``SweGrade``), and the two
backends. Each of ``k8s_backend``, ``local_backend``, ``log_grading`` and ``eval_script`` lists
the Guarantees and Not guaranteed items of the part it implements, beside the code that keeps them.

Run: ``python -m posttrain.eval.swe.k8s_backend INSTANCE_ID`` prints the eval script and pod spec
of the gold patch for inspection (nothing is created).
"""
