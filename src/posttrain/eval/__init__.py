"""Evaluation: benchmarks, grading, metrics (avg@k, pass@k, CIs), reports, and the ``posttrain eval`` CLI.

Modules (imported on use; importing the package is cheap and never pulls in vllm or torch):

* ``benchmarks``: the registry ``BENCHMARKS`` (beyond_aime, imo_answerbench, gsm8k, math500,
  swe_bench_verified, swe_repair) loading from ``data/`` (``POSTTRAIN_DATA_DIR`` overrides it).
* ``grading``: math grading on math-verify with a timeout, "needs judge" answers, an optional
  OpenAI-compatible judge.
* ``swe``: patch + FAIL_TO_PASS/PASS_TO_PASS tests + log grading; local and Kubernetes backends.
* ``metrics``: avg@k, unbiased pass@k, Wilson / bootstrap intervals, length statistics.
* ``runner``: ``evaluate(model_dir, benchmark, ...) -> EvalReport`` through the generator engines.
* ``report``: ``EvalReport``, its aggregation from graded samples and its JSON.
* ``report_render``: Markdown / HTML / PNG renderings and ``write_reports``.
* ``cli``: ``eval_cli`` and ``models_cli`` for ``posttrain eval`` and ``posttrain models``.

Run: ``python -m posttrain.eval.cli eval --help``; the documentation is ``docs/evaluation.md``.
"""
